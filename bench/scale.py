"""The scale scenario (issue 29 item 5), as one function a benchmark and a test both run: N DataVolumes,
half blank and half small HTTP imports, created at once in a namespace of their own, then followed
until every one has ended, while watches record what a user would check:

- every DataVolume `Succeeded` (none `Failed`, none still going at the deadline);
- each got exactly one worker pod: the importer pods seen per DataVolume are counted by uid, so a pod
  deleted and made again, or a retry, shows as two;
- when each step happened (claim bound, pod created, pod running, pod ended, DataVolume Succeeded), so
  that the slowest step of the pipeline is visible in the numbers, not guessed;
- how many API requests the run cost, from the API server's own `apiserver_request_total` (read before
  and after, the benchmark's own requests taken out): the same series on `cdi up` and on a real cluster.

It knows nothing of which cluster it runs on: the caller passes a client, and measures the controller
itself (a process's /proc on `cdi up`, the leader pod's metrics on a real cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from cdi.api.groups import DATAVOLUMES, GVR, NAMESPACES, PODS, PVCS
from cdi.kube import KubeClient
from cdi.kube.errors import AlreadyExists, ApiError

Obj = dict[str, Any]
IMAGE_NAME = "disk.qcow2"
RequestKey = tuple[str, str, str]  # (verb, resource[/subresource], code) of apiserver_request_total


def make_image(directory: Path, virtual_mib: int = 8, data_mib: int = 4) -> Path:
    """A qcow2 of `virtual_mib` MiB with `data_mib` MiB of random data at its start: a small real import
    (the importer converts it), of the same shape in every run of the benchmark and the test."""
    raw = directory / "disk.raw"
    with raw.open("wb") as out:
        out.truncate(virtual_mib << 20)
        out.write(os.urandom(data_mib << 20))
    image = directory / IMAGE_NAME
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(image)], check=True)
    raw.unlink()
    return image


@dataclass(frozen=True)
class Workload:
    """What to create: `count` DataVolumes named `scale-NNNN`, the even ones blank and the odd ones imported
    from `image_url` (all blank without one), each asking for `size` of `storage_class` (the cluster's
    default class when None)."""

    count: int
    namespace: str
    image_url: str | None = None
    storage_class: str | None = None
    size: str = "16Mi"

    def names(self) -> list[str]:
        return [f"scale-{i:04d}" for i in range(self.count)]

    def imported(self, name: str) -> bool:
        return self.image_url is not None and int(name.rsplit("-", 1)[1]) % 2 == 1

    def manifest(self, name: str) -> Obj:
        source: Obj = {"http": {"url": self.image_url}} if self.imported(name) else {"blank": {}}
        storage: Obj = {"resources": {"requests": {"storage": self.size}}}
        if self.storage_class:
            storage["storageClassName"] = self.storage_class
        return {"apiVersion": DATAVOLUMES.api_version, "kind": DATAVOLUMES.kind,
                "metadata": {"name": name, "labels": {"cdi-scale": "true"}},
                "spec": {"source": source, "storage": storage}}


@dataclass
class Timeline:
    """When (seconds after the first create was sent) each step of one DataVolume was first seen; `bound` is
    the first of its claims bound (with a populator, the prime claim the worker pod fills), `claim` the first
    of its claims seen."""

    created: float | None = None
    claim: float | None = None
    bound: float | None = None
    pod_created: float | None = None
    pod_running: float | None = None
    pod_ended: float | None = None
    succeeded: float | None = None
    failed: str | None = None
    restart_count: int = 0


STEPS = ("created", "claim", "bound", "pod_created", "pod_running", "pod_ended", "succeeded")


@dataclass
class Outcome:
    """What one run saw. `problems()` is empty when every DataVolume Succeeded with one worker pod."""

    workload: Workload
    timelines: dict[str, Timeline]
    pods: dict[str, set[str]]  # DataVolume -> uids of the worker pods seen for it
    unattributed_pods: list[str]  # worker pods in the namespace no DataVolume could be found for
    creates_seconds: float  # from the first create sent to the last one answered
    last_succeeded_seconds: float | None
    api_requests: Counter[RequestKey] = field(default_factory=Counter)  # the run's, the benchmark's own out
    own_requests: int = 0
    timed_out: bool = False

    @property
    def count(self) -> int:
        return self.workload.count

    def succeeded(self) -> int:
        return sum(1 for t in self.timelines.values() if t.succeeded is not None)

    def pods_per_datavolume(self) -> Counter[int]:
        """How many DataVolumes had 0, 1, 2, ... worker pods."""
        return Counter(len(self.pods.get(name, ())) for name in self.timelines)

    def problems(self) -> list[str]:
        found = []
        failed = {n: t.failed for n, t in self.timelines.items() if t.failed}
        if failed:
            found.append(f"{len(failed)} Failed, e.g. " + "; ".join(f"{n}: {r}" for n, r in list(failed.items())[:3]))
        missing = [n for n, t in self.timelines.items() if t.succeeded is None and not t.failed]
        if missing:
            found.append(f"{len(missing)} not Succeeded{' at the deadline' if self.timed_out else ''}, e.g. "
                         + ", ".join(missing[:5]))
        not_one = {n: len(self.pods.get(n, ())) for n in self.timelines if len(self.pods.get(n, ())) != 1}
        if not_one:
            found.append(f"{len(not_one)} without exactly one worker pod, e.g. "
                         + ", ".join(f"{n}: {c}" for n, c in list(not_one.items())[:5]))
        restarted = {n: t.restart_count for n, t in self.timelines.items() if t.restart_count}
        if restarted:
            found.append(f"{len(restarted)} with restartCount > 0, e.g. {list(restarted.items())[:3]}")
        if self.unattributed_pods:
            found.append(f"{len(self.unattributed_pods)} worker pods of no DataVolume: {self.unattributed_pods[:3]}")
        return found

    def step_medians(self) -> dict[str, float]:
        """Median seconds of each step (from the previous one), over the DataVolumes that reached both."""
        medians = {}
        for before, after in itertools.pairwise(STEPS):
            gaps = [getattr(t, after) - getattr(t, before) for t in self.timelines.values()
                    if getattr(t, before) is not None and getattr(t, after) is not None]
            if gaps:
                medians[f"{before} -> {after}"] = statistics.median(gaps)
        return medians

    def latency(self, quantile: float) -> float | None:
        """Seconds from a DataVolume's create to its Succeeded, at `quantile` (0.5: median)."""
        values = sorted(t.succeeded - t.created for t in self.timelines.values()
                        if t.succeeded is not None and t.created is not None)
        if not values:
            return None
        return values[min(len(values) - 1, int(quantile * len(values)))]

    def api_requests_total(self) -> int:
        return sum(self.api_requests.values())


# -- API request counts --------------------------------------------------------------------------------


async def request_totals(client: KubeClient) -> Counter[RequestKey]:
    """apiserver_request_total from the API server's /metrics, summed by verb, resource[/subresource] and code
    (the same read as `kubectl get --raw /metrics`)."""
    text = (await client.request("GET", "/metrics", accept="text/plain")).text
    totals: Counter[RequestKey] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            totals[(labels.get("verb", ""), resource, labels.get("code", ""))] += int(sample.value)
    return totals


def without(totals: Counter[RequestKey], own: Iterable[tuple[RequestKey, int]]) -> Counter[RequestKey]:
    rest = Counter(totals)
    for key, count in own:
        rest[key] -= count
    return +rest  # drops zeros (and anything the server counted differently from what we sent)


# -- the run -------------------------------------------------------------------------------------------


class _Watcher:
    """Lists then watches one kind in the namespace for the whole run, re-listing after a watch ends, and
    hands every object to `seen`. Counts its own requests (they are taken out of the API totals)."""

    def __init__(self, client: KubeClient, gvr: GVR, namespace: str, seen: Callable[[str, Obj], None]) -> None:
        self.client, self.gvr, self.namespace, self.seen = client, gvr, namespace, seen
        self.requests: Counter[RequestKey] = Counter()
        self.synced = asyncio.Event()

    async def run(self) -> None:
        while True:
            listed = await self.client.list(self.gvr, self.namespace)
            self.requests[("LIST", self.gvr.plural, "200")] += 1
            for obj in listed.items:
                self.seen("ADDED", obj)
            self.synced.set()
            try:
                async with self.client.watch(self.gvr, self.namespace, resource_version=listed.resource_version,
                                             allow_bookmarks=True) as events:
                    async for event in events:
                        if event.type != "BOOKMARK":
                            self.seen(event.type, event.object)
            except ApiError:
                pass  # 410 Gone or a dropped stream: list again
            finally:
                self.requests[("WATCH", self.gvr.plural, "200")] += 1


def _owner(obj: Obj, kind: str) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == kind:
            return str(ref.get("name"))
    return None


def _is_worker_pod(pod: Obj) -> bool:
    """An importer pod (CDI's `app: containerized-data-importer` label, as every worker pod has it) made for a
    claim; the benchmark creates no other pods."""
    meta = pod.get("metadata") or {}
    return (meta.get("labels") or {}).get("app") == "containerized-data-importer" and \
        _owner(pod, "PersistentVolumeClaim") is not None


async def run(client: KubeClient, workload: Workload, *, timeout: float = 1800.0, concurrency: int = 16,
              on_progress: Callable[[str], None] | None = None) -> Outcome:
    """Create the workload's DataVolumes at once (`concurrency` creates in flight) in its namespace (made if
    missing), and follow them until all have ended or `timeout` seconds have passed."""
    with contextlib.suppress(AlreadyExists):
        await client.create(NAMESPACES, {"metadata": {"name": workload.namespace}})
    names = workload.names()
    timelines = {name: Timeline() for name in names}
    pods: dict[str, set[str]] = {}  # owning claim -> worker pod uids
    claim_owner: dict[str, str] = {}  # claim -> DataVolume (or the claim it is the prime of)
    started = time.monotonic()  # set again when the first create is sent
    done = asyncio.Event()

    def now() -> float:
        return time.monotonic() - started

    def first(timeline: Timeline, step: str) -> None:
        if getattr(timeline, step) is None:
            setattr(timeline, step, now())

    def dv_of_claim(claim: str) -> str | None:
        for _ in range(4):  # a prime claim belongs to the target claim, which belongs to the DataVolume
            if claim in timelines:
                return claim
            owner = claim_owner.get(claim)
            if owner is None:
                return None
            claim = owner
        return None

    def seen_dv(kind: str, dv: Obj) -> None:
        timeline = timelines.get(dv["metadata"]["name"])
        if timeline is None or kind == "DELETED":
            return
        status = dv.get("status") or {}
        timeline.restart_count = int(status.get("restartCount") or 0)
        phase = status.get("phase")
        if phase == "Succeeded":
            first(timeline, "succeeded")
        elif phase == "Failed":
            reasons = [c.get("message") or c.get("reason") for c in status.get("conditions") or []
                       if c.get("type") == "Running"]
            timeline.failed = str(reasons[0] if reasons else "Failed")
        if all(t.succeeded is not None or t.failed for t in timelines.values()):
            done.set()

    def seen_claim(kind: str, pvc: Obj) -> None:
        name = pvc["metadata"]["name"]
        owner = _owner(pvc, "DataVolume") or _owner(pvc, "PersistentVolumeClaim")
        if owner is not None:
            claim_owner[name] = owner
        dv = dv_of_claim(name)  # the claim the worker fills: a populator's prime claim binds first
        if dv is not None:
            first(timelines[dv], "claim")
            if (pvc.get("status") or {}).get("phase") == "Bound":
                first(timelines[dv], "bound")

    def seen_pod(kind: str, pod: Obj) -> None:
        if not _is_worker_pod(pod):
            return
        claim = _owner(pod, "PersistentVolumeClaim")
        assert claim is not None
        pods.setdefault(claim, set()).add(pod["metadata"]["uid"])
        dv = dv_of_claim(claim)
        timeline = timelines.get(dv) if dv else None
        if timeline is None:
            return
        first(timeline, "pod_created")
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Running", "Succeeded", "Failed"):
            first(timeline, "pod_running")
        if phase in ("Succeeded", "Failed") or kind == "DELETED":
            first(timeline, "pod_ended")

    watchers = [_Watcher(client, DATAVOLUMES, workload.namespace, seen_dv),
                _Watcher(client, PVCS, workload.namespace, seen_claim),
                _Watcher(client, PODS, workload.namespace, seen_pod)]
    tasks = [asyncio.create_task(w.run(), name=f"watch-{w.gvr.plural}") for w in watchers]
    try:
        for watcher in watchers:
            await watcher.synced.wait()
        before = await request_totals(client)
        started = time.monotonic()
        gate = asyncio.Semaphore(concurrency)

        async def create(name: str) -> None:
            async with gate:
                await client.create(DATAVOLUMES, workload.manifest(name), workload.namespace)
                first(timelines[name], "created")

        await asyncio.gather(*(create(name) for name in names))
        creates_seconds = now()
        if on_progress:
            on_progress(f"{workload.count} DataVolumes created in {creates_seconds:.1f}s")
        timed_out = False
        try:
            await asyncio.wait_for(done.wait(), timeout)
        except TimeoutError:
            timed_out = True
        after = await request_totals(client)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await task
    own = Counter({("POST", "datavolumes", "201"): workload.count, ("GET", "", "200"): 1})  # creates, first read
    for watcher in watchers:
        own.update(watcher.requests)
    own.subtract({("LIST", w.gvr.plural, "200"): 1 for w in watchers})  # the first lists were before `before`
    pods_of_dv: dict[str, set[str]] = {}
    unattributed = []
    for claim, uids in pods.items():
        dv = dv_of_claim(claim)
        if dv is None:
            unattributed.extend(sorted(uids))
        else:
            pods_of_dv.setdefault(dv, set()).update(uids)
    ends = [t.succeeded for t in timelines.values() if t.succeeded is not None]
    delta = Counter(after)
    delta.subtract(before)
    return Outcome(workload, timelines, pods_of_dv, unattributed, creates_seconds,
                   max(ends) if len(ends) == len(names) else None,
                   without(delta, own.items()), sum(own.values()), timed_out)


async def delete_namespace(client: KubeClient, namespace: str, timeout: float = 600.0) -> None:
    """Remove what a run left (its DataVolumes, claims and volumes go with the namespace)."""
    with contextlib.suppress(ApiError):
        await client.delete(NAMESPACES, namespace)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            await client.get(NAMESPACES, namespace)
        except ApiError:
            return
        await asyncio.sleep(1.0)
