"""An in-memory stand-in for `cdi.kube.KubeClient`, for unit tests of reconcilers that run in
milliseconds without `cdi up`.

It keeps objects per GVR the way an API server does where reconcilers rely on it: uids,
resourceVersions checked on replace (409 when stale), `generateName`, `generation` (1 at create, one
more at each write that changes anything but metadata and status), a new claim's or pod's `Pending`
phase, the status subresource (a main-resource write keeps the status, a status write keeps the rest),
finalizers (a delete sets `deletionTimestamp` while any remain), merge/JSON/strategic patches, label and
field selectors, and ResourceQuotas refusing creates that go over them, reusing the embedded API
server's own patch, selector and quota code so there is one implementation of each.

Informers made by `informer(gvr)` are never behind: every write updates them (and runs their
handlers) before the verb returns, so a test sees exactly what the reconciler wrote and nothing
depends on timing. `writes` records every successful write, for asserting what was created or deleted.
Watches are not served: reconcilers read through informers, which this fake keeps current itself."""

from __future__ import annotations

import copy
import datetime
import itertools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cdi.api import groups
from cdi.api.groups import GVR
from cdi.embedded.kubeapi import quotausage
from cdi.embedded.kubeapi.patching import json_patch, merge_patch, strategic_merge_patch
from cdi.embedded.kubeapi.quota import forbidden
from cdi.embedded.kubeapi.resources import ResourceType
from cdi.embedded.kubeapi.selectors import parse_field_selector, parse_label_selector
from cdi.kube import AlreadyExists, Conflict, Informer, KubeClient, NotFound, ObjectList, WatchStream, object_key
from cdi.kube.client import PatchType
from cdi.kube.errors import error_from_status

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds


@dataclass(frozen=True)
class Write:
    """One successful write: `verb` is create, replace, patch or delete (a delete that only marked the
    object for deletion is still a delete)."""

    verb: str
    gvr: GVR
    namespace: str
    name: str
    subresource: str | None = None


def all_gvrs() -> list[GVR]:
    """Every kind `cdi.api.groups` names."""
    return [value for value in vars(groups).values() if isinstance(value, GVR)]


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What `generation` counts changes of: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKube(KubeClient):
    """`KubeClient`'s verbs over dicts in memory. Construct it plainly: `FakeKube()`."""

    def __init__(self, namespace: str = "default") -> None:  # no transport, hence no super().__init__
        self._namespace_default = namespace
        self._objects: dict[GVR, dict[Key, Obj]] = {}
        self._informers: dict[GVR, Informer] = {}
        self._versions = itertools.count(1)
        self.writes: list[Write] = []

    # -- what a test sets up and looks at -------------------------------------------------------------

    def add(self, gvr: GVR, obj: Mapping[str, Any]) -> Obj:
        """Put (or replace) an object as if it had always been so: no write recorded, no handler run, but
        the informers see it (what another component, a provisioner or the kubelet, wrote)."""
        stored = self._stamp(gvr, copy.deepcopy(dict(obj)))
        self._put(gvr, stored)
        informer = self._informers.get(gvr)
        if informer is not None:
            informer._store(object_key(stored), copy.deepcopy(stored))
        return copy.deepcopy(stored)

    def object(self, gvr: GVR, name: str, namespace: str | None = None) -> Obj | None:
        """The stored object (a copy), or None."""
        found = self._objects.get(gvr, {}).get((namespace or "" if gvr.namespaced else "", name))
        return copy.deepcopy(found) if found is not None else None

    def objects(self, gvr: GVR, namespace: str | None = None) -> list[Obj]:
        return [copy.deepcopy(o) for (ns, _), o in sorted(self._objects.get(gvr, {}).items())
                if namespace is None or ns == namespace]

    def created(self, gvr: GVR) -> list[str]:
        """namespace/name of every object of `gvr` created through the client, in order."""
        return [f"{w.namespace}/{w.name}" if w.namespace else w.name for w in self.writes
                if w.verb == "create" and w.gvr == gvr]

    def informer(self, gvr: GVR) -> Informer:
        """An informer of `gvr` that this fake keeps current (not started: nothing to watch)."""
        informer = self._informers.get(gvr)
        if informer is None:
            informer = Informer(self, gvr)
            for obj in self._objects.get(gvr, {}).values():
                informer._store(object_key(obj), copy.deepcopy(obj))
            informer._synced.set()
            self._informers[gvr] = informer
        return informer

    # -- KubeClient ---------------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        return self._namespace_default

    @property
    def host(self) -> str:
        return "https://fake.invalid"

    async def close(self) -> None:
        return None

    async def get(self, gvr: GVR, name: str, namespace: str | None = None, *,
                  subresource: str | None = None) -> Obj:
        stored = self._get(gvr, name, namespace)
        return copy.deepcopy(stored.get(subresource) or {} if subresource else stored)

    async def list(self, gvr: GVR, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None, limit: int | None = None, continue_token: str | None = None,
                   resource_version: str | None = None) -> ObjectList:
        labels, fields = parse_label_selector(label_selector), parse_field_selector(field_selector)
        items = [o for o in self.objects(gvr, namespace if gvr.namespaced else None)
                 if labels.matches((o.get("metadata") or {}).get("labels")) and fields.matches(o)]
        return ObjectList(items, str(self._version()))

    async def list_all(self, gvr: GVR, namespace: str | None = None, *, label_selector: str | None = None,
                       field_selector: str | None = None, page_size: int = 500) -> ObjectList:
        return await self.list(gvr, namespace, label_selector=label_selector, field_selector=field_selector)

    async def create(self, gvr: GVR, body: Mapping[str, Any], namespace: str | None = None, *,
                     dry_run: bool = False, field_manager: str | None = None) -> Obj:
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        if gvr.namespaced:
            meta["namespace"] = self._ns(gvr, namespace, obj)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if self._objects.get(gvr, {}).get(self._key(gvr, obj)) is not None:
            raise AlreadyExists(f'{gvr.plural} "{meta.get("name")}" already exists', code=409,
                                reason="AlreadyExists")
        if gvr.namespaced:
            self._admit_quota(gvr, obj)
        obj = self._stamp(gvr, obj)
        obj["metadata"]["generation"] = 1
        if gvr in (groups.PVCS, groups.PODS):  # the API server's default for a new claim or pod
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        if not dry_run:
            await self._write("create", gvr, obj)
        return copy.deepcopy(obj)

    async def replace(self, gvr: GVR, body: Mapping[str, Any], namespace: str | None = None, *,
                      subresource: str | None = None, dry_run: bool = False,
                      field_manager: str | None = None) -> Obj:
        meta = body.get("metadata") or {}
        current = self._get(gvr, str(meta.get("name") or ""), namespace or meta.get("namespace"))
        sent = meta.get("resourceVersion")
        if sent and sent != current["metadata"]["resourceVersion"]:
            raise Conflict(f'Operation cannot be fulfilled on {gvr.plural} "{meta.get("name")}": the object has '
                           "been modified; please apply your changes to the latest version and try again",
                           code=409, reason="Conflict")
        obj = copy.deepcopy(current)
        if subresource:
            obj[subresource] = copy.deepcopy(body.get(subresource))
        else:
            obj = {**copy.deepcopy(dict(body)), "status": obj.get("status")} if "status" in obj else \
                copy.deepcopy(dict(body))
            obj["metadata"] = {**obj["metadata"], **{k: current["metadata"][k] for k in
                                                     ("uid", "creationTimestamp", "namespace")
                                                     if k in current["metadata"]}}
        return await self._update("replace", gvr, obj, subresource, dry_run)

    async def patch(self, gvr: GVR, name: str, patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                    namespace: str | None = None, *, patch_type: PatchType = "merge",
                    subresource: str | None = None, dry_run: bool = False, field_manager: str | None = None,
                    force: bool | None = None) -> Obj:
        if (patch_type == "json") != isinstance(patch, Sequence):
            raise ValueError("a JSON patch is a list of operations, and only a JSON patch is")
        if patch_type == "apply" and isinstance(patch, Mapping):
            where = self._ns(gvr, namespace, patch) if gvr.namespaced else ""
            if self._objects.get(gvr, {}).get((where, name)) is None:
                return await self.create(gvr, patch, namespace, dry_run=dry_run)  # server-side apply creates
        current = self._get(gvr, name, namespace)
        if not isinstance(patch, Mapping):
            patched: Obj = json_patch(copy.deepcopy(current), [dict(op) for op in patch])
        elif patch_type == "strategic":
            patched = strategic_merge_patch(copy.deepcopy(current), patch)
        else:  # merge (an apply patch is a merge here: no field managers)
            patched = merge_patch(copy.deepcopy(current), patch)
        sent = (patched.get("metadata") or {}).get("resourceVersion")
        if sent and sent != current["metadata"]["resourceVersion"]:
            raise Conflict(f'{gvr.plural} "{name}": the object has been modified', code=409, reason="Conflict")
        if subresource:
            patched = {**copy.deepcopy(current), subresource: patched.get(subresource)}
        elif "status" in current or "status" in patched:
            patched["status"] = copy.deepcopy(current.get("status"))
            if patched["status"] is None:
                del patched["status"]
        return await self._update("patch", gvr, patched, subresource, dry_run)

    async def delete(self, gvr: GVR, name: str, namespace: str | None = None, *,
                     propagation_policy: Literal["Background", "Foreground", "Orphan"] | None = None,
                     grace_period_seconds: int | None = None, uid: str | None = None,
                     resource_version: str | None = None, dry_run: bool = False) -> Obj:
        current = self._get(gvr, name, namespace)
        meta = current["metadata"]
        if (uid and uid != meta.get("uid")) or (resource_version and resource_version != meta["resourceVersion"]):
            raise Conflict(f'{gvr.plural} "{name}": precondition failed', code=409, reason="Conflict")
        if dry_run:
            return copy.deepcopy(current)
        if meta.get("finalizers"):
            marked = copy.deepcopy(current)
            marked["metadata"].setdefault("deletionTimestamp", _now())
            return await self._update("delete", gvr, marked, None, False)
        await self._remove(gvr, current)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def watch(self, gvr: GVR, namespace: str | None = None, *, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_seconds: int | None = None, allow_bookmarks: bool = True,
              inactivity_timeout: float | None = None) -> WatchStream:
        raise NotImplementedError("FakeKube serves no watches: its informers are kept current by its writes")

    # -- storage ------------------------------------------------------------------------------------

    def _version(self) -> int:
        return next(self._versions)

    @staticmethod
    def _ns(gvr: GVR, namespace: str | None, body: Mapping[str, Any]) -> str:
        ns = namespace or (body.get("metadata") or {}).get("namespace")
        if not ns:
            raise ValueError(f"{gvr.kind} is namespaced: pass a namespace")
        return str(ns)

    @staticmethod
    def _key(gvr: GVR, obj: Mapping[str, Any]) -> Key:
        meta = obj.get("metadata") or {}
        return (str(meta.get("namespace") or "") if gvr.namespaced else "", str(meta.get("name") or ""))

    def _stamp(self, gvr: GVR, obj: Obj) -> Obj:
        obj.setdefault("apiVersion", gvr.api_version)
        obj.setdefault("kind", gvr.kind)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["resourceVersion"] = str(self._version())
        return obj

    def _admit_quota(self, gvr: GVR, obj: Obj) -> None:
        """The namespace's ResourceQuotas, counted as the quota controller counts them now, refuse what would
        go over one with the embedded API server's 403 (`quotausage` decides for both)."""
        namespace = str(obj["metadata"]["namespace"])
        quotas = self.objects(groups.RESOURCEQUOTAS, namespace)
        if not quotas:
            return
        present = [(f"{kind.group}/{kind.plural}", item) for kind, bucket in self._objects.items() if kind.namespaced
                   for (ns, _), item in bucket.items() if ns == namespace]
        counted = [{**q, "status": {"hard": (q.get("spec") or {}).get("hard") or {},
                                    "used": quotausage.render(quotausage.namespace_used(q, present))}}
                   for q in quotas]
        try:
            quotausage.admit(counted, f"{gvr.group}/{gvr.plural}", obj)
        except quotausage.Refused as exc:
            rtype = ResourceType(gvr.group, gvr.version, gvr.plural, gvr.kind, gvr.namespaced)
            raise error_from_status(forbidden(rtype, str(obj["metadata"].get("name", "")), str(exc)).body()) \
                from None

    def _get(self, gvr: GVR, name: str, namespace: str | None) -> Obj:
        key = (str(namespace or "") if gvr.namespaced else "", name)
        found = self._objects.get(gvr, {}).get(key)
        if found is None:
            raise NotFound(f'{gvr.plural} "{name}" not found', code=404, reason="NotFound")
        return found

    def _put(self, gvr: GVR, obj: Obj) -> Obj | None:
        key = self._key(gvr, obj)
        old = self._objects.setdefault(gvr, {}).get(key)
        self._objects[gvr][key] = obj
        return old

    async def _update(self, verb: str, gvr: GVR, obj: Obj, subresource: str | None, dry_run: bool) -> Obj:
        obj["metadata"]["resourceVersion"] = str(self._version())
        before = self._objects.get(gvr, {}).get(self._key(gvr, obj))
        if before is not None and not subresource and _content(before) != _content(obj):
            obj["metadata"]["generation"] = int(before["metadata"].get("generation") or 1) + 1  # as the API server
        if dry_run:
            return copy.deepcopy(obj)
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # the last finalizer went: the object goes, as on a server
            await self._remove(gvr, obj)
            return copy.deepcopy(obj)
        await self._write(verb, gvr, obj, subresource)
        return copy.deepcopy(obj)

    async def _remove(self, gvr: GVR, obj: Obj) -> None:
        del self._objects[gvr][self._key(gvr, obj)]
        meta = obj["metadata"]
        self.writes.append(Write("delete", gvr, str(meta.get("namespace") or ""), str(meta["name"])))
        informer = self._informers.get(gvr)
        if informer is not None and informer._remove(object_key(obj)) is not None:
            await informer._deleted(copy.deepcopy(obj))

    async def _write(self, verb: str, gvr: GVR, obj: Obj, subresource: str | None = None) -> None:
        old = self._put(gvr, obj)
        meta = obj["metadata"]
        self.writes.append(Write(verb, gvr, str(meta.get("namespace") or ""), str(meta["name"]), subresource))
        informer = self._informers.get(gvr)
        if informer is not None:
            cached = copy.deepcopy(obj)
            informer._store(object_key(cached), cached)
            if old is None:
                await informer._added(cached)
            else:
                await informer._updated(copy.deepcopy(old), cached)
