"""The importer's queue fed by a reading thread (`FedStream.put`): bounded, ordered, and it lets
go of the producer when the consumer goes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from cdi.uploadserver.feed import FedStream


def test_a_thread_producer_waits_while_full_and_everything_arrives_in_order() -> None:
    queue = FedStream(max_bytes=4)
    stopped = threading.Event()
    chunks = [bytes([i]) * 2 for i in range(10)]
    full = threading.Event()
    consuming = threading.Event()
    third_put_after_a_read: list[bool] = []

    def produce() -> None:
        assert queue.put(chunks[0], stopped) and queue.put(chunks[1], stopped)
        full.set()  # 4 bytes held: the next put has to wait for the consumer
        assert queue.put(chunks[2], stopped, poll=0.05)
        third_put_after_a_read.append(consuming.is_set())
        for chunk in chunks[3:]:
            assert queue.put(chunk, stopped, poll=0.05)
        queue.finish()

    producer = threading.Thread(target=produce)
    producer.start()
    assert full.wait(10)
    consuming.set()
    received = b"".join(bytes(c) for c in iter(lambda: queue.read(1 << 20), b""))
    producer.join(10)
    assert received == b"".join(chunks)
    assert third_put_after_a_read == [True]


def test_the_producer_is_let_go_when_the_consumer_closes_or_it_is_stopped() -> None:
    with ThreadPoolExecutor(2) as pool:
        queue = FedStream(max_bytes=1)
        stopped = threading.Event()
        assert queue.put(b"x", stopped)
        waiting = pool.submit(queue.put, b"y", stopped, 0.05)
        queue.close()
        assert waiting.result(10) is False
        other = FedStream(max_bytes=1)
        assert other.put(b"x", stopped)
        stopped.set()
        assert pool.submit(other.put, b"y", stopped, 0.05).result(10) is False
