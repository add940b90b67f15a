"""Claims and volumes: what Kubernetes' PersistentVolume controller, an external-provisioner with
its CSI driver, the resizer and the PVC/PV protection controllers do together, for the local
provisioners.

`ClaimController` provisions a PersistentVolume for each pending claim of a local class (empty, a
CSI clone of another claim, or a restore of a VolumeSnapshot), binds claims to volumes, grows bound
volumes when their claim asks for more, and lets a deleted claim go once no pod uses it.
`VolumeController` follows each volume: Bound, Available, Released; reclaims (deletes) released
volumes whose policy is Delete; and finishes deletion of PV objects."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from cdi.api import annotations as ann
from cdi.api import referencegrant
from cdi.api.groups import (
    PODS,
    PVCS,
    PVS,
    REFERENCEGRANTS,
    SNAPSHOT_GROUP,
    STORAGECLASSES,
    VOLUMESNAPSHOTCONTENTS,
    VOLUMESNAPSHOTS,
)
from cdi.api.quantity import QuantityError, format_bytes, parse_bytes
from cdi.embedded.control import Controller, Key, LocalApi
from cdi.embedded.storage.backend import LocalVolumes, StorageError
from cdi.embedded.storage.classes import PROVISIONERS

log = logging.getLogger(__name__)

Obj = dict[str, Any]

PVC_PROTECTION = "kubernetes.io/pvc-protection"
PV_PROTECTION = "kubernetes.io/pv-protection"
PROVISIONER_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def requested_bytes(pvc: Obj) -> int:
    value = ((pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    if value is None:
        raise StorageError("the claim requests no storage")
    try:
        return parse_bytes(value)
    except QuantityError as exc:
        raise StorageError(str(exc)) from exc


def capacity_bytes(obj: Obj, where: str = "status") -> int:
    value = ((obj.get(where) or {}).get("capacity") or {}).get("storage")
    try:
        return parse_bytes(value) if value is not None else 0
    except QuantityError:
        return 0


def data_source(pvc: Obj) -> Obj | None:
    """dataSourceRef, else dataSource (as the API server mirrors them)."""
    spec = pvc.get("spec") or {}
    return spec.get("dataSourceRef") or spec.get("dataSource")


def is_populated_elsewhere(source: Obj | None) -> bool:
    """A data source that no provisioner handles (a volume populator's kind): leave the claim alone."""
    if not source:
        return False
    group, kind = source.get("apiGroup") or "", source.get("kind")
    return not ((group == "" and kind == "PersistentVolumeClaim") or
                (group == SNAPSHOT_GROUP and kind == "VolumeSnapshot"))


def pods_using(api: LocalApi, namespace: str, claim: str) -> list[Obj]:
    """Pods that still need the claim: not finished, referencing it by name."""
    return [pod for pod in api.pods_of_claim(namespace, claim)
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def pv_handle(pv: Obj) -> tuple[str, str] | None:
    """(driver, volumeHandle) of a PV of a local provisioner."""
    csi = (pv.get("spec") or {}).get("csi") or {}
    if csi.get("driver") in PROVISIONERS and csi.get("volumeHandle"):
        return csi["driver"], csi["volumeHandle"]
    return None


class ClaimController(Controller):
    name = "claims"
    workers = 2

    def __init__(self, api: LocalApi, volumes: LocalVolumes, node_name: str) -> None:
        super().__init__()
        self.api = api
        self.volumes = volumes
        self.node_name = node_name
        self._reported: dict[Key, str] = {}

    def sources(self) -> Iterable[tuple[Any, Any]]:
        def claim_key(_: str, obj: Obj) -> Iterable[Key]:
            yield obj["metadata"]["namespace"], obj["metadata"]["name"]

        def from_volume(_: str, pv: Obj) -> Iterable[Key]:
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            if ref.get("name"):
                yield ref.get("namespace", ""), ref["name"]

        def from_pod(_: str, pod: Obj) -> Iterable[Key]:
            for volume in (pod.get("spec") or {}).get("volumes") or []:
                claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                if claim:
                    yield pod["metadata"]["namespace"], claim

        def from_snapshot(_: str, snap: Obj) -> Iterable[Key]:
            ns = snap["metadata"]["namespace"]
            for pvc in self.api.list(PVCS, ns):
                source = data_source(pvc) or {}
                if source.get("kind") == "VolumeSnapshot" and source.get("name") == snap["metadata"]["name"]:
                    yield ns, pvc["metadata"]["name"]

        def from_class(_: str, __: Obj) -> Iterable[Key]:
            return self.all_keys()

        return [(PVCS, claim_key), (PVS, from_volume), (PODS, from_pod), (VOLUMESNAPSHOTS, from_snapshot),
                (STORAGECLASSES, from_class)]

    def all_keys(self) -> Iterable[Key]:
        return [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.api.list(PVCS)]

    # -- reconcile ---------------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> None:
        ns, name = key
        pvc = self.api.get(PVCS, ns, name)
        if pvc is None:
            self._reported.pop(key, None)
            return
        meta, spec = pvc["metadata"], pvc.get("spec") or {}
        if meta.get("deletionTimestamp"):
            await self._release_protection(pvc)
            return
        phase = (pvc.get("status") or {}).get("phase")
        volume_name = spec.get("volumeName")
        if volume_name:
            pv = self.api.get(PVS, None, volume_name)
            if pv is None:
                if phase == "Bound":
                    await self.api.patch(PVCS, ns, name, {"status": {"phase": "Lost"}}, status=True)
                return
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            if ref and (ref.get("uid") not in (None, "", meta["uid"]) or ref.get("name") != name or
                        ref.get("namespace") != ns):
                if phase == "Bound":
                    await self.api.patch(PVCS, ns, name, {"status": {"phase": "Lost"}}, status=True)
                return
            await self._bind(pvc, pv)
            await self._maybe_expand(pvc, pv)
            return
        # a volume already claiming this claim (ours after a crash, or one a populator handed over)
        for pv in self.api.volumes_of_claim(ns, name, meta["uid"]):
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            mine = ref.get("uid") == meta["uid"] or (ref.get("name") == name and ref.get("namespace") == ns and
                                                     not ref.get("uid"))
            if mine and not pv["metadata"].get("deletionTimestamp"):
                await self._bind(pvc, pv)
                return
        class_name = spec.get("storageClassName")
        if not class_name:
            await self._bind_static(pvc)
            return
        sc = self.api.get(STORAGECLASSES, None, class_name)
        if sc is None:
            await self._report(pvc, "ProvisioningFailed", f'storageclass.storage.k8s.io "{class_name}" not found')
            return
        provisioner = sc.get("provisioner", "")
        await self._announce_provisioner(pvc, provisioner)
        if provisioner not in PROVISIONERS:
            return
        if sc.get("volumeBindingMode") == "WaitForFirstConsumer" and \
                not (meta.get("annotations") or {}).get(ann.SELECTED_NODE):
            await self._report(pvc, "WaitForFirstConsumer",
                               "waiting for first consumer to be created before binding", warn=False)
            return
        source = data_source(pvc)
        if is_populated_elsewhere(source):
            return
        try:
            pv = await self._provision(pvc, sc, source)
        except StorageError as exc:
            await self._report(pvc, "ProvisioningFailed", f"failed to provision volume with StorageClass "
                                                          f'"{class_name}": {exc}')
            self.enqueue_after(key, 5.0)
            return
        if pv is not None:
            await self._bind(self.api.get(PVCS, ns, name) or pvc, pv)

    async def _report(self, pvc: Obj, reason: str, message: str, warn: bool = True) -> None:
        key = (pvc["metadata"]["namespace"], pvc["metadata"]["name"])
        if self._reported.get(key) == message:
            return
        self._reported[key] = message
        await self.api.record_event({**pvc, "kind": "PersistentVolumeClaim", "apiVersion": "v1"}, reason, message,
                                    "Warning" if warn else "Normal", "persistentvolume-controller"
                                    if reason == "WaitForFirstConsumer" else "local-provisioner")

    async def _announce_provisioner(self, pvc: Obj, provisioner: str) -> None:
        annotations = pvc["metadata"].get("annotations") or {}
        if annotations.get(ann.STORAGE_PROVISIONER) == provisioner:
            return
        await self.api.patch(PVCS, pvc["metadata"]["namespace"], pvc["metadata"]["name"], {"metadata": {
            "annotations": {ann.STORAGE_PROVISIONER: provisioner, ann.STORAGE_PROVISIONER_BETA: provisioner}}})

    async def _release_protection(self, pvc: Obj) -> None:
        if PVC_PROTECTION not in (pvc["metadata"].get("finalizers") or []):
            return
        if pods_using(self.api, pvc["metadata"]["namespace"], pvc["metadata"]["name"]):
            return
        await self.api.remove_finalizer(PVCS, pvc["metadata"]["namespace"], pvc["metadata"]["name"], PVC_PROTECTION)

    # -- provisioning ------------------------------------------------------------------------------

    def _grants(self, namespace: str) -> list[Obj]:
        """The ReferenceGrants of a namespace (none where the Gateway API's CRD is not installed)."""
        try:
            return self.api.list(REFERENCEGRANTS, namespace)
        except LookupError:
            return []

    async def _provision(self, pvc: Obj, sc: Obj, source: Obj | None) -> Obj | None:
        meta, spec = pvc["metadata"], pvc.get("spec") or {}
        provisioner = sc["provisioner"]
        caps = PROVISIONERS[provisioner]
        pv_name = f"pvc-{meta['uid']}"
        existing = self.api.get(PVS, None, pv_name)
        if existing is not None:
            return existing
        size = requested_bytes(pvc)
        block = spec.get("volumeMode") == "Block"
        if source is not None and referencegrant.cross_namespace(meta["namespace"], source) and \
                not referencegrant.granted(self._grants(str(source["namespace"])), meta["namespace"], source):
            raise StorageError(referencegrant.refusal(meta["namespace"], meta["name"], source))
        if source is None:
            record = self.volumes.create(pv_name, size, block)
        elif source.get("kind") == "PersistentVolumeClaim":
            if not caps.clone:
                raise StorageError(f"the driver {provisioner} does not support cloning (CLONE_VOLUME capability)")
            src_ns = source.get("namespace") or meta["namespace"]
            src = self.api.get(PVCS, src_ns, source["name"])
            if src is None:
                raise StorageError(f'error getting handle for DataSource Type PersistentVolumeClaim by Name '
                                   f'{source["name"]}: persistentvolumeclaims "{source["name"]}" not found')
            src_pv = self.api.get(PVS, None, (src.get("spec") or {}).get("volumeName") or "")
            if (src.get("status") or {}).get("phase") != "Bound" or src_pv is None:
                raise StorageError(f'the source claim {source["name"]} is not bound')
            handle = pv_handle(src_pv)
            if handle is None or handle[0] != provisioner:
                raise StorageError(f"the source claim {source['name']} is not provisioned by {provisioner}")
            if (src.get("spec") or {}).get("volumeMode", "Filesystem") != spec.get("volumeMode", "Filesystem"):
                raise StorageError("the source claim's volumeMode differs from the claim's")
            src_size = capacity_bytes(src)
            if size < src_size:
                raise StorageError(f"requested volume size {size} is less than the size {src_size} for the "
                                   f"source volume {source['name']}")
            record = self.volumes.clone(pv_name, handle[1], size)
        else:
            if not caps.snapshot:
                raise StorageError(f"the driver {provisioner} does not support restoring snapshots")
            snap_ns = source.get("namespace") or meta["namespace"]
            snap = self.api.get(VOLUMESNAPSHOTS, snap_ns, source["name"])
            status = (snap or {}).get("status") or {}
            if snap is None or not status.get("readyToUse") or not status.get("boundVolumeSnapshotContentName"):
                raise StorageError(f'snapshot {source["name"]} is not ready to use')
            content = self.api.get(VOLUMESNAPSHOTCONTENTS, None, status["boundVolumeSnapshotContentName"])
            handle_name = ((content or {}).get("status") or {}).get("snapshotHandle")
            if content is None or not handle_name or content["spec"].get("driver") != provisioner:
                raise StorageError(f'snapshot {source["name"]} was not taken by {provisioner}')
            snap_record = self.volumes.snapshot(handle_name)
            if snap_record is None:
                raise StorageError(f"snapshot {handle_name} has no data")
            if snap_record.block != block:
                raise StorageError("the snapshot's volume mode differs from the claim's volumeMode")
            if size < snap_record.size:
                raise StorageError(f"requested volume size {size} is less than the size {snap_record.size} for "
                                   f"the source snapshot {source['name']}")
            record = self.volumes.restore(pv_name, handle_name, size)
        capacity = spec["resources"]["requests"]["storage"]
        if record.size > size:
            capacity = format_bytes(record.size)
        pv: Obj = {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv_name, "annotations": {ann.PROVISIONED_BY: provisioner,
                                                          "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                                                          "volume.kubernetes.io/provisioner-deletion-secret-namespace":
                                                              ""},
                         "finalizers": [PROVISIONER_FINALIZER]},
            "spec": {
                "capacity": {"storage": capacity},
                "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
                "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy") or "Delete",
                "storageClassName": sc["metadata"]["name"],
                "volumeMode": spec.get("volumeMode", "Filesystem"),
                "mountOptions": list(sc.get("mountOptions") or []),
                "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": meta["namespace"],
                             "name": meta["name"], "uid": meta["uid"],
                             "resourceVersion": meta.get("resourceVersion", "")},
                "csi": {"driver": provisioner, "volumeHandle": pv_name,
                        "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": f"cdi-{provisioner}",
                                             "kind": record.kind}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": HOSTNAME_LABEL, "operator": "In", "values": [self.node_name]}]}]}},
            },
        }
        if not block:
            pv["spec"]["csi"]["fsType"] = "ext4"
        if not pv["spec"]["mountOptions"]:
            del pv["spec"]["mountOptions"]
        created = await self.api.create(PVS, None, pv)
        log.info("provisioned %s (%s, %s bytes) for %s/%s", pv_name, record.kind, record.size, meta["namespace"],
                 meta["name"])
        await self.api.record_event({**pvc, "kind": "PersistentVolumeClaim", "apiVersion": "v1"},
                                    "ProvisioningSucceeded", f"Successfully provisioned volume {pv_name}",
                                    component="local-provisioner")
        return created

    async def _bind_static(self, pvc: Obj) -> None:
        """A claim with storageClassName "" binds to the smallest Available volume that fits."""
        spec = pvc.get("spec") or {}
        try:
            want = requested_bytes(pvc)
        except StorageError:
            return
        modes = set(spec.get("accessModes") or [])
        best: tuple[int, Obj] | None = None
        for pv in self.api.list(PVS):
            pspec = pv.get("spec") or {}
            if pspec.get("claimRef") or pv["metadata"].get("deletionTimestamp"):
                continue
            if (pspec.get("storageClassName") or "") != "" or pspec.get("volumeMode", "Filesystem") != \
                    spec.get("volumeMode", "Filesystem"):
                continue
            if not modes <= set(pspec.get("accessModes") or []):
                continue
            size = capacity_bytes(pv, "spec")
            if size >= want and (best is None or size < best[0]):
                best = (size, pv)
        if best is not None:
            await self._bind(pvc, best[1])

    # -- binding -----------------------------------------------------------------------------------

    async def _bind(self, pvc: Obj, pv: Obj) -> None:
        meta = pvc["metadata"]
        ns, name = meta["namespace"], meta["name"]
        pv_name = pv["metadata"]["name"]
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        if ref.get("uid") != meta["uid"]:
            pv = await self.api.patch(PVS, None, pv_name, {"spec": {"claimRef": {
                "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": ns, "name": name,
                "uid": meta["uid"], "resourceVersion": meta.get("resourceVersion", "")}}})
        if (pv.get("status") or {}).get("phase") != "Bound":
            await self.api.patch(PVS, None, pv_name, {"status": {"phase": "Bound"}}, status=True)
        annotations = meta.get("annotations") or {}
        if (pvc.get("spec") or {}).get("volumeName") != pv_name or annotations.get(BIND_COMPLETED) != "yes":
            patch: Obj = {"metadata": {"annotations": {BIND_COMPLETED: "yes"}}, "spec": {"volumeName": pv_name}}
            if (pvc.get("spec") or {}).get("volumeName") != pv_name:
                patch["metadata"]["annotations"][BOUND_BY_CONTROLLER] = "yes"
            pvc = await self.api.patch(PVCS, ns, name, patch)
        pspec = pv.get("spec") or {}
        status = pvc.get("status") or {}
        want = {"phase": "Bound", "accessModes": list(pspec.get("accessModes") or []),
                "capacity": dict(pspec.get("capacity") or {})}
        if any(status.get(k) != v for k, v in want.items()):
            await self.api.patch(PVCS, ns, name, {"status": want}, status=True)
            log.info("bound %s/%s to %s", ns, name, pv_name)

    # -- expansion ---------------------------------------------------------------------------------

    async def _maybe_expand(self, pvc: Obj, pv: Obj) -> None:
        try:
            want = requested_bytes(pvc)
        except StorageError:
            return
        have = capacity_bytes(pv, "spec")
        if want <= have:
            return
        handle = pv_handle(pv)
        if handle is None:
            return
        ns, name = pvc["metadata"]["namespace"], pvc["metadata"]["name"]
        request = pvc["spec"]["resources"]["requests"]["storage"]
        try:
            self.volumes.expand(handle[1], want)
        except StorageError as exc:
            await self._report(pvc, "VolumeResizeFailed", f"resize volume {pv['metadata']['name']} failed: {exc}")
            raise
        await self.api.patch(PVS, None, pv["metadata"]["name"], {"spec": {"capacity": {"storage": request}}})
        await self.api.patch(PVCS, ns, name, {"status": {"capacity": {"storage": request},
                                                         "allocatedResources": {"storage": request},
                                                         "conditions": None}}, status=True)
        await self.api.record_event({**pvc, "kind": "PersistentVolumeClaim", "apiVersion": "v1"},
                                    "VolumeResizeSuccessful", "MountVolume.NodeExpandVolume succeeded for volume "
                                                              f'"{pv["metadata"]["name"]}"', component="kubelet")


class VolumeController(Controller):
    """PersistentVolume phases, reclaiming, and the end of a PV's deletion."""

    name = "volumes"

    def __init__(self, api: LocalApi, volumes: LocalVolumes) -> None:
        super().__init__()
        self.api = api
        self.volumes = volumes

    def sources(self) -> Iterable[tuple[Any, Any]]:
        def volume_key(_: str, pv: Obj) -> Iterable[Key]:
            yield "", pv["metadata"]["name"]

        def from_claim(_: str, pvc: Obj) -> Iterable[Key]:
            name = (pvc.get("spec") or {}).get("volumeName")
            if name:
                yield "", name
            meta = pvc["metadata"]
            for pv in self.api.volumes_of_claim(meta["namespace"], meta["name"], meta["uid"]):
                ref = (pv.get("spec") or {}).get("claimRef") or {}
                if ref.get("uid") == meta["uid"] and pv["metadata"]["name"] != name:
                    yield "", pv["metadata"]["name"]

        return [(PVS, volume_key), (PVCS, from_claim)]

    def all_keys(self) -> Iterable[Key]:
        return [("", pv["metadata"]["name"]) for pv in self.api.list(PVS)]

    async def reconcile(self, key: Key) -> None:
        name = key[1]
        pv = self.api.get(PVS, None, name)
        if pv is None:
            return
        meta, spec = pv["metadata"], pv.get("spec") or {}
        phase = (pv.get("status") or {}).get("phase")
        ref = spec.get("claimRef") or {}
        claim = self.api.get(PVCS, ref.get("namespace"), ref["name"]) if ref.get("name") else None
        claim_alive = claim is not None and (not ref.get("uid") or claim["metadata"]["uid"] == ref.get("uid"))
        if meta.get("deletionTimestamp"):
            if PV_PROTECTION in (meta.get("finalizers") or []) and not (claim_alive and phase == "Bound"):
                await self.api.remove_finalizer(PVS, None, name, PV_PROTECTION)
            if PROVISIONER_FINALIZER in (meta.get("finalizers") or []):
                if spec.get("persistentVolumeReclaimPolicy") == "Delete":
                    self._delete_bytes(pv)
                await self.api.remove_finalizer(PVS, None, name, PROVISIONER_FINALIZER)
            return
        if not ref:
            if phase != "Available":
                await self.api.patch(PVS, None, name, {"status": {"phase": "Available"}}, status=True)
            return
        if claim_alive:
            return  # binding is the claim controller's job
        if not ref.get("uid"):
            # pre-bound to a claim that does not exist yet: Available to that claim (kube's PV controller)
            if phase != "Available":
                await self.api.patch(PVS, None, name, {"status": {"phase": "Available"}}, status=True)
            return
        if phase != "Released":
            await self.api.patch(PVS, None, name, {"status": {"phase": "Released"}}, status=True)
        if spec.get("persistentVolumeReclaimPolicy") == "Delete" and pv_handle(pv) is not None:
            self._delete_bytes(pv)
            await self.api.delete(PVS, None, name)
            log.info("reclaimed %s (policy Delete)", name)

    def _delete_bytes(self, pv: Obj) -> None:
        handle = pv_handle(pv)
        if handle is not None:
            self.volumes.delete(handle[1])
