"""What CDI knows about storage provisioners: claim property sets (access and volume modes, most
preferred first), advised clone strategy, DataImportCron source format and minimum PVC size.
From CDI's known-provisioner table, plus the embedded control plane's own provisioners.

StorageProfiles start from this table; their spec overrides it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdi.api import annotations as ann
from cdi.api.views import dig

Body = Mapping[str, Any]

RWO, ROX, RWX = "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"
FS, BLOCK = "Filesystem", "Block"


@dataclass(frozen=True)
class Capability:
    sets: tuple[tuple[str, str], ...]  # (access mode, volume mode), preferred first
    clone: str | None = None  # copy | snapshot | csi-clone
    dic_format: str | None = None  # pvc | snapshot
    minimum_size: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def _c(*sets: tuple[str, str], clone: str | None = None, dic: str | None = None, minimum: str | None = None) \
        -> Capability:
    return Capability(tuple(sets), clone, dic, minimum)


_RWX_BLOCK_RWO = ((RWX, BLOCK), (RWO, BLOCK), (RWO, FS))

KNOWN: dict[str, Capability] = {
    # the embedded control plane (cdi up)
    "local.storage.cdi.kubevirt.io": _c((RWO, FS), (RWO, BLOCK), clone="csi-clone"),
    "nosnap.local.storage.cdi.kubevirt.io": _c((RWO, FS), (RWO, BLOCK), clone="copy"),
    # hostpath and friends
    "kubevirt.io.hostpath-provisioner": _c((RWO, FS)),
    "kubevirt.io/hostpath-provisioner": _c((RWO, FS)),
    "k8s.io/minikube-hostpath": _c((RWO, FS)),
    "rancher.io/local-path": _c((RWO, FS)),
    # NFS
    "nfs.csi.k8s.io": _c((RWX, FS)),
    "k8s-sigs.io/nfs-subdir-external-provisioner": _c((RWX, FS)),
    # Ceph
    "kubernetes.io/rbd": _c(*_RWX_BLOCK_RWO),
    "rbd.csi.ceph.com": _c(*_RWX_BLOCK_RWO, clone="csi-clone"),
    "rook-ceph.rbd.csi.ceph.com": _c(*_RWX_BLOCK_RWO, clone="csi-clone", dic="snapshot"),
    "openshift-storage.rbd.csi.ceph.com": _c(*_RWX_BLOCK_RWO, clone="csi-clone", dic="snapshot"),
    "cephfs.csi.ceph.com": _c((RWX, FS), (RWO, FS), clone="csi-clone"),
    "rook-ceph.cephfs.csi.ceph.com": _c((RWX, FS), (RWO, FS), clone="csi-clone"),
    "openshift-storage.cephfs.csi.ceph.com": _c((RWX, FS), (RWO, FS), clone="csi-clone"),
    # cloud providers
    "kubernetes.io/aws-ebs": _c((RWO, BLOCK)),
    "ebs.csi.aws.com": _c((RWO, BLOCK)),
    "efs.csi.aws.com": _c((RWX, FS), (RWO, FS)),
    "kubernetes.io/azure-disk": _c((RWO, BLOCK)),
    "disk.csi.azure.com": _c((RWO, BLOCK)),
    "kubernetes.io/azure-file": _c((RWX, FS)),
    "file.csi.azure.com": _c((RWX, FS)),
    "kubernetes.io/gce-pd": _c((RWO, BLOCK), (RWO, FS)),
    "pd.csi.storage.gke.io": _c((RWO, BLOCK), (RWO, FS), clone="snapshot", dic="snapshot"),
    "manila.csi.openstack.org": _c((RWX, FS)),
    "cinder.csi.openstack.org": _c((RWO, BLOCK), (RWO, FS)),
    "csi.vsphere.vmware.com": _c((RWO, BLOCK), (RWO, FS)),
    "csi.ovirt.org": _c((RWO, BLOCK), (RWO, FS)),
    "vpc.block.csi.ibm.io": _c((RWO, BLOCK), (RWO, FS), clone="copy"),
    "blockvolume.csi.oraclecloud.com": _c(*_RWX_BLOCK_RWO, clone="csi-clone"),
    # vendors
    "linstor.csi.linbit.com": _c(*_RWX_BLOCK_RWO, (ROX, BLOCK), (ROX, FS)),
    "csi.huawei.com": _c(*_RWX_BLOCK_RWO, (ROX, BLOCK), (ROX, FS)),
    "csi-unity.dellemc.com": _c(*_RWX_BLOCK_RWO, (ROX, BLOCK), (ROX, FS)),
    "csi-isilon.dellemc.com": _c((RWX, FS), (RWO, FS), (ROX, FS), clone="csi-clone"),
    "csi-vxflexos.dellemc.com": _c(*_RWX_BLOCK_RWO, (ROX, BLOCK), (ROX, FS), clone="csi-clone"),
    "csi-powermax.dellemc.com": _c(*_RWX_BLOCK_RWO, (ROX, BLOCK), clone="csi-clone"),
    "csi-powerstore.dellemc.com": _c(*_RWX_BLOCK_RWO, (ROX, BLOCK), clone="copy"),
    "hspc.csi.hitachi.com": _c(*_RWX_BLOCK_RWO, clone="csi-clone", minimum="1Gi"),
    "csi.hpe.com": _c(*_RWX_BLOCK_RWO, clone="csi-clone"),
    "block.csi.ibm.com": _c(*_RWX_BLOCK_RWO, clone="csi-clone"),
    "spectrumscale.csi.ibm.com": _c((RWX, FS), (RWO, FS), clone="csi-clone"),
    "pxd.portworx.com": _c((RWX, BLOCK), (RWX, FS), (RWO, BLOCK), (RWO, FS), clone="csi-clone"),
    "kubernetes.io/portworx-volume": _c((RWX, BLOCK), (RWX, FS), (RWO, BLOCK), (RWO, FS)),
    "topolvm.cybozu.com": _c((RWO, BLOCK), (RWO, FS), clone="copy"),
    "topolvm.io": _c((RWO, BLOCK), (RWO, FS), clone="copy"),
    "kubesan.gitlab.io": _c((RWX, BLOCK), (ROX, BLOCK), (RWO, BLOCK), (RWO, FS), clone="csi-clone"),
    "driver.longhorn.io": _c((RWO, BLOCK)),
    "kubernetes.io/storageos": _c((RWO, FS)),
    "storageos": _c((RWO, FS)),
    "directpv-min-io": _c((RWO, FS)),
}
# Provisioners known to be unable to back a DataVolume (object buckets, no-provisioner handled apart).
UNSUPPORTED = {"openshift-storage.noobaa.io/obc", "openshift-storage.ceph.rook.io/bucket",
               "rook-ceph.ceph.rook.io/bucket", "stork-snapshot"}

RECOGNIZED = ("RecognizedProvisioner", "Provisioner is recognized")
UNRECOGNIZED = ("UnrecognizedProvisioner", "Provisioner is not recognized")


def capability(storage_class: Body) -> Capability | None:
    return KNOWN.get(str(storage_class.get("provisioner") or ""))


def snapshot_class_for(storage_class: Body, wanted: str | None, snapshot_classes: Sequence[Body]) -> str | None:
    """The VolumeSnapshotClass for smart clones: the named one, else the driver's default, else the first
    of the driver's by name."""
    driver = storage_class.get("provisioner")
    matching = [vsc for vsc in snapshot_classes if vsc.get("driver") == driver]
    if wanted:
        return wanted if any(dig(v, "metadata", "name") == wanted for v in matching) else None
    defaults = [v for v in matching if (dig(v, "metadata", "annotations") or {}).get(ann.DEFAULT_SNAPSHOT_CLASS)
                == "true"]
    chosen = sorted(defaults or matching, key=lambda v: str(dig(v, "metadata", "name")))
    return str(dig(chosen[0], "metadata", "name")) if chosen else None


def profile_status(storage_class: Body, spec: Body, snapshot_classes: Sequence[Body]) -> dict[str, Any]:
    """StorageProfile status as CDI computes it: spec first, then the StorageClass annotation, then the
    table, then defaults (snapshot clones where a snapshot class exists, else copy)."""
    known = capability(storage_class)
    snapshot_class = snapshot_class_for(storage_class, spec.get("snapshotClass"), snapshot_classes)
    status: dict[str, Any] = {"storageClass": dig(storage_class, "metadata", "name"),
                              "provisioner": storage_class.get("provisioner")}
    if snapshot_class:
        status["snapshotClass"] = snapshot_class
    clone = spec.get("cloneStrategy")
    if clone is None:
        annotated = (dig(storage_class, "metadata", "annotations") or {}).get(ann.CLONE_STRATEGY)
        if annotated in ("copy", "snapshot", "csi-clone"):
            clone = annotated
        else:
            clone = "snapshot" if snapshot_class else "copy"
            if known is not None and known.clone:
                clone = known.clone
            if clone == "snapshot" and not snapshot_class:
                clone = "copy"
    status["cloneStrategy"] = clone
    dic_format = spec.get("dataImportCronSourceFormat")
    if dic_format is None:
        dic_format = known.dic_format if known is not None and known.dic_format else "pvc"
        if dic_format == "snapshot" and not snapshot_class:
            dic_format = "pvc"
    status["dataImportCronSourceFormat"] = dic_format
    if spec.get("claimPropertySets"):
        status["claimPropertySets"] = [dict(cps) for cps in spec["claimPropertySets"]]
    elif known is not None:
        status["claimPropertySets"] = [{"accessModes": [mode], "volumeMode": volume} for mode, volume in known.sets]
    reason, message = RECOGNIZED if known is not None else UNRECOGNIZED
    status["conditions"] = [{"type": "Recognized", "status": "True" if known is not None else "False",
                             "reason": reason, "message": message}]
    return status
