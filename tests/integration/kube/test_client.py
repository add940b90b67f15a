"""KubeClient against the embedded API server: verbs, typed errors, paging, selectors, watch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from cdi.api.groups import CONFIGMAPS, DATAVOLUMES, NAMESPACES, PVCS
from cdi.embedded.kubeapi.objects import UserInfo
from cdi.kube import (
    AlreadyExists,
    ApiError,
    BadRequest,
    ConfigError,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeClient,
    NotFound,
    TransportError,
    Unauthorized,
    WatchInactive,
    retry_on_conflict,
)
from cdi.kube.config import load_config
from cdi.kube.patches import add_finalizer_patch, merge_diff, remove_finalizer_patch, with_resource_version
from tests.integration.kube.conftest import Cluster


def cm(name: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels}, "data": {"n": "0"}}


async def test_crud_round_trip(client: KubeClient) -> None:
    created = await client.create(CONFIGMAPS, cm("one", app="x"), "default")
    assert created["kind"] == "ConfigMap" and created["apiVersion"] == "v1"
    assert created["metadata"]["uid"] and created["metadata"]["resourceVersion"]

    got = await client.get(CONFIGMAPS, "one", "default")
    assert got["data"] == {"n": "0"}

    got["data"]["n"] = "1"
    replaced = await client.replace(CONFIGMAPS, got)
    assert replaced["data"]["n"] == "1"
    assert replaced["metadata"]["resourceVersion"] != got["metadata"]["resourceVersion"]

    merged = await client.patch(CONFIGMAPS, "one", {"data": {"m": "2"}}, "default")
    assert merged["data"] == {"n": "1", "m": "2"}
    jsoned = await client.patch(CONFIGMAPS, "one", [{"op": "remove", "path": "/data/m"}], "default",
                                patch_type="json")
    assert jsoned["data"] == {"n": "1"}
    strategic = await client.patch(CONFIGMAPS, "one", {"metadata": {"labels": {"b": "c"}}}, "default",
                                   patch_type="strategic")
    assert strategic["metadata"]["labels"] == {"app": "x", "b": "c"}

    await client.delete(CONFIGMAPS, "one", "default")
    with pytest.raises(NotFound) as info:
        await client.get(CONFIGMAPS, "one", "default")
    assert info.value.code == 404 and info.value.reason == "NotFound"
    assert info.value.details["name"] == "one"


async def test_patch_helpers_against_the_server(client: KubeClient) -> None:
    obj = await client.create(CONFIGMAPS, cm("p", app="x"), "default")
    wanted = {**obj, "data": {"n": "1", "new": "v"}, "metadata": {**obj["metadata"], "labels": {}}}
    patched = await client.patch(CONFIGMAPS, "p", merge_diff(obj, wanted), "default")
    assert patched["data"] == {"n": "1", "new": "v"} and not patched["metadata"].get("labels")

    with pytest.raises(Conflict):  # obj is stale now
        await client.patch(CONFIGMAPS, "p", with_resource_version({"data": {"n": "2"}},
                                                                  obj["metadata"]["resourceVersion"]), "default")
    with pytest.raises(Invalid):  # a failed JSON-patch test is 422, as on kube-apiserver
        await client.patch(CONFIGMAPS, "p", add_finalizer_patch(obj, "cdi.kubevirt.io/x"), "default",
                           patch_type="json")
    with_finalizer = await client.patch(CONFIGMAPS, "p", add_finalizer_patch(patched, "cdi.kubevirt.io/x"),
                                        "default", patch_type="json")
    assert with_finalizer["metadata"]["finalizers"] == ["cdi.kubevirt.io/x"]
    await client.delete(CONFIGMAPS, "p", "default")
    terminating = await client.get(CONFIGMAPS, "p", "default")  # held by the finalizer
    assert terminating["metadata"]["deletionTimestamp"]
    await client.patch(CONFIGMAPS, "p", remove_finalizer_patch(terminating, "cdi.kubevirt.io/x"), "default",
                       patch_type="json")
    with pytest.raises(NotFound):
        await client.get(CONFIGMAPS, "p", "default")


async def test_status_subresource(client: KubeClient) -> None:
    dv = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "dv"},
          "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}
    await client.create(DATAVOLUMES, dv, "default")
    patched = await client.patch(DATAVOLUMES, "dv", {"status": {"phase": "Pending"}}, "default",
                                 subresource="status")
    assert patched["status"]["phase"] == "Pending"
    # a status write through the main resource is ignored, as on a real server
    main = await client.patch(DATAVOLUMES, "dv", {"status": {"phase": "Succeeded"}}, "default")
    assert main["status"]["phase"] == "Pending"
    main["status"] = {"phase": "ImportInProgress", "progress": "10.0%"}
    replaced = await client.replace(DATAVOLUMES, main, subresource="status")
    assert replaced["status"]["progress"] == "10.0%"


async def test_typed_errors(client: KubeClient) -> None:
    with pytest.raises(NotFound):
        await client.get(CONFIGMAPS, "missing", "default")

    first = await client.create(CONFIGMAPS, cm("dup"), "default")
    with pytest.raises(AlreadyExists) as exists:
        await client.create(CONFIGMAPS, cm("dup"), "default")
    assert exists.value.code == 409 and not isinstance(exists.value, Conflict)

    await client.patch(CONFIGMAPS, "dup", {"data": {"n": "1"}}, "default")
    with pytest.raises(Conflict) as conflict:
        await client.replace(CONFIGMAPS, first)  # carries the old resourceVersion
    assert conflict.value.code == 409 and conflict.value.reason == "Conflict"
    assert not isinstance(conflict.value, AlreadyExists)
    with pytest.raises(Conflict):
        await client.delete(CONFIGMAPS, "dup", "default", uid="not-the-uid")

    pvc = {"metadata": {"name": "p"}, "spec": {}}
    with pytest.raises(Invalid) as invalid:
        await client.create(PVCS, pvc, "default")
    assert invalid.value.code == 422
    assert {c.field for c in invalid.value.causes} >= {"spec.accessModes"}
    assert all(c.reason.startswith("Field") for c in invalid.value.causes)

    with pytest.raises(BadRequest):
        await client.list(CONFIGMAPS, "default", label_selector="a in (")

    with pytest.raises(ValueError, match="namespaced"):
        await client.get(CONFIGMAPS, "x")


@pytest.mark.server(watch_history=5)
async def test_gone_for_an_expired_resource_version(client: KubeClient) -> None:
    old = (await client.list(CONFIGMAPS, "default")).resource_version
    for i in range(7):
        await client.create(CONFIGMAPS, cm(f"c{i}"), "default")
    async with client.watch(CONFIGMAPS, "default", resource_version=old) as events:
        with pytest.raises(Gone) as gone:
            await anext(events)  # kube-apiserver answers 200, then an ERROR event with a 410 Status
    assert gone.value.code == 410 and gone.value.reason == "Expired"


async def test_unauthorized_forbidden_and_transport_errors(cluster: Cluster, tmp_path: Path) -> None:
    kubeconfig = yaml.safe_load(cluster.server.kubeconfig_path.read_text())
    kubeconfig["users"][0]["user"]["token"] = "wrong"
    path = tmp_path / "bad-token"
    path.write_text(yaml.safe_dump(kubeconfig))
    async with await KubeClient.connect(path) as bad:
        with pytest.raises(Unauthorized):
            await bad.list(NAMESPACES)

    cluster.server.auth.add("bob-token", UserInfo("bob", ()))  # authenticated, but no RBAC grants
    kubeconfig["users"][0]["user"]["token"] = "bob-token"
    path.write_text(yaml.safe_dump(kubeconfig))
    async with await KubeClient.connect(path) as bob:
        with pytest.raises(Forbidden) as forbidden:
            await bob.list(CONFIGMAPS, "default")
        assert forbidden.value.code == 403 and not forbidden.value.transient

    proxy = await cluster.proxy()
    proxy.cut()
    async with await KubeClient.connect(await _kubeconfig_for(cluster, proxy.url, tmp_path)) as cut:
        with pytest.raises(TransportError) as info:
            await cut.list(NAMESPACES)
        assert info.value.transient and isinstance(info.value, ApiError)


async def _kubeconfig_for(cluster: Cluster, url: str, tmp_path: Path) -> Path:
    kubeconfig = yaml.safe_load(cluster.server.kubeconfig_path.read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = url
    path = tmp_path / "kubeconfig-other"
    path.write_text(yaml.safe_dump(kubeconfig))
    return path


async def test_list_paging_and_selectors(client: KubeClient) -> None:
    for i in range(7):
        await client.create(CONFIGMAPS, cm(f"page-{i}", tier="a" if i % 2 else "b"), "default")
    await client.create(CONFIGMAPS, cm("elsewhere", tier="a"), "kube-public")

    pages, token = [], None
    while True:
        page = await client.list(CONFIGMAPS, "default", limit=3, continue_token=token)
        pages.append(page)
        token = page.continue_token
        if not token:
            break
    assert [len(p.items) for p in pages] == [3, 3, 1]
    assert pages[0].remaining_item_count == 4
    names = [i["metadata"]["name"] for p in pages for i in p.items]
    assert names == [f"page-{i}" for i in range(7)]
    assert all(i["kind"] == "ConfigMap" for p in pages for i in p.items)

    everything = await client.list_all(CONFIGMAPS, "default", page_size=2)
    assert len(everything.items) == 7 and everything.resource_version

    tier_a = await client.list(CONFIGMAPS, "default", label_selector="tier=a")
    assert sorted(i["metadata"]["name"] for i in tier_a.items) == ["page-1", "page-3", "page-5"]
    across = await client.list(CONFIGMAPS, label_selector="tier=a")
    assert len(across.items) == 4
    by_name = await client.list(CONFIGMAPS, "default", field_selector="metadata.name=page-4")
    assert [i["metadata"]["name"] for i in by_name.items] == ["page-4"]


async def test_watch_events_bookmarks_and_server_timeout(client: KubeClient) -> None:
    start = (await client.list(CONFIGMAPS, "default")).resource_version
    await client.create(CONFIGMAPS, cm("w"), "default")
    await client.patch(CONFIGMAPS, "w", {"data": {"n": "1"}}, "default")
    await client.delete(CONFIGMAPS, "w", "default")
    seen: list[str] = []
    async with client.watch(CONFIGMAPS, "default", resource_version=start, timeout_seconds=1) as events:
        async for event in events:  # ends when the server closes the stream after timeoutSeconds
            seen.append(event.type)
            if event.type != "BOOKMARK":
                assert event.object["metadata"]["name"] == "w" and event.object["kind"] == "ConfigMap"
    assert seen[:3] == ["ADDED", "MODIFIED", "DELETED"]
    assert "BOOKMARK" in seen[3:]
    assert int(events.resource_version) >= int(start) + 3


async def test_watch_inactivity_timeout(cluster: Cluster) -> None:
    proxy = await cluster.proxy()
    client = await cluster.proxied_client(proxy)
    start = (await client.list(CONFIGMAPS, "default")).resource_version
    async with client.watch(CONFIGMAPS, "default", resource_version=start, inactivity_timeout=1.0) as events:
        await client.create(CONFIGMAPS, cm("before-stall"), "default")
        first = await anext(events)
        while first.type == "BOOKMARK":
            first = await anext(events)
        assert first.object["metadata"]["name"] == "before-stall"
        proxy.stall()
        with pytest.raises(WatchInactive):
            await anext(events)
    proxy.resume()


async def test_retry_on_conflict(client: KubeClient) -> None:
    await client.create(CONFIGMAPS, cm("counter"), "default")
    calls = 0

    async def bump() -> dict[str, object]:
        nonlocal calls
        calls += 1
        current = await client.get(CONFIGMAPS, "counter", "default")
        if calls == 1:  # somebody else writes between our read and our write
            await client.patch(CONFIGMAPS, "counter", {"data": {"other": "x"}}, "default")
        current["data"]["n"] = str(int(current["data"]["n"]) + 1)
        return await client.replace(CONFIGMAPS, current)

    result = await retry_on_conflict(bump)
    assert calls == 2 and result["data"] == {"n": "1", "other": "x"}

    async def always_exists() -> None:
        await client.create(CONFIGMAPS, cm("counter"), "default")

    with pytest.raises(AlreadyExists):
        await retry_on_conflict(always_exists)


async def test_raw_request(client: KubeClient) -> None:
    version = (await client.request("GET", "/version")).json()
    assert version["major"] == "1"
    groups = (await client.request("GET", "/apis")).json()
    assert "cdi.kubevirt.io" in {g["name"] for g in groups["groups"]}


async def test_config_sources(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = yaml.safe_load(cluster.server.kubeconfig_path.read_text())
    kubeconfig["contexts"][0]["context"]["namespace"] = "kube-public"
    path = tmp_path / "ctx-ns"
    path.write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{path}")
    monkeypatch.setenv("HOME", str(tmp_path))
    loaded = await load_config()
    assert loaded.namespace == "kube-public" and loaded.source == str(path)
    async with KubeClient(loaded) as client:
        assert client.namespace == "kube-public"
        assert (await client.list(NAMESPACES)).items

    with pytest.raises(ConfigError):
        await load_config(tmp_path / "does-not-exist")
    monkeypatch.setenv("KUBECONFIG", "")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="not running in a cluster"):
        await load_config()


async def test_concurrent_requests_share_one_client(client: KubeClient) -> None:
    await asyncio.gather(*(client.create(CONFIGMAPS, cm(f"par-{i}"), "default") for i in range(20)))
    assert len((await client.list(CONFIGMAPS, "default", label_selector="")).items) >= 20
