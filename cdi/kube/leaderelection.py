"""Leader election over a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it.

Why not `kubernetes.aio.leaderelection`: it never increments `leaseTransitions`, has no
`on_new_leader`, cannot release the lease on a clean stop, writes naive local times with a "Z"
suffix, and goes through the generated models. The algorithm here is client-go's:

- A candidate reads the Lease. It may take it when it does not exist (create), when nobody holds
  it (`holderIdentity` empty: released), or when the holder has not renewed it for
  `leaseDurationSeconds`. Expiry is judged by the candidate's own monotonic clock from the moment it
  last saw the record change, never by comparing `renewTime` with its wall clock, so clock skew
  between machines does not matter.
- Every write is a PUT carrying the resourceVersion that was read (or a create), so when two
  candidates race for the same record one of them gets 409 Conflict and stays a follower.
- The leader renews every `retry_period`. If it cannot renew within `renew_deadline` it stops
  leading (`on_stopped_leading`), so with `renew_deadline < lease_duration` it steps down before
  anybody else may take over.
- On a clean stop the leader can release the lease (empty holder), so a successor need not wait for
  the lease to expire.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cdi.api.groups import LEASES
from cdi.kube.client import KubeClient
from cdi.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from cdi.kube.events import NORMAL, EventRecorder

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Callback = Callable[[], Awaitable[None] | None]
NewLeaderCallback = Callable[[str], Awaitable[None] | None]


def micro_time(moment: datetime | None = None) -> str:
    """A `MicroTime` as Kubernetes writes it: RFC 3339 in UTC with microseconds."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElectionConfig:
    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election needs a non-empty identity")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs retry_period < renew_deadline < lease_duration")


class LeaderElector:
    """Runs for leadership of one Lease; `await elector.run()` returns when leadership is lost.

    `on_started_leading` runs as a task while we lead and is cancelled when we stop leading;
    `on_stopped_leading` runs after that (also when `run()` is cancelled while leading);
    `on_new_leader(identity)` runs whenever the observed holder changes (including to ourselves).
    With a `recorder`, acquiring and losing leadership are also recorded as `LeaderElection` events on
    the Lease, as client-go does ("<identity> became leader")."""

    def __init__(self, client: KubeClient, config: LeaderElectionConfig, *,
                 on_started_leading: Callback | None = None, on_stopped_leading: Callback | None = None,
                 on_new_leader: NewLeaderCallback | None = None, recorder: EventRecorder | None = None) -> None:
        self.client = client
        self.config = config
        self.recorder = recorder
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self._observed: Obj | None = None  # the last Lease read or written
        self._observed_spec: Obj = {}
        self._observed_at = 0.0  # monotonic time the observed spec last changed
        self._leader = ""
        self._leading = asyncio.Event()
        self._rng = random.Random()

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    @property
    def leader(self) -> str:
        """The holder we last observed ("" when unknown or released)."""
        return self._leader

    async def wait_leading(self, timeout: float | None = None) -> None:
        async with asyncio.timeout(timeout):
            await self._leading.wait()

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Acquire, lead until the lease cannot be renewed, then return (or until cancelled)."""
        await self._acquire()
        self._leading.set()
        log.info("%s: became leader of lease %s/%s", self.identity, self.config.namespace, self.config.name)
        self._record(f"{self.identity} became leader")
        work = asyncio.create_task(self._run_callback(self.on_started_leading), name="leading")
        try:
            await self._renew_until_lost()
        finally:
            self._leading.clear()
            work.cancel()
            await asyncio.wait([work])  # its own outcome is logged by _run_callback; ours still propagates
            if self.config.release_on_cancel and _current_task_cancelling():
                await self.release()
            log.info("%s: stopped leading lease %s/%s", self.identity, self.config.namespace, self.config.name)
            self._record(f"{self.identity} stopped leading")
            await asyncio.shield(self._run_callback(self.on_stopped_leading))

    async def _acquire(self) -> None:
        while not await self._try_acquire_or_renew(self.config.retry_period):
            await asyncio.sleep(self.config.retry_period * (1 + 0.2 * self._rng.random()))

    async def _renew_until_lost(self) -> None:
        while True:
            await asyncio.sleep(self.config.retry_period)
            deadline = time.monotonic() + self.config.renew_deadline
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning("%s: could not renew lease within %.1fs", self.identity, self.config.renew_deadline)
                    return
                if await self._try_acquire_or_renew(remaining):
                    break
                if self._leader and self._leader != self.identity:
                    log.warning("%s: lease was taken over by %s", self.identity, self._leader)
                    return
                await asyncio.sleep(min(self.config.retry_period, max(0.0, deadline - time.monotonic())))

    def _record(self, message: str) -> None:
        if self.recorder is not None and self._observed is not None:
            self.recorder.record(self._observed, NORMAL, "LeaderElection", message)

    async def _run_callback(self, callback: Callback | None) -> None:
        if callback is None:
            return
        try:
            result = callback()
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: leader election callback failed", self.identity)

    async def _observe(self, lease: Obj) -> None:
        spec = lease.get("spec") or {}
        if spec != self._observed_spec:
            self._observed_spec = dict(spec)
            self._observed_at = time.monotonic()
        self._observed = lease
        holder = str(spec.get("holderIdentity") or "")
        if holder != self._leader:
            self._leader = holder
            if holder and self.on_new_leader is not None:
                try:
                    result = self.on_new_leader(holder)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("%s: on_new_leader failed", self.identity)

    # -- one attempt -------------------------------------------------------------------------------

    async def _try_acquire_or_renew(self, timeout: float) -> bool:
        """One read-and-write; True if we hold the lease afterwards. Never raises API errors."""
        try:
            async with asyncio.timeout(timeout):
                return await self._attempt()
        except TimeoutError:
            log.warning("%s: lease request timed out", self.identity)
            return False
        except ApiError as exc:
            log.warning("%s: lease %s/%s: %s", self.identity, self.config.namespace, self.config.name, exc)
            return False

    async def _attempt(self) -> bool:
        cfg = self.config
        now = micro_time()
        duration = max(1, math.ceil(cfg.lease_duration))
        try:
            lease = await self.client.get(LEASES, cfg.name, cfg.namespace)
        except NotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": duration,
                             "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}
            try:
                created = await self.client.create(LEASES, body, cfg.namespace)
            except AlreadyExists:
                return False
            await self._observe(created)
            return True

        await self._observe(lease)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        held_for = float(spec.get("leaseDurationSeconds") or duration)
        if holder and holder != self.identity and time.monotonic() < self._observed_at + held_for:
            return False  # somebody else holds an unexpired lease

        new_spec = dict(spec)
        new_spec.update(holderIdentity=self.identity, leaseDurationSeconds=duration, renewTime=now)
        if holder != self.identity:  # taking over (expired or released): a transition, as in client-go
            new_spec["acquireTime"] = now
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        try:
            updated = await self.client.replace(LEASES, {**lease, "spec": new_spec}, cfg.namespace)
        except Conflict:
            return False
        await self._observe(updated)
        return True

    async def release(self) -> bool:
        """Give the lease up (empty holder) if we hold it, so a successor need not wait for expiry."""
        try:
            async with asyncio.timeout(self.config.renew_deadline):
                return await self._release()
        except (ApiError, TimeoutError) as exc:
            log.warning("%s: could not release lease: %s", self.identity, exc)
            return False

    async def _release(self) -> bool:
        lease = self._observed
        for _ in range(2):
            if lease is None or str((lease.get("spec") or {}).get("holderIdentity") or "") != self.identity:
                return False
            now = micro_time()
            spec = {**(lease.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1,
                    "acquireTime": now, "renewTime": now}
            try:
                released = await self.client.replace(LEASES, {**lease, "spec": spec}, self.config.namespace)
            except Conflict:
                # A renewal cancelled mid-flight may have landed without us seeing the answer: re-read,
                # and release only if the lease is still ours.
                lease = await self.client.get(LEASES, self.config.name, self.config.namespace)
                continue
            await self._observe(released)
            log.info("%s: released lease %s/%s", self.identity, self.config.namespace, self.config.name)
            return True
        return False


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
