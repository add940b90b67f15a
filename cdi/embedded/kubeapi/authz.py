"""RBAC authorization, evaluated as kube-apiserver's RBAC authorizer does: ClusterRoleBindings and
RoleBindings grant Roles and ClusterRoles to users, groups and service accounts; `system:masters` may do
anything. ClusterRoles with an aggregation rule get their rules written by the aggregation controller,
as kube-controller-manager's. Also the bootstrap roles every cluster has."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cdi.embedded.kubeapi.background import BackgroundLoop
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.kubeapi.objects import Objects, RequestContext, UserInfo
from cdi.embedded.kubeapi.selectors import label_selector_from_object
from cdi.embedded.kubeapi.store import Store

log = logging.getLogger(__name__)

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
        return list(entry.obj().get("rules") or []) if entry else []

    def _role_rules(self, ref: Mapping[str, Any], namespace: str) -> list[Mapping[str, Any]]:
        if ref.get("kind") == "ClusterRole":
            return self._cluster_role_rules(str(ref.get("name")))
        entry = self.store.get(ROLES, namespace, str(ref.get("name")))
        return list(entry.obj().get("rules") or []) if entry else []

    def rules_for(self, user: UserInfo, namespace: str) -> Iterator[Mapping[str, Any]]:
        """Every rule granted to `user` in `namespace` (cluster-wide ones first), as kube-apiserver's rule
        resolver visits them: what authorizes requests and what SelfSubjectRulesReview lists."""
        for _, _, entry in self.store.items(CLUSTER_ROLE_BINDINGS):
            binding = entry.obj()
            if any(_subject_matches(s, user, "") for s in binding.get("subjects") or []):
                yield from self._role_rules(binding.get("roleRef") or {}, "")
        if namespace:
            for _, _, entry in self.store.items(ROLE_BINDINGS, namespace):
                binding = entry.obj()
                if any(_subject_matches(s, user, namespace) for s in binding.get("subjects") or []):
                    yield from self._role_rules(binding.get("roleRef") or {}, namespace)

    def allowed(self, user: UserInfo, attrs: Attributes) -> bool:
        if "system:masters" in user.groups:
            return True
        return any(_rule_allows(rule, attrs) for rule in self.rules_for(user, attrs.namespace))


def _semantic(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A rule as Kubernetes' semantic equality compares it: an empty list is the same as none."""
    return {key: value for key, value in rule.items() if value not in (None, [], "")}


def _aggregated_rules(store: Store, role: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rules the aggregation controller gives `role`: those of every other ClusterRole a selector
    of its aggregation rule picks, selector by selector and role by role in name order, each rule once."""
    name = (role.get("metadata") or {}).get("name")
    rules: list[dict[str, Any]] = []
    seen: list[dict[str, Any]] = []
    for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []:
        chosen = label_selector_from_object(selector)
        for _, other_name, other in sorted(store.items(CLUSTER_ROLES), key=lambda item: item[1]):
            if other_name == name or not chosen.matches(other.labels):
                continue
            for rule in other.obj().get("rules") or []:
                if _semantic(rule) not in seen:
                    seen.append(_semantic(rule))
                    rules.append(rule)
    return rules


class RoleAggregation(BackgroundLoop):
    """kube-controller-manager's clusterrole-aggregation controller: writes into each ClusterRole with an
    `aggregationRule` the rules of the ClusterRoles it selects, so that what `kubectl get clusterrole admin
    -o yaml` shows is what RBAC grants. Aggregation chains (`view` into `edit` into `admin`, and CDI's
    roles through them) because each write is a change that triggers the next pass."""

    task_name = "clusterrole-aggregation"

    def __init__(self, objects: Objects) -> None:
        super().__init__()
        self.objects = objects
        self.store = objects.store
        rtype = objects.registry.lookup("rbac.authorization.k8s.io", "v1", "clusterroles")
        assert rtype is not None
        self.rtype = rtype

    async def settle(self) -> None:
        """Passes until nothing changes: at start, so the bootstrap roles are whole before anyone asks
        (bounded, in case selectors chase each other)."""
        for _ in range(1 + self.store.count(CLUSTER_ROLES)):
            if not await self._pass():
                return

    async def _pass(self) -> bool:
        """One pass over the aggregated roles; whether it rewrote any."""
        wrote = False
        for _, name, entry in self.store.items(CLUSTER_ROLES):
            role = entry.obj()
            if not role.get("aggregationRule"):
                continue
            rules = _aggregated_rules(self.store, role)
            if [_semantic(r) for r in rules] == [_semantic(r) for r in role.get("rules") or []]:
                continue
            try:
                await self.objects.update(self.rtype, None, name, {**role, "rules": rules}, RequestContext())
                wrote = True
            except StatusError as exc:  # changed or deleted meanwhile: its own change brings another pass
                log.debug("aggregating ClusterRole %s: %s", name, exc)
        return wrote

    async def _run(self) -> None:
        with self.store.subscribe(CLUSTER_ROLES) as sub:
            await self.settle()  # what changed between the start-up pass and the subscription
            while True:
                await sub.queue.get()
                while not sub.queue.empty():  # a burst of changes needs one pass
                    sub.queue.get_nowait()
                sub.overflowed = False
                try:
                    await self._pass()
                except Exception:  # one bad role must not stop aggregation for the rest
                    log.exception("ClusterRole aggregation failed")


_READ = ["get", "list", "watch"]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]
_BOOTSTRAP = {"kubernetes.io/bootstrapping": "rbac-defaults"}
# kube-apiserver reconciles the bootstrap roles it finds with this annotation at every start
AUTOUPDATE = "rbac.authorization.kubernetes.io/autoupdate"


def _role(name: str, rules: list[dict[str, Any]], aggregate_to: str | None = None,
          aggregate_from: str | None = None) -> dict[str, Any]:
    labels = dict(_BOOTSTRAP)
    if aggregate_to:
        labels[f"rbac.authorization.k8s.io/aggregate-to-{aggregate_to}"] = "true"
    role: dict[str, Any] = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": {"name": name, "labels": labels, "annotations": {AUTOUPDATE: "true"}},
                            "rules": rules}
    if aggregate_from:
        role["aggregationRule"] = {"clusterRoleSelectors": [
            {"matchLabels": {f"rbac.authorization.k8s.io/aggregate-to-{aggregate_from}": "true"}}]}
    return role


def bootstrap_policy() -> list[dict[str, Any]]:
    """The default ClusterRoles and ClusterRoleBindings of a fresh cluster: kube-apiserver's bootstrap
    policy for the kinds this server serves. `admin`, `edit` and `view` are aggregated as there: `view`
    carries the aggregate-to-edit label and `edit` the aggregate-to-admin one, so each includes the next."""
    view = ["pods", "pods/log", "pods/status", "persistentvolumeclaims", "persistentvolumeclaims/status",
            "services", "services/status", "endpoints", "configmaps", "serviceaccounts", "events", "resourcequotas",
            "resourcequotas/status", "namespaces/status"]
    edit = ["pods", "persistentvolumeclaims", "services", "endpoints", "configmaps", "secrets", "serviceaccounts",
            "events"]
    roles = [
        _role("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                                {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        _role("admin", [], aggregate_from="admin"),
        _role("edit", [], aggregate_to="admin", aggregate_from="edit"),
        _role("view", [], aggregate_to="edit", aggregate_from="view"),
        _role("system:aggregate-to-admin", [
            {"apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"], "verbs": ["create"]},
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
             "verbs": _READ + _WRITE},
        ], aggregate_to="admin"),
        _role("system:aggregate-to-edit", [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": _READ},
            {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
            {"apiGroups": [""], "resources": edit, "verbs": _WRITE},
            {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"], "verbs": _READ + _WRITE},
            {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": _WRITE},
        ], aggregate_to="edit"),
        _role("system:aggregate-to-view", [
            {"apiGroups": [""], "resources": view, "verbs": _READ},
            # reading namespaces at the namespace scope: reading *this* namespace
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": _READ},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": _READ},
            {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingresses/status"], "verbs": _READ},
        ], aggregate_to="view"),
        _role("system:discovery", [{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz",
                                                        "/livez", "/readyz", "/openapi", "/openapi/*", "/version",
                                                        "/version/"], "verbs": ["get"]}]),
        _role("system:basic-user", [
            {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews",
                                                                  "selfsubjectrulesreviews"], "verbs": ["create"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}]),
    ]
    bindings = [
        ("cluster-admin", "cluster-admin", "system:masters"),
        ("system:discovery", "system:discovery", "system:authenticated"),
        ("system:basic-user", "system:basic-user", "system:authenticated"),
    ]
    return roles + [{
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": dict(_BOOTSTRAP), "annotations": {AUTOUPDATE: "true"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
    } for name, role, group in bindings]


def reconcile_bootstrap(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any] | None:
    """A stored bootstrap ClusterRole or binding brought up to this version's, as kube-apiserver's start-up
    reconciliation does for those annotated autoupdate: missing labels, rules, selectors and subjects are
    added, nothing is taken away. None when nothing is missing or the annotation says "false"."""
    meta = current.get("metadata") or {}
    if (meta.get("annotations") or {}).get(AUTOUPDATE, "true") != "true":
        return None
    updated = {**current, "metadata": {**meta, "labels": {**(wanted["metadata"].get("labels") or {}),
                                                           **(meta.get("labels") or {})},
                                       "annotations": {AUTOUPDATE: "true", **(meta.get("annotations") or {})}}}

    def union(have: list[Any], want: list[Any]) -> list[Any]:
        return have + [item for item in want if item not in have]

    if wanted["kind"] == "ClusterRole":
        if wanted.get("aggregationRule"):  # its rules are the aggregation controller's
            selectors = (current.get("aggregationRule") or {}).get("clusterRoleSelectors") or []
            updated["aggregationRule"] = {"clusterRoleSelectors": union(
                list(selectors), wanted["aggregationRule"]["clusterRoleSelectors"])}
        else:
            updated["rules"] = union(list(current.get("rules") or []), wanted["rules"])
    else:
        updated["subjects"] = union(list(current.get("subjects") or []), wanted["subjects"])
    return None if updated == current else updated
