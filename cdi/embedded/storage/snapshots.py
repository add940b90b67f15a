"""VolumeSnapshots as external-snapshotter's snapshot-controller and csi-snapshotter sidecar handle
them for the local provisioner: a VolumeSnapshot of a bound claim gets a cluster-scoped
VolumeSnapshotContent `snapcontent-<uid>` and a frozen copy of the volume's bytes; both report
`readyToUse` and `restoreSize`. Deleting the snapshot deletes its content (policy Delete) and the
bytes; pre-provisioned contents (`source.volumeSnapshotContentName`) are bound as they are."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from typing import Any

from cdi.api import annotations as ann
from cdi.api.groups import (
    PVCS,
    PVS,
    SNAPSHOT_API_VERSION,
    VOLUMESNAPSHOTCLASSES,
    VOLUMESNAPSHOTCONTENTS,
    VOLUMESNAPSHOTS,
)
from cdi.api.quantity import format_bytes
from cdi.embedded.control import Controller, Key, LocalApi
from cdi.embedded.storage.backend import LocalVolumes, StorageError
from cdi.embedded.storage.claims import capacity_bytes, pv_handle
from cdi.embedded.storage.classes import PROVISIONERS

log = logging.getLogger(__name__)

Obj = dict[str, Any]

SNAPSHOT_BOUND = "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection"
CONTENT_BOUND = "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection"


def _rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _error(message: str) -> Obj:
    return {"message": message, "time": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


class SnapshotController(Controller):
    name = "snapshots"

    def __init__(self, api: LocalApi, volumes: LocalVolumes) -> None:
        super().__init__()
        self.api = api
        self.volumes = volumes

    def sources(self) -> Iterable[tuple[Any, Any]]:
        def snapshot_key(_: str, vs: Obj) -> Iterable[Key]:
            yield vs["metadata"]["namespace"], vs["metadata"]["name"]

        def from_content(_: str, vsc: Obj) -> Iterable[Key]:
            ref = (vsc.get("spec") or {}).get("volumeSnapshotRef") or {}
            if ref.get("name"):
                yield ref.get("namespace", ""), ref["name"]

        def from_claim(_: str, pvc: Obj) -> Iterable[Key]:
            ns = pvc["metadata"]["namespace"]
            for vs in self.api.list(VOLUMESNAPSHOTS, ns):
                if ((vs.get("spec") or {}).get("source") or {}).get("persistentVolumeClaimName") == \
                        pvc["metadata"]["name"] and not (vs.get("status") or {}).get("readyToUse"):
                    yield ns, vs["metadata"]["name"]

        return [(VOLUMESNAPSHOTS, snapshot_key), (VOLUMESNAPSHOTCONTENTS, from_content), (PVCS, from_claim)]

    def all_keys(self) -> Iterable[Key]:
        return [(v["metadata"]["namespace"], v["metadata"]["name"]) for v in self.api.list(VOLUMESNAPSHOTS)]

    async def reconcile(self, key: Key) -> None:
        ns, name = key
        vs = self.api.get(VOLUMESNAPSHOTS, ns, name)
        if vs is None:
            return
        meta, spec, status = vs["metadata"], vs.get("spec") or {}, vs.get("status") or {}
        if meta.get("deletionTimestamp"):
            await self._finish_deletion(vs)
            return
        source = spec.get("source") or {}
        if source.get("volumeSnapshotContentName"):
            await self._bind_existing(vs, source["volumeSnapshotContentName"])
            return
        if status.get("readyToUse"):
            return
        claim_name = source.get("persistentVolumeClaimName")
        if not claim_name:
            return
        pvc = self.api.get(PVCS, ns, claim_name)
        if pvc is None or (pvc.get("status") or {}).get("phase") != "Bound":
            await self._status(vs, {"readyToUse": False})
            return
        pv = self.api.get(PVS, None, (pvc.get("spec") or {}).get("volumeName") or "")
        handle = pv_handle(pv) if pv is not None else None
        if handle is None:
            return  # not a volume of ours: some other snapshotter's business
        driver, volume = handle
        vsclass = self._class(spec.get("volumeSnapshotClassName"), driver)
        if vsclass is None:
            wanted = spec.get("volumeSnapshotClassName")
            await self._status(vs, {"readyToUse": False, "error": _error(
                f'Failed to get snapshot class with error volumesnapshotclass.snapshot.storage.k8s.io "{wanted}" '
                "not found" if wanted else f"cannot find default snapshot class for driver {driver}")})
            return
        if not spec.get("volumeSnapshotClassName"):
            vs = await self.api.patch(VOLUMESNAPSHOTS, ns, name,
                                      {"spec": {"volumeSnapshotClassName": vsclass["metadata"]["name"]}})
        if not PROVISIONERS[driver].snapshot or vsclass.get("driver") != driver:
            await self._status(vs, {"readyToUse": False, "error": _error(
                f"the driver {driver} of claim {claim_name} does not support snapshots")})
            return
        await self.api.add_finalizer(VOLUMESNAPSHOTS, ns, name, SNAPSHOT_BOUND)
        content_name = f"snapcontent-{meta['uid']}"
        content = self.api.get(VOLUMESNAPSHOTCONTENTS, None, content_name)
        if content is None:
            content = await self.api.create(VOLUMESNAPSHOTCONTENTS, None, {
                "apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshotContent",
                "metadata": {"name": content_name, "finalizers": [CONTENT_BOUND]},
                "spec": {"deletionPolicy": vsclass.get("deletionPolicy", "Delete"), "driver": driver,
                         "source": {"volumeHandle": volume},
                         "sourceVolumeMode": (pvc.get("spec") or {}).get("volumeMode", "Filesystem"),
                         "volumeSnapshotClassName": vsclass["metadata"]["name"],
                         "volumeSnapshotRef": {"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshot",
                                               "name": name, "namespace": ns, "uid": meta["uid"],
                                               "resourceVersion": meta.get("resourceVersion", "")}},
            })
        snapshot_handle = f"snapshot-{meta['uid']}"
        try:
            record = self.volumes.take_snapshot(snapshot_handle, volume)
        except StorageError as exc:
            await self._status(vs, {"readyToUse": False, "error": _error(f"failed to take snapshot: {exc}")})
            raise
        restore = max(record.size, capacity_bytes(pvc))
        await self.api.patch(VOLUMESNAPSHOTCONTENTS, None, content_name, {"status": {
            "snapshotHandle": snapshot_handle, "creationTime": int(record.created * 1e9), "readyToUse": True,
            "restoreSize": restore}}, status=True)
        await self._status(vs, {"boundVolumeSnapshotContentName": content_name,
                                "creationTime": _rfc3339(record.created), "readyToUse": True,
                                "restoreSize": format_bytes(restore), "error": None})
        log.info("snapshot %s/%s of %s ready (%s)", ns, name, volume, snapshot_handle)

    def _class(self, name: str | None, driver: str) -> Obj | None:
        if name:
            return self.api.get(VOLUMESNAPSHOTCLASSES, None, name)
        for vsclass in self.api.list(VOLUMESNAPSHOTCLASSES):
            if vsclass.get("driver") == driver and \
                    (vsclass["metadata"].get("annotations") or {}).get(ann.DEFAULT_SNAPSHOT_CLASS) == "true":
                return vsclass
        return None

    async def _status(self, vs: Obj, status: Obj) -> None:
        current = vs.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return
        await self.api.patch(VOLUMESNAPSHOTS, vs["metadata"]["namespace"], vs["metadata"]["name"],
                             {"status": status}, status=True)

    async def _bind_existing(self, vs: Obj, content_name: str) -> None:
        content = self.api.get(VOLUMESNAPSHOTCONTENTS, None, content_name)
        if content is None:
            await self._status(vs, {"readyToUse": False,
                                    "error": _error(f"volumesnapshotcontent {content_name} not found")})
            return
        ref = (content.get("spec") or {}).get("volumeSnapshotRef") or {}
        meta = vs["metadata"]
        if ref.get("name") != meta["name"] or ref.get("namespace") != meta["namespace"]:
            await self._status(vs, {"readyToUse": False, "error": _error(
                f"VolumeSnapshotContent {content_name} is bound to a different snapshot")})
            return
        if not ref.get("uid"):
            content = await self.api.patch(VOLUMESNAPSHOTCONTENTS, None, content_name,
                                           {"spec": {"volumeSnapshotRef": {"uid": meta["uid"]}}})
        cstatus = content.get("status") or {}
        if not cstatus.get("readyToUse"):
            return  # the content controller fills it in
        await self.api.add_finalizer(VOLUMESNAPSHOTS, meta["namespace"], meta["name"], SNAPSHOT_BOUND)
        created = cstatus.get("creationTime") or 0
        await self._status(vs, {"boundVolumeSnapshotContentName": content_name,
                                "creationTime": _rfc3339(created / 1e9), "readyToUse": True,
                                "restoreSize": format_bytes(int(cstatus.get("restoreSize") or 0)), "error": None})

    async def _finish_deletion(self, vs: Obj) -> None:
        meta = vs["metadata"]
        content_name = (vs.get("status") or {}).get("boundVolumeSnapshotContentName")
        content = self.api.get(VOLUMESNAPSHOTCONTENTS, None, content_name) if content_name else None
        if content_name and content is not None and (content.get("spec") or {}).get("deletionPolicy") == "Delete" \
                and not content["metadata"].get("deletionTimestamp"):
            await self.api.delete(VOLUMESNAPSHOTCONTENTS, None, content_name)
        await self.api.remove_finalizer(VOLUMESNAPSHOTS, meta["namespace"], meta["name"], SNAPSHOT_BOUND)


class ContentController(Controller):
    """VolumeSnapshotContents: readiness of pre-provisioned ones, deletion of bytes."""

    name = "snapshot-contents"

    def __init__(self, api: LocalApi, volumes: LocalVolumes) -> None:
        super().__init__()
        self.api = api
        self.volumes = volumes

    def sources(self) -> Iterable[tuple[Any, Any]]:
        def content_key(_: str, vsc: Obj) -> Iterable[Key]:
            yield "", vsc["metadata"]["name"]

        def from_snapshot(_: str, vs: Obj) -> Iterable[Key]:
            bound = (vs.get("status") or {}).get("boundVolumeSnapshotContentName") or \
                ((vs.get("spec") or {}).get("source") or {}).get("volumeSnapshotContentName")
            if bound:
                yield "", bound

        return [(VOLUMESNAPSHOTCONTENTS, content_key), (VOLUMESNAPSHOTS, from_snapshot)]

    def all_keys(self) -> Iterable[Key]:
        return [("", c["metadata"]["name"]) for c in self.api.list(VOLUMESNAPSHOTCONTENTS)]

    async def reconcile(self, key: Key) -> None:
        name = key[1]
        content = self.api.get(VOLUMESNAPSHOTCONTENTS, None, name)
        if content is None:
            return
        meta, spec, status = content["metadata"], content.get("spec") or {}, content.get("status") or {}
        if spec.get("driver") not in PROVISIONERS:
            return
        ref = spec.get("volumeSnapshotRef") or {}
        vs = self.api.get(VOLUMESNAPSHOTS, ref.get("namespace"), ref.get("name", "")) if ref.get("name") else None
        vs_alive = vs is not None and (not ref.get("uid") or vs["metadata"]["uid"] == ref["uid"])
        handle = status.get("snapshotHandle") or (spec.get("source") or {}).get("snapshotHandle")
        if meta.get("deletionTimestamp"):
            if vs_alive and not (vs or {}).get("metadata", {}).get("deletionTimestamp"):
                return  # still bound to a live snapshot
            if spec.get("deletionPolicy") == "Delete" and handle:
                self.volumes.delete_snapshot(handle)
            await self.api.remove_finalizer(VOLUMESNAPSHOTCONTENTS, None, name, CONTENT_BOUND)
            return
        if not vs_alive and ref.get("uid"):
            if spec.get("deletionPolicy") == "Delete":
                await self.api.delete(VOLUMESNAPSHOTCONTENTS, None, name)
            return
        source_handle = (spec.get("source") or {}).get("snapshotHandle")
        if source_handle and not status.get("readyToUse"):
            record = self.volumes.snapshot(source_handle)
            if record is None:
                await self.api.patch(VOLUMESNAPSHOTCONTENTS, None, name, {"status": {
                    "readyToUse": False, "error": _error(f"snapshot {source_handle} does not exist")}}, status=True)
                return
            await self.api.patch(VOLUMESNAPSHOTCONTENTS, None, name, {"status": {
                "snapshotHandle": source_handle, "creationTime": int(record.created * 1e9), "readyToUse": True,
                "restoreSize": record.size}}, status=True)
        if CONTENT_BOUND not in (meta.get("finalizers") or []) and vs_alive:
            await self.api.add_finalizer(VOLUMESNAPSHOTCONTENTS, None, name, CONTENT_BOUND)
