"""Typed read-only views over object bodies.

Objects travel as the plain dicts the API server sends; a view gives typed, named access to the
fields the code reads without copying or re-modelling them, so unknown fields survive a round trip
and no generated model needs to keep up with the API."""

from collections.abc import Mapping
from typing import Any

from cdi.api.quantity import parse_bytes

Body = Mapping[str, Any]


def dig(body: Body | None, *path: str | int) -> Any:
    """The value at `path` in nested dicts/lists, or None where any step is missing."""
    node: Any = body
    for step in path:
        if isinstance(step, int):
            if not isinstance(node, list) or not -len(node) <= step < len(node):
                return None
            node = node[step]
        else:
            if not isinstance(node, Mapping):
                return None
            node = node.get(step)
        if node is None:
            return None
    return node


class ObjectView:
    """Metadata accessors common to every kind."""

    __slots__ = ("raw",)

    def __init__(self, raw: Body) -> None:
        self.raw = raw

    @property
    def metadata(self) -> Body:
        meta = self.raw.get("metadata")
        return meta if isinstance(meta, Mapping) else {}

    @property
    def name(self) -> str:
        return str(self.metadata.get("name") or "")

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def uid(self) -> str:
        return str(self.metadata.get("uid") or "")

    @property
    def resource_version(self) -> str:
        return str(self.metadata.get("resourceVersion") or "")

    @property
    def generation(self) -> int:
        return int(self.metadata.get("generation") or 0)

    @property
    def creation_timestamp(self) -> str:
        return str(self.metadata.get("creationTimestamp") or "")

    @property
    def spec(self) -> Body:
        spec = self.raw.get("spec")
        return spec if isinstance(spec, Mapping) else {}

    @property
    def status(self) -> Body:
        status = self.raw.get("status")
        return status if isinstance(status, Mapping) else {}

    @property
    def labels(self) -> Mapping[str, str]:
        return self.metadata.get("labels") or {}

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.metadata.get("annotations") or {}

    @property
    def owner_references(self) -> list[Body]:
        return list(self.metadata.get("ownerReferences") or [])

    @property
    def deleting(self) -> bool:
        return bool(self.metadata.get("deletionTimestamp"))

    def owned_by(self, uid: str) -> bool:
        return any(ref.get("uid") == uid for ref in self.owner_references)

    def controller_ref(self) -> Body | None:
        for ref in self.owner_references:
            if ref.get("controller"):
                return ref
        return None


class DataVolumeView(ObjectView):
    __slots__ = ()

    @property
    def source(self) -> Body:
        return self.spec.get("source") or {}

    @property
    def source_ref(self) -> Body | None:
        """`spec.sourceRef` (a DataSource the clone source is resolved through), None when unset."""
        return self.spec.get("sourceRef")

    @property
    def source_kind(self) -> str | None:
        """The one key set in spec.source (http, s3, registry, blank, upload, pvc, ...)."""
        kinds = [k for k, v in self.source.items() if v is not None]
        return kinds[0] if len(kinds) == 1 else None

    @property
    def content_type(self) -> str:
        return str(self.spec.get("contentType") or "kubevirt")

    @property
    def storage_spec(self) -> Body | None:
        return self.spec.get("storage")

    @property
    def pvc_spec(self) -> Body | None:
        return self.spec.get("pvc")

    @property
    def requested_size(self) -> int | None:
        claim = self.storage_spec or self.pvc_spec or {}
        size = dig(claim, "resources", "requests", "storage")
        return parse_bytes(size) if size is not None else None

    @property
    def phase(self) -> str:
        return str(self.status.get("phase") or "")


class ClaimView(ObjectView):
    """A PersistentVolumeClaim: what the worker-pod reconcilers read of it."""

    __slots__ = ()

    @property
    def phase(self) -> str:
        return str(self.status.get("phase") or "")

    @property
    def bound(self) -> bool:
        return self.phase == "Bound"

    @property
    def storage_class(self) -> str:
        return str(self.spec.get("storageClassName") or "")

    @property
    def block(self) -> bool:
        return self.spec.get("volumeMode") == "Block"

    @property
    def volume_mode(self) -> str:
        """`spec.volumeMode`, Filesystem when unset (the API server's default)."""
        return str(self.spec.get("volumeMode") or "Filesystem")

    @property
    def volume_name(self) -> str:
        """The PersistentVolume it is bound to ("" while unbound)."""
        return str(self.spec.get("volumeName") or "")

    @property
    def requested_storage(self) -> str:
        """`spec.resources.requests.storage` as written ("" when unset)."""
        return str(dig(self.spec, "resources", "requests", "storage") or "")

    @property
    def capacity(self) -> str:
        """`status.capacity.storage` as written ("" while unbound)."""
        return str(dig(self.status, "capacity", "storage") or "")

    @property
    def data_source_ref(self) -> Body:
        """What populates it: `spec.dataSourceRef`, else `spec.dataSource` ({} when neither is set)."""
        ref = self.spec.get("dataSourceRef") or self.spec.get("dataSource")
        return ref if isinstance(ref, Mapping) else {}

    @property
    def populator_ref(self) -> Body:
        """`spec.dataSourceRef` alone ({} when unset): the populator that fills it (CDI's
        IsPVCDataSourceRefKind and CheckPVCUsingPopulators read only this field, not `spec.dataSource`)."""
        ref = self.spec.get("dataSourceRef")
        return ref if isinstance(ref, Mapping) else {}


class PersistentVolumeView(ObjectView):
    """A PersistentVolume: the claim it is bound to."""

    __slots__ = ()

    @property
    def claim_ref(self) -> Body:
        """`spec.claimRef` ({} while it is available)."""
        ref = self.spec.get("claimRef")
        return ref if isinstance(ref, Mapping) else {}

    @property
    def storage_class(self) -> str:
        return str(self.spec.get("storageClassName") or "")

    @property
    def access_modes(self) -> list[str]:
        return [str(mode) for mode in self.spec.get("accessModes") or []]

    @property
    def volume_mode(self) -> str:
        """`spec.volumeMode`, Filesystem when unset (the API server's default)."""
        return str(self.spec.get("volumeMode") or "Filesystem")

    @property
    def capacity(self) -> str:
        """`spec.capacity.storage` as written ("" when unset)."""
        return str(dig(self.spec, "capacity", "storage") or "")

    @property
    def phase(self) -> str:
        return str(self.status.get("phase") or "")


class PodView(ObjectView):
    """A pod: phase, container states and the claims it mounts."""

    __slots__ = ()

    @property
    def phase(self) -> str:
        return str(dig(self.raw, "status", "phase") or "")

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def container_statuses(self) -> list[Body]:
        return list(dig(self.raw, "status", "containerStatuses") or [])

    @property
    def conditions(self) -> list[Body]:
        return list(dig(self.raw, "status", "conditions") or [])

    @property
    def containers(self) -> list[Body]:
        return list(self.spec.get("containers") or [])

    @property
    def volumes(self) -> list[Body]:
        return list(self.spec.get("volumes") or [])

    def volume(self, name: str) -> Body | None:
        """The volume called `name` (None when the pod has none)."""
        return next((v for v in self.volumes if v.get("name") == name), None)

    def configmap_of(self, volume: str) -> str:
        """The ConfigMap the volume `volume` mounts ("" when it is absent or not a ConfigMap volume)."""
        return str(dig(self.volume(volume), "configMap", "name") or "")

    def secret_of(self, volume: str) -> str:
        """The Secret the volume `volume` mounts ("" when it is absent or not a Secret volume)."""
        return str(dig(self.volume(volume), "secret", "secretName") or "")

    @property
    def claim_names(self) -> list[str]:
        """The claims its volumes mount."""
        return [str(name) for v in self.volumes if (name := dig(v, "persistentVolumeClaim", "claimName"))]

    @property
    def pod_ip(self) -> str:
        return str(self.status.get("podIP") or "")

    @property
    def first_terminated(self) -> Body | None:
        """The first container's `state.terminated` (None while it runs or has not started)."""
        statuses = self.container_statuses
        terminated = dig(statuses[0], "state", "terminated") if statuses else None
        return terminated if isinstance(terminated, Mapping) else None

    def owned_by_claim(self, name: str) -> bool:
        return any(r.get("kind") == "PersistentVolumeClaim" and r.get("name") == name
                   for r in self.owner_references)


class DataSourceView(ObjectView):
    """A DataSource: the PVC, snapshot or DataSource its `spec.source` names."""

    __slots__ = ()

    @property
    def source(self) -> Body:
        return self.spec.get("source") or {}

    def source_of(self, kind: str) -> Body | None:
        """`spec.source.<kind>` (pvc, snapshot or dataSource), None when unset."""
        ref = self.source.get(kind)
        return ref if isinstance(ref, Mapping) else None


class SnapshotView(ObjectView):
    """A VolumeSnapshot: whether it can be restored, and to what size."""

    __slots__ = ()

    @property
    def ready_to_use(self) -> bool:
        return self.status.get("readyToUse") is True

    @property
    def restore_size(self) -> str:
        """`status.restoreSize` as written ("" until the snapshotter reports it)."""
        return str(self.status.get("restoreSize") or "")

    @property
    def content_name(self) -> str:
        """The VolumeSnapshotContent it is bound to ("" while unbound)."""
        return str(self.status.get("boundVolumeSnapshotContentName") or "")


class SnapshotContentView(ObjectView):
    """A VolumeSnapshotContent: the driver that took it and the mode of the volume it came from."""

    __slots__ = ()

    @property
    def driver(self) -> str:
        return str(self.spec.get("driver") or "")

    @property
    def source_volume_mode(self) -> str:
        """`spec.sourceVolumeMode` ("" when the snapshotter did not record it)."""
        return str(self.spec.get("sourceVolumeMode") or "")


class StorageProfileView(ObjectView):
    """A StorageProfile: the clone strategy and snapshot class it settles on for its storage class."""

    __slots__ = ()

    @property
    def clone_strategy(self) -> str:
        return str(self.status.get("cloneStrategy") or "")

    @property
    def snapshot_class(self) -> str:
        return str(self.status.get("snapshotClass") or "")

    @property
    def claim_property_sets(self) -> list[Body]:
        """`status.claimPropertySets`: the access and volume modes its storage class works with, preferred first."""
        return list(self.status.get("claimPropertySets") or [])

    @property
    def import_source_format(self) -> str:
        """`status.dataImportCronSourceFormat`: what a DataImportCron keeps (pvc, the default, or snapshot)."""
        return str(self.status.get("dataImportCronSourceFormat") or "pvc")


class CDIView(ObjectView):
    """The `CDI` resource: the installation's settings the controller and `cdi up` read besides the operator."""

    __slots__ = ()

    @property
    def cert_config(self) -> Body:
        """`spec.certConfig` ({} when unset): the certificates' lifetimes (`cdi.common.certconfig` reads it)."""
        config = self.spec.get("certConfig")
        return config if isinstance(config, Mapping) else {}

    @property
    def clone_strategy_override(self) -> str:
        """`spec.cloneStrategyOverride` ("" when unset): the strategy every clone uses, whatever the profiles say."""
        return str(self.spec.get("cloneStrategyOverride") or "")


class DataImportCronView(ObjectView):
    """A DataImportCron: its schedule, the DataVolume template it imports with, and what it keeps."""

    __slots__ = ()

    @property
    def managed_data_source(self) -> str:
        return str(self.spec.get("managedDataSource") or "")

    @property
    def schedule(self) -> str:
        return str(self.spec.get("schedule") or "")

    @property
    def template(self) -> Body:
        """`spec.template`, the DataVolume each import is made from ({} when unset)."""
        template = self.spec.get("template")
        return template if isinstance(template, Mapping) else {}

    @property
    def template_spec(self) -> Body:
        return self.template.get("spec") or {}

    @property
    def retention_policy(self) -> str:
        return str(self.spec.get("retentionPolicy") or "")

    @property
    def garbage_collect(self) -> str:
        """`spec.garbageCollect`, Outdated when unset (CDI's default)."""
        return str(self.spec.get("garbageCollect") or "Outdated")

    @property
    def imports_to_keep(self) -> int | None:
        keep = self.spec.get("importsToKeep")
        return None if keep is None else int(keep)

def condition(body: Body, type_: str) -> Body | None:
    for cond in dig(body, "status", "conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == type_:
            return cond
    return None
