"""CDI's provisioner keys: which key each StorageClass parameter combination selects, and the first rule
that holds wins in CDI's order."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.controller.capabilities import (
    CLAIM_PROPERTY_SETS,
    CLONE_STRATEGIES,
    KEY_RULES,
    MINIMUM_PVC_SIZES,
    SOURCE_FORMATS,
    UNKNOWN,
    claim_property_sets,
    is_complete,
    profile_annotations,
    provisioner_key,
    recognition,
)


def sc(provisioner: str, name: str = "sc", **parameters: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "provisioner": provisioner, "parameters": parameters}


@pytest.mark.parametrize(("provisioner", "parameters", "key"), [
    ("kubevirt.io.hostpath-provisioner", {"storagePool": "local"}, "kubevirt.io.hostpath-provisioner"),
    ("kubevirt.io.hostpath-provisioner", {"overlayCSI": ""}, "kubevirt.io.hostpath-provisioner/overlay"),
    ("kubernetes.io/portworx-volume", {"sharedv4_mount_options": "vers=3.0,nolock"},
     "kubernetes.io/portworx-volume/nfs"),
    ("kubernetes.io/portworx-volume", {"sharedv4_mount_options": "vers=3.0"}, "kubernetes.io/portworx-volume"),
    ("pxd.portworx.com", {"backend": "pure_block"}, "pxd.portworx.com/pure_block"),
    ("pxd.portworx.com", {"backend": "pure_fa_file"}, "pxd.portworx.com/pure_fa_file"),
    ("pxd.portworx.com", {"sharedv4_mount_options": "nolock,vers=3.0"}, "pxd.portworx.com/nfs"),
    # a backend parameter of another value rules out the NFS key
    ("pxd.portworx.com", {"backend": "other", "sharedv4_mount_options": "vers=3.0,nolock"}, "pxd.portworx.com"),
    ("csi.trident.netapp.io", {"backendType": "ontap-nas-flexgroup"}, "csi.trident.netapp.io/ontap-nas"),
    ("csi.trident.netapp.io", {"backendType": "ontap-san-economy"}, "csi.trident.netapp.io/ontap-san"),
    ("csi.trident.netapp.io", {"backendType": "google-cloud-netapp-volumes", "selector": "a=b ; performance=flex"},
     "csi.trident.netapp.io/gcnv-flex"),
    ("csi.trident.netapp.io", {"backendType": "google-cloud-netapp-volumes"}, UNKNOWN),
    ("csi.trident.netapp.io", {}, UNKNOWN),
    ("infinibox-csi-driver", {"storage_protocol": "fc"}, "infinibox-csi-driver/iscsiorfibrechannel"),
    ("infinibox-csi-driver", {"storage_protocol": "nvme"}, "infinibox-csi-driver/nvme"),
    ("infinibox-csi-driver", {"storage_protocol": "nfs_treeq"}, "infinibox-csi-driver/nfs"),
    ("infinibox-csi-driver", {"storage_protocol": "smb"}, UNKNOWN),
    ("csi.vsphere.vmware.com", {"csi.storage.k8s.io/fstype": "NFS4"}, "csi.vsphere.vmware.com/nfs"),
    ("csi.vsphere.vmware.com", {"csi.storage.k8s.io/fstype": "ext4"}, "csi.vsphere.vmware.com"),
    ("csi-unity.dellemc.com", {"protocol": "NFS"}, "csi-unity.dellemc.com/nfs"),
    ("csi-unity.dellemc.com", {"protocol": "iSCSI"}, "csi-unity.dellemc.com"),
    ("csi-powerstore.dellemc.com", {"csi.storage.k8s.io/fstype": "nfs"}, "csi-powerstore.dellemc.com/nfs"),
    ("csi-vxflexos.dellemc.com", {"csi.storage.k8s.io/fstype": "Nfs"}, "csi-vxflexos.dellemc.com/nfs"),
    ("csi-powermax.dellemc.com", {"csi.storage.k8s.io/fstype": "xfs"}, "csi-powermax.dellemc.com"),
    ("csi.huawei.com", {"protocol": "nfs"}, "csi.huawei.com/nfs"),
    ("csi.huawei.com", {"protocol": "NFS"}, "csi.huawei.com"),
    ("driver.longhorn.io", {"migratable": "true", "nfsOptions": "x", "fsType": "ext4"},
     "driver.longhorn.io/migratable"),
    ("driver.longhorn.io", {"migratable": "false", "nfsOptions": "x", "fsType": "ext4"}, "driver.longhorn.io/nfs"),
    ("driver.longhorn.io", {"fsType": "ext4"}, "driver.longhorn.io/fs"),
    ("driver.longhorn.io", {"nfsOptions": ""}, "driver.longhorn.io"),
    ("ebs.csi.aws.com", {"type": "io1"}, "ebs.csi.aws.com/io1"),
    ("ebs.csi.aws.com", {"type": "io2"}, "ebs.csi.aws.com/io2"),
    ("ebs.csi.aws.com", {"type": "gp2"}, "ebs.csi.aws.com/gp"),
    ("ebs.csi.aws.com", {"type": "gp3"}, "ebs.csi.aws.com/gp"),
    ("ebs.csi.aws.com", {"type": "st1"}, "ebs.csi.aws.com"),
    ("pd.csi.storage.gke.io", {"type": "hyperdisk-balanced-high-availability"}, "pd.csi.storage.gke.io/hyperdisk"),
    ("pd.csi.storage.gke.io", {"type": "pd-ssd"}, "pd.csi.storage.gke.io"),
    ("csi.san.synology.com", {}, "csi.san.synology.com/iscsi"),
    ("csi.san.synology.com", {"protocol": "smb"}, "csi.san.synology.com/smb"),
    ("csi.san.synology.com", {"protocol": "nfs"}, "csi.san.synology.com/nfs"),
    ("csi.san.synology.com", {"protocol": "ftp"}, UNKNOWN),
    ("vpc.file.csi.ibm.io", {"profile": "rfs", "vmState": "true"}, "vpc.file.csi.ibm.io/rfs-rwo"),
    ("vpc.file.csi.ibm.io", {"profile": "rfs"}, "vpc.file.csi.ibm.io/rfs"),
    ("vpc.file.csi.ibm.io", {"profile": "dp2", "vmState": "true"}, "vpc.file.csi.ibm.io/dp2-rwo"),
    ("vpc.file.csi.ibm.io", {"profile": "dp2", "vmState": "false"}, "vpc.file.csi.ibm.io/dp2"),
    ("vpc.file.csi.ibm.io", {}, "vpc.file.csi.ibm.io"),
    ("rook-ceph.rbd.csi.ceph.com", {"pool": "x"}, "rook-ceph.rbd.csi.ceph.com"),
])
def test_parameters_select_the_provisioner_key(provisioner: str, parameters: dict[str, str], key: str) -> None:
    assert provisioner_key(sc(provisioner, **parameters)) == key


def test_every_derived_key_has_an_entry() -> None:
    derived = {r.key for rules in KEY_RULES.values() for r in rules.rules} | \
        {rules.otherwise for rules in KEY_RULES.values()}
    assert derived - {UNKNOWN} <= set(CLAIM_PROPERTY_SETS)
    assert set(CLONE_STRATEGIES) <= set(CLAIM_PROPERTY_SETS)
    assert set(SOURCE_FORMATS) <= set(CLAIM_PROPERTY_SETS)
    assert set(MINIMUM_PVC_SIZES) - set(CLAIM_PROPERTY_SETS) == {"xspc.csi.hpe.com"}  # as in CDI


def test_recognition_reasons() -> None:
    assert recognition(sc("ebs.csi.aws.com", type="io2")) == "RecognizedProvisioner"
    assert recognition(sc("example.com/x")) == "UnrecognizedProvisioner"
    assert recognition(sc("xspc.csi.hpe.com")) == "UnrecognizedProvisioner"
    assert recognition(sc("csi.trident.netapp.io", backendType="solidfire-san")) == \
        "UnrecognizedStorageClassParameters"


def test_no_provisioner_sets_come_from_the_class_volumes() -> None:
    pv = [{"spec": {"storageClassName": "sc", "accessModes": ["ReadWriteOnce", "ReadOnlyMany"]}},
          {"spec": {"storageClassName": "sc", "accessModes": ["ReadWriteOnce"], "volumeMode": "Block"}},
          {"spec": {"storageClassName": "sc", "accessModes": ["ReadWriteOnce"]}},
          {"spec": {"storageClassName": "other", "accessModes": ["ReadWriteMany"]}}]
    assert claim_property_sets(sc("kubernetes.io/no-provisioner"), pv) == (
        ("ReadWriteOnce", "Filesystem"), ("ReadOnlyMany", "Filesystem"), ("ReadWriteOnce", "Block"))
    assert claim_property_sets(sc("kubernetes.io/no-provisioner"), []) is None


def test_profile_annotations_keep_a_users_minimum_and_follow_the_table() -> None:
    gke = sc("pd.csi.storage.gke.io", type="hyperdisk-balanced")
    vscs = [{"metadata": {"name": "b"}, "driver": "pd.csi.storage.gke.io", "parameters": {"snapshot-type": "images"}},
            {"metadata": {"name": "a"}, "driver": "pd.csi.storage.gke.io"}]
    assert profile_annotations(gke, {}, vscs) == {
        "cdi.kubevirt.io/minimumSupportedPvcSize": "4Gi", "cdi.kubevirt.io/useReadWriteOnceForDataImportCron": "true",
        "cdi.kubevirt.io/snapshotClassForDataImportCron": "b"}
    assert profile_annotations(gke, {"cdi.kubevirt.io/minimumSupportedPvcSize": "8Gi",
                                     "cdi.kubevirt.io/snapshotClassForDataImportCron": "gone"}, [])[
        "cdi.kubevirt.io/minimumSupportedPvcSize"] == "8Gi"
    assert "cdi.kubevirt.io/snapshotClassForDataImportCron" not in profile_annotations(
        gke, {"cdi.kubevirt.io/snapshotClassForDataImportCron": "gone"}, [])
    assert profile_annotations(sc("example.com/x"), {"x": "y"}, []) == {"x": "y"}


def test_unsupported_provisioners_always_count_as_complete() -> None:
    assert is_complete("openshift-storage.noobaa.io/obc", {})
    assert not is_complete("example.com/x", {})
    assert not is_complete("example.com/x", {"claimPropertySets": [{"accessModes": ["ReadWriteOnce"]}]})
    assert is_complete("example.com/x", {"claimPropertySets": [{"accessModes": ["ReadWriteOnce"],
                                                                "volumeMode": "Block"}]})
