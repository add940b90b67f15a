"""Watch streams: ordering, initial state, selector transitions, bookmarks, timeouts, 410 Gone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from tests.integration.kubeapi.conftest import CM, Api, configmap

MERGE = {"content_type": "application/merge-patch+json"}


@asynccontextmanager
async def watching(api: Api, query: str) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    resp = await api.session.get(f"{api.url}{CM}?watch=true&{query}")
    assert resp.status == 200

    async def pump() -> None:
        async for line in resp.content:
            if line.strip():
                await events.put(json.loads(line))
        await events.put({"type": "CLOSED"})

    task = asyncio.create_task(pump())
    try:
        yield events
    finally:
        task.cancel()
        resp.close()


async def next_event(events: asyncio.Queue[dict[str, Any]], skip_bookmarks: bool = True) -> dict[str, Any]:
    while True:
        event = await asyncio.wait_for(events.get(), 5)
        if not (skip_bookmarks and event["type"] == "BOOKMARK"):
            return event


async def test_events_after_a_resource_version_arrive_in_order(api: Api) -> None:
    start = (await api.ok("GET", CM))["metadata"]["resourceVersion"]
    async with watching(api, f"resourceVersion={start}") as events:
        await api.ok("POST", CM, configmap("w1"))
        await api.ok("PATCH", f"{CM}/w1", {"data": {"k": "v2"}}, **MERGE)
        await api.ok("DELETE", f"{CM}/w1")
        seen = [await next_event(events) for _ in range(3)]
    assert [e["type"] for e in seen] == ["ADDED", "MODIFIED", "DELETED"]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in seen]
    assert rvs == sorted(rvs) and rvs[0] > int(start)
    assert seen[1]["object"]["data"] == {"k": "v2"}


async def test_watch_replays_changes_made_before_it_started(api: Api) -> None:
    start = (await api.ok("GET", CM))["metadata"]["resourceVersion"]
    await api.ok("POST", CM, configmap("before"))
    async with watching(api, f"resourceVersion={start}") as events:
        event = await next_event(events)
    assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "before"


async def test_watch_without_version_starts_with_current_objects(api: Api) -> None:
    await api.ok("POST", CM, configmap("existing"))
    async with watching(api, "fieldSelector=metadata.name%3Dexisting") as events:
        event = await next_event(events)
    assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "existing"


async def test_objects_moving_across_a_label_selector_are_added_and_deleted(api: Api) -> None:
    await api.ok("POST", CM, configmap("mover", {"team": "a"}))
    start = (await api.ok("GET", CM))["metadata"]["resourceVersion"]
    async with watching(api, f"resourceVersion={start}&labelSelector=team%3Db") as events:
        await api.ok("PATCH", f"{CM}/mover", {"metadata": {"labels": {"team": "b"}}}, **MERGE)
        entered = await next_event(events)
        await api.ok("PATCH", f"{CM}/mover", {"metadata": {"labels": {"team": "c"}}}, **MERGE)
        left = await next_event(events)
    assert entered["type"] == "ADDED" and left["type"] == "DELETED"
    assert left["object"]["metadata"]["labels"] == {"team": "c"}


async def test_bookmarks_carry_the_current_resource_version(api: Api) -> None:
    start = (await api.ok("GET", CM))["metadata"]["resourceVersion"]
    async with watching(api, f"resourceVersion={start}&allowWatchBookmarks=true") as events:
        await api.ok("POST", CM, configmap("bm"))
        first = await next_event(events)
        bookmark = await next_event(events, skip_bookmarks=False)
        while bookmark["type"] != "BOOKMARK":
            bookmark = await next_event(events, skip_bookmarks=False)
    assert first["type"] == "ADDED"
    assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= int(first["object"]["metadata"]["resourceVersion"])
    assert bookmark["object"]["kind"] == "ConfigMap"


async def test_timeout_seconds_ends_the_stream(api: Api) -> None:
    async with watching(api, "timeoutSeconds=1&resourceVersion=1") as events:
        event = await next_event(events)
        while event["type"] != "CLOSED":
            event = await next_event(events)
    assert event["type"] == "CLOSED"


async def test_watch_from_a_version_older_than_history_is_gone(api: Api) -> None:
    start = (await api.ok("GET", CM))["metadata"]["resourceVersion"]
    for i in range(60):  # the fixture keeps 50 changes
        await api.ok("POST", CM, configmap(f"churn-{i}"))
    async with watching(api, f"resourceVersion={start}") as events:
        event = await next_event(events)
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"
    assert "too old resource version" in event["object"]["message"]


async def test_a_watch_ends_when_its_client_goes_away(api: Api) -> None:
    from tests.support.cluster import async_wait_for
    baseline = api.server.store.watcher_count
    resp = await api.session.get(f"{api.url}{CM}?watch=true&resourceVersion=1")
    await async_wait_for(lambda: api.server.store.watcher_count > baseline, message="watch subscribed")
    resp.close()
    await async_wait_for(lambda: api.server.store.watcher_count == baseline, message="watch unsubscribed")


async def test_a_watch_from_an_invalid_resource_version_is_400_before_the_stream_starts(api: Api) -> None:
    for version in ("abc", "-1", "1.5"):
        status, body = await api.call("GET", f"{CM}?watch=true&resourceVersion={version}")
        assert status == 400, (version, body)
        assert body["kind"] == "Status" and body["reason"] == "BadRequest" and body["code"] == 400
        assert body["message"].startswith(f'invalid resource version: resourceVersion: Invalid value: "{version}"')


async def test_a_watch_from_a_version_not_reached_yet_waits_for_it(api: Api) -> None:
    """As kube-apiserver's watch cache: a plain watch past the newest version is not an error (only
    lists and gets answer 504); it delivers the changes after that version once they happen."""
    start = int((await api.ok("GET", CM))["metadata"]["resourceVersion"])
    async with watching(api, f"resourceVersion={start + 1}") as events:
        await api.ok("POST", CM, configmap("skipped"))  # start + 1: not after the version asked for
        await api.ok("POST", CM, configmap("seen"))
        event = await next_event(events)
    assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "seen"
