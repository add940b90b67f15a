"""RBAC for users other than the admin: bindings grant roles, aggregated cluster roles, access
reviews, and 403 messages worded as kube-apiserver words them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.kubeapi.conftest import DV, Api, datavolume, make_api
from tests.support.cluster import async_wait_for

RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture
async def rbac_api(tmp_path: Path) -> AsyncIterator[Api]:
    tokens = tmp_path / "tokens.csv"
    tokens.write_text('bob-token,bob,1001\ncarol-token,carol,1002,"devs,qa"\n')
    instance = await make_api(tmp_path / "srv", token_auth_file=tokens)
    yield instance
    await instance.session.close()
    await instance.server.stop()


async def as_user(api: Api, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    async with api.session.request(method, api.url + path, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


def binding(kind: str, name: str, role_kind: str, role: str, subject_kind: str, subject: str,
            namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": subject_kind, "name": subject}]}


async def test_users_need_a_binding_to_act(rbac_api: Api) -> None:
    api = rbac_api
    status, body = await as_user(api, "bob-token", "GET", DV)
    assert status == 403
    assert body["message"] == ('datavolumes.cdi.kubevirt.io is forbidden: User "bob" cannot list resource '
                               '"datavolumes" in API group "cdi.kubevirt.io" in the namespace "default"')
    status, _ = await as_user(api, "bob-token", "GET", "/apis")
    assert status == 200  # discovery is open to every authenticated user
    await api.ok("POST", f"{RBAC}/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "datavolume-admin"},
        "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["*"]}]})
    await api.ok("POST", f"{RBAC}/namespaces/default/rolebindings",
                 binding("RoleBinding", "bob-dv", "ClusterRole", "datavolume-admin", "User", "bob", "default"))
    status, _ = await as_user(api, "bob-token", "POST", DV, datavolume("bobs"))
    assert status == 201
    status, body = await as_user(api, "bob-token", "GET",
                                 "/apis/cdi.kubevirt.io/v1beta1/namespaces/kube-system/datavolumes")
    assert status == 403 and 'in the namespace "kube-system"' in body["message"]
    status, _ = await as_user(api, "bob-token", "GET", "/api/v1/namespaces/default/secrets")
    assert status == 403


async def test_group_bindings_and_aggregated_roles(rbac_api: Api) -> None:
    api = rbac_api
    await api.ok("POST", f"{RBAC}/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "cdi.kubevirt.io:view", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
        "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["get", "list", "watch"]}]})
    await api.ok("POST", f"{RBAC}/clusterrolebindings",
                 binding("ClusterRoleBinding", "devs-view", "ClusterRole", "view", "Group", "devs"))

    async def carol_lists() -> bool:  # the aggregation controller writes `view` a moment later
        return (await as_user(api, "carol-token", "GET", DV))[0] == 200

    await async_wait_for(carol_lists, message="the view role aggregated cdi.kubevirt.io:view")
    view = await api.ok("GET", f"{RBAC}/clusterroles/view")
    assert {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"],
            "verbs": ["get", "list", "watch"]} in view["rules"]
    status, _ = await as_user(api, "carol-token", "POST", DV, datavolume("nope"))
    assert status == 403


async def test_access_reviews_answer_for_users_and_for_the_caller(rbac_api: Api) -> None:
    api = rbac_api
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": "bob", "resourceAttributes": {"verb": "create", "group": "upload.cdi.kubevirt.io",
                                              "resource": "uploadtokenrequests", "namespace": "default"}}}
    denied = await api.ok("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    assert denied["status"]["allowed"] is False
    await api.ok("POST", f"{RBAC}/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "cdi-uploader"},
        "rules": [{"apiGroups": ["upload.cdi.kubevirt.io"], "resources": ["uploadtokenrequests"],
                   "verbs": ["create"]}]})
    await api.ok("POST", f"{RBAC}/namespaces/default/rolebindings",
                 binding("RoleBinding", "bob-up", "ClusterRole", "cdi-uploader", "User", "bob", "default"))
    allowed = await api.ok("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    assert allowed["status"]["allowed"] is True
    self_review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {
        "resourceAttributes": {"verb": "create", "group": "upload.cdi.kubevirt.io",
                               "resource": "uploadtokenrequests", "namespace": "default"}}}
    status, body = await as_user(api, "bob-token", "POST",
                                 "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", self_review)
    assert status == 201 and body["status"]["allowed"] is True
    status, body = await as_user(api, "carol-token", "POST",
                                 "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", self_review)
    assert status == 201 and body["status"]["allowed"] is False


async def test_resource_names_allow_listing_and_watching_one_object_by_field_selector(rbac_api: Api) -> None:
    """As kube-apiserver authorizes a list or watch whose field selector names one object: as a request for
    that name, so a Role's `resourceNames` allows it (what an aggregated API server's reader Role of
    `extension-apiserver-authentication` relies on to follow that ConfigMap), and nothing more."""
    api = rbac_api
    await api.ok("POST", f"{RBAC}/namespaces/kube-system/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "auth-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"],
                   "resourceNames": ["extension-apiserver-authentication"]}]})
    await api.ok("POST", f"{RBAC}/namespaces/kube-system/rolebindings",
                 binding("RoleBinding", "bob-auth", "Role", "auth-reader", "User", "bob", "kube-system"))
    configmaps = "/api/v1/namespaces/kube-system/configmaps"
    one = "fieldSelector=metadata.name%3Dextension-apiserver-authentication"
    status, body = await as_user(api, "bob-token", "GET", f"{configmaps}?{one}")
    assert status == 200 and [c["metadata"]["name"] for c in body["items"]] == ["extension-apiserver-authentication"]
    async with api.session.get(f"{api.url}{configmaps}?{one}&watch=true&timeoutSeconds=1",
                               headers={"Authorization": "Bearer bob-token"}) as watch:
        assert watch.status == 200
        first = await watch.content.readline()
        assert b"extension-apiserver-authentication" in first
    status, body = await as_user(api, "bob-token", "GET", configmaps)
    assert status == 403
    assert body["message"] == ('configmaps is forbidden: User "bob" cannot list resource "configmaps" in API group '
                               '"" in the namespace "kube-system"')
    status, body = await as_user(api, "bob-token", "GET", f"{configmaps}?fieldSelector=metadata.name%3Dother")
    assert status == 403
    assert body["message"].startswith('configmaps "other" is forbidden: User "bob" cannot list resource')
    status, _ = await as_user(api, "bob-token", "GET",
                              f"{configmaps}?fieldSelector=metadata.name%21%3Dextension-apiserver-authentication")
    assert status == 403


async def test_bootstrap_roles_regain_what_a_restart_brings(tmp_path: Path) -> None:
    """A data directory from an older version gets the newer bootstrap rules at start, as kube-apiserver
    reconciles its bootstrap policy (adding, never removing: a rule an admin added stays)."""
    api = await make_api(tmp_path / "srv")
    role = await api.ok("GET", f"{RBAC}/clusterroles/system:basic-user")
    kept = {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]}
    await api.ok("PUT", f"{RBAC}/clusterroles/system:basic-user", {**role, "rules": [kept]})
    await api.session.close()
    await api.server.stop()
    api = await make_api(tmp_path / "srv")
    try:
        rules = (await api.ok("GET", f"{RBAC}/clusterroles/system:basic-user"))["rules"]
        assert rules[0] == kept
        assert {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"],
                "verbs": ["create"]} in rules
    finally:
        await api.session.close()
        await api.server.stop()
