"""Multi-block .xz decoded in parallel through byte ranges.

xz is the slowest decompressor (liblzma decodes one stream on one core; CDI uses a pure-Go decoder,
slower still). But an .xz file made by `xz -T` (the default for large files since xz 5.4) is a
sequence of independently compressed blocks, and the index at the end of the file gives every
block's compressed and uncompressed size. With range reads, each block can be fetched and decoded
by its own worker and written straight at its output offset: decoding uses every core, nothing is
reordered in memory, the uncompressed size is known (and checked against the volume) before the
first byte is written, and the fixed block order makes the import resumable like a raw one.

Each block is decoded as a one-block xz stream synthesised around it (the original stream header,
the block, a one-record index, a footer), so liblzma still verifies the block's check (CRC64 or
SHA-256) and sizes. Single-block files, and blocks too large to hold, take the streaming route.
"""

from __future__ import annotations

import lzma
import struct
import zlib
from dataclasses import dataclass

from .errors import ImporterError, Reason
from .ranges import RangeReader, Span
from .sparse_writer import SparseWriter

MAGIC = b"\xfd7zXZ\x00"
FOOTER_MAGIC = b"YZ"
MAX_BLOCK = 64 << 20  # compressed bytes of one block held in memory by a worker
MAX_BLOCKS = 1_000_000
_OUT_CHUNK = 4 << 20


@dataclass(frozen=True)
class XzBlock:
    offset: int  # of the block header in the file
    unpadded: int
    uncompressed: int
    out_offset: int
    flags: bytes  # stream flags of the stream it belongs to

    @property
    def size(self) -> int:
        return self.unpadded + (-self.unpadded % 4)


@dataclass(frozen=True)
class XzSpan(Span):
    block: int = -1  # index into XzLayout.blocks, or -1 for stream headers, indexes, padding


@dataclass
class XzLayout:
    blocks: list[XzBlock]
    file_size: int

    @property
    def uncompressed(self) -> int:
        return sum(b.uncompressed for b in self.blocks)

    def spans(self, cover_all: bool) -> list[XzSpan]:
        """One span per block; with `cover_all`, extra spans tile the bytes between blocks."""
        spans: list[XzSpan] = []
        pos = 0
        for i, block in enumerate(self.blocks):
            if cover_all and block.offset > pos:
                spans.append(XzSpan(len(spans), pos, block.offset - pos))
            spans.append(XzSpan(len(spans), block.offset, block.size, i))
            pos = block.offset + block.size
        if cover_all and pos < self.file_size:
            spans.append(XzSpan(len(spans), pos, self.file_size - pos))
        return spans


def _invalid(message: str) -> ImporterError:
    return ImporterError(Reason.INVALID_IMAGE, f"xz: {message}")


def _read(reader: RangeReader, offset: int, length: int) -> bytes:
    if offset < 0 or offset + length > reader.size:
        raise _invalid("the index points outside the file")
    buf = bytearray(length)
    reader.read_into(offset, memoryview(buf))
    return bytes(buf)


def _vli(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for i in range(9):
        if pos + i >= len(data):
            break
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos + i + 1
    raise _invalid("bad variable-length integer in the index")


def _encode_vli(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _crc(data: bytes) -> bytes:
    return struct.pack("<I", zlib.crc32(data))


def read_layout(reader: RangeReader) -> XzLayout:
    """Walk the file backwards, stream by stream, through the footers and indexes."""
    size = reader.size
    pos = size
    streams: list[list[XzBlock]] = []
    while pos > 0:
        tail = _read(reader, max(0, pos - 4096), min(pos, 4096))
        padding = len(tail) - len(tail.rstrip(b"\x00"))
        if padding:  # stream padding: zeros after a stream (a footer ends in "YZ", never in zeros)
            pos -= padding
            continue
        if pos < 24:
            raise _invalid("too short for an xz stream")
        footer = _read(reader, pos - 12, 12)
        if footer[10:12] != FOOTER_MAGIC or _crc(footer[4:10]) != footer[0:4]:
            raise _invalid("bad stream footer")
        flags = footer[8:10]
        backward = (struct.unpack_from("<I", footer, 4)[0] + 1) * 4
        index_start = pos - 12 - backward
        index = _read(reader, index_start, backward)
        if index[0] != 0 or _crc(index[:-4]) != index[-4:]:
            raise _invalid("bad index")
        count, p = _vli(index, 1)
        if count > MAX_BLOCKS:
            raise _invalid(f"{count} blocks")
        records: list[tuple[int, int]] = []
        for _ in range(count):
            unpadded, p = _vli(index, p)
            uncompressed, p = _vli(index, p)
            records.append((unpadded, uncompressed))
        blocks_size = sum(u + (-u % 4) for u, _ in records)
        stream_start = index_start - blocks_size - 12
        header = _read(reader, stream_start, 12) if stream_start >= 0 else b""
        if header[:6] != MAGIC or header[6:8] != flags or _crc(header[6:8]) != header[8:12]:
            raise _invalid("bad stream header")
        offset = stream_start + 12
        stream = []
        for unpadded, uncompressed in records:
            stream.append(XzBlock(offset, unpadded, uncompressed, 0, flags))
            offset += unpadded + (-unpadded % 4)
        streams.append(stream)
        pos = stream_start
    blocks: list[XzBlock] = []
    out = 0
    for stream in reversed(streams):
        for b in stream:
            blocks.append(XzBlock(b.offset, b.unpadded, b.uncompressed, out, b.flags))
            out += b.uncompressed
    return XzLayout(blocks, size)


def _wrap(block: XzBlock) -> tuple[bytes, bytes]:
    """The stream header before, and the one-record index and footer after, one block."""
    head = MAGIC + block.flags + _crc(block.flags)
    index = b"\x00" + _encode_vli(1) + _encode_vli(block.unpadded) + _encode_vli(block.uncompressed)
    index += b"\x00" * (-len(index) % 4)
    index += _crc(index)
    backward = struct.pack("<I", len(index) // 4 - 1)
    return head, index + _crc(backward + block.flags) + backward + block.flags + FOOTER_MAGIC


class BlockDecoder:
    """Decodes the block of a fetched span and writes it at its output offset (runs in the workers)."""

    def __init__(self, layout: XzLayout, writer: SparseWriter) -> None:
        self.layout = layout
        self.writer = writer

    def __call__(self, span: Span, buf: bytearray) -> None:
        assert isinstance(span, XzSpan)
        if span.block < 0:
            return
        block = self.layout.blocks[span.block]
        head, tail = _wrap(block)
        decoder = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        out = block.out_offset
        try:
            for piece in (head, memoryview(buf)[: span.length], tail):
                data: bytes | memoryview = piece
                while True:
                    chunk = decoder.decompress(data, _OUT_CHUNK)
                    data = b""
                    if chunk:
                        self.writer.write_at(out, chunk)
                        out += len(chunk)
                    if decoder.eof or decoder.needs_input:
                        break
        except lzma.LZMAError as exc:
            raise _invalid(f"block at offset {block.offset} is corrupt: {exc}") from exc
        if not decoder.eof or out - block.out_offset != block.uncompressed:
            raise _invalid(
                f"block at offset {block.offset} decodes to {out - block.out_offset} bytes, "
                f"the index says {block.uncompressed}"
            )


def decode_head(reader: RangeReader, layout: XzLayout, length: int) -> bytes:
    """The first `length` decompressed bytes (format detection), from the first block(s)."""
    out = bytearray()
    for block in layout.blocks:
        if len(out) >= length or block.size > MAX_BLOCK:
            break
        head, tail = _wrap(block)
        stream = head + _read(reader, block.offset, block.size) + tail
        try:
            out += lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(stream, length - len(out))
        except lzma.LZMAError as exc:
            raise _invalid(f"block at offset {block.offset} is corrupt: {exc}") from exc
    return bytes(out)
