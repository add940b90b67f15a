"""The informer against the embedded API server: sync, deliveries, and every way a watch ends."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.groups import CONFIGMAPS, NAMESPACES, SECRETS
from cdi.kube import Backoff, Informer, KubeClient, object_key
from tests.integration.kube.conftest import Cluster, eventually


def cm(name: str, n: int = 0, namespace: str = "default", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "data": {"n": str(n)}}


def fast_backoff() -> Backoff:
    return Backoff(initial=0.02, maximum=0.2)


class Deliveries:
    """Records what the handlers were told, as (what, key, data.n)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def on_add(self, obj: dict[str, Any]) -> None:
        self.calls.append(("add", object_key(obj), (obj.get("data") or {}).get("n", "")))

    async def on_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:  # async on purpose
        assert object_key(old) == object_key(new)
        self.calls.append(("update", object_key(new), (new.get("data") or {}).get("n", "")))

    def on_delete(self, obj: dict[str, Any]) -> None:
        self.calls.append(("delete", object_key(obj), (obj.get("data") or {}).get("n", "")))

    def of(self, what: str, key: str | None = None) -> list[tuple[str, str, str]]:
        return [c for c in self.calls if c[0] == what and (key is None or c[1] == key)]

    def attach(self, informer: Informer) -> Deliveries:
        informer.add_handler(self.on_add, self.on_update, self.on_delete)
        return self


async def server_keys(client: KubeClient, namespace: str = "default") -> set[str]:
    return {object_key(o) for o in (await client.list(CONFIGMAPS, namespace)).items}


async def test_initial_sync_deliveries_cache_and_index(client: KubeClient) -> None:
    for name in ("a", "b", "c"):
        await client.create(CONFIGMAPS, cm(name, tier=name), "default")
    await client.create(CONFIGMAPS, cm("other", namespace="kube-public"), "kube-public")

    informer = Informer(client, CONFIGMAPS, "default", backoff=fast_backoff())
    informer.add_index("tier", lambda o: [(o["metadata"].get("labels") or {}).get("tier", "")])
    seen = Deliveries().attach(informer)
    async with informer:
        await informer.wait_synced(5)
        assert informer.has_synced
        assert sorted(informer.keys()) == ["default/a", "default/b", "default/c"]
        assert sorted(c[1] for c in seen.of("add")) == ["default/a", "default/b", "default/c"]
        assert informer.get("default/a")["kind"] == "ConfigMap"  # type: ignore[index]
        assert informer.get_by_name("b", "default") is informer.get("default/b")
        assert [o["metadata"]["name"] for o in informer.by_index("tier", "c")] == ["c"]
        with pytest.raises(RuntimeError):
            informer.add_handler(on_add=print)

        await client.create(CONFIGMAPS, cm("d", tier="c"), "default")
        await client.patch(CONFIGMAPS, "a", {"data": {"n": "1"}}, "default")
        await client.delete(CONFIGMAPS, "b", "default")
        await client.create(CONFIGMAPS, cm("ignored", namespace="kube-public"), "kube-public")

        await eventually(lambda: seen.of("delete"), message="delete of b")
        await eventually(lambda: seen.of("add", "default/d") and seen.of("update", "default/a"))
        assert seen.of("update", "default/a") == [("update", "default/a", "1")]
        assert seen.of("delete") == [("delete", "default/b", "0")]
        assert sorted(informer.keys()) == ["default/a", "default/c", "default/d"]
        assert informer.get("default/a")["data"] == {"n": "1"}  # type: ignore[index]
        assert sorted(o["metadata"]["name"] for o in informer.by_index("tier", "c")) == ["c", "d"]
        assert informer.by_index("tier", "b") == []
        assert len(informer) == 3 and "default/b" not in informer
        assert informer.stats.lists == 1 and informer.stats.gone == 0


async def test_cluster_wide_with_label_selector(client: KubeClient) -> None:
    await client.create(CONFIGMAPS, cm("in", app="x"), "default")
    await client.create(CONFIGMAPS, cm("out", app="y"), "default")
    informer = Informer(client, CONFIGMAPS, label_selector="app=x", backoff=fast_backoff())
    seen = Deliveries().attach(informer)
    async with informer:
        await informer.wait_synced(5)
        assert informer.keys() == ["default/in"]
        await client.create(CONFIGMAPS, cm("in2", namespace="kube-public", app="x"), "kube-public")
        # relabeling an object out of the selector is a delete for this informer, into it an add
        await client.patch(CONFIGMAPS, "in", {"metadata": {"labels": {"app": "z"}}}, "default")
        await client.patch(CONFIGMAPS, "out", {"metadata": {"labels": {"app": "x"}}}, "default")
        await eventually(lambda: sorted(informer.keys()) == ["default/out", "kube-public/in2"])
        assert [c[1] for c in seen.of("delete")] == ["default/in"]
        assert informer.list("kube-public")[0]["metadata"]["name"] == "in2"


async def test_handler_failures_do_not_stop_deliveries(client: KubeClient) -> None:
    informer = Informer(client, CONFIGMAPS, "default", backoff=fast_backoff())
    seen: list[str] = []

    def flaky(obj: dict[str, Any]) -> None:
        seen.append(obj["metadata"]["name"])
        if obj["metadata"]["name"] == "boom":
            raise RuntimeError("handler bug")

    informer.add_handler(on_add=flaky)
    async with informer:
        await informer.wait_synced(5)
        await client.create(CONFIGMAPS, cm("boom"), "default")
        await client.create(CONFIGMAPS, cm("after"), "default")
        await eventually(lambda: seen == ["boom", "after"])
        assert "default/after" in informer


@pytest.mark.server(watch_history=5)
async def test_relist_after_410_converges_and_delivers_missed_deletes(cluster: Cluster) -> None:
    direct = await cluster.client()
    proxy = await cluster.proxy()
    via_proxy = await cluster.proxied_client(proxy, request_timeout=1.0)
    for name in ("kept", "doomed", "edited"):
        await direct.create(CONFIGMAPS, cm(name), "default")

    informer = Informer(via_proxy, CONFIGMAPS, "default", backoff=fast_backoff(), inactivity_timeout=5)
    seen = Deliveries().attach(informer)
    async with informer:
        await informer.wait_synced(5)
        await eventually(lambda: informer.stats.watches >= 1, message="watch started")
        proxy.cut()  # the informer loses its watch and cannot reconnect

        # more changes than the server's history holds, including a delete
        await direct.delete(CONFIGMAPS, "doomed", "default")
        await direct.create(CONFIGMAPS, cm("newcomer", 7), "default")
        for n in range(1, 7):
            await direct.patch(CONFIGMAPS, "edited", {"data": {"n": str(n)}}, "default")
        assert informer.get("default/doomed") is not None  # the cache is stale while cut off

        proxy.resume()
        await eventually(lambda: informer.stats.gone >= 1, message="a 410 from the old resourceVersion")
        expected = await server_keys(direct)
        await eventually(lambda: set(informer.keys()) == expected, message="cache converged")
        assert informer.stats.lists >= 2
        assert seen.of("delete") == [("delete", "default/doomed", "0")]
        assert seen.of("add", "default/newcomer") == [("add", "default/newcomer", "7")]
        # the relist delivers one synthetic update with the final state, not the missed steps
        assert seen.of("update", "default/edited") == [("update", "default/edited", "6")]
        assert seen.of("update", "default/kept") == []
        assert informer.get("default/edited")["data"]["n"] == "6"  # type: ignore[index]

        # and it keeps watching afterwards
        await direct.patch(CONFIGMAPS, "kept", {"data": {"n": "9"}}, "default")
        await eventually(lambda: seen.of("update", "default/kept") == [("update", "default/kept", "9")])


async def test_watches_closed_by_the_server_lose_no_events(client: KubeClient) -> None:
    await client.create(CONFIGMAPS, cm("ticker"), "default")
    informer = Informer(client, CONFIGMAPS, "default", watch_timeout=1, backoff=fast_backoff())
    seen = Deliveries().attach(informer)
    async with informer:
        await informer.wait_synced(5)
        n = 0

        async def write_until_reconnected() -> bool:
            nonlocal n
            n += 1
            await client.patch(CONFIGMAPS, "ticker", {"data": {"n": str(n)}}, "default")
            return informer.stats.watches >= 3  # the server ended at least two watches meanwhile

        await eventually(write_until_reconnected, timeout=20, message="two server-closed watches")
        await eventually(lambda: seen.calls and seen.calls[-1] == ("update", "default/ticker", str(n)))
        assert [int(c[2]) for c in seen.of("update")] == list(range(1, n + 1))  # every step, in order, once
        assert informer.stats.gone == 0 and informer.stats.lists == 1  # resumed, never relisted


async def test_server_restart(cluster: Cluster) -> None:
    client = await cluster.client(request_timeout=2)
    for name in ("stays", "doomed"):
        await client.create(CONFIGMAPS, cm(name), "default")
    informer = Informer(client, CONFIGMAPS, "default", backoff=fast_backoff(), inactivity_timeout=5)
    seen = Deliveries().attach(informer)
    async with informer:
        await informer.wait_synced(5)
        await eventually(lambda: informer.stats.watches >= 1, message="watching")
        await cluster.restart()  # ends the watch; the old resourceVersion may or may not still be served
        await client.delete(CONFIGMAPS, "doomed", "default")
        await client.create(CONFIGMAPS, cm("newcomer"), "default")
        await eventually(lambda: sorted(informer.keys()) == ["default/newcomer", "default/stays"], timeout=15)
        assert informer.stats.watches >= 2
        assert seen.of("delete") == [("delete", "default/doomed", "0")]
        assert [c[1] for c in seen.of("add")][-1] == "default/newcomer"


@pytest.mark.server(bookmark_interval=0.1)
async def test_inactivity_timeout_reconnects_a_silent_watch(cluster: Cluster) -> None:
    direct = await cluster.client()
    proxy = await cluster.proxy()
    via_proxy = await cluster.proxied_client(proxy, request_timeout=1.0)
    informer = Informer(via_proxy, CONFIGMAPS, "default", watch_timeout=300, inactivity_timeout=0.5,
                        backoff=fast_backoff())
    seen = Deliveries().attach(informer)
    async with informer:
        await informer.wait_synced(5)
        await eventually(lambda: informer.stats.watches >= 1)
        proxy.stall()  # the connection stays open but nothing arrives: only the inactivity timer notices
        await direct.create(CONFIGMAPS, cm("during-stall"), "default")
        await eventually(lambda: informer.stats.inactivity_timeouts >= 1, message="inactivity detected")
        proxy.resume()
        await eventually(lambda: "default/during-stall" in informer, message="event after reconnect")
        assert seen.of("add") == [("add", "default/during-stall", "0")]


@pytest.mark.server(bookmark_interval=0.1)
async def test_bookmarks_move_the_resource_version(client: KubeClient) -> None:
    informer = Informer(client, CONFIGMAPS, "default", backoff=fast_backoff())
    async with informer:
        await informer.wait_synced(5)
        secret = await client.create(SECRETS, {"metadata": {"name": "s"}, "stringData": {"k": "v"}}, "default")
        latest = int(secret["metadata"]["resourceVersion"])
        await eventually(lambda: int(informer.resource_version or 0) >= latest, message="bookmark past the secret")
        assert informer.stats.bookmarks >= 1 and informer.stats.events == 0


async def test_cluster_scoped_kind_is_keyed_by_name(client: KubeClient) -> None:
    informer = Informer(client, NAMESPACES, "ignored-for-cluster-scoped", backoff=fast_backoff())
    seen = Deliveries().attach(informer)
    async with informer:
        await informer.wait_synced(5)
        assert {"default", "kube-system"} <= set(informer.keys())
        await client.create(NAMESPACES, {"metadata": {"name": "fresh"}})
        await eventually(lambda: seen.of("add", "fresh"))
        assert informer.get_by_name("fresh") is informer.get("fresh")
