"""The kinds the server serves: a table of built-in Kubernetes kinds plus whatever CRDs define.

A `ResourceType` is one group/version/plural as discovery shows it; several versions of a CRD share
one storage key, as in a real API server."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

STANDARD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = STANDARD_VERBS
    subresources: tuple[str, ...] = ()
    schema: Mapping[str, Any] | None = None
    columns: tuple[Mapping[str, Any], ...] | None = None
    builtin: bool = True
    storage_group: str | None = None  # events.k8s.io events live in core storage
    storage_version: str = ""
    selectable_fields: tuple[str, ...] = ()  # a CRD version's selectableFields, as field selector labels
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Where objects of this type are stored, shared by all versions of a kind."""
        group = self.group if self.storage_group is None else self.storage_group
        return f"{group}/{self.plural}"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def singular_name(self) -> str:
        return self.singular or self.kind.lower()

    @property
    def strategic_merge(self) -> bool:
        return self.builtin

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _core(plural: str, kind: str, namespaced: bool, short: tuple[str, ...] = (), sub: tuple[str, ...] = (),
          cats: tuple[str, ...] = (), verbs: tuple[str, ...] = STANDARD_VERBS) -> ResourceType:
    return ResourceType("", "v1", plural, kind, namespaced, short_names=short, subresources=sub, categories=cats,
                        verbs=verbs)


def _g(group: str, version: str, plural: str, kind: str, namespaced: bool, short: tuple[str, ...] = (),
       sub: tuple[str, ...] = (), verbs: tuple[str, ...] = STANDARD_VERBS, **kw: Any) -> ResourceType:
    return ResourceType(group, version, plural, kind, namespaced, short_names=short, subresources=sub, verbs=verbs,
                        **kw)


BUILTINS: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", False, ("ns",), ("status", "finalize"),
          verbs=("create", "delete", "get", "list", "patch", "update", "watch")),
    _core("pods", "Pod", True, ("po",), ("status", "log", "binding"), ("all",)),
    _core("persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",), ("status",)),
    _core("persistentvolumes", "PersistentVolume", False, ("pv",), ("status",)),
    _core("services", "Service", True, ("svc",), ("status",), ("all",),
          verbs=("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")),
    _core("endpoints", "Endpoints", True, ("ep",)),
    _core("secrets", "Secret", True),
    _core("configmaps", "ConfigMap", True, ("cm",)),
    _core("events", "Event", True, ("ev",)),
    _core("serviceaccounts", "ServiceAccount", True, ("sa",)),
    _core("nodes", "Node", False, ("no",), ("status",)),
    _core("resourcequotas", "ResourceQuota", True, ("quota",), ("status",)),
    _g("events.k8s.io", "v1", "events", "Event", True, ("ev",), storage_group=""),
    _g("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, ("sc",)),
    _g("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False),
    _g("coordination.k8s.io", "v1", "leases", "Lease", True),
    # what an admin puts in front of the upload proxy (CDIConfig `status.uploadProxyURL` names its host);
    # served as objects only: no ingress controller routes them
    _g("networking.k8s.io", "v1", "ingresses", "Ingress", True, ("ing",), ("status",)),
    _g("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
       ("crd", "crds"), ("status",)),
    _g("apiregistration.k8s.io", "v1", "apiservices", "APIService", False, (), ("status",)),
    _g("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    _g("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    _g("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _g("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _g("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration",
       False),
    _g("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False),
    _g("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False, verbs=("create",)),
    _g("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
       verbs=("create",)),
    _g("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview", False,
       verbs=("create",)),
    _g("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False, verbs=("create",)),
    _g("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False, verbs=("create",)),
)


class Registry:
    """Lookup of served types by path and by storage key."""

    def __init__(self) -> None:
        self._by_path: dict[tuple[str, str, str], ResourceType] = {}
        self._crd_types: dict[str, list[ResourceType]] = {}
        self._storage_cache: dict[str, ResourceType | None] = {}
        for rtype in BUILTINS:
            self._add(rtype)

    def _add(self, rtype: ResourceType) -> None:
        self._storage_cache.clear()
        self._by_path[(rtype.group, rtype.version, rtype.plural)] = rtype

    def _remove(self, rtype: ResourceType) -> None:
        self._storage_cache.clear()
        self._by_path.pop((rtype.group, rtype.version, rtype.plural), None)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_path.get((group, version, plural))

    def storage_type(self, key: str) -> ResourceType | None:
        """The preferred type stored under `key` (the storage version of a CRD, core events)."""
        if key not in self._storage_cache:
            self._storage_cache[key] = self._find_storage_type(key)
        return self._storage_cache[key]

    def _find_storage_type(self, key: str) -> ResourceType | None:
        preferred = None
        for rtype in self._by_path.values():
            if rtype.key == key and rtype.storage_group is None:
                if rtype.builtin or rtype.version == rtype.storage_version:
                    return rtype
                preferred = preferred or rtype
        return preferred

    def all(self) -> Iterable[ResourceType]:
        return list(self._by_path.values())

    def groups(self) -> dict[str, list[str]]:
        """Group name → served versions, preferred version first (discovery order)."""
        out: dict[str, list[str]] = {}
        for rtype in self._by_path.values():
            versions = out.setdefault(rtype.group, [])
            if rtype.version not in versions:
                versions.append(rtype.version)
        return out

    def ordered_groups(self) -> list[tuple[str, list[str]]]:
        """Groups in discovery order (core, built-in, then CRD groups; kubectl resolves short names in
        that order), each with its versions GA first, then beta, then alpha."""
        groups = self.groups()
        builtin = {t.group for t in self._by_path.values() if t.builtin}
        ordered = sorted(groups.items(), key=lambda kv: (kv[0] != "", kv[0] not in builtin, kv[0]))
        return [(name, sorted(versions, key=_version_priority)) for name, versions in ordered]

    def types_in(self, group: str, version: str) -> list[ResourceType]:
        return [t for (g, v, _), t in self._by_path.items() if g == group and v == version]

    def register_crd(self, crd: Mapping[str, Any]) -> list[ResourceType]:
        """Serve the versions a CRD declares; replaces what an earlier revision of it served."""
        name = crd["metadata"]["name"]
        self.unregister_crd(name)
        spec = crd["spec"]
        names = spec["names"]
        storage_version = next((v["name"] for v in spec["versions"] if v.get("storage")), spec["versions"][0]["name"])
        types = []
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            sub = tuple(sorted((version.get("subresources") or {}).keys()))
            rtype = ResourceType(
                group=spec["group"], version=version["name"], plural=names["plural"], kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced", singular=names.get("singular", ""),
                short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
                subresources=sub, schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                columns=tuple(version.get("additionalPrinterColumns") or ()), builtin=False,
                storage_version=storage_version,
                selectable_fields=tuple(str(f.get("jsonPath", "")).lstrip(".")
                                        for f in version.get("selectableFields") or () if f.get("jsonPath")),
            )
            self._add(rtype)
            types.append(rtype)
        self._crd_types[name] = types
        return types

    def unregister_crd(self, name: str) -> list[ResourceType]:
        types = self._crd_types.pop(name, [])
        for rtype in types:
            self._remove(rtype)
        return types


def _version_priority(version: str) -> tuple[int, int, int]:
    match = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if not match:
        return (3, 0, 0)
    major, stage, minor = match.groups()
    return ({None: 0, "beta": 1, "alpha": 2}[stage], -int(major), -int(minor or 0))


def spec_fields(rtype: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an object whose change bumps metadata.generation: everything but metadata, and but
    status where status is a subresource of its own."""
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if rtype.has_status else set())
    return {k: v for k, v in obj.items() if k not in skip}
