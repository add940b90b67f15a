"""The DataSource reconciler and the `sourceRef` resolution clones use, as CDI's
datasource-controller: a DataSource names a PVC, a VolumeSnapshot, or another DataSource (one level
of indirection, same namespace); its `Ready` condition says whether what it names can be cloned now,
and `status.source` holds the resolved source while it is ready (empty otherwise)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api import groups
from cdi.api.views import DataSourceView, DataVolumeView, ObjectView, SnapshotView
from cdi.controller import conditions
from cdi.controller.runtime import Reconciler, write_status
from cdi.controller.watches import Watch
from cdi.kube import object_key

Obj = dict[str, Any]
Body = Mapping[str, Any]
Lookup = Callable[[groups.GVR, str, str], Obj | None]

# reasons of the Ready condition (CDI's constants)
READY = "Ready"
NO_SOURCE = "NoSource"
NOT_FOUND = "NotFound"
SNAPSHOT_NOT_READY = "SnapshotNotReady"
MAX_REFERENCE_DEPTH_REACHED = "MaxReferenceDepthReached"
SELF_REFERENCE = "SelfReference"
CROSS_NAMESPACE_REFERENCE = "CrossNamespaceReference"
READY_MESSAGE = "DataSource is ready to be consumed"


class ChainError(Exception):
    """A DataSource reference chain that cannot be followed; `reason` is the Ready condition's."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class CloneSource:
    """What a clone reads: `kind` is `pvc` or `snapshot`, in `namespace`."""

    kind: str
    namespace: str
    name: str


def resolve_chain(data_source: Body, lookup: Lookup) -> Body:
    """The DataSource that holds the real source: `data_source` itself, or the one it names (CDI's
    ResolveDataSourceChain: at most one level, never itself, never in another namespace)."""
    view = DataSourceView(data_source)
    ref = view.source_of("dataSource")
    if ref is None:
        return data_source
    namespace = view.namespace
    ref_namespace = str(ref.get("namespace") or namespace)
    if ref_namespace != namespace:
        raise ChainError("DataSource cannot reference a DataSource in another namespace", CROSS_NAMESPACE_REFERENCE)
    if ref.get("name") == view.name:
        raise ChainError("DataSource cannot self-reference", SELF_REFERENCE)
    resolved = lookup(groups.DATASOURCES, str(ref.get("name") or ""), ref_namespace)
    if resolved is None:
        raise ChainError(f'datasources.cdi.kubevirt.io "{ref.get("name")}" not found', NOT_FOUND)
    if DataSourceView(resolved).source_of("dataSource") is not None:
        raise ChainError("DataSource reference chain exceeds maximum depth of 1", MAX_REFERENCE_DEPTH_REACHED)
    return resolved


def source_of(data_source: Body) -> CloneSource | None:
    """The PVC or snapshot a resolved DataSource names (namespace defaulting to the DataSource's)."""
    view = DataSourceView(data_source)
    namespace = view.namespace
    for kind in ("pvc", "snapshot"):
        ref = view.source_of(kind)
        if ref is not None and ref.get("name"):
            return CloneSource(kind, str(ref.get("namespace") or namespace), str(ref["name"]))
    return None


def resolve_source_ref(dv: Body, lookup: Lookup) -> CloneSource:
    """The clone source of a DataVolume: `spec.source.pvc`/`snapshot`, or what its `sourceRef`
    DataSource resolves to. Raises ChainError while that cannot be said (DataSource missing, empty
    or a broken chain)."""
    view = DataVolumeView(dv)
    namespace = view.namespace
    ref = view.source_ref
    if ref is None:
        for kind in ("pvc", "snapshot"):
            source = view.source.get(kind)
            if source is not None:
                return CloneSource(kind, str(source.get("namespace") or namespace), str(source.get("name") or ""))
        raise ChainError("no clone source", NO_SOURCE)
    if ref.get("kind") != "DataSource":
        raise ChainError(f"Unsupported sourceRef kind {ref.get('kind')}, currently only DataSource is supported",
                         NO_SOURCE)
    ds_namespace = str(ref.get("namespace") or namespace)
    data_source = lookup(groups.DATASOURCES, str(ref.get("name") or ""), ds_namespace)
    if data_source is None:
        raise ChainError(f'datasources.cdi.kubevirt.io "{ref.get("name")}" not found', NOT_FOUND)
    found = source_of(resolve_chain(data_source, lookup))
    if found is None:
        raise ChainError(f"Empty source field in '{ref.get('name')}'. DataSource may not be ready yet", NO_SOURCE)
    return found


def referenced_keys(data_source: Body) -> list[tuple[str, str]]:
    """(kind, namespace/name) of what a DataSource names, for mapping events back to it."""
    view = DataSourceView(data_source)
    namespace = view.namespace
    out = []
    for kind in ("pvc", "snapshot", "dataSource"):
        ref = view.source_of(kind)
        if ref is not None and ref.get("name"):
            out.append((kind, f"{ref.get('namespace') or namespace}/{ref['name']}"))
    return out


class DataSourceReconciler(Reconciler):
    name = "datasource"

    def lookup(self, gvr: groups.GVR, name: str, namespace: str) -> Obj | None:
        return self.ctx.cached(gvr, name, namespace)

    def referring(self, kind: str, key: str) -> list[str]:
        """Every DataSource that names the `kind` object `key` (a PVC, snapshot, DataVolume of the PVC's
        name, or DataSource)."""
        return [object_key(data_source) for data_source in self.ctx.cached_list(groups.DATASOURCES)
                if (kind, key) in referenced_keys(data_source)]

    def watches(self) -> list[Watch]:
        """A DataSource, and every DataSource naming it; those naming a claim, when the claim or the
        DataVolume of its name changes; those naming a snapshot, when it changes."""
        return [Watch(groups.DATASOURCES, lambda ds: [object_key(ds), *self.referring("dataSource", object_key(ds))]),
                Watch(groups.PVCS, lambda pvc: self.referring("pvc", object_key(pvc))),
                Watch(groups.DATAVOLUMES, lambda dv: self.referring("pvc", object_key(dv))),
                Watch(groups.VOLUMESNAPSHOTS, lambda snapshot: self.referring("snapshot", object_key(snapshot)))]

    async def reconcile(self, key: str) -> float | None:
        namespace, _, name = key.partition("/")
        data_source = self.ctx.cached(groups.DATASOURCES, name, namespace)
        if data_source is None or DataSourceView(data_source).deleting:
            return None
        status: Obj = json.loads(json.dumps(data_source.get("status") or {}))
        found: list[Obj] = [dict(c) for c in status.get("conditions") or []]
        labels: dict[str, str] = {}
        try:
            resolved = resolve_chain(data_source, self.lookup)
            status["source"] = json.loads(json.dumps(DataSourceView(resolved).source))
        except ChainError as exc:
            conditions.update(found, "Ready", "False", str(exc), exc.reason)
            resolved = data_source
        else:
            source = source_of(resolved)
            if source is None:
                conditions.update(found, "Ready", "False", "No source PVC set", NO_SOURCE)
            elif source.kind == "pvc":
                self._pvc_ready(source, found, labels)
            else:
                self._snapshot_ready(source, found, labels)
        ready = conditions.find(found, "Ready")
        if ready is not None and ready.get("status") == "False":
            status["source"] = {}
        status["conditions"] = found
        # the status is written on top of the labels' patch (its resourceVersion), not over it with a 409
        current = await self._copy_labels(data_source, labels)
        if status != (current.get("status") or {}):
            await write_status(self.ctx.client, groups.DATASOURCES, current, status)
        return None

    def _pvc_ready(self, source: CloneSource, found: list[Obj], labels: dict[str, str]) -> None:
        pvc = self.ctx.cached(groups.PVCS, source.name, source.namespace)
        dv = self.ctx.cached(groups.DATAVOLUMES, source.name, source.namespace)
        if dv is None and pvc is None:
            conditions.update(found, "Ready", "False", "PVC not found", NOT_FOUND)
            return
        phase = DataVolumeView(dv).phase if dv is not None else ""
        if dv is not None and phase != "Succeeded":
            conditions.update(found, "Ready", "False", f"Import DataVolume phase {phase}", phase)
            return
        for owner in (dv, pvc):
            if owner is not None:
                labels.update(_allowed_labels(ObjectView(owner).labels))
        conditions.update(found, "Ready", "True", READY_MESSAGE, READY)

    def _snapshot_ready(self, source: CloneSource, found: list[Obj], labels: dict[str, str]) -> None:
        snapshot = self.ctx.cached(groups.VOLUMESNAPSHOTS, source.name, source.namespace)
        if snapshot is None:
            conditions.update(found, "Ready", "False", "Snapshot not found", NOT_FOUND)
        elif SnapshotView(snapshot).ready_to_use:
            labels.update(_allowed_labels(SnapshotView(snapshot).labels))
            conditions.update(found, "Ready", "True", READY_MESSAGE, READY)
        else:
            conditions.update(found, "Ready", "False", "Snapshot phase is not ready", SNAPSHOT_NOT_READY)

    async def _copy_labels(self, data_source: Body, labels: Mapping[str, str]) -> Body:
        """CDI copies kubevirt.io labels (instancetype, preference) from the source onto the DataSource;
        returns the DataSource as it now is."""
        view = DataSourceView(data_source)
        current = view.labels
        missing = {k: v for k, v in labels.items() if current.get(k) != v}
        if not missing:
            return data_source
        patched: Obj = await self.ctx.client.patch(groups.DATASOURCES, view.name,
                                                   {"metadata": {"labels": missing}},
                                                   view.namespace)
        return patched


def _allowed_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Labels `<something>.kubevirt.io/<name>` or `kubevirt.io/<name>` (CDI's validLabelsMatch)."""
    out = {}
    for key, value in labels.items():
        prefix, _, rest = key.partition("/")
        if rest and (prefix == "kubevirt.io" or prefix.endswith(".kubevirt.io")):
            out[key] = value
    return out
