"""The receiving end of a host-assisted clone (`cdi.common.clonestream`), served by the upload server's
threaded front (`cdi.uploadserver.front`): the stream is read from the TLS connection in 4 MiB buffers
(one call each on the native path, the GIL released while OpenSSL decrypts) and its extents written in
place through the importer's `SparseWriter` (around the page cache, zero blocks skipped) by a writing
thread of its own, so that decrypting and writing overlap. Into the target's Filesystem `disk.img`
(created sparse, then grown to the volume's usable size) or Block device (the gaps between extents
punched, never written as zeros), flushed before the answer. A retried clone starts over: the image
file is truncated, and every byte of a device is rewritten or punched. A stream cut short fails the
clone (the source pod sends it again)."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cdi.api.sizing import usable_space
from cdi.common import clonestream
from cdi.importer.sparse_writer import SparseWriter
from cdi.uploadserver.config import UploadServerConfig

CHUNK = 4 << 20
BUFFERS = 6  # in flight between the reading and the writing thread (24 MiB)


class CloneRefused(Exception):
    """A stream this target cannot take (400)."""


class StreamCut(Exception):
    """The stream ended (or broke) before its end marker (500: the source sends it again)."""


@dataclass(frozen=True)
class CloneResult:
    virtual_size: int
    data_bytes: int


Fill = Callable[[memoryview], int]  # fills some of the view (0: the connection ended); OSError when it broke


class Reader:
    """The stream from a connection: `exactly(n)` for the small records, `into(view)` to fill a buffer."""

    def __init__(self, fill: Fill, head: bytes = b"") -> None:
        self._fill = fill
        self._head = bytearray(head)  # what arrived with the request's head
        self.received = 0

    def into(self, view: memoryview) -> None:
        """Fill all of `view`; StreamCut when the stream ends first."""
        done = 0
        if self._head:
            done = min(len(self._head), len(view))
            view[:done] = self._head[:done]
            del self._head[:done]
        while done < len(view):
            try:
                n = self._fill(view[done:])
            except (OSError, TimeoutError) as exc:
                raise StreamCut(f"the clone stream broke after {self.received + done} bytes: {exc}") from exc
            if not n:
                raise StreamCut(f"the clone stream ended after {self.received + done} bytes, before its end")
            done += n
        self.received += len(view)

    def exactly(self, n: int) -> bytes:
        buffer = bytearray(n)
        self.into(memoryview(buffer))
        return bytes(buffer)


class _Writer:
    """Writes filled buffers in a thread of its own and hands them back to be filled again."""

    def __init__(self, writer: SparseWriter) -> None:
        self.writer = writer
        self.free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(BUFFERS):
            self.free.put(bytearray(CHUNK))
        self.work: queue.Queue[tuple[int, bytearray, int] | None] = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="clone-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.work.get()) is not None:
            offset, buffer, length = item
            if self.error is None:
                try:
                    self.writer.write_at(offset, buffer, 0, length)
                except BaseException as exc:  # re-raised in the reading thread
                    self.error = exc
            self.free.put(buffer)

    def buffer(self) -> bytearray:
        if self.error is not None:
            raise self.error
        return self.free.get()

    def write(self, offset: int, buffer: bytearray, length: int) -> None:
        self.work.put((offset, buffer, length))

    def close(self, quiet: bool = False) -> None:
        """Wait for the writes queued so far; re-raise a write failure (unless already failing)."""
        self.work.put(None)
        self.thread.join()
        if self.error is not None and not quiet:
            raise self.error


def receive(reader: Reader, config: UploadServerConfig) -> CloneResult:
    """Read a whole clone stream and write it into the target; CloneRefused, StreamCut or OSError."""
    head = reader.exactly(len(clonestream.MAGIC) + clonestream.HEADER.size)
    if not head.startswith(clonestream.MAGIC):
        raise CloneRefused("not a clone stream")
    (virtual,) = clonestream.HEADER.unpack(head[len(clonestream.MAGIC):])
    if config.is_block:
        fd = os.open(config.destination, os.O_WRONLY)
        capacity = os.lseek(fd, 0, os.SEEK_END)
        final = capacity
    else:
        available = config.image_size or virtual
        capacity = available
        final = max(virtual, usable_space(config.filesystem_overhead, available))
        fd = os.open(config.destination, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o660)
    writer: SparseWriter | None = None
    behind: _Writer | None = None
    try:
        if virtual > capacity:
            raise CloneRefused(f"the source ({virtual} bytes) is larger than the target ({capacity} bytes)")
        if not config.is_block:
            os.ftruncate(fd, final)
        writer = SparseWriter(fd, known_zero=not config.is_block, is_block=config.is_block, what="the clone target")
        behind = _Writer(writer)
        position, data = 0, 0
        while True:
            offset, length = clonestream.EXTENT.unpack(reader.exactly(clonestream.EXTENT.size))
            if offset == clonestream.END_OFFSET:
                break
            if offset < position or offset + length > virtual:
                raise CloneRefused(f"extent {offset}+{length} out of order or past the end ({virtual})")
            if config.is_block:  # positional: independent of the writes still queued
                writer.zero_range(position, offset - position)
            done = 0
            while done < length:
                buffer = behind.buffer()
                n = min(CHUNK, length - done)
                reader.into(memoryview(buffer)[:n])
                behind.write(offset + done, buffer, n)
                done += n
            position, data = offset + length, data + length
        behind.close()
        if config.is_block:
            writer.zero_range(position, capacity - position)
        writer.sync()
        return CloneResult(virtual, data)
    finally:
        if writer is not None:
            if behind is not None:
                behind.close(quiet=True)
            writer.close()
        os.close(fd)
