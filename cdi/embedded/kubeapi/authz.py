"""RBAC authorization, evaluated as kube-apiserver's RBAC authorizer does: ClusterRoleBindings and
RoleBindings grant Roles and ClusterRoles (with aggregation rules) to users, groups and service
accounts; `system:masters` may do anything. Also the bootstrap roles every cluster has."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cdi.embedded.kubeapi.objects import UserInfo
from cdi.embedded.kubeapi.selectors import label_selector_from_object
from cdi.embedded.kubeapi.store import Store

CLUSTER_ROLES = "rbac.authorization.k8s.io/clusterroles"
CLUSTER_ROLE_BINDINGS = "rbac.authorization.k8s.io/clusterrolebindings"
ROLES = "rbac.authorization.k8s.io/roles"
ROLE_BINDINGS = "rbac.authorization.k8s.io/rolebindings"


@dataclass(frozen=True)
class Attributes:
    """What a request asks to do, in the terms RBAC rules are written in."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""  # for non-resource requests

    @property
    def is_resource(self) -> bool:
        return bool(self.resource)

    def describe(self, user: UserInfo) -> str:
        """The message kube-apiserver gives when it forbids a request."""
        if not self.is_resource:
            return f'forbidden: User "{user.name}" cannot {self.verb} path "{self.path}"'
        resource = self.resource + (f"/{self.subresource}" if self.subresource else "")
        qualified = f"{self.resource}.{self.group}" if self.group else self.resource
        target = f'{qualified} "{self.name}"' if self.name else qualified
        where = f' in the namespace "{self.namespace}"' if self.namespace else " at the cluster scope"
        return (f'{target} is forbidden: User "{user.name}" cannot {self.verb} resource "{resource}" in API group '
                f'"{self.group}"{where}')


def _matches(values: Iterable[str], wanted: str) -> bool:
    return any(v in ("*", wanted) for v in values)


def _rule_allows(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    if not _matches(rule.get("verbs") or [], attrs.verb):
        return False
    if not attrs.is_resource:
        return any(url in ("*", attrs.path) or (url.endswith("*") and attrs.path.startswith(url[:-1]))
                   for url in rule.get("nonResourceURLs") or [])
    if not _matches(rule.get("apiGroups") or [], attrs.group):
        return False
    resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
    resources = rule.get("resources") or []
    if not (_matches(resources, resource) or (attrs.subresource and f"*/{attrs.subresource}" in resources)):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _subject_matches(subject: Mapping[str, Any], user: UserInfo, binding_namespace: str) -> bool:
    kind = subject.get("kind")
    if kind == "User":
        return subject.get("name") == user.name
    if kind == "Group":
        return subject.get("name") in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{namespace}:{subject.get('name')}"
    return False


class RbacAuthorizer:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _cluster_role_rules(self, name: str) -> list[Mapping[str, Any]]:
        entry = self.store.get(CLUSTER_ROLES, "", name)
        if entry is None:
            return []
        role = entry.obj()
        rules = list(role.get("rules") or [])
        aggregation = role.get("aggregationRule") or {}
        for selector in aggregation.get("clusterRoleSelectors") or []:
            chosen = label_selector_from_object(selector)
            for _, other_name, other in self.store.items(CLUSTER_ROLES):
                if other_name != name and chosen.matches(other.labels):
                    rules.extend(other.obj().get("rules") or [])
        return rules

    def _role_rules(self, ref: Mapping[str, Any], namespace: str) -> list[Mapping[str, Any]]:
        if ref.get("kind") == "ClusterRole":
            return self._cluster_role_rules(str(ref.get("name")))
        entry = self.store.get(ROLES, namespace, str(ref.get("name")))
        return list(entry.obj().get("rules") or []) if entry else []

    def allowed(self, user: UserInfo, attrs: Attributes) -> bool:
        if "system:masters" in user.groups:
            return True
        for _, _, entry in self.store.items(CLUSTER_ROLE_BINDINGS):
            binding = entry.obj()
            if any(_subject_matches(s, user, "") for s in binding.get("subjects") or []) and \
                    any(_rule_allows(r, attrs) for r in self._role_rules(binding.get("roleRef") or {}, "")):
                return True
        if attrs.namespace:
            for _, _, entry in self.store.items(ROLE_BINDINGS, attrs.namespace):
                binding = entry.obj()
                if any(_subject_matches(s, user, attrs.namespace) for s in binding.get("subjects") or []) and \
                        any(_rule_allows(r, attrs) for r in
                            self._role_rules(binding.get("roleRef") or {}, attrs.namespace)):
                    return True
        return False


_READ = ["get", "list", "watch"]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]


def _role(name: str, rules: list[dict[str, Any]], aggregate_to: tuple[str, ...] = (),
          aggregate_from: str | None = None) -> dict[str, Any]:
    role: dict[str, Any] = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                            "rules": rules}
    for target in aggregate_to:
        role["metadata"]["labels"][f"rbac.authorization.k8s.io/aggregate-to-{target}"] = "true"
    if aggregate_from:
        role["aggregationRule"] = {"clusterRoleSelectors": [
            {"matchLabels": {f"rbac.authorization.k8s.io/aggregate-to-{aggregate_from}": "true"}}]}
    return role


def bootstrap_policy() -> list[dict[str, Any]]:
    """The default ClusterRoles and ClusterRoleBindings of a fresh cluster (a useful subset)."""
    core_namespaced = ["pods", "pods/log", "persistentvolumeclaims", "services", "endpoints", "configmaps",
                       "secrets", "serviceaccounts", "events"]
    roles = [
        _role("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                                {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        _role("admin", [], aggregate_from="admin"),
        _role("edit", [], aggregate_to=("admin",), aggregate_from="edit"),
        _role("view", [], aggregate_to=("edit",), aggregate_from="view"),
        _role("system:aggregate-to-view", [
            {"apiGroups": [""], "resources": [r for r in core_namespaced if r != "secrets"], "verbs": _READ},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": _READ},
            {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"], "verbs": _READ},
        ], aggregate_to=("view",)),
        _role("system:aggregate-to-edit", [
            {"apiGroups": [""], "resources": core_namespaced, "verbs": _READ + _WRITE},
            {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"], "verbs": _READ + _WRITE},
        ], aggregate_to=("edit",)),
        _role("system:aggregate-to-admin", [
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
             "verbs": _READ + _WRITE},
        ], aggregate_to=("admin",)),
        _role("system:discovery", [{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz",
                                                        "/livez", "/readyz", "/openapi", "/openapi/*", "/version",
                                                        "/version/"], "verbs": ["get"]}]),
        _role("system:basic-user", [
            {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews",
                                                                  "selfsubjectrulesreviews"], "verbs": ["create"]}]),
    ]
    bindings = [
        ("cluster-admin", "cluster-admin", "system:masters"),
        ("system:discovery", "system:discovery", "system:authenticated"),
        ("system:basic-user", "system:basic-user", "system:authenticated"),
    ]
    return roles + [{
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
    } for name, role, group in bindings]
