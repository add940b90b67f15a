"""Deletion semantics: finalizers, owner-reference garbage collection in its three modes,
namespace deletion, and state surviving a restart."""

from __future__ import annotations

from pathlib import Path

from tests.integration.kubeapi.conftest import CM, DV, Api, configmap, datavolume, make_api, owner_ref
from tests.support.cluster import async_wait_for

MERGE = {"content_type": "application/merge-patch+json"}


async def gone(api: Api, path: str) -> bool:
    status, _ = await api.call("GET", path)
    return status == 404


async def test_finalizers_hold_deletion_until_removed(api: Api) -> None:
    await api.ok("POST", CM, configmap("fin", finalizers=["example.com/hold"]))
    deleting = await api.ok("DELETE", f"{CM}/fin")
    assert deleting["metadata"]["deletionTimestamp"]
    assert (await api.ok("GET", f"{CM}/fin"))["metadata"]["deletionTimestamp"]
    status, body = await api.call("PATCH", f"{CM}/fin", {"metadata": {"finalizers": ["example.com/hold", "more"]}},
                                  **MERGE)
    assert status == 422 and "no new finalizers" in body["message"]
    await api.ok("PATCH", f"{CM}/fin", {"metadata": {"finalizers": None}}, **MERGE)
    assert await gone(api, f"{CM}/fin")


async def test_background_deletion_removes_dependents(api: Api) -> None:
    owner = await api.ok("POST", DV, datavolume("owner-bg"))
    await api.ok("POST", CM, configmap("dep-bg", owners=[owner_ref(owner)]))
    await api.ok("DELETE", f"{DV}/owner-bg", {"propagationPolicy": "Background"})
    assert await gone(api, f"{DV}/owner-bg")
    await async_wait_for(lambda: gone(api, f"{CM}/dep-bg"), message="dependent collected")


async def test_foreground_deletion_waits_for_blocking_dependents(api: Api) -> None:
    owner = await api.ok("POST", DV, datavolume("owner-fg"))
    await api.ok("POST", CM, configmap("dep-fg", owners=[owner_ref(owner, block=True)], finalizers=["test/keep"]))
    deleting = await api.ok("DELETE", f"{DV}/owner-fg", {"propagationPolicy": "Foreground"})
    assert "foregroundDeletion" in deleting["metadata"]["finalizers"]
    await async_wait_for(lambda: _deleting(api, f"{CM}/dep-fg"), message="dependent being deleted")
    assert not await gone(api, f"{DV}/owner-fg")  # blocked by the dependent
    await api.ok("PATCH", f"{CM}/dep-fg", {"metadata": {"finalizers": None}}, **MERGE)
    await async_wait_for(lambda: gone(api, f"{DV}/owner-fg"), message="owner removed after its dependent")


async def _deleting(api: Api, path: str) -> bool:
    status, body = await api.call("GET", path)
    return status == 200 and bool(body["metadata"].get("deletionTimestamp"))


async def test_orphan_deletion_keeps_dependents_without_the_reference(api: Api) -> None:
    owner = await api.ok("POST", DV, datavolume("owner-or"))
    await api.ok("POST", CM, configmap("dep-or", owners=[owner_ref(owner)]))
    await api.ok("DELETE", f"{DV}/owner-or", {"propagationPolicy": "Orphan"})
    await async_wait_for(lambda: gone(api, f"{DV}/owner-or"), message="owner removed")
    dependent = await api.ok("GET", f"{CM}/dep-or")
    assert not dependent["metadata"].get("ownerReferences")


async def test_dependents_of_a_missing_owner_are_collected(api: Api) -> None:
    ghost = {"apiVersion": "v1", "kind": "ConfigMap", "name": "ghost", "uid": "00000000-dead-beef-0000-000000000000"}
    await api.ok("POST", CM, configmap("orphaned", owners=[ghost]))
    await async_wait_for(lambda: gone(api, f"{CM}/orphaned"), message="dangling dependent collected")


async def test_a_dependent_with_another_live_owner_survives(api: Api) -> None:
    first = await api.ok("POST", DV, datavolume("owner-1"))
    second = await api.ok("POST", DV, datavolume("owner-2"))
    await api.ok("POST", CM, configmap("shared", owners=[owner_ref(first), owner_ref(second)]))
    await api.ok("DELETE", f"{DV}/owner-1")

    async def one_owner_left() -> bool:
        body = await api.ok("GET", f"{CM}/shared")
        return [r["name"] for r in body["metadata"].get("ownerReferences", [])] == ["owner-2"]

    await async_wait_for(one_owner_left, message="reference to the deleted owner dropped")


async def test_deleting_a_namespace_deletes_its_objects(api: Api) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}}
    await api.ok("POST", "/api/v1/namespaces", namespace)
    ns_cm = "/api/v1/namespaces/doomed/configmaps"
    await api.ok("POST", ns_cm, configmap("held", finalizers=["test/keep"]))
    await api.ok("POST", ns_cm, configmap("free"))
    deleting = await api.ok("DELETE", "/api/v1/namespaces/doomed")
    assert deleting["status"]["phase"] == "Terminating"
    await async_wait_for(lambda: gone(api, f"{ns_cm}/free"), message="namespace content deleted")
    status, body = await api.call("POST", ns_cm, configmap("late"))
    assert status == 403 and "being terminated" in body["message"]
    assert not await gone(api, "/api/v1/namespaces/doomed")
    await api.ok("PATCH", f"{ns_cm}/held", {"metadata": {"finalizers": None}}, **MERGE)
    await async_wait_for(lambda: gone(api, "/api/v1/namespaces/doomed"), message="namespace removed")


async def test_state_and_revisions_survive_a_restart(tmp_path: Path) -> None:
    first = await make_api(tmp_path / "srv")
    created = await first.ok("POST", DV, datavolume("keep"))
    before = int((await first.ok("GET", DV))["metadata"]["resourceVersion"])
    await first.ok("DELETE", f"{DV}/keep")
    await first.ok("POST", DV, datavolume("keep"))
    last = int((await first.ok("GET", DV))["metadata"]["resourceVersion"])
    await first.session.close()
    await first.server.stop()

    second = await make_api(tmp_path / "srv")
    try:
        restored = await second.ok("GET", f"{DV}/keep")
        assert restored["metadata"]["uid"] != created["metadata"]["uid"]
        assert int(restored["metadata"]["resourceVersion"]) == last
        again = await second.ok("POST", CM, configmap("after"))
        assert int(again["metadata"]["resourceVersion"]) > last > before
        assert second.server.port == first.server.port  # the kubeconfig others hold stays valid
    finally:
        await second.session.close()
        await second.server.stop()
