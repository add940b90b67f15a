"""The upload server's reusable receive buffers: a buffer anybody still holds is never filled again."""

from __future__ import annotations

import queue

from cdi.uploadserver.front import ReceiveBuffers


def test_a_buffer_still_held_anywhere_is_not_handed_out_again() -> None:
    buffers = ReceiveBuffers(1024)
    queued: queue.Queue[bytearray] = queue.Queue()
    first = buffers.get(1024)
    queued.put(first)
    del first
    second = buffers.get(1024)
    view = memoryview(second)[100:200]  # a slice being written, as the importer's write-behind holds one
    del second
    third = buffers.get(1024)
    held = {id(queued.queue[0]), id(view.obj)}
    assert id(third) not in held and len(held) == 2


def test_a_buffer_nobody_holds_any_more_is_reused() -> None:
    buffers = ReceiveBuffers(1024)
    first = buffers.get(1024)
    first[:5] = b"hello"
    first_id = id(first)
    del first
    assert id(buffers.get(1024)) == first_id


def test_other_sizes_and_more_than_kept_are_fresh_buffers() -> None:
    buffers = ReceiveBuffers(1024)
    tail = buffers.get(10)
    assert len(tail) == 10
    held = [buffers.get(1024) for _ in range(ReceiveBuffers.KEEP + 3)]
    assert len({id(b) for b in held}) == len(held)
    assert all(len(b) == 1024 for b in held)
