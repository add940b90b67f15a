"""The upload server's reusable receive buffers have one owner at a time: the reading thread fills a buffer,
the importer's queue holds it, the importer reads it and hands it back once written; only then is it filled
again. A buffer the importer still holds (or only got a slice of) is never refilled."""

from __future__ import annotations

import gzip
import hashlib
import random
import threading
from pathlib import Path

from cdi.importer import FileTarget, ImportOptions, import_stream
from cdi.uploadserver.feed import FedStream
from cdi.uploadserver.front import ReceiveBuffers

SIZE = 1024


def test_a_buffer_is_filled_again_only_after_the_consumer_gave_it_back() -> None:
    buffers = ReceiveBuffers(SIZE)
    queue = FedStream(1 << 20)
    queue.recycle_with(buffers.give_back)
    first = buffers.get(SIZE)
    queue.put(first, threading.Event())
    chunk = queue.read(SIZE)
    assert chunk is first
    assert all(buffers.get(SIZE) is not first for _ in range(ReceiveBuffers.KEEP + 2))  # still the consumer's
    queue.give_back(chunk)
    assert buffers.get(SIZE) is first
    queue.give_back(chunk)  # twice is once
    assert buffers.get(SIZE) is not first


def test_a_chunk_read_in_slices_or_not_the_last_one_read_is_never_recycled() -> None:
    buffers = ReceiveBuffers(SIZE)
    queue = FedStream(1 << 20)
    queue.recycle_with(buffers.give_back)
    sliced, whole = buffers.get(SIZE), buffers.get(SIZE)
    for buffer in (sliced, whole):
        queue.put(buffer, threading.Event())
    half = queue.read(SIZE // 2)
    queue.give_back(half)
    queue.give_back(sliced)  # the consumer may still hold `half`, a view of it
    rest = queue.read(SIZE)
    assert len(rest) == SIZE // 2
    assert queue.read(SIZE) is whole
    queue.give_back(sliced)
    assert buffers.get(SIZE) is not sliced


def test_a_buffer_the_consumer_holds_is_never_refilled_under_load() -> None:
    """A producing thread fills buffers with their sequence number as fast as it can; the consumer keeps every
    third chunk (as a writer still busy with it would) and gives the others back. What it keeps never changes."""
    buffers = ReceiveBuffers(SIZE)
    queue = FedStream(8 * SIZE)
    queue.recycle_with(buffers.give_back)
    count = 3000
    stopped = threading.Event()

    def produce() -> None:
        for i in range(count):
            buffer = buffers.get(SIZE)
            buffer[:] = i.to_bytes(4, "big") * (SIZE // 4)
            queue.put(buffer, stopped)
        queue.finish()

    producer = threading.Thread(target=produce)
    producer.start()
    kept: list[tuple[int, bytearray]] = []
    i = 0
    while chunk := queue.read(SIZE):
        assert bytes(chunk) == i.to_bytes(4, "big") * (SIZE // 4)
        if i % 3 == 0:
            assert isinstance(chunk, bytearray)
            kept.append((i, chunk))
        else:
            queue.give_back(chunk)
        i += 1
    producer.join()
    assert i == count
    assert all(bytes(chunk) == n.to_bytes(4, "big") * (SIZE // 4) for n, chunk in kept)
    assert buffers.fresh < count * 0.4  # the given-back ones were reused


def _prefix(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _feed(data: bytes, buffers: ReceiveBuffers) -> FedStream:
    queue = FedStream(4 << 20)
    queue.recycle_with(buffers.give_back)

    def produce() -> None:
        for start in range(0, len(data), buffers.size):
            buffer = buffers.get(min(buffers.size, len(data) - start))
            buffer[:] = data[start:start + len(buffer)]
            queue.put(buffer, threading.Event())
        queue.finish()

    threading.Thread(target=produce, daemon=True).start()
    return queue


def test_the_importer_gives_back_each_chunk_it_wrote(tmp_path: Path) -> None:
    """A raw upload: every chunk is handed back once written, and the volume holds exactly the bytes sent."""
    data = random.Random(7).randbytes(24 << 20)
    buffers = ReceiveBuffers(1 << 20)
    (tmp_path / "data").mkdir()
    import_stream(_feed(data, buffers), FileTarget(tmp_path / "data"), ImportOptions(), size=len(data))
    assert hashlib.sha256(_prefix(tmp_path / "data" / "disk.img", len(data))).digest() == hashlib.sha256(data).digest()
    assert buffers.fresh < 24 // 2


def test_chunks_a_decompressor_read_are_not_given_back(tmp_path: Path) -> None:
    """A compressed upload: the importer never says it is done with a chunk, so none is filled again."""
    data = random.Random(8).randbytes(6 << 20)
    packed = gzip.compress(data, compresslevel=1)
    buffers = ReceiveBuffers(1 << 20)
    (tmp_path / "data").mkdir()
    import_stream(_feed(packed, buffers), FileTarget(tmp_path / "data"), ImportOptions(), size=len(packed))
    assert _prefix(tmp_path / "data" / "disk.img", len(data)) == data
    assert buffers.fresh == -(-len(packed) // (1 << 20))
