"""A stream that stands in for a source in tests: bytes in memory. (A body fed from another thread is
the upload server's own `cdi.uploadserver.feed.FedStream`.)"""

from __future__ import annotations

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
