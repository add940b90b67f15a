"""vmdk (monolithicSparse and streamOptimized) converted to raw by reading the image through byte ranges.

qemu-img reading a vmdk through nbdkit-curl asks for one grain (64 KiB) at a time, one request after
the other (its vmdk driver serializes reads), which made a vmdk import twice as slow as CDI's
download-then-convert. A sparse vmdk is as simple as a qcow2: a header, a grain directory, grain
tables that map each grain of the disk to a sector of the file (or to nothing), and the grains. So
it takes the qcow2 route's machinery: the tables are read first (a few hundred KiB), the grains are
fetched in file order in spans of a few MiB by several workers and written at their disk offsets;
streamOptimized grains (a marker, then zlib data) are inflated in the workers. Resumable, no scratch.

Out of scope (the pipeline falls back to qemu-img over nbdkit): compressed grains without markers,
compression other than deflate, and maps too large to hold.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from dataclasses import dataclass

from isal import isal_zlib

from .compression import ISAL_ERROR
from .errors import ImporterError, Reason
from .qcow2 import MAX_EXTENTS, ClusterWriter, NotNative, Qcow2Map, QSpan
from .ranges import RangeFetcher, RangeReader, Span
from .sparse_writer import SparseWriter

_MAGIC = b"KDMV"
_GD_AT_END = 0xFFFFFFFFFFFFFFFF
_FLAG_COMPRESSED = 1 << 16
_FLAG_MARKERS = 1 << 17
_COMPRESS_DEFLATE = 1
_GTE_ZEROED = 1  # a grain table entry for a grain that reads as zeros
_MARKER = 12  # a compressed grain starts with its disk sector (u64) and its data size (u32)


def _invalid(message: str) -> ImporterError:
    return ImporterError(Reason.INVALID_IMAGE, f"vmdk: {message}")


@dataclass(frozen=True)
class VmdkHeader:
    """The fields of a sparse extent header the map needs (duck-types `Qcow2Header` for the writer)."""

    size: int  # disk bytes
    grain: int  # bytes per grain
    gtes_per_gt: int
    gd_offset: int  # bytes
    compressed: bool
    compression_type: int = 0  # what `ClusterWriter` asks (0: not zstd)

    @property
    def cluster_size(self) -> int:
        return self.grain


def parse_header(raw: bytes) -> tuple[int, int, int, int, int, int, int]:
    """(flags, capacity, granularity, gtes per gt, gd offset, compress algorithm, version) of a header."""
    if raw[:4] != _MAGIC or len(raw) < 79:
        raise _invalid("sparse extent header is missing")
    version, flags, capacity, granularity = struct.unpack_from("<IIQQ", raw, 4)
    (gtes,) = struct.unpack_from("<I", raw, 44)
    (gd_offset,) = struct.unpack_from("<Q", raw, 56)
    (algorithm,) = struct.unpack_from("<H", raw, 77)
    return flags, capacity, granularity, gtes, gd_offset, algorithm, version


def read_header(reader: RangeReader, head: bytes) -> VmdkHeader:
    """The header, from the footer when the grain directory is at the end (streamOptimized)."""
    flags, capacity, granularity, gtes, gd_offset, algorithm, _ = parse_header(head)
    if gd_offset == _GD_AT_END:
        # footer marker, footer (magic + header), end-of-stream marker: the last three sectors
        if reader.size < 1536 + 512:
            raise _invalid("the file is too short for its footer")
        footer = bytearray(1024)
        reader.read_into(reader.size - 1024 - 512, memoryview(footer))
        flags, capacity, granularity, gtes, gd_offset, algorithm, _ = parse_header(bytes(footer[512:]))
        if gd_offset == _GD_AT_END:
            raise _invalid("the footer does not say where the grain directory is")
    compressed = bool(flags & _FLAG_COMPRESSED)
    if compressed and (algorithm != _COMPRESS_DEFLATE or not flags & _FLAG_MARKERS):
        raise NotNative(f"compressed grains without markers or with algorithm {algorithm}")
    if not granularity or granularity & (granularity - 1) or granularity > 2048:  # qemu: at most 1 MiB
        raise _invalid(f"grain size of {granularity} sectors is not valid")
    if not 1 <= gtes <= 1 << 16:
        raise _invalid(f"{gtes} entries per grain table is not valid")
    return VmdkHeader(capacity * 512, granularity * 512, gtes, gd_offset * 512, compressed)


def read_map(reader: RangeReader, head: bytes, *, workers: int = 4, max_piece: int = 4 << 20) -> Qcow2Map:
    """Fetch the grain directory and grain tables and build the extent map (host order)."""
    header = read_header(reader, head)
    file_size = reader.size
    per_gt = header.gtes_per_gt * header.grain
    gd_entries = -(-header.size // per_gt)
    gd_bytes = gd_entries * 4
    if header.gd_offset + gd_bytes > file_size:
        raise _invalid("the grain directory lies beyond the end of the file")
    raw_gd = bytearray(gd_bytes)
    if gd_bytes:
        reader.read_into(header.gd_offset, memoryview(raw_gd))
    gd = _le32(raw_gd)
    gt_bytes = header.gtes_per_gt * 4
    tables: list[tuple[int, int]] = []  # (byte offset of the table, its index in the directory)
    for index, sector in enumerate(gd):
        if sector:
            offset = sector * 512
            if offset + gt_bytes > file_size:
                raise _invalid(f"grain table {index} lies beyond the end of the file")
            tables.append((offset, index))
    tables.sort()
    # tables usually lie next to each other: read them in a few large pieces, not 2 KiB at a time
    pieces: list[tuple[int, int, int, int]] = []  # (offset, length, first table, last table)
    for i, (offset, _) in enumerate(tables):
        if pieces and offset - (pieces[-1][0] + pieces[-1][1]) < 64 << 10 and (
            offset + gt_bytes - pieces[-1][0] <= max_piece
        ):
            start, _, first, _ = pieces[-1]
            pieces[-1] = (start, max(offset + gt_bytes - start, pieces[-1][1]), first, i + 1)
        else:
            pieces.append((offset, gt_bytes, i, i + 1))
    spans = [QSpan(n, off, length, first, last) for n, (off, length, first, last) in enumerate(pieces)]
    grains: list[int] = []  # host sector << 32 | grain index, so that one sort gives host order
    for span, buf in RangeFetcher(reader, spans, workers=workers, window=max(8, workers * 2)):
        assert isinstance(span, QSpan)
        for offset, index in tables[span.first : span.last]:
            rel = offset - span.offset
            entries = _le32(buf[rel : rel + gt_bytes])
            base = index * header.gtes_per_gt
            for i, sector in enumerate(entries):
                if sector > _GTE_ZEROED:
                    grains.append(sector << 32 | (base + i))
        if len(grains) > 4 * MAX_EXTENTS:
            raise NotNative("more grains than the map holds")
    grains.sort()
    return _extents(header, grains, file_size, max_piece)


def _le32(data: bytes | bytearray | memoryview) -> array[int]:
    table = array("I", bytes(data))
    if sys.byteorder == "big":
        table.byteswap()
    return table


def _extents(header: VmdkHeader, grains: list[int], file_size: int, max_piece: int) -> Qcow2Map:
    m = Qcow2Map(header, file_size)  # type: ignore[arg-type]  # VmdkHeader has what the map reads
    grain, size = header.grain, header.size
    run_host = run_guest = run_len = -1
    for n, key in enumerate(grains):
        host, index = (key >> 32) * 512, key & 0xFFFFFFFF
        guest = index * grain
        if guest >= size:
            continue  # entries past the end of the disk (the last table is not full)
        length = min(grain, size - guest)
        if header.compressed:
            # a compressed grain runs to the next one (the marker says exactly how far, checked on use)
            end = (grains[n + 1] >> 32) * 512 if n + 1 < len(grains) else file_size
            csize = min(end, file_size, host + _MARKER + grain + (grain >> 3) + 4096) - host
            if csize <= _MARKER:
                raise _invalid(f"compressed grain at disk offset {guest} lies beyond the end of the file")
            _append(m, host, guest, length, csize)
            continue
        if host + length > file_size:
            raise _invalid(f"grain at disk offset {guest} lies beyond the end of the file")
        if run_len > 0 and host == run_host + run_len and guest == run_guest + run_len and run_len < max_piece:
            run_len += length
            continue
        if run_len > 0:
            _append(m, run_host, run_guest, run_len, 0)
        run_host, run_guest, run_len = host, guest, length
    if run_len > 0:
        _append(m, run_host, run_guest, run_len, 0)
    if len(m) > MAX_EXTENTS:
        raise NotNative(f"more than {MAX_EXTENTS} extents")
    return m


def _append(m: Qcow2Map, host: int, guest: int, length: int, csize: int) -> None:
    m.host.append(host)
    m.guest.append(guest)
    m.length.append(length)
    m.csize.append(csize)


class GrainWriter(ClusterWriter):
    """`ClusterWriter` whose compressed pieces are streamOptimized grains: a marker, then zlib data."""

    def __init__(self, m: Qcow2Map, writer: SparseWriter) -> None:
        super().__init__(m, writer)

    def _inflate(self, data: memoryview, guest: int) -> bytes:
        lba, size = struct.unpack_from("<QI", data, 0)
        if lba * 512 != guest or _MARKER + size > len(data):
            raise _invalid(f"grain marker at disk offset {guest} says sector {lba} and {size} bytes")
        try:
            return isal_zlib.decompressobj().decompress(data[_MARKER : _MARKER + size], self.cluster)
        except (zlib.error, ISAL_ERROR) as exc:
            raise _invalid(f"compressed grain at disk offset {guest} is corrupt: {exc}") from exc


__all__ = ["GrainWriter", "NotNative", "Span", "VmdkHeader", "read_header", "read_map"]
