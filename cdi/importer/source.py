"""What a source hands to the pipeline: an `Origin`.

An origin is an opened source object: its first bytes (`head`, for format detection), its size
when known, a `RangeReader` when the server can serve byte ranges (which enables parallel fetch,
streaming conversion of qcow2 and resume), and in every case a sequential `stream()` of the whole
object. HTTP, S3 and registry sources produce origins; so does the upload server, from a plain
request body (`StreamOrigin`), which is what lets both share one pipeline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ImporterError, Reason
from .formats import HEAD_SIZE
from .ranges import RangeReader
from .streams import PeekStream, Stream

log = logging.getLogger(__name__)

TRAILING_LIMIT = 64 << 20  # bytes after the end of an image that a stream origin reads and drops


class ByteMeter:
    """Bytes received from the source (thread-safe), reported as bytesTransferred and progress."""

    def __init__(self) -> None:
        self.total = 0
        self._lock = threading.Lock()
        self.listeners: list[Callable[[int], None]] = []

    def add(self, n: int) -> None:
        with self._lock:
            self.total += n
            total = self.total
        for listener in self.listeners:
            listener(total)


@dataclass
class NbdSpec:
    """How nbdkit's curl plugin can read the same object (for formats qemu-img converts)."""

    url: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    user: str | None = None
    password: str | None = None
    cainfo: list[str] = field(default_factory=list)  # PEM files; empty means the system trust
    insecure: bool = False


class Origin:
    """An opened source object. Subclasses fill in the attributes and override what they support."""

    name: str = "source"
    size: int | None = None
    head: bytes = b""
    ranges: RangeReader | None = None
    identity: dict[str, Any] | None = None  # what a resumed import must find unchanged
    pushed: bool = False  # `stream()` only hands on chunks another thread produced (reading costs no work)
    labels: dict[str, str]
    meter: ByteMeter

    def __init__(self) -> None:
        self.labels = {}
        self.meter = ByteMeter()

    @property
    def wire_size(self) -> int | None:
        """Bytes the source will send for `stream()` (progress); differs from `size` for registry layers."""
        return self.size

    def stream(self) -> Stream:
        """The whole object, from byte 0, once."""
        raise NotImplementedError

    def nbd(self) -> NbdSpec | None:
        """Parameters for nbdkit-curl, if the object is reachable by plain (ranged) HTTP GETs."""
        return None

    def finish(self) -> None:
        """Called after the data was consumed: verify what only the end can verify (layer digests)."""

    def abort(self) -> None:
        """Release requests still in flight (the import stopped or failed)."""

    def give_back(self, chunk: Any) -> None:
        """The pipeline is done with `chunk`, a chunk `stream()` returned: it is written, and nothing holds it
        or a view of it any more (only said for a `pushed` stream, whose producer may reuse its buffer)."""

    def close(self) -> None:
        pass


class StreamOrigin(Origin):
    """A plain sequential stream (an upload request body): no ranges, no resume."""

    pushed = True

    def __init__(self, stream: Stream, name: str = "stream", size: int | None = None) -> None:
        super().__init__()
        self.name = name
        self.size = size
        counted = _CountingStream(stream, self.meter)
        self._peek = PeekStream(counted)
        self.head = self._peek.peek(HEAD_SIZE)
        self._used = False
        self._give_back = getattr(stream, "give_back", None)
        self._finished = False

    def stream(self) -> Stream:
        if self._used:
            raise RuntimeError("a stream origin can be read once")
        self._used = True
        return self._peek

    def give_back(self, chunk: Any) -> None:
        if self._give_back is not None:
            self._give_back(chunk)

    def finish(self) -> None:
        """The body must have ended, cleanly and at its announced size, before the image counts as
        received: an image format can end before its body does (a qcow2 or a gzip member says where it
        ends), and a body that ended early must never pass for a complete one. What follows the image is
        read and dropped (at most `TRAILING_LIMIT` bytes); a body that broke raises the client's error."""
        if self._finished:
            return
        trailing = 0
        while chunk := self._peek.read(1 << 20):
            trailing += len(chunk)
            if trailing > TRAILING_LIMIT:
                raise ImporterError(Reason.INVALID_IMAGE, f"{self.name} goes on for more than {TRAILING_LIMIT} "
                                                          "bytes after the end of its image")
        if trailing:
            log.info("%s: %d bytes after the end of the image were dropped", self.name, trailing)
        if self.size is not None and self.meter.total != self.size:
            raise ImporterError(Reason.CONNECTION_FAILED, f"{self.name} ended after {self.meter.total} of its "
                                                          f"{self.size} bytes", retryable=True)
        self._finished = True

    def close(self) -> None:
        self._peek.close()


class _CountingStream:
    def __init__(self, inner: Stream, meter: ByteMeter) -> None:
        self.inner = inner
        self.meter = meter

    def read(self, n: int) -> Any:
        chunk = self.inner.read(n)
        if chunk:
            self.meter.add(len(chunk))
        return chunk

    def close(self) -> None:
        self.inner.close()
