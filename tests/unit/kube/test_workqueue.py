"""WorkQueue semantics (client-go's workqueue), without a server."""

from __future__ import annotations

import asyncio

import pytest

from cdi.kube import ItemExponentialLimiter, MaxOfLimiter, ShutDown, TokenBucketLimiter, WorkQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def take(queue: WorkQueue[str], timeout: float = 2.0) -> str:
    return await asyncio.wait_for(queue.get(), timeout)


async def nothing_ready(queue: WorkQueue[str]) -> bool:
    """True if `get()` has nothing to hand out right now."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), 0.02)
    return True


async def test_duplicates_before_processing_run_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "a", "b", "c"):
        queue.add(key)
    assert len(queue) == 3
    assert [await take(queue) for _ in range(3)] == ["a", "b", "c"]
    assert len(queue) == 0 and queue.processing == 3
    assert await nothing_ready(queue)


async def test_an_item_readded_while_processing_is_requeued_after_done() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    item = await take(queue)
    queue.add("a")  # a change arrives while a worker holds "a"
    queue.add("a")
    assert len(queue) == 0  # not handed to a second worker concurrently
    assert await nothing_ready(queue)
    queue.done(item)
    assert len(queue) == 1
    assert await take(queue) == "a"
    queue.done("a")
    assert len(queue) == 0 and queue.processing == 0


async def test_waiting_getters_are_woken_in_order() -> None:
    queue: WorkQueue[str] = WorkQueue()
    getters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await asyncio.sleep(0)
    queue.add("x")
    queue.add("y")
    for _ in range(100):
        if sum(t.done() for t in getters) >= 2:
            break
        await asyncio.sleep(0)
    assert [t.result() for t in getters if t.done()] == ["x", "y"]  # first come, first served
    queue.shutdown()
    with pytest.raises(ShutDown):
        await asyncio.wait_for(getters[2], 2)


async def test_a_cancelled_getter_does_not_swallow_an_item() -> None:
    queue: WorkQueue[str] = WorkQueue()
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.add("x")  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    assert await asyncio.wait_for(second, 2) == "x"


async def test_add_after_and_the_earliest_time_wins() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("late", 0.3)
    queue.add_after("soon", 0.05)
    queue.add_after("late", 0.1)  # earlier: replaces 0.3
    queue.add_after("soon", 5.0)  # later: ignored
    assert queue.waiting == 2 and len(queue) == 0
    assert await take(queue) == "soon"
    assert await take(queue) == "late"
    assert queue.waiting == 0
    queue.add_after("now", 0)
    assert len(queue) == 1


async def test_rate_limited_requeues_back_off_per_item_until_forgotten() -> None:
    limiter: ItemExponentialLimiter[str] = ItemExponentialLimiter(base=0.01, maximum=0.04)
    assert [limiter.when("a") for _ in range(5)] == [0.01, 0.02, 0.04, 0.04, 0.04]
    assert limiter.when("b") == 0.01  # per item
    assert limiter.num_requeues("a") == 5
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0 and limiter.when("a") == 0.01

    queue: WorkQueue[str] = WorkQueue(ItemExponentialLimiter(base=0.01, maximum=0.05))
    for attempt in range(1, 4):
        queue.add_rate_limited("k")
        assert queue.num_requeues("k") == attempt
        assert await take(queue) == "k"
        queue.done("k")
    queue.forget("k")
    assert queue.num_requeues("k") == 0


def test_token_bucket_limits_the_overall_rate() -> None:
    clock = FakeClock()
    bucket: TokenBucketLimiter[str] = TokenBucketLimiter(qps=10, burst=3, clock=clock)
    assert [bucket.when(str(i)) for i in range(3)] == [0, 0, 0]  # the burst
    assert bucket.when("x") == pytest.approx(0.1)  # then one every 1/qps, reserved ahead
    assert bucket.when("y") == pytest.approx(0.2)
    clock.now += 1.0  # refills (up to the burst)
    assert bucket.when("z") == 0

    combined: MaxOfLimiter[str] = MaxOfLimiter(ItemExponentialLimiter(0.001, 10), TokenBucketLimiter(1, 1, clock))
    assert combined.when("a") == 0.001
    assert combined.when("b") == pytest.approx(1.0)  # the bucket is the binding limit now
    assert combined.num_requeues("a") == 1


async def test_shutdown_hands_out_what_is_queued_then_raises() -> None:
    queue: WorkQueue[str] = WorkQueue(name="dv")
    queue.add("a")
    queue.add_after("parked", 10)
    queue.shutdown()
    assert queue.shutting_down and queue.waiting == 0
    queue.add("ignored")
    assert await take(queue) == "a"
    with pytest.raises(ShutDown):
        await take(queue)


async def test_shutdown_with_drain_waits_for_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    item = await take(queue)
    drained = asyncio.create_task(queue.shutdown_with_drain(5))
    await asyncio.sleep(0)
    assert not drained.done()
    queue.done(item)
    await asyncio.wait_for(drained, 2)


async def test_async_iteration_stops_at_shutdown() -> None:
    queue: WorkQueue[int] = WorkQueue()
    for i in range(3):
        queue.add(i)
    seen = []
    async for item in queue:
        seen.append(item)
        queue.done(item)
        if len(seen) == 3:
            queue.shutdown()
    assert seen == [0, 1, 2]


async def test_workers_process_each_key_once_per_burst() -> None:
    """The controller pattern: several workers, a burst of events per key, one reconcile per key
    unless an event arrives during its reconcile."""
    queue: WorkQueue[str] = WorkQueue()
    reconciled: list[str] = []
    busy: set[str] = set()

    async def worker() -> None:
        async for key in queue:
            assert key not in busy  # never two workers on one key
            busy.add(key)
            await asyncio.sleep(0)
            reconciled.append(key)
            busy.discard(key)
            queue.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(4)]
    for _ in range(5):
        for key in ("ns/a", "ns/b", "ns/c"):
            queue.add(key)
    for _ in range(1000):
        if not len(queue) and not queue.processing:
            break
        await asyncio.sleep(0.001)
    queue.shutdown()
    await asyncio.wait_for(asyncio.gather(*workers), 2)
    assert sorted(reconciled) == ["ns/a", "ns/b", "ns/c"]
