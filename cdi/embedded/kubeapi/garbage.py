"""The garbage collector and the namespace controller of the embedded API server.

Owner references work as in Kubernetes: deleting an owner deletes its dependents (background),
or first waits for those that block it (foreground), or strips the reference (orphan); a
dependent whose owners are all gone is deleted; deleting a namespace deletes what is in it and
then the namespace."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from cdi.embedded.kubeapi.background import BackgroundLoop
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.kubeapi.objects import FOREGROUND, ORPHAN, DeleteOptions, Objects, RequestContext
from cdi.embedded.kubeapi.resources import ResourceType
from cdi.embedded.kubeapi.store import DELETED, Change, Entry

log = logging.getLogger(__name__)

_NAMESPACES = "/namespaces"
_GC = RequestContext()


class GarbageCollector(BackgroundLoop):
    task_name = "garbage-collector"

    def __init__(self, objects: Objects) -> None:
        super().__init__()
        self.objects = objects
        self.store = objects.store

    async def _run(self) -> None:
        with self.store.subscribe(None) as sub:
            await self._sweep()
            while True:
                change = await sub.queue.get()
                if change is None:  # overflowed: everything may be stale, look at all of it again
                    sub.overflowed = False
                    await self._sweep()
                    continue
                try:
                    await self._handle(change)
                except Exception:  # one bad object must not stop collection for the rest
                    log.exception("garbage collection of %s/%s failed", change.namespace, change.name)

    async def _sweep(self) -> None:
        for key in self.store.stored_keys():
            for ns, name, entry in self.store.items(key):
                await self._examine(key, ns, name, entry)

    async def _handle(self, change: Change) -> None:
        if change.type == DELETED:
            owner_uid = change.previous.uid if change.previous else change.entry.uid
            await self._collect_dependents(owner_uid)
            for owner in change.entry.owners:
                await self._recheck_owner(owner)
            if change.namespace:
                await self._recheck_namespace(change.namespace)
            return
        await self._examine(change.key, change.namespace, change.name, change.entry)

    def _type(self, key: str) -> ResourceType | None:
        return self.objects.registry.storage_type(key)

    async def _examine(self, key: str, ns: str, name: str, entry: Entry) -> None:
        if entry.owners and not any(self.store.locate(uid) for uid in entry.owners):
            await self._delete(key, ns, name, "Background")
            return
        obj = entry.obj()
        meta = obj.get("metadata") or {}
        if not meta.get("deletionTimestamp"):
            return
        finalizers = meta.get("finalizers") or []
        if key == _NAMESPACES:
            await self._recheck_namespace(name)
        if ORPHAN in finalizers:
            await self._orphan(entry.uid)
            await self._drop_finalizer(key, ns, name, ORPHAN)
        elif FOREGROUND in finalizers:
            for dep_key, dep_ns, dep_name in self.store.dependents(entry.uid):
                await self._delete(dep_key, dep_ns, dep_name, "Foreground")
            await self._recheck_owner(entry.uid)

    async def _collect_dependents(self, owner_uid: str) -> None:
        for dep_key, dep_ns, dep_name in self.store.dependents(owner_uid):
            dep = self.store.get(dep_key, dep_ns, dep_name)
            if dep is None:
                continue
            if any(uid != owner_uid and self.store.locate(uid) for uid in dep.owners):
                await self._strip_owner(dep_key, dep_ns, dep_name, owner_uid)
            else:
                await self._delete(dep_key, dep_ns, dep_name, "Background")

    async def _recheck_owner(self, owner_uid: str) -> None:
        """A foreground-deleted owner goes once no dependent that blocks it is left."""
        where = self.store.locate(owner_uid)
        if where is None:
            return
        key, ns, name = where
        entry = self.store.get(key, ns, name)
        if entry is None:
            return
        meta = entry.obj().get("metadata") or {}
        if not meta.get("deletionTimestamp") or FOREGROUND not in (meta.get("finalizers") or []):
            return
        for dep_key, dep_ns, dep_name in self.store.dependents(owner_uid):
            dep = self.store.get(dep_key, dep_ns, dep_name)
            if dep is None:
                continue
            refs = (dep.obj().get("metadata") or {}).get("ownerReferences") or []
            if any(r.get("uid") == owner_uid and r.get("blockOwnerDeletion") for r in refs):
                return
        await self._drop_finalizer(key, ns, name, FOREGROUND)

    async def _orphan(self, owner_uid: str) -> None:
        for dep_key, dep_ns, dep_name in self.store.dependents(owner_uid):
            await self._strip_owner(dep_key, dep_ns, dep_name, owner_uid)

    async def _recheck_namespace(self, namespace: str) -> None:
        entry = self.store.get(_NAMESPACES, "", namespace)
        if entry is None:
            return
        obj = entry.obj()
        if not (obj.get("metadata") or {}).get("deletionTimestamp"):
            return
        remaining = False
        for key in self.store.stored_keys():
            if key == _NAMESPACES:
                continue
            for ns, name, _ in self.store.items(key, namespace):
                remaining = True
                await self._delete(key, ns, name, "Background")
        if remaining:
            return
        if (obj.get("spec") or {}).get("finalizers"):
            rtype = self._type(_NAMESPACES)
            assert rtype is not None
            await self.objects.update(rtype, None, namespace,
                                      {**obj, "spec": {**obj.get("spec", {}), "finalizers": []}}, _GC, "finalize")

    async def _delete(self, key: str, ns: str, name: str, policy: str) -> None:
        rtype = self._type(key)
        if rtype is None:
            return
        entry = self.store.get(key, ns, name)
        if entry is None or (orjson.loads(entry.raw).get("metadata") or {}).get("deletionTimestamp"):
            return
        try:
            await self.objects.delete(rtype, ns, name, DeleteOptions(propagation=policy), _GC)
        except StatusError as exc:
            if exc.code not in (404, 409):
                raise

    async def _patch_meta(self, key: str, ns: str, name: str, change: dict[str, Any]) -> None:
        rtype = self._type(key)
        if rtype is None:
            return
        try:
            await self.objects.patch(rtype, ns, name, "application/merge-patch+json", {"metadata": change}, _GC)
        except StatusError as exc:
            if exc.code != 404:
                raise

    async def _strip_owner(self, key: str, ns: str, name: str, owner_uid: str) -> None:
        entry = self.store.get(key, ns, name)
        if entry is None:
            return
        refs = (entry.obj().get("metadata") or {}).get("ownerReferences") or []
        kept = [r for r in refs if r.get("uid") != owner_uid]
        await self._patch_meta(key, ns, name, {"ownerReferences": kept or None})

    async def _drop_finalizer(self, key: str, ns: str, name: str, finalizer: str) -> None:
        entry = self.store.get(key, ns, name)
        if entry is None:
            return
        finalizers = (entry.obj().get("metadata") or {}).get("finalizers") or []
        kept = [f for f in finalizers if f != finalizer]
        await self._patch_meta(key, ns, name, {"finalizers": kept or None})
