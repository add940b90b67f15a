"""The spans that `ImportContext.fetch_spans` fetches are hashed in a thread of their own (`Behind`), and a
buffer goes back to the fetcher's pool only once hashed: with a hash far slower than the fetch and a window
of three buffers, a buffer refilled before its hash would show in the digest."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from cdi.importer import resume
from cdi.importer.checksum import Hasher
from cdi.importer.options import ImportOptions
from cdi.importer.progress import Progress
from cdi.importer.ranges import SpanList
from cdi.importer.routes.context import ImportContext
from cdi.importer.source import Origin
from cdi.importer.sparse_writer import SparseWriter
from cdi.importer.target import FileTarget

SPAN = 64 << 10
DATA = os.urandom(40 * SPAN + 12345)  # a short last span too


class MemoryRanges:
    size = len(DATA)

    def read_into(self, offset: int, view: memoryview) -> None:
        view[:] = DATA[offset : offset + len(view)]


class SlowHasher(Hasher):
    """Hashes slowly, and says in which thread."""

    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__()
        self.threads: set[str] = set()
        self.fail_after = fail_after

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self.threads.add(threading.current_thread().name)
        if self.fail_after is not None and self.count >= self.fail_after:
            raise RuntimeError("the hash broke")
        time.sleep(0.002)
        super().update(data)


def fetch(tmp_path: Path, hasher: Hasher) -> tuple[ImportContext, bytes]:
    origin = Origin()
    origin.name = "memory"
    options = ImportOptions(span_size=SPAN, workers=3, window=3)
    ctx = ImportContext(origin, FileTarget(tmp_path), options, Progress(), threading.Event())
    ctx.hasher = hasher
    path = tmp_path / "disk.img"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        writer = SparseWriter(fd, known_zero=True)
        checkpoint = resume.Checkpointer(writer, None, {}, {}, spans=0, done=0, every_bytes=1 << 40,
                                         every_seconds=1e9)
        ctx.fetch_spans(MemoryRanges(), SpanList(0, len(DATA), SPAN),
                        lambda s, buf: writer.write_at(s.offset, buf, 0, s.length), checkpoint, done=0)
        writer.close()
    finally:
        os.close(fd)
    return ctx, path.read_bytes()


def test_spans_are_hashed_in_order_behind_the_fetch_and_never_refilled_first(tmp_path: Path) -> None:
    hasher = SlowHasher()
    ctx, written = fetch(tmp_path, hasher)
    assert written == DATA
    assert hasher.count == len(DATA)
    assert hasher.sha256() == hashlib.sha256(DATA).hexdigest()
    assert hasher.threads == {"hash"}  # not the thread that hands the spans on and checkpoints
    assert ctx.hasher is hasher


def test_a_failure_of_the_hash_is_raised_by_the_fetch(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the hash broke"):
        fetch(tmp_path, SlowHasher(fail_after=5 * SPAN))
