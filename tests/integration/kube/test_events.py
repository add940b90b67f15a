"""EventRecorder against the embedded API server: fields, aggregation, never raising."""

from __future__ import annotations

from typing import Any

from cdi.api.groups import CONFIGMAPS, EVENTS, NAMESPACES
from cdi.kube import NORMAL, WARNING, EventRecorder, KubeClient


async def events_about(client: KubeClient, name: str, namespace: str = "default") -> list[dict[str, Any]]:
    items = (await client.list(EVENTS, namespace)).items
    return [e for e in items if e["involvedObject"]["name"] == name]


async def test_record_creates_a_complete_event(client: KubeClient) -> None:
    obj = await client.create(CONFIGMAPS, {"metadata": {"name": "target"}}, "default")
    async with EventRecorder(client, "cdi-controller", host="node-1") as recorder:
        recorder.record(obj, NORMAL, "ImportScheduled", "Import into target scheduled")
        await recorder.flush(5)
    [event] = await events_about(client, "target")
    assert event["metadata"]["name"].startswith("target.")
    assert event["involvedObject"] == {
        "apiVersion": "v1", "kind": "ConfigMap", "name": "target", "namespace": "default",
        "uid": obj["metadata"]["uid"], "resourceVersion": obj["metadata"]["resourceVersion"]}
    assert event["type"] == "Normal" and event["reason"] == "ImportScheduled"
    assert event["message"] == "Import into target scheduled"
    assert event["source"] == {"component": "cdi-controller", "host": "node-1"}
    assert event["reportingComponent"] == "cdi-controller" and event["reportingInstance"] == "node-1"
    assert event["count"] == 1 and event["firstTimestamp"] == event["lastTimestamp"]


async def test_repeats_aggregate_into_one_event(client: KubeClient) -> None:
    obj = await client.create(CONFIGMAPS, {"metadata": {"name": "noisy"}}, "default")
    recorder = EventRecorder(client, "cdi-controller")
    for _ in range(3):
        recorder.record(obj, WARNING, "ErrImportFailed", "Unable to connect to http data source")
    recorder.record(obj, WARNING, "ErrImportFailed", "a different message")
    recorder.record(obj, NORMAL, "ImportSucceeded", "done")
    await recorder.flush(5)
    events = await events_about(client, "noisy")
    counts = sorted((e["reason"], e["message"], e["count"]) for e in events)
    assert counts == [("ErrImportFailed", "Unable to connect to http data source", 3),
                      ("ErrImportFailed", "a different message", 1), ("ImportSucceeded", "done", 1)]
    aggregated = next(e for e in events if e["count"] == 3)
    assert aggregated["lastTimestamp"] >= aggregated["firstTimestamp"]

    # if the aggregated event disappears (expiry, deletion), the next repeat starts a new one
    await client.delete(EVENTS, aggregated["metadata"]["name"], "default")
    recorder.record(obj, WARNING, "ErrImportFailed", "Unable to connect to http data source")
    await recorder.close()
    again = [e for e in await events_about(client, "noisy") if e["message"].startswith("Unable")]
    assert [e["count"] for e in again] == [1]


async def test_cluster_scoped_objects_get_events_in_default(client: KubeClient) -> None:
    ns = await client.get(NAMESPACES, "kube-public")
    async with EventRecorder(client, "cdi-controller") as recorder:
        recorder.record(ns, NORMAL, "Seen", "cluster-scoped")
        await recorder.flush(5)
    [event] = await events_about(client, "kube-public")
    assert event["metadata"]["namespace"] == "default" and "namespace" not in event["involvedObject"]


async def test_failures_never_reach_the_caller(client: KubeClient) -> None:
    recorder = EventRecorder(client, "cdi-controller")
    ghost = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "no-such-ns"}}
    recorder.record(ghost, NORMAL, "Reason", "the namespace does not exist")  # the API refuses: logged
    recorder.record({"metadata": {}}, NORMAL, "Reason", "no kind or name")  # invalid: dropped
    recorder.record(ghost, "Bogus", "Reason", "bad type")  # type: ignore[arg-type]
    obj = await client.create(CONFIGMAPS, {"metadata": {"name": "fine"}}, "default")
    recorder.record(obj, NORMAL, "Reason", "still working")
    await recorder.close()
    assert recorder.dropped == 2 and recorder.failed == 1
    assert [e["message"] for e in await events_about(client, "fine")] == ["still working"]
