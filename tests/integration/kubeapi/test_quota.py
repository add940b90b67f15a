"""ResourceQuota on the embedded API server, over HTTPS as kubectl and CDI's controller see it: the quota
controller keeps `status.hard`/`status.used`, and creates that would go over a quota are refused with
kube-apiserver's 403 and words; raising the quota, or freeing what it counts, lets them through."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tests.integration.kubeapi.conftest import PODS, Api

QUOTAS = "/api/v1/namespaces/default/resourcequotas"
PVCS = "/api/v1/namespaces/default/persistentvolumeclaims"
MERGE = {"content_type": "application/merge-patch+json"}


def quota(name: str, hard: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": {"hard": hard, **spec}}


def claim(name: str, size: str, storage_class: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def pod(name: str, resources: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "debian"}
    if resources is not None:
        container["resources"] = resources
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], **spec}}


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def status_of(api: Api, name: str) -> dict[str, Any]:
    body = await api.ok("GET", f"{QUOTAS}/{name}")
    status: dict[str, Any] = body.get("status") or {}
    return status


async def synced(api: Api, name: str, used: dict[str, str]) -> None:
    async def done() -> bool:
        status = await status_of(api, name)
        return status.get("used") == used and status.get("hard") == (await api.ok(
            "GET", f"{QUOTAS}/{name}"))["spec"]["hard"]
    await until(done)


async def test_the_quota_controller_fills_the_status_in_canonical_quantities(api: Api) -> None:
    await api.ok("POST", PVCS, claim("before", "1536Mi"))
    created = await api.ok("POST", QUOTAS, quota("q", {"requests.storage": "2048Mi", "persistentvolumeclaims": "5",
                                                       "count/configmaps": "10", "limits.cpu": "1000m"}))
    assert created["status"] == {}  # the controller's to fill, as kube-apiserver resets it
    assert created["spec"]["hard"] == {"requests.storage": "2Gi", "persistentvolumeclaims": "5",
                                       "count/configmaps": "10", "limits.cpu": "1"}
    await synced(api, "q", {"requests.storage": "1536Mi", "persistentvolumeclaims": "1", "count/configmaps": "0",
                            "limits.cpu": "0"})
    table = await api.ok("GET", f"{QUOTAS}/q", headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Age", "Request", "Limit"]
    assert table["rows"][0]["cells"][2:] == [
        "count/configmaps: 0/10, persistentvolumeclaims: 1/5, requests.storage: 1536Mi/2Gi", "limits.cpu: 0/1"]


async def test_a_claim_over_the_storage_quota_is_refused_until_the_quota_is_raised(api: Api) -> None:
    await api.ok("POST", QUOTAS, quota("storage", {"requests.storage": "1Gi"}))
    await synced(api, "storage", {"requests.storage": "0"})
    await api.ok("POST", PVCS, claim("small", "512Mi"))
    assert (await status_of(api, "storage"))["used"] == {"requests.storage": "512Mi"}  # charged on admission
    status, body = await api.call("POST", PVCS, claim("big", "1024Mi"))
    assert status == 403 and body["reason"] == "Forbidden"
    assert body["message"] == ('persistentvolumeclaims "big" is forbidden: exceeded quota: storage, requested: '
                               "requests.storage=1Gi, used: requests.storage=512Mi, limited: requests.storage=1Gi")
    assert body["details"] == {"name": "big", "kind": "persistentvolumeclaims"}
    await api.ok("PATCH", f"{QUOTAS}/storage", {"spec": {"hard": {"requests.storage": "2Gi"}}}, **MERGE)
    await synced(api, "storage", {"requests.storage": "512Mi"})
    await api.ok("POST", PVCS, claim("big", "1024Mi"))
    assert (await status_of(api, "storage"))["used"] == {"requests.storage": "1536Mi"}


async def test_deleting_what_a_quota_counts_frees_it(api: Api) -> None:
    await api.ok("POST", QUOTAS, quota("count", {"count/persistentvolumeclaims": "1"}))
    await synced(api, "count", {"count/persistentvolumeclaims": "0"})
    await api.ok("POST", PVCS, claim("one", "1Mi"))
    status, body = await api.call("POST", PVCS, claim("two", "1Mi"))
    assert status == 403
    assert body["message"].endswith("exceeded quota: count, requested: count/persistentvolumeclaims=1, used: "
                                    "count/persistentvolumeclaims=1, limited: count/persistentvolumeclaims=1")
    await api.ok("DELETE", f"{PVCS}/one")
    await synced(api, "count", {"count/persistentvolumeclaims": "0"})
    await api.ok("POST", PVCS, claim("two", "1Mi"))


async def test_a_storage_class_quota_counts_only_its_class(api: Api) -> None:
    await api.ok("POST", QUOTAS, quota("gold", {"gold.storageclass.storage.k8s.io/requests.storage": "1Gi"}))
    await synced(api, "gold", {"gold.storageclass.storage.k8s.io/requests.storage": "0"})
    await api.ok("POST", PVCS, claim("silver", "5Gi", "silver"))
    status, body = await api.call("POST", PVCS, claim("gold", "2Gi", "gold"))
    assert status == 403 and "requested: gold.storageclass.storage.k8s.io/requests.storage=2Gi" in body["message"]


async def test_a_claim_that_grows_is_charged_what_it_adds(api: Api) -> None:
    await api.ok("POST", QUOTAS, quota("grow", {"requests.storage": "1Gi"}))
    await synced(api, "grow", {"requests.storage": "0"})
    await api.ok("POST", PVCS, claim("c", "512Mi"))
    await api.ok("PATCH", f"{PVCS}/c", {"metadata": {"labels": {"a": "b"}}}, **MERGE)  # no growth, no charge
    status, body = await api.call("PATCH", f"{PVCS}/c", {"spec": {"resources": {"requests": {"storage": "2Gi"}}}},
                                  **MERGE)
    assert status == 403 and "requested: requests.storage=1536Mi, used: requests.storage=512Mi" in body["message"]


async def test_pods_count_and_cpu_memory_quotas_need_requests(api: Api) -> None:
    await api.ok("POST", QUOTAS, quota("compute", {"pods": "2", "requests.cpu": "1", "limits.memory": "1Gi"}))
    await synced(api, "compute", {"limits.memory": "0", "pods": "0", "requests.cpu": "0"})
    status, body = await api.call("POST", PODS, pod("bare"))
    assert status == 403
    assert body["message"] == ('pods "bare" is forbidden: failed quota: compute: must specify limits.memory for: '
                               "main; requests.cpu for: main")
    # limits alone are requests too (kube-apiserver's pod defaults)
    sized = {"limits": {"cpu": "600m", "memory": "512Mi"}}
    created = await api.ok("POST", PODS, pod("first", sized))
    assert created["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "600m", "memory": "512Mi"}
    status, body = await api.call("POST", PODS, pod("second", sized))
    assert status == 403 and body["message"].endswith(
        "exceeded quota: compute, requested: requests.cpu=600m, used: requests.cpu=600m, limited: requests.cpu=1")
    # a pod that ended no longer counts for compute resources
    await api.ok("PATCH", f"{PODS}/first/status", {"status": {"phase": "Succeeded"}}, **MERGE)
    await synced(api, "compute", {"limits.memory": "0", "pods": "0", "requests.cpu": "0"})
    await api.ok("POST", PODS, pod("second", sized))


async def test_a_scoped_quota_counts_only_pods_in_its_scope(api: Api) -> None:
    await api.ok("POST", QUOTAS, quota("besteffort", {"pods": "1"}, scopes=["BestEffort"]))
    await synced(api, "besteffort", {"pods": "0"})
    await api.ok("POST", PODS, pod("a"))
    await api.ok("POST", PODS, pod("sized", {"requests": {"cpu": "1"}}))  # not best effort: not counted
    status, _ = await api.call("POST", PODS, pod("b"))
    assert status == 403
    await synced(api, "besteffort", {"pods": "1"})


async def test_a_generated_name_is_shown_as_its_prefix(api: Api) -> None:
    await api.ok("POST", QUOTAS, quota("none", {"count/pods": "0"}))
    await synced(api, "none", {"count/pods": "0"})
    body = pod("")
    body["metadata"] = {"generateName": "worker-"}
    status, refused = await api.call("POST", PODS, body)
    assert status == 403 and refused["message"].startswith('pods "worker-" is forbidden: exceeded quota: none')


async def test_dry_runs_are_checked_but_not_charged(api: Api) -> None:
    await api.ok("POST", QUOTAS, quota("dry", {"requests.storage": "1Gi"}))
    await synced(api, "dry", {"requests.storage": "0"})
    await api.ok("POST", f"{PVCS}?dryRun=All", claim("c", "1Gi"))
    assert (await status_of(api, "dry"))["used"] == {"requests.storage": "0"}
    status, _ = await api.call("POST", f"{PVCS}?dryRun=All", claim("c", "2Gi"))
    assert status == 403


async def test_invalid_quotas_are_refused_as_kube_apiserver_refuses_them(api: Api) -> None:
    status, body = await api.call("POST", QUOTAS, quota("neg", {"requests.storage": "-1Gi", "pods": "1.5",
                                                                "bogus": "1"}))
    assert status == 422
    assert {c["field"]: c["message"] for c in body["details"]["causes"]} == {
        "spec.hard[requests.storage]": 'Invalid value: "-1Gi": must be greater than or equal to 0',
        "spec.hard[pods]": 'Invalid value: "1500m": must be an integer',
        "spec.hard[bogus]": 'Invalid value: "bogus": must be a standard resource for quota'}
    status, body = await api.call("POST", QUOTAS, quota("nan", {"requests.storage": "lots"}))
    assert status == 400 and "quantities must match the regular expression" in body["message"]
