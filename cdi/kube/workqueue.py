"""client-go's work queue, for asyncio: deduplicating, delaying and rate-limited.

The semantics are the ones every Kubernetes controller relies on:

- An item added while it is already waiting is not added again: five events about one DataVolume
  cause one reconcile.
- An item is never handed to two workers at once. If it is added while a worker processes it, it is
  marked dirty and handed out again after that worker calls `done(item)`, so the change is not lost.
- `add_after(item, delay)` parks an item until its time has come; parking it twice keeps the earlier time.
- `add_rate_limited(item)` parks it for as long as the rate limiter says: per item, exponential in the
  number of failures (until `forget(item)` after a success); overall, a token bucket so that a
  storm of failures does not become a storm of API calls.
- `shutdown()` stops handing out items; `get()` then raises `ShutDown`. `len(queue)` is the depth of
  the ready queue, for the `workqueue_depth` metric.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Generic, Protocol, TypeVar

from cdi.common.backoff import backoff_delay

T = TypeVar("T", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)

Clock = Callable[[], float]


class ShutDown(Exception):
    """The queue was shut down: no more items will be handed out."""


class RateLimiter(Protocol[K_contra]):
    """How long an item must wait before its next attempt (client-go's `RateLimiter`)."""

    def when(self, item: K_contra) -> float: ...

    def forget(self, item: K_contra) -> None: ...

    def num_requeues(self, item: K_contra) -> int: ...


class ItemExponentialLimiter(Generic[T]):
    """`base * 2**failures` per item, capped at `maximum` (client-go: 5 ms to 1000 s; `backoff_delay`)."""

    def __init__(self, base: float = 0.005, maximum: float = 1000.0) -> None:
        self.base = base
        self.maximum = maximum
        self._failures: dict[T, int] = {}

    def when(self, item: T) -> float:
        failures = self._failures.get(item, 0)
        self._failures[item] = failures + 1
        return backoff_delay(failures, self.base, self.maximum)

    def forget(self, item: T) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: T) -> int:
        return self._failures.get(item, 0)


class TokenBucketLimiter(Generic[T]):
    """An overall limit of `qps` attempts per second with bursts of `burst` (client-go: 10 qps, burst 100).

    `when` reserves a token and returns how long until it is valid, so callers never block."""

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Clock = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("token bucket needs qps > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def when(self, item: T) -> float:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def forget(self, item: T) -> None:
        pass

    def num_requeues(self, item: T) -> int:
        return 0


class MaxOfLimiter(Generic[T]):
    """The longest wait any of the limiters asks for (client-go's `MaxOfRateLimiter`)."""

    def __init__(self, *limiters: RateLimiter[T]) -> None:
        self.limiters = limiters

    def when(self, item: T) -> float:
        return max(limiter.when(item) for limiter in self.limiters)

    def forget(self, item: T) -> None:
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return max(limiter.num_requeues(item) for limiter in self.limiters)


def default_rate_limiter() -> MaxOfLimiter[T]:
    """client-go's `DefaultControllerRateLimiter`: per-item 5 ms..1000 s, overall 10 qps burst 100."""
    return MaxOfLimiter(ItemExponentialLimiter(0.005, 1000.0), TokenBucketLimiter(10.0, 100))


class WorkQueue(Generic[T]):
    """A deduplicating, delaying, rate-limited queue of hashable items (usually "namespace/name" keys)."""

    def __init__(self, rate_limiter: RateLimiter[T] | None = None, *, name: str = "",
                 clock: Clock = time.monotonic) -> None:
        self.name = name
        self.rate_limiter: RateLimiter[T] = rate_limiter if rate_limiter is not None else default_rate_limiter()
        self._clock = clock
        self._queue: deque[T] = deque()
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._waiting: list[tuple[float, int, T]] = []  # heap of (ready time, sequence, item)
        self._ready_at: dict[T, float] = {}
        self._sequence = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._getters: deque[asyncio.Future[None]] = deque()
        self._shutting_down = False
        self._drained = asyncio.Event()
        self._drained.set()

    # -- adding ------------------------------------------------------------------------------------

    def add(self, item: T) -> None:
        """Queue `item` unless it is already queued; if it is being processed, queue it after `done`."""
        if self._shutting_down or item in self._dirty:
            return
        self._dirty.add(item)
        if item in self._processing:
            return
        self._queue.append(item)
        self._notify()

    def add_after(self, item: T, delay: float) -> None:
        """Queue `item` after `delay` seconds (at once when `delay <= 0`). The earlier of two times wins."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(item)
            return
        ready = self._clock() + delay
        current = self._ready_at.get(item)
        if current is not None and current <= ready:
            return
        self._ready_at[item] = ready
        heapq.heappush(self._waiting, (ready, next(self._sequence), item))
        self._arm()

    def add_rate_limited(self, item: T) -> None:
        """Queue `item` again after the rate limiter's delay (call after a failed attempt)."""
        self.add_after(item, self.rate_limiter.when(item))

    def forget(self, item: T) -> None:
        """Clear `item`'s failure history (call after a successful attempt)."""
        self.rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return self.rate_limiter.num_requeues(item)

    # -- timer for delayed items -------------------------------------------------------------------

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._waiting:
            ready, _, item = self._waiting[0]
            if self._ready_at.get(item) != ready:
                heapq.heappop(self._waiting)  # superseded by an earlier time
                continue
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, ready - self._clock()), self._fire)
            return

    def _fire(self) -> None:
        self._timer = None
        now = self._clock()
        while self._waiting and self._waiting[0][0] <= now:
            ready, _, item = heapq.heappop(self._waiting)
            if self._ready_at.get(item) == ready:
                del self._ready_at[item]
                self.add(item)
        self._arm()

    # -- taking ------------------------------------------------------------------------------------

    def _notify(self) -> None:
        """Wake one waiting `get()` (asyncio.Queue's hand-off, without its unbounded put side)."""
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    async def get(self) -> T:
        """The next item to process; it is exclusively yours until you call `done(item)`."""
        while not self._queue:
            if self._shutting_down:
                raise ShutDown(self.name)
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                if getter.done() and not getter.cancelled():
                    self._notify()  # we were woken for an item we will not take: pass it on
                else:
                    getter.cancel()
                raise
        item = self._queue.popleft()
        self._processing.add(item)
        self._dirty.discard(item)
        self._drained.clear()
        return item

    def done(self, item: T) -> None:
        """Processing of `item` finished (successfully or not); re-queue it if it was added meanwhile."""
        self._processing.discard(item)
        if item in self._dirty:
            self._queue.append(item)
            self._notify()
        if not self._processing:
            self._drained.set()

    async def __aiter__(self) -> AsyncIterator[T]:
        """`async for item in queue:` until shut down (the loop body must still call `done`)."""
        while True:
            try:
                yield await self.get()
            except ShutDown:
                return

    # -- state -------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Items ready to be handed out (not counting delayed or in-process ones)."""
        return len(self._queue)

    @property
    def waiting(self) -> int:
        """Items parked by `add_after` / `add_rate_limited`."""
        return len(self._ready_at)

    @property
    def processing(self) -> int:
        return len(self._processing)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def shutdown(self) -> None:
        """Refuse new items, drop delayed ones, and wake every waiting `get()` (they raise `ShutDown`
        once the ready queue is empty)."""
        self._shutting_down = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting.clear()
        self._ready_at.clear()
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)

    async def shutdown_with_drain(self, timeout: float | None = None) -> None:
        """`shutdown()`, then wait until every handed-out item is `done`."""
        self.shutdown()
        async with asyncio.timeout(timeout):
            await self._drained.wait()
