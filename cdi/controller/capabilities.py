"""What CDI knows about storage provisioners, as data: CDI's `storagecapabilities` tables, keyed as CDI
keys them. A StorageClass maps to a *provisioner key*: its provisioner name, or, for the drivers whose
behaviour depends on the class's parameters (EBS volume type, Trident backend type, Longhorn
`migratable`, ...), a derived key such as `ebs.csi.aws.com/io2`; a parameter combination CDI cannot
place maps to `UNKNOWN` (condition reason `UnrecognizedStorageClassParameters`). The key then selects
the claim property sets (access and volume modes, most preferred first), the advised clone strategy,
the DataImportCron source format and the minimum supported PVC size. The embedded control plane's own
provisioners are added to CDI's table.

StorageProfiles start from these tables; their spec overrides them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdi.api import annotations as ann
from cdi.api.views import ObjectView, PersistentVolumeView

Body = Mapping[str, Any]
Params = Mapping[str, str]
Test = Callable[[Params], bool]
Sets = tuple[tuple[str, str], ...]  # (access mode, volume mode), preferred first

RWO, ROX, RWX = "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"
FS, BLOCK = "Filesystem", "Block"
COPY, SNAPSHOT, CSI_CLONE = "copy", "snapshot", "csi-clone"

UNKNOWN = "UNKNOWN"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
FSTYPE = "csi.storage.k8s.io/fstype"

HPP_CSI = "kubevirt.io.hostpath-provisioner"
HPP_OVERLAY_CSI = "kubevirt.io.hostpath-provisioner/overlay"
HPP_LEGACY = "kubevirt.io/hostpath-provisioner"
PORTWORX_PURE_BLOCK = "pxd.portworx.com/pure_block"
PORTWORX_PURE_FA_FILE = "pxd.portworx.com/pure_fa_file"
HITACHI_HSPC = "hspc.csi.hitachi.com"
HPE_XP = "xspc.csi.hpe.com"
NOOBAA = "openshift-storage.noobaa.io/obc"
OCS_BUCKET = "openshift-storage.ceph.rook.io/bucket"
ROOK_CEPH_BUCKET = "rook-ceph.ceph.rook.io/bucket"
STORK_SNAPSHOT = "stork-snapshot"


# -- StorageClass parameters -> provisioner key ----------------------------------------------------------

def equals(parameter: str, *values: str, lower: bool = False) -> Test:
    """The parameter is one of `values` (an absent parameter reads as "")."""
    def test(params: Params) -> bool:
        value = params.get(parameter, "")
        return (value.lower() if lower else value) in values
    return test


def present(parameter: str) -> Test:
    return lambda params: parameter in params


def absent(parameter: str) -> Test:
    return lambda params: parameter not in params


def non_empty(parameter: str) -> Test:
    return lambda params: params.get(parameter, "") != ""


def prefix(parameter: str, value: str) -> Test:
    return lambda params: params.get(parameter, "").startswith(value)


def substring(parameter: str, value: str) -> Test:
    """The lower-cased parameter contains `value`."""
    return lambda params: value in params.get(parameter, "").lower()


def items(parameter: str, separator: str, *values: str) -> Test:
    """The parameter, split on the `separator` pattern, holds every one of `values`."""
    pattern = re.compile(separator)
    return lambda params: set(values) <= set(pattern.split(params.get(parameter, "")))


@dataclass(frozen=True)
class Rule:
    """`key` when every test holds."""

    key: str
    tests: tuple[Test, ...]


def rule(key: str, *tests: Test) -> Rule:
    return Rule(key, tests)


@dataclass(frozen=True)
class KeyRules:
    """A provisioner whose key depends on its class's parameters: the first rule that holds wins,
    else `otherwise`."""

    rules: tuple[Rule, ...]
    otherwise: str


def _nfs_by_fstype(base: str) -> KeyRules:
    return KeyRules((rule(f"{base}/nfs", equals(FSTYPE, "nfs", lower=True)),), base)


_NFS_V3_NOLOCK = items("sharedv4_mount_options", ",", "vers=3.0", "nolock")

KEY_RULES: dict[str, KeyRules] = {
    HPP_CSI: KeyRules((rule(HPP_OVERLAY_CSI, present("overlayCSI")),), HPP_CSI),
    "kubernetes.io/portworx-volume": KeyRules(
        (rule("kubernetes.io/portworx-volume/nfs", _NFS_V3_NOLOCK),), "kubernetes.io/portworx-volume"),
    "pxd.portworx.com": KeyRules((
        rule(PORTWORX_PURE_BLOCK, equals("backend", "pure_block")),
        rule(PORTWORX_PURE_FA_FILE, equals("backend", "pure_fa_file")),
        rule("pxd.portworx.com/nfs", absent("backend"), _NFS_V3_NOLOCK),
    ), "pxd.portworx.com"),
    "csi.trident.netapp.io": KeyRules((
        rule("csi.trident.netapp.io/ontap-nas", prefix("backendType", "ontap-nas")),
        rule("csi.trident.netapp.io/ontap-san", prefix("backendType", "ontap-san")),
        rule("csi.trident.netapp.io/gcnv-flex", equals("backendType", "google-cloud-netapp-volumes"),
             items("selector", r"\s*[;,]\s*", "performance=flex")),
    ), UNKNOWN),
    "infinibox-csi-driver": KeyRules((
        rule("infinibox-csi-driver/iscsiorfibrechannel", equals("storage_protocol", "iscsi", "fc")),
        rule("infinibox-csi-driver/nvme", equals("storage_protocol", "nvme")),
        rule("infinibox-csi-driver/nfs", equals("storage_protocol", "nfs", "nfs_treeq")),
    ), UNKNOWN),
    "csi.vsphere.vmware.com": KeyRules(
        (rule("csi.vsphere.vmware.com/nfs", substring(FSTYPE, "nfs")),), "csi.vsphere.vmware.com"),
    "csi-unity.dellemc.com": KeyRules(
        (rule("csi-unity.dellemc.com/nfs", equals("protocol", "nfs", lower=True)),), "csi-unity.dellemc.com"),
    "csi-powerstore.dellemc.com": _nfs_by_fstype("csi-powerstore.dellemc.com"),
    "csi-vxflexos.dellemc.com": _nfs_by_fstype("csi-vxflexos.dellemc.com"),
    "csi-powermax.dellemc.com": _nfs_by_fstype("csi-powermax.dellemc.com"),
    "csi.huawei.com": KeyRules((rule("csi.huawei.com/nfs", equals("protocol", "nfs")),), "csi.huawei.com"),
    "driver.longhorn.io": KeyRules((
        rule("driver.longhorn.io/migratable", equals("migratable", "true")),
        rule("driver.longhorn.io/nfs", non_empty("nfsOptions")),
        rule("driver.longhorn.io/fs", non_empty("fsType")),
    ), "driver.longhorn.io"),
    "ebs.csi.aws.com": KeyRules((
        rule("ebs.csi.aws.com/io1", equals("type", "io1")),
        rule("ebs.csi.aws.com/io2", equals("type", "io2")),
        rule("ebs.csi.aws.com/gp", equals("type", "gp2", "gp3")),
    ), "ebs.csi.aws.com"),
    "pd.csi.storage.gke.io": KeyRules((
        rule("pd.csi.storage.gke.io/hyperdisk",
             equals("type", "hyperdisk-balanced", "hyperdisk-balanced-high-availability")),
    ), "pd.csi.storage.gke.io"),
    "csi.san.synology.com": KeyRules((
        rule("csi.san.synology.com/iscsi", equals("protocol", "iscsi", "")),
        rule("csi.san.synology.com/smb", equals("protocol", "smb")),
        rule("csi.san.synology.com/nfs", equals("protocol", "nfs", "nfs_treeq")),
    ), UNKNOWN),
    "vpc.file.csi.ibm.io": KeyRules((
        rule("vpc.file.csi.ibm.io/rfs-rwo", equals("profile", "rfs"), equals("vmState", "true")),
        rule("vpc.file.csi.ibm.io/rfs", equals("profile", "rfs")),
        rule("vpc.file.csi.ibm.io/dp2-rwo", equals("profile", "dp2"), equals("vmState", "true")),
        rule("vpc.file.csi.ibm.io/dp2", equals("profile", "dp2")),
    ), "vpc.file.csi.ibm.io"),
}


def provisioner_key(storage_class: Body) -> str:
    """The key CDI looks the class up by: the provisioner, or the key its parameters derive."""
    provisioner = str(storage_class.get("provisioner") or "")
    rules = KEY_RULES.get(provisioner)
    if rules is None:
        return provisioner
    params: Params = {str(k): str(v) for k, v in (storage_class.get("parameters") or {}).items()}
    return next((r.key for r in rules.rules if all(test(params) for test in r.tests)), rules.otherwise)


# -- the tables, keyed by provisioner key ------------------------------------------------------------------

_RBD: Sets = ((RWX, BLOCK), (RWO, BLOCK), (RWO, FS))
_ALL_BUT_RWX_FILE: Sets = ((RWX, BLOCK), (RWO, BLOCK), (RWO, FS), (ROX, BLOCK), (ROX, FS))
_ALL_FS: Sets = ((RWX, FS), (RWO, FS), (ROX, FS))
_DELL_POWERMAX: Sets = ((RWX, BLOCK), (RWO, BLOCK), (RWO, FS), (ROX, BLOCK))
_RWO_BLOCK_AND_FS: Sets = ((RWO, BLOCK), (RWO, FS))
_RWX_FS_RWO_FS: Sets = ((RWX, FS), (RWO, FS))

CLAIM_PROPERTY_SETS: dict[str, Sets] = {
    # the embedded control plane (cdi up)
    "local.storage.cdi.kubevirt.io": ((RWO, FS), (RWO, BLOCK)),
    "nosnap.local.storage.cdi.kubevirt.io": ((RWO, FS), (RWO, BLOCK)),
    # hostpath-provisioner
    HPP_CSI: ((RWO, FS),),
    HPP_OVERLAY_CSI: ((RWX, FS),),
    HPP_LEGACY: ((RWO, FS),),
    "k8s.io/minikube-hostpath": ((RWO, FS),),
    # nfs-csi
    "nfs.csi.k8s.io": ((RWX, FS),),
    "k8s-sigs.io/nfs-subdir-external-provisioner": ((RWX, FS),),
    # ceph-rbd
    "kubernetes.io/rbd": _RBD,
    "rbd.csi.ceph.com": _RBD,
    "rook-ceph.rbd.csi.ceph.com": _RBD,
    "openshift-storage.rbd.csi.ceph.com": _RBD,
    # ceph-fs
    "cephfs.csi.ceph.com": _RWX_FS_RWO_FS,
    "rook-ceph.cephfs.csi.ceph.com": _RWX_FS_RWO_FS,
    "openshift-storage.cephfs.csi.ceph.com": _RWX_FS_RWO_FS,
    # LINSTOR
    "linstor.csi.linbit.com": _ALL_BUT_RWX_FILE,
    # Dell Unity XT, PowerFlex, PowerScale, PowerMax, PowerStore
    "csi-unity.dellemc.com": _ALL_BUT_RWX_FILE,
    "csi-unity.dellemc.com/nfs": _ALL_FS,
    "csi-vxflexos.dellemc.com": _ALL_BUT_RWX_FILE,
    "csi-vxflexos.dellemc.com/nfs": _ALL_FS,
    "csi-isilon.dellemc.com": _ALL_FS,
    "csi-powermax.dellemc.com": _DELL_POWERMAX,
    "csi-powermax.dellemc.com/nfs": _ALL_FS,
    "csi-powerstore.dellemc.com": _DELL_POWERMAX,
    "csi-powerstore.dellemc.com/nfs": _ALL_FS,
    # storageos
    "kubernetes.io/storageos": ((RWO, FS),),
    "storageos": ((RWO, FS),),
    # AWS Elastic Block Store
    "kubernetes.io/aws-ebs": ((RWO, BLOCK),),
    "ebs.csi.aws.com": ((RWO, BLOCK),),
    "ebs.csi.aws.com/io1": ((RWO, BLOCK),),
    "ebs.csi.aws.com/io2": _RBD,
    "ebs.csi.aws.com/gp": ((RWO, BLOCK),),
    # AWS Elastic File System
    "efs.csi.aws.com": _RWX_FS_RWO_FS,
    # Azure disk and file
    "kubernetes.io/azure-disk": ((RWO, BLOCK),),
    "disk.csi.azure.com": ((RWO, BLOCK),),
    "kubernetes.io/azure-file": ((RWX, FS),),
    "file.csi.azure.com": ((RWX, FS),),
    # GCE Persistent Disk
    "kubernetes.io/gce-pd": _RWO_BLOCK_AND_FS,
    "pd.csi.storage.gke.io": _RWO_BLOCK_AND_FS,
    "pd.csi.storage.gke.io/hyperdisk": _RBD,
    # Hitachi, HPE
    HITACHI_HSPC: _RBD,
    "csi.hpe.com": _RBD,
    # IBM Spectrum Scale, FlashSystem, VPC block and file
    "spectrumscale.csi.ibm.com": _RWX_FS_RWO_FS,
    "block.csi.ibm.com": _RBD,
    "vpc.block.csi.ibm.io": _RWO_BLOCK_AND_FS,
    "vpc.file.csi.ibm.io": _RWX_FS_RWO_FS,
    "vpc.file.csi.ibm.io/dp2": _RWX_FS_RWO_FS,
    "vpc.file.csi.ibm.io/dp2-rwo": ((RWO, FS),),
    "vpc.file.csi.ibm.io/rfs": _RWX_FS_RWO_FS,
    "vpc.file.csi.ibm.io/rfs-rwo": ((RWO, FS),),
    # Portworx in-tree and CSI
    "kubernetes.io/portworx-volume/nfs": _RWX_FS_RWO_FS,
    "kubernetes.io/portworx-volume": ((RWX, BLOCK), (RWX, FS), (RWO, BLOCK), (RWO, FS)),
    "pxd.portworx.com/nfs": _RWX_FS_RWO_FS,
    "pxd.portworx.com": ((RWX, BLOCK), (RWX, FS), (RWO, BLOCK), (RWO, FS)),
    PORTWORX_PURE_BLOCK: _RBD,
    PORTWORX_PURE_FA_FILE: _RWX_FS_RWO_FS,
    # NetApp Trident
    "csi.trident.netapp.io/ontap-nas": _RWX_FS_RWO_FS,
    "csi.trident.netapp.io/ontap-san": ((RWX, BLOCK),),
    "csi.trident.netapp.io/gcnv-flex": _RWX_FS_RWO_FS,
    # TopoLVM
    "topolvm.cybozu.com": _RWO_BLOCK_AND_FS,
    "topolvm.io": _RWO_BLOCK_AND_FS,
    # OpenStack Cinder and Manila, oVirt
    "cinder.csi.openstack.org": _RWO_BLOCK_AND_FS,
    "manila.csi.openstack.org": ((RWX, FS),),
    "csi.ovirt.org": _RWO_BLOCK_AND_FS,
    # Infinidat
    "infinibox-csi-driver/iscsiorfibrechannel": _RBD,
    "infinibox-csi-driver/nvme": _RBD,
    "infinibox-csi-driver/nfs": _RWX_FS_RWO_FS,
    # vSphere
    "csi.vsphere.vmware.com": _RWO_BLOCK_AND_FS,
    "csi.vsphere.vmware.com/nfs": ((RWX, FS), (RWO, BLOCK), (RWO, FS)),
    # Huawei
    "csi.huawei.com": _ALL_BUT_RWX_FILE,
    "csi.huawei.com/nfs": _ALL_FS,
    # KubeSAN
    "kubesan.gitlab.io": ((RWX, BLOCK), (ROX, BLOCK), (RWO, BLOCK), (RWO, FS)),
    # Longhorn
    "driver.longhorn.io": ((RWO, BLOCK),),
    "driver.longhorn.io/migratable": ((RWX, BLOCK), (RWO, BLOCK)),
    "driver.longhorn.io/nfs": _RWX_FS_RWO_FS,
    "driver.longhorn.io/fs": ((RWO, FS),),
    # Oracle Cloud
    "blockvolume.csi.oraclecloud.com": _RBD,
    # Synology
    "csi.san.synology.com/iscsi": _RBD,
    "csi.san.synology.com/nfs": _RWX_FS_RWO_FS,
    "csi.san.synology.com/smb": _RWX_FS_RWO_FS,
    # DirectPV
    "directpv-min-io": ((RWO, FS),),
}

# DataImportCron sources scale better cloned from one VolumeSnapshot on these.
SOURCE_FORMATS: dict[str, str] = {
    "rook-ceph.rbd.csi.ceph.com": SNAPSHOT,
    "openshift-storage.rbd.csi.ceph.com": SNAPSHOT,
    "csi.trident.netapp.io/ontap-nas": SNAPSHOT,
    "csi.trident.netapp.io/ontap-san": SNAPSHOT,
    "csi.trident.netapp.io/gcnv-flex": SNAPSHOT,
    "pd.csi.storage.gke.io": SNAPSHOT,
    "pd.csi.storage.gke.io/hyperdisk": SNAPSHOT,
    "vpc.file.csi.ibm.io": SNAPSHOT,
    "vpc.file.csi.ibm.io/dp2": SNAPSHOT,
    "vpc.file.csi.ibm.io/dp2-rwo": SNAPSHOT,
    "vpc.file.csi.ibm.io/rfs": SNAPSHOT,
    "vpc.file.csi.ibm.io/rfs-rwo": SNAPSHOT,
}

CLONE_STRATEGIES: dict[str, str] = {
    "local.storage.cdi.kubevirt.io": CSI_CLONE,
    "nosnap.local.storage.cdi.kubevirt.io": COPY,
    "csi-vxflexos.dellemc.com": CSI_CLONE,
    "csi-isilon.dellemc.com": CSI_CLONE,
    "csi-powermax.dellemc.com": CSI_CLONE,
    "csi-powerstore.dellemc.com": COPY,
    HITACHI_HSPC: CSI_CLONE,
    "csi.hpe.com": CSI_CLONE,
    "spectrumscale.csi.ibm.com": CSI_CLONE,
    "block.csi.ibm.com": CSI_CLONE,
    "vpc.block.csi.ibm.io": COPY,
    "vpc.file.csi.ibm.io": SNAPSHOT,
    "vpc.file.csi.ibm.io/dp2": SNAPSHOT,
    "vpc.file.csi.ibm.io/dp2-rwo": SNAPSHOT,
    "vpc.file.csi.ibm.io/rfs": SNAPSHOT,
    "vpc.file.csi.ibm.io/rfs-rwo": SNAPSHOT,
    "rbd.csi.ceph.com": CSI_CLONE,
    "rook-ceph.rbd.csi.ceph.com": CSI_CLONE,
    "openshift-storage.rbd.csi.ceph.com": CSI_CLONE,
    "cephfs.csi.ceph.com": CSI_CLONE,
    "rook-ceph.cephfs.csi.ceph.com": CSI_CLONE,
    "openshift-storage.cephfs.csi.ceph.com": CSI_CLONE,
    "pxd.portworx.com/nfs": CSI_CLONE,
    "pxd.portworx.com": CSI_CLONE,
    PORTWORX_PURE_BLOCK: CSI_CLONE,
    PORTWORX_PURE_FA_FILE: CSI_CLONE,
    "topolvm.cybozu.com": COPY,
    "topolvm.io": COPY,
    "infinibox-csi-driver/iscsiorfibrechannel": CSI_CLONE,
    "infinibox-csi-driver/nvme": CSI_CLONE,
    "infinibox-csi-driver/nfs": CSI_CLONE,
    "csi.trident.netapp.io/ontap-nas": SNAPSHOT,
    "csi.trident.netapp.io/ontap-san": SNAPSHOT,
    "csi.trident.netapp.io/gcnv-flex": SNAPSHOT,
    "kubesan.gitlab.io": CSI_CLONE,
    "pd.csi.storage.gke.io": SNAPSHOT,
    "pd.csi.storage.gke.io/hyperdisk": SNAPSHOT,
    "csi.san.synology.com/iscsi": CSI_CLONE,
    "csi.san.synology.com/nfs": CSI_CLONE,
    "csi.san.synology.com/smb": CSI_CLONE,
    "blockvolume.csi.oraclecloud.com": CSI_CLONE,
}

# Set on the StorageProfile as `cdi.kubevirt.io/minimumSupportedPvcSize` (a user's value is kept).
MINIMUM_PVC_SIZES: dict[str, str] = {
    "pd.csi.storage.gke.io/hyperdisk": "4Gi",
    "ebs.csi.aws.com/io1": "4Gi",
    "ebs.csi.aws.com/io2": "4Gi",
    "ebs.csi.aws.com/gp": "1Gi",
    "csi.san.synology.com/iscsi": "1Gi",
    "csi.san.synology.com/nfs": "1Gi",
    "csi.san.synology.com/smb": "1Gi",
    "csi.trident.netapp.io/gcnv-flex": "1Gi",
    "vpc.file.csi.ibm.io/rfs": "1Gi",
    "vpc.file.csi.ibm.io/rfs-rwo": "1Gi",
    "vpc.file.csi.ibm.io/dp2": "10Gi",
    "vpc.file.csi.ibm.io/dp2-rwo": "10Gi",
    HPE_XP: "1Gi",
    HITACHI_HSPC: "1Gi",
}

# DataImportCron claims must be ReadWriteOnce on these (profile annotation
# `cdi.kubevirt.io/useReadWriteOnceForDataImportCron`).
RWO_FOR_DATA_IMPORT_CRON: frozenset[str] = frozenset({"pd.csi.storage.gke.io", "pd.csi.storage.gke.io/hyperdisk"})

# DataImportCron snapshots on these need a VolumeSnapshotClass of the class's driver with these parameters
# (profile annotation `cdi.kubevirt.io/snapshotClassForDataImportCron`).
DATA_IMPORT_CRON_SNAPSHOT_PARAMETERS: dict[str, Mapping[str, str]] = {
    "pd.csi.storage.gke.io": {"snapshot-type": "images"},
    "pd.csi.storage.gke.io/hyperdisk": {"snapshot-type": "images"},
}

# Provisioners known not to work with CDI (object buckets, Stork snapshots, no-provisioner). They still
# get a StorageProfile, as in CDI; they are only never counted as incomplete in
# `kubevirt_cdi_storageprofile_info`, so that CDIStorageProfilesIncomplete does not fire for them.
UNSUPPORTED: frozenset[str] = frozenset({OCS_BUCKET, ROOK_CEPH_BUCKET, NOOBAA, STORK_SNAPSHOT, NO_PROVISIONER})

RECOGNIZED_PROVISIONER = "RecognizedProvisioner"
UNRECOGNIZED_PROVISIONER = "UnrecognizedProvisioner"
UNRECOGNIZED_PARAMETERS = "UnrecognizedStorageClassParameters"
_RECOGNITION = {
    RECOGNIZED_PROVISIONER: ("True", "Provisioner is recognized"),
    UNRECOGNIZED_PROVISIONER: ("False", "Provisioner is not recognized"),
    UNRECOGNIZED_PARAMETERS: ("False", "Storage class parameters are not recognized"),
}


def recognition(storage_class: Body) -> str:
    """The `Recognized` condition's reason for this class."""
    key = provisioner_key(storage_class)
    if key == UNKNOWN:
        return UNRECOGNIZED_PARAMETERS
    return RECOGNIZED_PROVISIONER if key in CLAIM_PROPERTY_SETS else UNRECOGNIZED_PROVISIONER


def claim_property_sets(storage_class: Body, volumes: Sequence[Body] = ()) -> Sets | None:
    """The table's sets for the class; for `kubernetes.io/no-provisioner`, the (access mode, volume mode)
    pairs of the class's existing PersistentVolumes, each once. None when nothing is known."""
    key = provisioner_key(storage_class)
    if key != NO_PROVISIONER:
        return CLAIM_PROPERTY_SETS.get(key)
    name = ObjectView(storage_class).name
    pairs: dict[tuple[str, str], None] = {}
    for pv in volumes:
        volume = PersistentVolumeView(pv)
        if volume.storage_class == name:
            for mode in volume.access_modes:
                pairs[(mode, volume.volume_mode)] = None
    return tuple(pairs) or None


def minimum_pvc_size(storage_class: Body) -> str | None:
    return MINIMUM_PVC_SIZES.get(provisioner_key(storage_class))


def data_import_cron_snapshot_class(storage_class: Body, snapshot_classes: Sequence[Body]) -> str | None:
    """The VolumeSnapshotClass DataImportCron snapshots must use on this class: of its driver, with the
    parameters the table asks for; the default-annotated one, else the first by name."""
    wanted = DATA_IMPORT_CRON_SNAPSHOT_PARAMETERS.get(provisioner_key(storage_class))
    if wanted is None:
        return None
    matching = [vsc for vsc in snapshot_classes if vsc.get("driver") == storage_class.get("provisioner")
                and all((vsc.get("parameters") or {}).get(k) == v for k, v in wanted.items())]
    defaults = [v for v in matching if ObjectView(v).annotations.get(ann.DEFAULT_SNAPSHOT_CLASS)
                == "true"]
    if defaults:
        return ObjectView(defaults[0]).name
    names = sorted(ObjectView(v).name for v in matching)
    return names[0] if names else None


def profile_annotations(storage_class: Body, annotations: Mapping[str, str],
                        snapshot_classes: Sequence[Body]) -> dict[str, str]:
    """The StorageProfile's annotations after CDI's reconcile: the table's minimum size and
    DataImportCron access-mode hint added where absent (a value the user set is kept), the DataImportCron
    snapshot class set or removed."""
    result = dict(annotations)
    minimum = minimum_pvc_size(storage_class)
    if minimum is not None:
        result.setdefault(ann.MINIMUM_PVC_SIZE, minimum)
    if provisioner_key(storage_class) in RWO_FOR_DATA_IMPORT_CRON:
        result.setdefault(ann.USE_RWO_FOR_DATA_IMPORT_CRON, "true")
    snapshot_class = data_import_cron_snapshot_class(storage_class, snapshot_classes)
    if snapshot_class is None:
        result.pop(ann.SNAPSHOT_CLASS_FOR_DATA_IMPORT_CRON, None)
    else:
        result[ann.SNAPSHOT_CLASS_FOR_DATA_IMPORT_CRON] = snapshot_class
    return result


def snapshot_class_for(storage_class: Body, wanted: str | None, snapshot_classes: Sequence[Body]) -> str | None:
    """The VolumeSnapshotClass for smart clones: the named one, else the driver's default, else the first
    of the driver's by name."""
    driver = storage_class.get("provisioner")
    matching = [vsc for vsc in snapshot_classes if vsc.get("driver") == driver]
    if wanted:
        return wanted if any(ObjectView(v).name == wanted for v in matching) else None
    defaults = [v for v in matching if ObjectView(v).annotations.get(ann.DEFAULT_SNAPSHOT_CLASS)
                == "true"]
    chosen = sorted(defaults or matching, key=lambda v: ObjectView(v).name)
    return ObjectView(chosen[0]).name if chosen else None


def profile_status(storage_class: Body, spec: Body, snapshot_classes: Sequence[Body],
                   volumes: Sequence[Body] = ()) -> dict[str, Any]:
    """StorageProfile status as CDI computes it: spec first, then the StorageClass annotation, then the
    table, then defaults (snapshot clones where a snapshot class exists, else copy)."""
    key = provisioner_key(storage_class)
    snapshot_class = snapshot_class_for(storage_class, spec.get("snapshotClass"), snapshot_classes)
    status: dict[str, Any] = {"storageClass": ObjectView(storage_class).name,
                              "provisioner": storage_class.get("provisioner")}
    if snapshot_class:
        status["snapshotClass"] = snapshot_class
    clone = spec.get("cloneStrategy")
    if clone is None:
        annotated = ObjectView(storage_class).annotations.get(ann.CLONE_STRATEGY)
        if annotated in (COPY, SNAPSHOT, CSI_CLONE):
            clone = annotated
        else:
            clone = CLONE_STRATEGIES.get(key, SNAPSHOT if snapshot_class else COPY)
            if clone == SNAPSHOT and not snapshot_class:
                clone = COPY
    status["cloneStrategy"] = clone
    dic_format = spec.get("dataImportCronSourceFormat")
    if dic_format is None:
        dic_format = SOURCE_FORMATS.get(key, "pvc")
        if dic_format == SNAPSHOT and not snapshot_class:
            dic_format = "pvc"
    status["dataImportCronSourceFormat"] = dic_format
    sets = claim_property_sets(storage_class, volumes)
    if spec.get("claimPropertySets"):
        status["claimPropertySets"] = [dict(cps) for cps in spec["claimPropertySets"]]
    elif sets:
        status["claimPropertySets"] = [{"accessModes": [mode], "volumeMode": volume} for mode, volume in sets]
    reason = recognition(storage_class)
    condition_status, message = _RECOGNITION[reason]
    status["conditions"] = [{"type": "Recognized", "status": condition_status, "reason": reason,
                             "message": message}]
    return status


def is_complete(provisioner: str, status: Body) -> bool:
    """`complete` of `kubevirt_cdi_storageprofile_info`: every claim property set has access and volume
    modes; an unsupported provisioner always counts as complete."""
    if provisioner in UNSUPPORTED:
        return True
    sets = status.get("claimPropertySets") or []
    return bool(sets) and all(cps.get("accessModes") and cps.get("volumeMode") for cps in sets)
