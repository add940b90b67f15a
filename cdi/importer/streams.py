"""Sequential byte streams: the shape in which every source that cannot be range-read arrives.

A `Stream` has one method that matters, `read(n)`, returning at most `n` bytes and an empty result
at the end. The result may be a memoryview into a buffer the stream reuses, valid only until the
next `read`: copying 4 MiB chunks for nothing costs a core at the speeds we aim for. Consumers that
keep data (or need `bytes` methods) call `as_bytes`.

The upload server hands its request body to the pipeline as such a stream (`uploadserver.feed`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .errors import ImporterError, Reason

Chunk = bytes | bytearray | memoryview


class Stream(Protocol):
    def read(self, n: int) -> Chunk:
        """At most n bytes (fewer only at the end or when the source has no more yet); b'' at the end."""
        ...

    def close(self) -> None: ...


def as_bytes(chunk: Chunk) -> bytes | bytearray:
    return chunk if isinstance(chunk, bytes | bytearray) else bytes(chunk)


def read_exact(stream: Stream, n: int) -> bytes:
    """Exactly n bytes, or fewer only at the end of the stream."""
    first = stream.read(n)
    if len(first) == n or not first:
        return bytes(first)
    parts = [bytes(first)]
    got = len(first)
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            break
        parts.append(bytes(chunk))
        got += len(chunk)
    return b"".join(parts)


def skip(stream: Stream, n: int, chunk: int = 4 << 20) -> int:
    """Read and discard n bytes; returns how many were there."""
    done = 0
    while done < n:
        data = stream.read(min(chunk, n - done))
        if not data:
            break
        done += len(data)
    return done


class PeekStream:
    """Lets the pipeline look at the first bytes (format detection) and then read them again."""

    def __init__(self, inner: Stream) -> None:
        self.inner = inner
        self._buf = b""
        self._eof = False

    def peek(self, n: int) -> bytes:
        while len(self._buf) < n and not self._eof:
            chunk = self.inner.read(max(n - len(self._buf), 64 * 1024))
            if not chunk:
                self._eof = True
                break
            self._buf += bytes(chunk)
        return self._buf[:n]

    def read(self, n: int) -> Chunk:
        if self._buf:
            out, self._buf = self._buf[:n], self._buf[n:]
            return out
        return self.inner.read(n)

    def close(self) -> None:
        self.inner.close()


class ChainStream:
    """Bytes already in hand (a fetched header) followed by a stream that starts after them."""

    def __init__(self, head: bytes, rest: Callable[[], Stream] | None) -> None:
        self._head = memoryview(head)
        self._rest_factory = rest
        self._rest: Stream | None = None

    def read(self, n: int) -> Chunk:
        if self._head:
            out, self._head = self._head[:n], self._head[n:]
            return out
        if self._rest is None:
            if self._rest_factory is None:
                return b""
            self._rest = self._rest_factory()
        return self._rest.read(n)

    def close(self) -> None:
        if self._rest is not None:
            self._rest.close()


class TapStream:
    """Passes every chunk read to `tap` first (hashing, counting): bytes as they came off the wire."""

    def __init__(self, inner: Stream, tap: Callable[[Chunk], None]) -> None:
        self.inner = inner
        self._tap = tap

    def read(self, n: int) -> Chunk:
        chunk = self.inner.read(n)
        if chunk:
            self._tap(chunk)
        return chunk

    def close(self) -> None:
        self.inner.close()


class LimitedStream:
    """The next `length` bytes of a stream (a tar member's contents)."""

    def __init__(self, inner: Stream, length: int, what: str = "stream") -> None:
        self.inner = inner
        self.remaining = length
        self.what = what

    def read(self, n: int) -> Chunk:
        if self.remaining <= 0:
            return b""
        chunk = self.inner.read(min(n, self.remaining))
        if not chunk:
            raise ImporterError(Reason.INVALID_IMAGE, f"{self.what} ends {self.remaining} bytes early")
        self.remaining -= len(chunk)
        return chunk

    def close(self) -> None:
        pass
