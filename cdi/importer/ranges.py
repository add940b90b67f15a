"""Parallel range fetching with a bounded reorder window.

One HTTP stream is CDI's bottleneck #3 (cdi-datapath.md §12): a single TCP connection, no
parallelism, no resume. Here `workers` threads fetch spans of a few MiB with Range GETs, each into
a buffer from a fixed pool of `window` buffers (so memory is window x span, whatever the image
size), optionally process them right away in the worker (positional writes), and hand them to the
consumer strictly in order (hashing, decompression, resume checkpoints). A span whose buffer the
consumer has not released yet holds back new fetches, which is the backpressure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

from .retry import Terminated
from .streams import Chunk


class RangeReader(Protocol):
    """Random access to an object of known size (an HTTP/S3 object served with Range support)."""

    size: int

    def read_into(self, offset: int, view: memoryview) -> None:
        """Fill `view` with the bytes at `offset` (retrying transient failures), or raise."""
        ...


@dataclass(frozen=True)
class Span:
    index: int
    offset: int
    length: int


class SpanList(Sequence[Span]):
    """[start, end) cut into spans of `size` bytes, computed on demand (a TiB is 262144 spans)."""

    def __init__(self, start: int, end: int, size: int, first_index: int = 0) -> None:
        self.start, self.end, self.size, self.first_index = start, end, size, first_index
        self._n = max(0, -(-(end - start) // size))

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Span: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Span]: ...

    def __getitem__(self, i: int | slice) -> Span | Sequence[Span]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        offset = self.start + i * self.size
        return Span(self.first_index + i, offset, min(self.size, self.end - offset))


Process = Callable[[Span, bytearray], None]


class RangeFetcher:
    """Iterate `(span, buffer)` in span order while workers fetch ahead.

    The buffer is only valid until the next iteration step, unless the fetcher `lends` its buffers: then
    each one yielded is the consumer's until it hands it back (`give_back`, from any thread), and the
    window counts it as in flight until then (so work the consumer does behind itself, the hashing of
    `ImportContext.fetch_spans`, holds back new fetches as the consumer itself would). `process`, if
    given, runs in the worker right after the fetch (out of order, in parallel). `fetch` replaces
    `reader.read_into` for spans that need more than one read (qcow2 host runs)."""

    def __init__(
        self,
        reader: RangeReader,
        spans: Sequence[Span],
        *,
        workers: int = 4,
        window: int = 16,
        process: Process | None = None,
        stop: threading.Event | None = None,
        fetch: Callable[[Span, memoryview], None] | None = None,
        on_idle: Callable[[], None] | None = None,
        on_cancel: Callable[[], None] | None = None,
        lends: bool = False,
    ) -> None:
        self.reader = reader
        self.lends = lends
        self.spans = spans
        self.workers = max(1, min(workers, len(spans) or 1))
        self.window = max(self.workers, window)
        self.process = process
        self.fetch = fetch or (lambda span, view: reader.read_into(span.offset, view))
        self.stop = stop or threading.Event()
        self.on_idle = on_idle
        self.on_cancel = on_cancel
        self._complete = False
        self._cond = threading.Condition()
        self._free: list[bytearray] = []
        self._allocated = 0
        self._next = 0
        self._results: dict[int, tuple[bytearray, BaseException | None]] = {}
        self._failed = False
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._max_len = max((s.length for s in _sample(spans)), default=0)

    def _buffer(self) -> bytearray | None:
        """A free buffer, waiting for one if the window is full; None when there is no more work."""
        with self._cond:
            while True:
                if self._closed or self._failed or self._next >= len(self.spans):
                    return None
                if self._free:
                    return self._free.pop()
                if self._allocated < self.window:
                    self._allocated += 1
                    return bytearray(self._max_len)
                self._cond.wait(0.5)

    def _worker(self) -> None:
        while True:
            buf = self._buffer()
            if buf is None:
                return
            with self._cond:
                if self._next >= len(self.spans) or self._closed:
                    self._free.append(buf)
                    return
                index = self._next
                self._next += 1
            span = self.spans[index]
            error: BaseException | None = None
            try:
                if self.stop.is_set():
                    raise Terminated()
                if len(buf) < span.length:
                    buf = bytearray(span.length)
                self.fetch(span, memoryview(buf)[: span.length])
                if self.process is not None:
                    self.process(span, buf)
            except BaseException as exc:  # handed to the consumer, which re-raises it
                error = exc
            with self._cond:
                self._results[index] = (buf, error)
                if error is not None:
                    self._failed = True
                self._cond.notify_all()

    def __iter__(self) -> Iterator[tuple[Span, bytearray]]:
        for _ in range(self.workers):
            thread = threading.Thread(target=self._worker, name="range-fetch", daemon=True)
            thread.start()
            self._threads.append(thread)
        try:
            for index in range(len(self.spans)):
                with self._cond:
                    while index not in self._results:
                        failed = next((e for _, e in self._results.values() if e is not None), None)
                        if failed is not None:
                            raise failed
                        if self.stop.is_set():
                            raise Terminated()
                        if not self._cond.wait(0.5) and self.on_idle is not None:
                            self._cond.release()  # the idle work (an fdatasync) must not block the workers
                            try:
                                self.on_idle()
                            finally:
                                self._cond.acquire()
                    buf, error = self._results.pop(index)
                if error is not None:
                    raise error
                yield self.spans[index], buf
                if not self.lends:
                    self.give_back(buf)
            self._complete = True
        finally:
            self.close()

    def give_back(self, buf: bytearray) -> None:
        """A buffer the consumer is done with (and holds no view of) goes back to the pool, to be refilled."""
        with self._cond:
            self._free.append(buf)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if not self._complete and self._threads and self.on_cancel is not None:
            self.on_cancel()  # workers blocked on a stalled server must not hold up the exit
        for thread in self._threads:
            thread.join()
        self._threads.clear()


def _sample(spans: Sequence[Span]) -> list[Span]:
    """The spans that decide the buffer size: all of a list, the first of a uniform SpanList."""
    if isinstance(spans, SpanList):
        return [spans[0]] if len(spans) else []
    return list(spans)


class PrefetchStream:
    """A sequential stream over [start, end) of a range reader, fetched in parallel ahead of the reader."""

    def __init__(
        self,
        reader: RangeReader,
        start: int,
        end: int,
        *,
        span: int = 4 << 20,
        workers: int = 4,
        window: int = 8,
        stop: threading.Event | None = None,
        on_cancel: Callable[[], None] | None = None,
    ) -> None:
        self._fetcher = RangeFetcher(
            reader, SpanList(start, end, span), workers=workers, window=window, stop=stop, on_cancel=on_cancel
        )
        self._iter: Iterator[tuple[Span, bytearray]] | None = None
        self._view = memoryview(b"")

    def read(self, n: int) -> Chunk:
        if not self._view:
            if self._iter is None:
                self._iter = iter(self._fetcher)
            try:
                span, buf = next(self._iter)
            except StopIteration:
                return b""
            self._view = memoryview(buf)[: span.length]
        out, self._view = self._view[:n], self._view[n:]
        return out

    def close(self) -> None:
        self._fetcher.close()
