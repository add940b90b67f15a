"""The importer's queue fed by a reading thread (`FedStream.put_blocking`): bounded, ordered, and it lets
go of the producer when the consumer goes."""

from __future__ import annotations

import asyncio
import threading

from cdi.uploadserver.feed import FedStream


async def test_a_thread_producer_waits_while_full_and_everything_arrives_in_order() -> None:
    queue = FedStream(max_bytes=4)
    stopped = threading.Event()
    chunks = [bytes([i]) * 2 for i in range(10)]
    full = threading.Event()
    consuming = threading.Event()
    third_put_after_a_read: list[bool] = []

    def produce() -> None:
        assert queue.put_blocking(chunks[0], stopped) and queue.put_blocking(chunks[1], stopped)
        full.set()  # 4 bytes held: the next put has to wait for the consumer
        assert queue.put_blocking(chunks[2], stopped, poll=0.05)
        third_put_after_a_read.append(consuming.is_set())
        for chunk in chunks[3:]:
            assert queue.put_blocking(chunk, stopped, poll=0.05)
        queue.finish()

    def consume() -> bytes:
        consuming.set()
        return b"".join(bytes(c) for c in iter(lambda: queue.read(1 << 20), b""))

    producer = threading.Thread(target=produce)
    producer.start()
    assert await asyncio.to_thread(full.wait, 10)
    received = await asyncio.to_thread(consume)
    producer.join(10)
    assert received == b"".join(chunks)
    assert third_put_after_a_read == [True]


async def test_the_producer_is_let_go_when_the_consumer_closes_or_it_is_stopped() -> None:
    queue = FedStream(max_bytes=1)
    stopped = threading.Event()
    assert queue.put_blocking(b"x", stopped)
    waiting = asyncio.ensure_future(asyncio.to_thread(queue.put_blocking, b"y", stopped, 0.05))
    await asyncio.sleep(0)
    queue.close()
    assert await asyncio.wait_for(waiting, 10) is False
    other = FedStream(max_bytes=1)
    assert other.put_blocking(b"x", stopped)
    stopped.set()
    assert await asyncio.wait_for(asyncio.to_thread(other.put_blocking, b"y", stopped, 0.05), 10) is False
