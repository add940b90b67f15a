"""Lease leader election against the embedded API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from cdi.api.groups import EVENTS, LEASES
from cdi.kube import EventRecorder, KubeClient, LeaderElectionConfig, LeaderElector
from tests.integration.kube.conftest import Cluster, eventually


class Candidate:
    """An elector running in a task, with a log of its callbacks."""

    def __init__(self, client: KubeClient, identity: str, *, lease_duration: float = 1.0,
                 renew_deadline: float = 0.5, retry_period: float = 0.1, release_on_cancel: bool = True) -> None:
        self.log: list[str] = []
        self.leaders: list[str] = []
        config = LeaderElectionConfig("cdi-controller", "kube-system", identity, lease_duration=lease_duration,
                                      renew_deadline=renew_deadline, retry_period=retry_period,
                                      release_on_cancel=release_on_cancel)
        self.elector = LeaderElector(client, config, on_started_leading=self._started,
                                     on_stopped_leading=self._stopped, on_new_leader=self.leaders.append)
        self.task: asyncio.Task[None] | None = None
        self.working = asyncio.Event()
        self.work_cancelled = False

    async def _started(self) -> None:
        self.log.append("started")
        self.working.set()
        try:
            await asyncio.Event().wait()  # "run the controllers" until leadership ends
        except asyncio.CancelledError:
            self.work_cancelled = True
            raise

    def _stopped(self) -> None:
        self.log.append("stopped")

    def start(self) -> Candidate:
        self.task = asyncio.create_task(self.elector.run())
        return self

    async def cancel(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def running(*candidates: Candidate) -> AsyncIterator[None]:
    for c in candidates:
        c.start()
    try:
        yield
    finally:
        for c in candidates:
            if c.task is not None and not c.task.done():
                await c.cancel()


async def lease_spec(client: KubeClient) -> dict[str, object]:
    return dict((await client.get(LEASES, "cdi-controller", "kube-system"))["spec"])


async def test_acquire_renew_and_release(client: KubeClient) -> None:
    a = Candidate(client, "a")
    a.elector.recorder = recorder = EventRecorder(client, "cdi-controller")
    async with running(a):
        await a.elector.wait_leading(5)
        await asyncio.wait_for(a.working.wait(), 5)
        first = await lease_spec(client)
        assert first["holderIdentity"] == "a" and first["leaseTransitions"] == 0
        assert first["leaseDurationSeconds"] == 1
        await eventually(lambda: _renewed_after(client, str(first["renewTime"])), message="renewal")
        assert (await lease_spec(client))["acquireTime"] == first["acquireTime"]
        assert a.leaders == ["a"] and a.elector.leader == "a"
        await a.cancel()
    assert a.log == ["started", "stopped"] and a.work_cancelled
    released = await lease_spec(client)
    assert released["holderIdentity"] == "" and not a.elector.is_leader
    await recorder.close()
    events = (await client.list(EVENTS, "kube-system")).items
    assert sorted((e["reason"], e["message"], e["involvedObject"]["kind"]) for e in events) == [
        ("LeaderElection", "a became leader", "Lease"), ("LeaderElection", "a stopped leading", "Lease")]


async def _renewed_after(client: KubeClient, renew_time: str) -> bool:
    return str((await lease_spec(client))["renewTime"]) > renew_time


async def test_only_one_of_many_candidates_leads(cluster: Cluster) -> None:
    candidates = [Candidate(await cluster.client(), f"c{i}") for i in range(4)]
    async with running(*candidates):
        await eventually(lambda: any(c.elector.is_leader for c in candidates), message="a leader")
        leader = next(c for c in candidates if c.elector.is_leader)
        client = candidates[0].elector.client
        spec = await lease_spec(client)
        assert spec["holderIdentity"] == leader.elector.identity
        # followers learn who leads, and nobody else believes it leads
        await eventually(lambda: all(c.elector.leader == leader.elector.identity for c in candidates))
        assert [c.elector.identity for c in candidates if c.elector.is_leader] == [leader.elector.identity]

        # a clean stop releases the lease and somebody else takes over, counting a transition
        await leader.cancel()
        await eventually(lambda: any(c.elector.is_leader for c in candidates if c is not leader),
                         message="a successor")
        successor = next(c for c in candidates if c.elector.is_leader)
        spec = await lease_spec(client)
        assert spec["holderIdentity"] == successor.elector.identity
        assert spec["leaseTransitions"] == 1
        assert leader.log == ["started", "stopped"]


async def test_handover_when_the_holder_stops_renewing(cluster: Cluster) -> None:
    proxy = await cluster.proxy()
    frozen_client = await cluster.proxied_client(proxy, request_timeout=1.0)
    observer = await cluster.client()
    a = Candidate(frozen_client, "a", lease_duration=2.0, renew_deadline=0.6, retry_period=0.1)
    b = Candidate(await cluster.client(), "b", lease_duration=2.0, renew_deadline=0.6, retry_period=0.1)
    async with running(a):
        await a.elector.wait_leading(5)
        async with running(b):
            await eventually(lambda: b.elector.leader == "a", message="b sees a as leader")
            assert not b.elector.is_leader

            proxy.stall()  # a is cut off mid-flight: it cannot renew, and it cannot release either

            await asyncio.wait_for(b.elector.wait_leading(), 10)
            spec = await lease_spec(observer)
            assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
            # a gave up on its own once renewing failed past its renew deadline
            await eventually(lambda: a.log == ["started", "stopped"], message="a stepped down")
            assert a.task is not None and a.task.done() and not a.elector.is_leader

            proxy.resume()
            assert b.elector.is_leader
            assert b.leaders[-1] == "b" and b.log == ["started"]


@pytest.mark.parametrize("bad", [dict(retry_period=1.0, renew_deadline=1.0), dict(lease_duration=1.0),
                                 dict(identity="")])
def test_config_is_validated(bad: dict[str, object]) -> None:
    args: dict[str, object] = {"name": "l", "namespace": "ns", "identity": "me", "lease_duration": 15.0,
                               "renew_deadline": 10.0, "retry_period": 2.0, **bad}
    with pytest.raises(ValueError, match="leader election needs"):
        LeaderElectionConfig(**args)  # type: ignore[arg-type]
