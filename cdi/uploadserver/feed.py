"""The queue from a request body (the connection's reading thread) to the importer's thread (the
pipeline).

The importer reads a blocking `Stream` (`read(n)`); the reading thread puts each chunk it read
(`put`), waiting while the queue is full, so a client faster than the disk waits (TCP
backpressure) and memory stays bounded by `max_bytes` (plus one chunk). Chunks are handed to the
pipeline whole when they fit its read, without copying.

The end of the body is said only by `finish` (or `fail`), never by a chunk: an empty chunk is dropped,
since `read` returning `b""` is how the pipeline learns that the body ended (a reader that yields an
empty piece at every chunk boundary of a chunked body, as aiohttp's `iter_chunks` does, once truncated
piped uploads).

A failure (`fail`, the client went away) is raised to the pipeline only after the chunks that
arrived before it: every byte received is good, and written, so a resumed upload needs to resend as
little as possible, and the resumable offset is exactly what arrived, whatever the scheduling.

Buffers have one owner at a time: the producer, then this queue, then the consumer, which hands a chunk
back (`give_back`) once it is done with it; only then does it go to `recycle` (the producer's pool,
`front.ReceiveBuffers`) to be filled again. A chunk the consumer keeps, or only got a slice of, is never
recycled."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

Chunk = bytes | bytearray | memoryview


class FedStream:
    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._chunks: deque[Chunk] = deque()
        self._size = 0
        self._done = False
        self._closed = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._current = memoryview(b"")
        self._lent: Chunk | None = None  # the chunk `read` last returned whole: the one `give_back` takes
        self._recycle: Callable[[Chunk], None] | None = None

    # -- producer (the reading thread) ------------------------------------------------------------------
    def put(self, chunk: Chunk, stopped: threading.Event, poll: float = 1.0) -> bool:
        """Queue a chunk, blocking while the queue is full; False once the consumer has gone or `stopped` is
        set (looked at every `poll` seconds while waiting)."""
        with self._cond:
            while not self._closed and self._size >= self._max:
                if stopped.is_set():
                    return False
                self._cond.wait(poll)
            if self._closed:
                return False
            self._append(chunk)
            return True

    def _append(self, chunk: Chunk) -> None:  # with the lock held
        if not chunk:  # an empty chunk would read as the end of the body: only `finish` ends it
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        self._cond.notify_all()  # the consumer (the producer re-checks the queue and waits on)

    def finish(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._done = True
            self._cond.notify_all()

    # -- consumer (the pipeline's thread) -------------------------------------------------------------
    def read(self, n: int) -> Chunk:
        if not self._current:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._chunks) or self._done)
                if not self._chunks:
                    if self._error is not None:
                        raise self._error
                    return b""
                data = self._chunks.popleft()
                self._size -= len(data)
                self._wake_producer()
            if len(data) <= n:
                self._lent = data
                return data
            self._lent = None
            self._current = memoryview(data)
        out, self._current = self._current[:n], self._current[n:]
        return out

    def recycle_with(self, recycle: Callable[[Chunk], None]) -> None:
        """Where chunks the consumer gave back go (the producer's buffer pool)."""
        self._recycle = recycle

    def give_back(self, chunk: Chunk) -> None:
        """The consumer is done with `chunk` and holds no reference to it or to a view of it. Only the chunk
        `read` last returned whole is recycled (once): anything else is left alone."""
        if chunk is self._lent and chunk is not None:
            self._lent = None
            if self._recycle is not None:
                self._recycle(chunk)

    def close(self) -> None:
        """The consumer is done (or failed): the producer's `put` returns False from now on."""
        with self._cond:
            self._closed = self._done = True
            self._chunks.clear()
            self._size = 0
            self._wake_producer()

    def _wake_producer(self) -> None:  # with the lock held
        if self._size < self._max or self._closed:
            self._cond.notify_all()  # the producer in put
