"""Streaming decompression of gz, xz and zst with bounded output per step.

Every decompressor here produces at most `chunk` bytes per `read`, whatever the compression ratio,
so a decompression bomb never materialises in memory; the pipeline stops it as soon as the output
passes the usable space of the target. gzip goes through ISA-L (python-isal, several times faster
than zlib), xz through liblzma, zstd through libzstd; all three release the GIL while they work, so
fetching and writing carry on in other threads.

Truncated input is an error (`InvalidImage`), never a silently short image. Concatenated members
(multi-member gzip, concatenated xz streams, several zstd frames) are decoded as one stream, as the
command-line tools do."""

from __future__ import annotations

import lzma
import struct
from typing import IO, cast

from isal import igzip_lib

from .errors import ImporterError, Reason
from .streams import Chunk, Stream

GZIP = "gz"
XZ = "xz"
ZSTD = "zst"

_MAGIC = ((GZIP, b"\x1f\x8b"), (XZ, b"\xfd7zXZ\x00"), (ZSTD, b"\x28\xb5\x2f\xfd"))
_IN_CHUNK = 1 << 20
# the isal stubs declare IsalError as an instance, not a class
ISAL_ERROR = cast(type[Exception], igzip_lib.IsalError)


def zstd_error() -> type[Exception]:
    import zstandard

    return cast(type[Exception], zstandard.ZstdError)


def detect(head: bytes) -> str | None:
    for kind, magic in _MAGIC:
        if head.startswith(magic):
            return kind
    return None


def open_stream(inner: Stream, kind: str, chunk: int = 4 << 20) -> Stream:
    if kind == ZSTD:
        return ZstdStream(inner, chunk)
    return _NeedsInputStream(inner, kind, chunk)


def _corrupt(kind: str, exc: BaseException | str) -> ImporterError:
    return ImporterError(Reason.INVALID_IMAGE, f"corrupt {kind} data: {exc}")


class _NeedsInputStream:
    """gzip (ISA-L) and xz (liblzma): decompressors with `needs_input` / `max_length`."""

    def __init__(self, inner: Stream, kind: str, chunk: int) -> None:
        self.inner = inner
        self.kind = kind
        self.chunk = chunk
        self._dec = self._new()
        self._input_done = False
        self._pending: bytes = b""  # input for a next member, from unused_data
        self._finished = False

    def _new(self) -> igzip_lib.IgzipDecompressor | lzma.LZMADecompressor:
        if self.kind == GZIP:
            return igzip_lib.IgzipDecompressor(flag=igzip_lib.DECOMP_GZIP)
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)

    def _next_member(self) -> bool:
        """After the end of a member: start the next one if more compressed data follows."""
        rest = self._dec.unused_data
        while True:
            if self.kind == XZ:
                rest = rest.lstrip(b"\x00")  # stream padding between concatenated xz streams
            if rest:
                break
            if self._input_done:
                return False
            data = self.inner.read(_IN_CHUNK)
            if not data:
                self._input_done = True
                return False
            rest = bytes(data)
        if self.kind == GZIP and not rest.startswith(b"\x1f\x8b"):
            return False  # trailing garbage after the last member is ignored, as gzip -d does
        self._dec = self._new()
        self._pending = rest
        return True

    def read(self, n: int) -> Chunk:
        if self._finished:
            return b""
        limit = min(n, self.chunk)
        try:
            while True:
                if self._dec.eof and not self._next_member():
                    self._finished = True
                    return b""
                data: Chunk = b""
                if self._pending:
                    data, self._pending = self._pending, b""
                elif self._dec.needs_input:
                    data = self.inner.read(_IN_CHUNK)
                    if not data:
                        raise _corrupt(self.kind, "the stream ends before the end of the compressed data")
                out = self._dec.decompress(data, limit)
                if out:
                    return out
        except (ISAL_ERROR, lzma.LZMAError, EOFError) as exc:
            raise _corrupt(self.kind, exc) from exc

    def close(self) -> None:
        self.inner.close()


class _ZstdFrameWalker:
    """Follows zstd frame and block boundaries in the compressed bytes.

    python-zstandard's stream_reader bounds the output per read (bomb-safe) but returns a short
    stream silently when the input is truncated; walking the block headers (cheap: 3 bytes per
    block of up to 128 KiB) tells whether the input ended on a frame boundary."""

    def __init__(self) -> None:
        self._buf = b""
        self._skip = 0
        self._state = "magic"
        self._checksum = False
        self.frames = 0
        self.content_size: int | None = None  # of the first frame, when declared

    def feed(self, data: Chunk) -> None:
        view = memoryview(data)
        while view:
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                view = view[n:]
                continue
            need = self._need()
            take = min(need - len(self._buf), len(view))
            self._buf += bytes(view[:take])
            view = view[take:]
            if len(self._buf) == need:
                self._step()

    def _need(self) -> int:
        if self._state == "magic":
            return 4
        if self._state == "skippable":
            return 4
        if self._state == "fhd":
            return 1
        if self._state == "header":
            return self._header_len
        return 3  # block header

    def _step(self) -> None:
        buf, self._buf = self._buf, b""
        if self._state == "magic":
            (magic,) = struct.unpack("<I", buf)
            if magic == 0xFD2FB528:
                self._state = "fhd"
            elif magic & 0xFFFFFFF0 == 0x184D2A50:
                self._state = "skippable"
            else:
                raise _corrupt(ZSTD, "bad frame magic")
        elif self._state == "skippable":
            self._skip = struct.unpack("<I", buf)[0]
            self._state = "magic"
        elif self._state == "fhd":
            fhd = buf[0]
            fcs_flag, single, self._checksum, did_flag = fhd >> 6, (fhd >> 5) & 1, bool(fhd & 4), fhd & 3
            self._fcs_len = (1 if single else 0) if fcs_flag == 0 else (2, 4, 8)[fcs_flag - 1]
            self._header_len = (0 if single else 1) + (0, 1, 2, 4)[did_flag] + self._fcs_len
            self._state = "header" if self._header_len else "block"
        elif self._state == "header":
            if self._fcs_len and self.frames == 0 and self.content_size is None:
                fcs = int.from_bytes(buf[-self._fcs_len :], "little")
                self.content_size = fcs + 256 if self._fcs_len == 2 else fcs
            self._state = "block"
        else:
            (value,) = struct.unpack("<I", buf + b"\x00")
            last, btype, size = value & 1, (value >> 1) & 3, value >> 3
            if btype == 3:
                raise _corrupt(ZSTD, "reserved block type")
            self._skip = 1 if btype == 1 else size
            if last:
                self._skip += 4 if self._checksum else 0
                self.frames += 1
                self._state = "magic"

    def complete(self) -> bool:
        return self._state == "magic" and not self._buf and not self._skip and self.frames > 0


class _ZstdSource:
    """The compressed side of a zstd stream_reader: counts frames as bytes go by."""

    def __init__(self, inner: Stream, walker: _ZstdFrameWalker) -> None:
        self.inner = inner
        self.walker = walker
        self.eof = False

    def read(self, n: int = -1) -> bytes:
        data = self.inner.read(_IN_CHUNK if n < 0 else min(n, _IN_CHUNK))
        if not data:
            self.eof = True
            return b""
        self.walker.feed(data)
        return bytes(data)


class ZstdStream:
    def __init__(self, inner: Stream, chunk: int) -> None:
        import zstandard  # only zstd imports pay for it (every importer pod starts a Python)

        self._error = zstandard.ZstdError
        self.inner = inner
        self.chunk = chunk
        self.walker = _ZstdFrameWalker()
        self._source = _ZstdSource(inner, self.walker)
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            cast("IO[bytes]", self._source), read_size=_IN_CHUNK, read_across_frames=True, closefd=False
        )

    def read(self, n: int) -> Chunk:
        try:
            out = self._reader.read(min(n, self.chunk))
        except self._error as exc:
            raise _corrupt(ZSTD, exc) from exc
        if not out and not self.walker.complete():
            raise _corrupt(ZSTD, "the stream ends before the end of the compressed data")
        return out

    def close(self) -> None:
        self.inner.close()
