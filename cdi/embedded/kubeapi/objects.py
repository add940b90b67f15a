"""API semantics over the store: what create, update, patch, delete, list and watch mean in
Kubernetes (uids, generateName, generation, resourceVersion conflicts, status subresources,
finalizers and deletionTimestamp, admission, validation), independent of HTTP.

The REST handlers and the in-process parts of the embedded control plane (node, storage) both go
through this one class, so they cannot disagree about semantics."""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from cdi.embedded.kubeapi import errors
from cdi.embedded.kubeapi.bodies import MAX_DEPTH, too_deep
from cdi.embedded.kubeapi.conversions import from_storage, needs_conversion, to_storage
from cdi.embedded.kubeapi.errors import Cause, StatusError
from cdi.embedded.kubeapi.patching import apply_patch
from cdi.embedded.kubeapi.resources import Registry, ResourceType, spec_fields
from cdi.embedded.kubeapi.schema import validate as validate_schema
from cdi.embedded.kubeapi.selectors import FieldSelector, LabelSelector
from cdi.embedded.kubeapi.store import ADDED, DELETED, MODIFIED, Change, Entry, Store, TooOld
from cdi.embedded.kubeapi.strategies import Strategies, validate_name

log = logging.getLogger(__name__)

Obj = dict[str, Any]
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"


@dataclass(frozen=True)
class UserInfo:
    """Who makes a request, as kube-apiserver's user.Info: `extra` holds what an authenticator or
    impersonation (`Impersonate-Extra-<key>`) adds, key to values, and travels with the user into
    admission reviews, access reviews and the aggregation layer's headers."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def as_dict(self) -> Obj:
        """authentication.k8s.io/v1 UserInfo, as admission reviews and SelfSubjectReview carry it (empty
        fields omitted)."""
        info: Obj = {"username": self.name}
        if self.uid:
            info["uid"] = self.uid
        if self.groups:
            info["groups"] = list(self.groups)
        if self.extra:
            info["extra"] = {key: list(values) for key, values in self.extra.items()}
        return info


SYSTEM = UserInfo("system:apiserver", ("system:masters", "system:authenticated"))


@dataclass
class RequestContext:
    user: UserInfo = SYSTEM
    dry_run: bool = False
    field_validation: str = "Ignore"
    warnings: list[str] = field(default_factory=list)


@dataclass
class DeleteOptions:
    propagation: str | None = None
    grace_period: int | None = None
    uid: str | None = None
    resource_version: str | None = None


@dataclass
class AdmissionRequest:
    operation: str  # CREATE, UPDATE, DELETE
    rtype: ResourceType
    namespace: str
    name: str
    obj: Obj | None
    old: Obj | None
    ctx: RequestContext
    subresource: str = ""


class AdmissionHook(Protocol):
    """Mutating hooks may return a replacement object; validating hooks raise StatusError."""

    async def mutate(self, request: AdmissionRequest) -> Obj | None: ...

    async def validate(self, request: AdmissionRequest) -> None: ...


@dataclass
class WatchEvent:
    type: str  # ADDED MODIFIED DELETED BOOKMARK ERROR
    obj: Obj | None = None
    entry: Entry | None = None
    rv: int = 0


@dataclass
class ListPage:
    entries: list[Entry]
    rv: int
    continue_token: str = ""
    remaining: int | None = None


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_SNAPSHOT_TTL = 300.0  # seconds a paged list's snapshot is kept for its next pages
_MAX_SNAPSHOTS = 64


def _monotonic() -> float:
    import time
    return time.monotonic()


def _encode_continue(snapshot_id: str, offset: int) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"id": snapshot_id, "offset": offset})).decode()


def _decode_continue(token: str) -> tuple[str, int]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["id"]), int(data["offset"])
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.bad_request(f"continue key is not valid: {exc}") from exc


class Objects:
    def __init__(self, registry: Registry, store: Store, strategies: Strategies) -> None:
        self.registry = registry
        self.store = store
        self.strategies = strategies
        self.admission: list[AdmissionHook] = []
        # after every other hook, whenever those were added: kube-apiserver runs ResourceQuota last, so
        # that no plugin refuses a request once its usage has been charged
        self.admission_last: list[AdmissionHook] = []
        self._pages: dict[str, tuple[float, int, list[Entry]]] = {}
        self.on_crd_change: list[Callable[[Obj, bool], None]] = []

    # -- helpers -----------------------------------------------------------------------------------

    def _storage(self, rtype: ResourceType) -> ResourceType:
        return self.registry.storage_type(rtype.key) or rtype

    def _ns(self, rtype: ResourceType, namespace: str | None) -> str:
        return (namespace or "") if rtype.namespaced else ""

    def view(self, rtype: ResourceType, entry: Entry) -> Obj:
        """The stored object as `rtype` presents it."""
        obj = entry.obj()
        if needs_conversion(rtype, obj.get("apiVersion", "")):
            obj = from_storage(rtype, obj)
        return obj

    def raw(self, rtype: ResourceType, entry: Entry) -> bytes:
        """JSON of the object as `rtype` presents it, without re-serialising when no conversion is due."""
        if rtype.group != "events.k8s.io" and entry.raw.find(
                b'"apiVersion":"' + rtype.api_version.encode() + b'"', 0, 200) != -1:
            return entry.raw
        return orjson.dumps(self.view(rtype, entry))

    def _current(self, rtype: ResourceType, ns: str, name: str) -> Entry:
        entry = self.store.get(rtype.key, ns, name)
        if entry is None:
            raise errors.not_found(rtype.plural, rtype.group, name)
        return entry

    def _check_namespace(self, rtype: ResourceType, ns: str, creating: bool) -> None:
        if not rtype.namespaced:
            return
        if not ns:
            raise errors.bad_request("the server could not find the requested resource: a namespace is required")
        entry = self.store.get("/namespaces", "", ns)
        if entry is None:
            raise errors.not_found("namespaces", "", ns)
        if creating and b'"deletionTimestamp"' in entry.raw:
            raise StatusError(403, f"{rtype.kind} \"\" is forbidden: unable to create new content in namespace "
                                   f"{ns} because it is being terminated", "Forbidden")

    def _check_type(self, rtype: ResourceType, obj: Obj) -> None:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if api_version and api_version != rtype.api_version:
            raise errors.bad_request(f"the API version in the data ({api_version}) does not match the expected API "
                                     f"version ({rtype.api_version})")
        if kind and kind != rtype.kind:
            raise errors.bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rtype.kind})")
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind

    def _validate_schema(self, rtype: ResourceType, obj: Obj, ctx: RequestContext, name: str) -> Obj:
        if rtype.schema is None:
            return obj
        outcome = validate_schema(rtype.schema, obj)
        if outcome.unknown:
            if ctx.field_validation == "Strict":
                fields = ", ".join(f'unknown field "{u}"' for u in outcome.unknown)
                raise errors.bad_request(f"{rtype.kind} in version \"{rtype.version}\" cannot be handled as a "
                                         f"{rtype.kind}: strict decoding error: {fields}")
            if ctx.field_validation == "Warn":
                ctx.warnings.extend(f'unknown field "{u}"' for u in outcome.unknown)
        if outcome.causes:
            raise errors.invalid(rtype.kind, rtype.group, name, outcome.causes)
        value: Obj = outcome.value
        return value

    async def _admit(self, request: AdmissionRequest) -> Obj | None:
        obj = request.obj
        for hook in [*self.admission, *self.admission_last]:
            mutated = await hook.mutate(request)
            if mutated is not None:
                obj = request.obj = mutated
        return obj

    async def _validate_admission(self, request: AdmissionRequest) -> None:
        for hook in [*self.admission, *self.admission_last]:
            await hook.validate(request)

    def _generate_name(self, prefix: str, rtype: ResourceType, ns: str) -> str:
        for _ in range(10):
            name = prefix + "".join(random.choices(_NAME_CHARS, k=5))
            if self.store.get(rtype.key, ns, name) is None:
                return name
        raise StatusError(500, "could not generate a unique name", "ServerTimeout")

    # -- create ------------------------------------------------------------------------------------

    def _own_copy(self, rtype: ResourceType, body: Any) -> tuple[Obj, Obj]:
        """A private copy of a request body, typed as `rtype`, and its metadata."""
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        obj: Obj = orjson.loads(orjson.dumps(body))
        self._check_type(rtype, obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        return obj, meta

    async def create(self, rtype: ResourceType, namespace: str | None, body: Any, ctx: RequestContext | None = None,
                     subresource: str = "") -> Obj:
        ctx = ctx or RequestContext()
        obj, meta = self._own_copy(rtype, body)
        ns = self._ns(rtype, namespace or meta.get("namespace"))
        if rtype.namespaced and namespace and meta.get("namespace") not in (None, "", namespace):
            raise errors.bad_request("the namespace of the provided object does not match the namespace sent on "
                                     "the request")
        self._check_namespace(rtype, ns, creating=True)
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = self._generate_name(str(meta["generateName"]), rtype, ns)
            else:
                raise errors.invalid(rtype.kind, rtype.group, "", [Cause(
                    "metadata.name", "Required value: name or generateName is required", "FieldValueRequired")])
        name = str(meta["name"])
        if rtype.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        meta.pop("generation", None)
        if not rtype.builtin or rtype.kind == "CustomResourceDefinition":
            meta["generation"] = 1  # built-in kinds here (core, storage, rbac...) carry none, as on a real server
        if rtype.has_status and not rtype.builtin:
            obj.pop("status", None)
        causes = validate_name(rtype, name)
        causes += self.strategies.prepare_create(rtype, obj)
        if causes:
            raise errors.invalid(rtype.kind, rtype.group, name, causes)
        request = AdmissionRequest("CREATE", rtype, ns, name, obj, None, ctx, subresource)
        obj = await self._admit(request) or obj
        causes = self.strategies.validate_create(rtype, obj)
        if causes:
            raise errors.invalid(rtype.kind, rtype.group, name, causes)
        obj = self._validate_schema(rtype, obj, ctx, name)
        await self._validate_admission(request)
        if rtype.key == "apiextensions.k8s.io/customresourcedefinitions":
            self._prepare_crd(obj)
        if self.store.get(rtype.key, ns, name) is not None:
            raise errors.already_exists(rtype.plural, rtype.group, name)
        # addresses (a Service's cluster IP) last, once nothing can refuse the object: a refused create
        # or a dry run holds none
        causes = self.strategies.allocate(rtype, obj)
        if causes:
            raise errors.invalid(rtype.kind, rtype.group, name, causes)
        try:
            storage = self._storage(rtype)
            stored = to_storage(rtype, obj, storage) if needs_conversion(rtype, storage.api_version) else obj
            if ctx.dry_run:
                self.strategies.released(rtype, obj)
                return obj
            entry = self.store.put(rtype.key, ns, name, stored)
        except BaseException:
            self.strategies.released(rtype, obj)
            raise
        self._after_write(rtype, None, entry)
        return self.view(rtype, entry)

    # -- read --------------------------------------------------------------------------------------

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        return self.view(rtype, self._current(rtype, self._ns(rtype, namespace), name))

    def get_entry(self, rtype: ResourceType, namespace: str | None, name: str) -> Entry:
        return self._current(rtype, self._ns(rtype, namespace), name)

    def find(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj | None:
        entry = self.store.get(rtype.key, self._ns(rtype, namespace), name)
        return None if entry is None else self.view(rtype, entry)

    def list(self, rtype: ResourceType, namespace: str | None = None, labels: LabelSelector | None = None,
             fields: FieldSelector | None = None, limit: int = 0, continue_token: str = "") -> ListPage:
        """Objects in namespace/name order. Pages after the first come from a snapshot taken by the first,
        so a paged list is consistent as on a real server; an expired snapshot is 410 Gone."""
        if continue_token:
            return self._next_page(continue_token, limit)
        ns = namespace if rtype.namespaced and namespace else None
        entries = []
        for item_ns, item_name, entry in self.store.items(rtype.key, ns):
            if labels is not None and not labels.empty and not labels.matches(entry.labels):
                continue
            if fields is not None and not fields.empty and not self._fields_match(rtype, fields, item_ns, item_name,
                                                                                   entry):
                continue
            entries.append(entry)
        page = ListPage(entries, self.store.rv)
        if limit and len(entries) > limit:
            page.entries = entries[:limit]
            page.continue_token = self._snapshot(page.rv, entries[limit:])
            page.remaining = len(entries) - limit
        return page

    def _snapshot(self, rv: int, rest: list[Entry]) -> str:
        loop_time = _monotonic()
        for key in [k for k, (expires, _, _) in self._pages.items() if expires < loop_time]:
            del self._pages[key]
        while len(self._pages) >= _MAX_SNAPSHOTS:
            self._pages.pop(next(iter(self._pages)))
        snapshot_id = uuid.uuid4().hex
        self._pages[snapshot_id] = (loop_time + _SNAPSHOT_TTL, rv, rest)
        return _encode_continue(snapshot_id, 0)

    def _next_page(self, token: str, limit: int) -> ListPage:
        snapshot_id, offset = _decode_continue(token)
        held = self._pages.get(snapshot_id)
        if held is None:
            raise errors.gone("The provided continue parameter is too old to display a consistent list result. "
                              "You can start a new list without the continue parameter.")
        _, rv, rest = held
        end = offset + limit if limit else len(rest)
        page = ListPage(rest[offset:end], rv)
        if end < len(rest):
            page.continue_token = _encode_continue(snapshot_id, end)
            page.remaining = len(rest) - end
        else:
            del self._pages[snapshot_id]
        return page

    def _fields_match(self, rtype: ResourceType, fields: FieldSelector, ns: str, name: str, entry: Entry) -> bool:
        only = fields.only_name()
        if only is not None:
            return name == only
        return fields.matches(self.view(rtype, entry))

    # -- update and patch --------------------------------------------------------------------------

    async def update(self, rtype: ResourceType, namespace: str | None, name: str, body: Any,
                     ctx: RequestContext | None = None, subresource: str = "") -> Obj:
        ctx = ctx or RequestContext()
        obj, meta = self._own_copy(rtype, body)
        ns = self._ns(rtype, namespace)
        if meta.get("name") not in (None, name):
            raise errors.bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the "
                                     f"URL ({name})")
        if rtype.namespaced and meta.get("namespace") not in (None, "", ns):
            raise errors.bad_request("the namespace of the provided object does not match the namespace sent on "
                                     "the request")
        entry = self._current(rtype, ns, name)
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and str(wanted_rv) != str(entry.rv):
            raise errors.stale(rtype.plural, rtype.group, name)
        return await self._replace(rtype, ns, name, entry, obj, ctx, subresource)

    async def patch(self, rtype: ResourceType, namespace: str | None, name: str, content_type: str, patch: Any,
                    ctx: RequestContext | None = None, subresource: str = "") -> Obj:
        ctx = ctx or RequestContext()
        ns = self._ns(rtype, namespace)
        for _ in range(5):
            entry = self._current(rtype, ns, name)
            current = self.view(rtype, entry)
            patched = apply_patch(content_type, current, patch, strategic_allowed=rtype.strategic_merge)
            if too_deep(patched):  # a JSON patch can add a deep value at a deep path
                raise errors.bad_request(f"the patched object exceeded max depth of {MAX_DEPTH}")
            meta = patched.setdefault("metadata", {})
            wanted_rv = meta.get("resourceVersion")
            if wanted_rv and str(wanted_rv) != str(entry.rv):
                raise errors.stale(rtype.plural, rtype.group, name)
            if meta.get("name") != name:
                raise errors.bad_request("the name of the object may not be changed by a patch")
            try:
                return await self._replace(rtype, ns, name, entry, patched, ctx, subresource,
                                           precondition=entry.rv)
            except _Retry:
                continue
        raise errors.stale(rtype.plural, rtype.group, name)

    async def _replace(self, rtype: ResourceType, ns: str, name: str, entry: Entry, obj: Obj, ctx: RequestContext,
                       subresource: str, precondition: int | None = None) -> Obj:
        old = self.view(rtype, entry)
        old_meta = old["metadata"]
        if subresource == "status":
            new = dict(old)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            obj = new
            obj["metadata"] = dict(old_meta)
        elif subresource in ("", "finalize"):
            if rtype.has_status and subresource == "":
                if "status" in old:
                    obj["status"] = old["status"]
                else:
                    obj.pop("status", None)
            if subresource == "finalize":
                obj = {**old, "spec": {**(old.get("spec") or {}),
                                       "finalizers": (obj.get("spec") or {}).get("finalizers") or []}}
        else:
            raise errors.StatusError(404, f"the server could not find the requested resource ({subresource})")
        meta = obj.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["name"] = name
        if rtype.namespaced:
            meta["namespace"] = ns
        if meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                raise errors.invalid(rtype.kind, rtype.group, name, [Cause(
                    "metadata.finalizers", "Forbidden: no new finalizers can be added if the object is being "
                                           "deleted", "FieldValueForbidden")])
        if "generation" in old_meta and spec_fields(rtype, obj) != spec_fields(rtype, old):
            meta["generation"] = int(old_meta.get("generation") or 1) + 1
        causes = self.strategies.prepare_update(rtype, obj, old) if subresource != "status" else []
        if causes:
            raise errors.invalid(rtype.kind, rtype.group, name, causes)
        request = AdmissionRequest("UPDATE", rtype, ns, name, obj, old, ctx, subresource)
        obj = await self._admit(request) or obj
        obj = self._validate_schema(rtype, obj, ctx, name)
        await self._validate_admission(request)
        if rtype.key == "apiextensions.k8s.io/customresourcedefinitions" and subresource == "":
            self._prepare_crd(obj, old)
        elif rtype.key == "apiextensions.k8s.io/customresourcedefinitions":  # a migration rewrites storedVersions
            stored = list((obj.get("status") or {}).get("storedVersions") or [])
            storage = next((v["name"] for v in obj["spec"].get("versions") or [] if v.get("storage")), "")
            causes = _stored_version_causes(obj["spec"], stored)
            if storage and storage not in stored:
                listed = ", ".join(f'"{v}"' for v in stored)
                causes.append(Cause("status.storedVersions", f"Invalid value: []string{{{listed}}}: must have the "
                                                             f"storage version {storage}"))
            if causes:
                raise errors.invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, causes)
        current = self.store.get(rtype.key, ns, name)
        if current is None:
            raise errors.not_found(rtype.plural, rtype.group, name)
        if current.rv != entry.rv:
            if precondition is not None:
                raise _Retry()
            raise errors.stale(rtype.plural, rtype.group, name)
        obj["metadata"]["resourceVersion"] = str(entry.rv)
        if obj == old:
            return old  # a no-op write neither bumps resourceVersion nor wakes watchers
        if ctx.dry_run:
            return obj
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not (
                rtype.kind == "Namespace" and (obj.get("spec") or {}).get("finalizers")):
            return self._remove(rtype, ns, name)
        storage = self._storage(rtype)
        stored = to_storage(rtype, obj, storage) if needs_conversion(rtype, storage.api_version) else obj
        new_entry = self.store.put(rtype.key, ns, name, stored)
        self._after_write(rtype, entry, new_entry)
        return self.view(rtype, new_entry)

    # -- delete ------------------------------------------------------------------------------------

    async def delete(self, rtype: ResourceType, namespace: str | None, name: str,
                     options: DeleteOptions | None = None, ctx: RequestContext | None = None) -> Obj:
        options = options or DeleteOptions()
        ctx = ctx or RequestContext()
        ns = self._ns(rtype, namespace)
        entry = self._current(rtype, ns, name)
        obj = self.view(rtype, entry)
        meta = obj["metadata"]
        if options.uid and options.uid != meta.get("uid"):
            raise errors.conflict(rtype.plural, rtype.group, name,
                                  f"Precondition failed: UID in precondition: {options.uid}, UID in object meta: "
                                  f"{meta.get('uid')}")
        if options.resource_version and options.resource_version != str(entry.rv):
            raise errors.conflict(rtype.plural, rtype.group, name,
                                  f"Precondition failed: ResourceVersion in precondition: "
                                  f"{options.resource_version}, ResourceVersion in object meta: {entry.rv}")
        await self._validate_admission(AdmissionRequest("DELETE", rtype, ns, name, None, obj, ctx))
        if ctx.dry_run:
            return obj
        finalizers = list(meta.get("finalizers") or [])
        policy = options.propagation
        if policy == "Foreground" and FOREGROUND not in finalizers:
            finalizers.append(FOREGROUND)
        elif policy == "Orphan" and ORPHAN not in finalizers:
            finalizers.append(ORPHAN)
        graceful = self._graceful(rtype, obj, options)
        namespace_like = rtype.key == "/namespaces"
        if finalizers or graceful is not None or namespace_like:
            if meta.get("deletionTimestamp") and finalizers == list(meta.get("finalizers") or []) and \
                    graceful is None:
                return obj
            new = orjson.loads(entry.raw)
            new_meta = new["metadata"]
            if not new_meta.get("deletionTimestamp"):
                stamp = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=graceful or 0)
                new_meta["deletionTimestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
                new_meta["deletionGracePeriodSeconds"] = graceful or 0
            elif graceful is not None:
                new_meta["deletionGracePeriodSeconds"] = min(graceful, new_meta.get("deletionGracePeriodSeconds", 0))
            if finalizers:
                new_meta["finalizers"] = finalizers
            if namespace_like:
                new.setdefault("status", {})["phase"] = "Terminating"
            new_entry = self.store.put(rtype.key, ns, name, new)
            self._after_write(rtype, entry, new_entry)
            return self.view(rtype, new_entry)
        return self._remove(rtype, ns, name)

    def _graceful(self, rtype: ResourceType, obj: Obj, options: DeleteOptions) -> int | None:
        """Pods bound to a node are deleted gracefully: the node stops them, then deletes them for good."""
        if rtype.key != "/pods" or not (obj.get("spec") or {}).get("nodeName"):
            return None
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed") and options.grace_period is None:
            grace = 0
        else:
            grace = options.grace_period
            if grace is None:
                grace = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        return grace if grace > 0 else None

    def _remove(self, rtype: ResourceType, ns: str, name: str) -> Obj:
        entry = self.store.remove(rtype.key, ns, name)
        if entry is None:
            raise errors.not_found(rtype.plural, rtype.group, name)
        obj = self.view(rtype, entry)
        self.strategies.released(rtype, obj)
        if rtype.key == "apiextensions.k8s.io/customresourcedefinitions":
            self._drop_custom_resources(obj)
        return obj

    def _drop_custom_resources(self, crd: Obj) -> None:
        """Deleting a CRD deletes its objects and stops serving it."""
        spec = crd.get("spec") or {}
        key = f"{spec.get('group')}/{(spec.get('names') or {}).get('plural')}"
        for item_ns, item_name, _ in self.store.items(key):
            self.store.remove(key, item_ns, item_name)
        self.registry.unregister_crd(crd["metadata"]["name"])
        for hook in self.on_crd_change:
            hook(crd, True)

    async def delete_collection(self, rtype: ResourceType, namespace: str | None, labels: LabelSelector,
                                fields: FieldSelector, options: DeleteOptions, ctx: RequestContext) -> list[Obj]:
        page = self.list(rtype, namespace, labels, fields)
        deleted = []
        for entry in page.entries:
            obj = entry.obj()
            meta = obj["metadata"]
            try:
                deleted.append(await self.delete(rtype, meta.get("namespace"), meta["name"], options, ctx))
            except StatusError as exc:
                if exc.code != 404:
                    raise
        return deleted

    # -- CRDs --------------------------------------------------------------------------------------

    def _prepare_crd(self, obj: Obj, old: Obj | None = None) -> None:
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        causes = []
        expected = f"{names.get('plural')}.{spec.get('group')}"
        if obj["metadata"]["name"] != expected:
            causes.append(Cause("metadata.name", f'Invalid value: "{obj["metadata"]["name"]}": must be '
                                                 f"spec.names.plural+\".\"+spec.group"))
        if not spec.get("versions"):
            causes.append(Cause("spec.versions", "Invalid value: must have exactly one version marked as storage "
                                                 "version"))
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            causes.append(Cause("spec.scope", f'Unsupported value: "{spec.get("scope")}": supported values: '
                                              '"Cluster", "Namespaced"', "FieldValueNotSupported"))
        stored = sorted({v["name"] for v in spec.get("versions") or [] if v.get("storage")} |
                        set(((old or {}).get("status") or {}).get("storedVersions") or []))
        causes += _stored_version_causes(spec, stored)
        if causes:
            raise errors.invalid("CustomResourceDefinition", "apiextensions.k8s.io", obj["metadata"]["name"], causes)
        stamp = now()
        status = obj.setdefault("status", {})
        status["acceptedNames"] = {k: v for k, v in names.items()}
        status["storedVersions"] = stored
        status["conditions"] = [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": stamp},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": stamp},
        ]

    def _after_write(self, rtype: ResourceType, old: Entry | None, new: Entry) -> None:
        if rtype.key == "apiextensions.k8s.io/customresourcedefinitions":
            obj = new.obj()
            self.registry.register_crd(obj)
            for hook in self.on_crd_change:
                hook(obj, False)

    # -- watch -------------------------------------------------------------------------------------

    async def watch(self, rtype: ResourceType, namespace: str | None = None, resource_version: str = "",
                    labels: LabelSelector | None = None, fields: FieldSelector | None = None,
                    bookmarks: bool = False, bookmark_interval: float = 10.0,
                    timeout: float | None = None) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version`; from "" or "0", first a synthetic ADDED per current object."""
        ns = namespace if rtype.namespaced and namespace else None
        labels = labels or LabelSelector()
        fields = fields or FieldSelector()

        def matches(entry: Entry, item_ns: str, item_name: str) -> bool:
            if ns is not None and item_ns != ns:
                return False
            if not labels.empty and not labels.matches(entry.labels):
                return False
            return fields.empty or self._fields_match(rtype, fields, item_ns, item_name, entry)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        with self.store.subscribe(rtype.key) as sub:
            last = self.store.rv
            backlog: list[Change] = []
            if resource_version in ("", "0"):
                for item_ns, item_name, entry in self.store.items(rtype.key, ns):
                    if matches(entry, item_ns, item_name):
                        yield WatchEvent(ADDED, entry=entry, rv=entry.rv)
            else:
                try:
                    start = int(resource_version)
                except ValueError as exc:
                    raise errors.bad_request(f"invalid resource version: {resource_version}") from exc
                try:
                    backlog = list(self.store.history_since(start, rtype.key))
                except TooOld as exc:
                    yield WatchEvent("ERROR", obj=errors.gone(str(exc)).body())
                    return
                last = start
            for change in backlog:
                event = self._event_for(change, matches)
                last = change.rv
                if event:
                    yield event
            next_bookmark = loop.time() + bookmark_interval
            while True:
                wait = None
                if bookmarks:
                    wait = max(0.0, next_bookmark - loop.time())
                if deadline is not None:
                    remaining = max(0.0, deadline - loop.time())
                    wait = remaining if wait is None else min(wait, remaining)
                try:
                    change = await asyncio.wait_for(sub.queue.get(), wait) if wait is not None else \
                        await sub.queue.get()
                except TimeoutError:
                    if deadline is not None and loop.time() >= deadline:
                        return
                    next_bookmark = loop.time() + bookmark_interval
                    yield WatchEvent("BOOKMARK", rv=max(last, self.store.rv))
                    continue
                if change is None:
                    return  # overflow or shutdown: the client re-watches from its last resourceVersion
                if change.rv <= last:
                    continue
                last = change.rv
                event = self._event_for(change, matches)
                if event:
                    yield event

    @staticmethod
    def _event_for(change: Change, matches: Callable[[Entry, str, str], bool]) -> WatchEvent | None:
        now_match = matches(change.entry, change.namespace, change.name)
        if change.type == DELETED:
            was = change.previous is not None and matches(change.previous, change.namespace, change.name)
            return WatchEvent(DELETED, entry=change.entry, rv=change.rv) if was or now_match else None
        was_match = change.previous is not None and matches(change.previous, change.namespace, change.name)
        if now_match and was_match:
            return WatchEvent(MODIFIED, entry=change.entry, rv=change.rv)
        if now_match:
            return WatchEvent(ADDED, entry=change.entry, rv=change.rv)
        if was_match:
            return WatchEvent(DELETED, entry=change.entry, rv=change.rv)
        return None


class _Retry(Exception):
    """The object changed while a patch was being admitted; apply the patch again."""



def _stored_version_causes(spec: Obj, stored: list[str]) -> list[Cause]:
    """kube-apiserver's rule: every version objects may still be stored in (status.storedVersions) stays
    declared in spec.versions, served or not, until a migration drops it from storedVersions."""
    declared = {v.get("name") for v in spec.get("versions") or []}
    return [Cause(f"status.storedVersions[{i}]", f'Invalid value: "{version}": must appear in spec.versions')
            for i, version in enumerate(stored) if version not in declared]
