"""The local storage of `cdi up` as one object: its classes and driver objects in the API, its
admission plugins, its controllers, and the `publish` call the local node makes to find a volume's
bytes (what NodePublishVolume is to a CSI driver)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdi.api.groups import CSIDRIVERS, GVR, STORAGECLASSES, VOLUMESNAPSHOTCLASSES
from cdi.embedded.control import LocalApi
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.storage.admission import StorageAdmission
from cdi.embedded.storage.backend import BLOCK, LocalVolumes, StorageError
from cdi.embedded.storage.claims import ClaimController, VolumeController, pv_handle
from cdi.embedded.storage.classes import csi_drivers, snapshot_classes, storage_classes
from cdi.embedded.storage.snapshots import ContentController, SnapshotController

log = logging.getLogger(__name__)

Obj = dict[str, Any]


@dataclass(frozen=True)
class PublishedVolume:
    """A volume as a pod gets it: a directory to bind (Filesystem) or a file to bind as a device (Block)."""

    path: Path
    block: bool


class LocalStorage:
    def __init__(self, api: LocalApi, root: Path, node_name: str, ext4: bool = False) -> None:
        self.api = api
        self.volumes = LocalVolumes(root, ext4=ext4)
        self.admission = StorageAdmission(api)
        self.controllers = [ClaimController(api, self.volumes, node_name), VolumeController(api, self.volumes),
                            SnapshotController(api, self.volumes), ContentController(api, self.volumes)]

    async def start(self) -> None:
        self.volumes.start()
        self.api.objects.admission.append(self.admission)
        for gvr, bodies in ((STORAGECLASSES, storage_classes()), (VOLUMESNAPSHOTCLASSES, snapshot_classes()),
                            (CSIDRIVERS, csi_drivers())):
            for body in bodies:
                await self._ensure(gvr, body)
        for controller in self.controllers:
            controller.start(self.api)

    async def stop(self) -> None:
        for controller in self.controllers:
            await controller.stop()
        if self.admission in self.api.objects.admission:
            self.api.objects.admission.remove(self.admission)
        self.volumes.stop()

    async def _ensure(self, gvr: GVR, body: Obj) -> None:
        """Create the object unless it exists (an admin's edits to an existing one are kept)."""
        if self.api.get(gvr, None, body["metadata"]["name"]) is not None:
            return
        try:
            await self.api.create(gvr, None, body)
        except StatusError as exc:
            if exc.code != 409:
                raise

    def publish(self, pv: Obj) -> PublishedVolume:
        """Where the bytes of `pv` are on this machine; raises StorageError when it has none here."""
        spec = pv.get("spec") or {}
        handle = pv_handle(pv)
        if handle is not None:
            record = self.volumes.get(handle[1])
            if record is None:
                raise StorageError(f"volume {handle[1]} has no data on this node")
            return PublishedVolume(self.volumes.path(handle[1]), record.kind == BLOCK)
        for source in ("hostPath", "local"):
            path = (spec.get(source) or {}).get("path")
            if path:
                return PublishedVolume(Path(path), spec.get("volumeMode") == "Block")
        raise StorageError(f"persistent volume {pv['metadata']['name']} has no source this node can mount")
