"""One StorageProfile per StorageClass, created and deleted with it (object-bucket classes included, as
in CDI), its status computed from the profile's spec, the class, the known-provisioner table and the
snapshot classes present, and the table's annotations (minimum PVC size, DataImportCron hints) added."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.views import ObjectView, PersistentVolumeView
from cdi.controller import conditions
from cdi.controller.capabilities import NO_PROVISIONER, is_complete, profile_annotations, profile_status
from cdi.controller.runtime import Reconciler, write_status
from cdi.controller.watches import Watch
from cdi.kube import AlreadyExists, NotFound

Obj = dict[str, Any]


def _merge_conditions(old: list[Mapping[str, Any]], new: list[Mapping[str, Any]]) -> list[Obj]:
    merged = [dict(c) for c in old]
    for cond in new:
        conditions.update(merged, str(cond["type"]), str(cond["status"]), str(cond.get("message", "")),
                          str(cond.get("reason", "")))
    return merged


class StorageProfileReconciler(Reconciler):
    name = "storageprofile"

    def watches(self) -> list[Watch]:
        """A profile is keyed by its class's name: the class and the profile themselves; every class when a
        snapshot class changes (which classes can snapshot); a no-provisioner class when one of its volumes
        changes (its profile takes its claim property sets from them)."""
        return [Watch(groups.STORAGECLASSES, lambda sc: [ObjectView(sc).name]),
                Watch(groups.STORAGEPROFILES, lambda profile: [ObjectView(profile).name]),
                Watch(groups.VOLUMESNAPSHOTCLASSES, lambda _: [ObjectView(sc).name for sc in
                                                               self.ctx.cached_list(groups.STORAGECLASSES)]),
                Watch(groups.PVS, self._no_provisioner_class_of)]

    def _no_provisioner_class_of(self, volume: Obj) -> list[str]:
        name = PersistentVolumeView(volume).storage_class
        storage_class = self.ctx.cached(groups.STORAGECLASSES, name) if name else None
        return [name] if storage_class is not None and storage_class.get("provisioner") == NO_PROVISIONER else []

    async def reconcile(self, key: str) -> float | None:
        storage_class = self.ctx.cached(groups.STORAGECLASSES, key)
        profile = self.ctx.cached(groups.STORAGEPROFILES, key)
        if storage_class is None or ObjectView(storage_class).deleting:
            if profile is not None:
                try:
                    await self.ctx.client.delete(groups.STORAGEPROFILES, key)
                except NotFound:
                    pass
            self._drop_metric(key)
            return None
        if profile is None:
            body: Obj = {"apiVersion": groups.CDI_API_VERSION, "kind": "StorageProfile",
                         "metadata": {"name": key, "labels": {ann.LABEL_APP: ann.LABEL_APP_VALUE}}, "spec": {}}
            try:
                profile = await self.ctx.client.create(groups.STORAGEPROFILES, body)
            except AlreadyExists:
                return 0.2
        snapshot_classes = self.ctx.cached_list(groups.VOLUMESNAPSHOTCLASSES)
        annotations = ObjectView(profile).annotations
        wanted = profile_annotations(storage_class, annotations, snapshot_classes)
        if wanted != annotations:
            # a replace carrying the resourceVersion: a stale cache gets a 409 and the reconcile runs again
            metadata = {**profile["metadata"], "annotations": wanted}
            profile = await self.ctx.client.replace(groups.STORAGEPROFILES, {**profile, "metadata": metadata})
        spec = profile.get("spec") or {}
        status = profile_status(storage_class, spec, snapshot_classes, self.ctx.cached_list(groups.PVS))
        status["conditions"] = _merge_conditions((profile.get("status") or {}).get("conditions") or [],
                                                 status["conditions"])
        if status != profile.get("status"):
            await write_status(self.ctx.client, groups.STORAGEPROFILES, profile, status)
        self._metric(storage_class, status)
        return None

    def _drop_metric(self, name: str) -> None:
        gauge = self.ctx.metrics.storageprofile_info
        for labels in list(getattr(gauge, "_metrics", {})):
            if labels and labels[0] == name:
                gauge.remove(*labels)

    def _metric(self, storage_class: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        view = ObjectView(storage_class)
        name, annotations = view.name, view.annotations
        sets = status.get("claimPropertySets") or []
        rwx = any("ReadWriteMany" in (cps.get("accessModes") or []) for cps in sets)
        smart = status.get("cloneStrategy") in ("snapshot", "csi-clone")
        single_node = len(self.ctx.cached_list(groups.NODES)) <= 1  # live migration needs RWX only with peers
        self._drop_metric(name)
        self.ctx.metrics.storageprofile_info.labels(
            name, str(storage_class.get("provisioner", "")),
            str(is_complete(str(storage_class.get("provisioner", "")), status)).lower(),
            str(annotations.get(ann.DEFAULT_STORAGE_CLASS) == "true").lower(),
            str(annotations.get(ann.DEFAULT_VIRT_STORAGE_CLASS) == "true").lower(),
            str(rwx).lower(), str(smart).lower(), str(not smart or not (rwx or single_node)).lower()).set(1)
