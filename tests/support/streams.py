"""Streams that stand in for a source in tests: bytes in memory, and a body fed from another thread
(as the upload server's request body is)."""

from __future__ import annotations

import threading
from collections import deque

from cdi.importer.streams import Chunk


class BytesStream:
    """A stream over bytes in memory."""

    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def read(self, n: int) -> Chunk:
        chunk = self._view[self._pos : self._pos + n]
        self._pos += len(chunk)
        return chunk

    def close(self) -> None:
        pass


class QueueStream:
    """A stream fed from another thread: `feed(data)` ... `finish()` (or `fail(exc)`).

    The queue holds at most `max_bytes`, so a fast producer (an HTTP request body) waits for the
    pipeline instead of buffering the upload in memory."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._max = max_bytes
        self._done = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._current = memoryview(b"")

    def feed(self, data: bytes, timeout: float | None = None) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._size < self._max or self._done, timeout):
                raise TimeoutError("pipeline did not consume data in time")
            if self._done:
                raise BrokenPipeError("stream closed")
            self._chunks.append(data)
            self._size += len(data)
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._done = True
            self._cond.notify_all()

    def read(self, n: int) -> Chunk:
        if not self._current:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._chunks) or self._done)
                if self._error is not None:
                    raise self._error
                if not self._chunks:
                    return b""
                data = self._chunks.popleft()
                self._size -= len(data)
                self._cond.notify_all()
            self._current = memoryview(data)
        out, self._current = self._current[:n], self._current[n:]
        return out

    def close(self) -> None:
        with self._cond:
            self._done = True
            self._chunks.clear()
            self._size = 0
            self._cond.notify_all()
