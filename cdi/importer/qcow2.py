"""qcow2 converted to raw by reading the image through byte ranges: parallel, streaming, resumable.

qcow2 is simple enough to read directly: a header, an L1 table, L2 tables that map each guest
cluster to a host offset (a standard cluster), to compressed bytes (deflate or zstd), or to
nothing (zero / unallocated). Reading the L1 and L2 tables first (a few hundred KiB for a cloud
image) gives the complete map; the data is then fetched in host order (sequential for the server),
in spans of a few MiB by several workers, and each cluster is written at its guest offset. Nothing
is staged on scratch, compressed clusters are inflated in parallel worker threads, and the span
order is deterministic, so the import resumes like a raw one.

Out of scope (the pipeline falls back to qemu-img over nbdkit): extended L2 entries (subclusters),
and maps too large to hold (more than MAX_EXTENTS separate extents).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from isal import isal_zlib

from .compression import ISAL_ERROR
from .compression import zstd_error as _zstd_error
from .errors import ImporterError, Reason
from .formats import Qcow2Header
from .ranges import RangeFetcher, RangeReader, Span
from .sparse_writer import SparseWriter

MAX_EXTENTS = 2_000_000
_COALESCE = 4 << 20  # bytes of inflated clusters gathered into one write
_L1_OFFSET_MASK = 0x00FFFFFFFFFFFE00
_L2_OFFSET_MASK = 0x00FFFFFFFFFFFE00
_COMPRESSED = 1 << 62
_ZERO_FLAG = 1


class NotNative(Exception):
    """This qcow2 is better converted by qemu-img."""


@dataclass(frozen=True)
class QSpan(Span):
    first: int = 0  # extents [first, last) lie inside this span
    last: int = 0


def _invalid(message: str) -> ImporterError:
    return ImporterError(Reason.INVALID_IMAGE, f"qcow2: {message}")


class Qcow2Map:
    """Data extents sorted by host offset: (host, guest, length, compressed size or 0)."""

    def __init__(self, header: Qcow2Header, file_size: int) -> None:
        self.header = header
        self.file_size = file_size
        self.host = array("q")
        self.guest = array("q")
        self.length = array("q")
        self.csize = array("q")

    def __len__(self) -> int:
        return len(self.host)

    @property
    def data_bytes(self) -> int:
        return sum(self.length)

    @property
    def fetch_bytes(self) -> int:
        return sum(c or n for c, n in zip(self.csize, self.length, strict=True))

    def zero_ranges(self) -> Iterator[tuple[int, int]]:
        """Guest ranges not covered by any data extent (zero or unallocated clusters)."""
        order = sorted(range(len(self.guest)), key=self.guest.__getitem__)
        pos = 0
        for i in order:
            g = self.guest[i]
            if g > pos:
                yield pos, g - pos
            pos = max(pos, g + self.length[i])
        if pos < self.header.size:
            yield pos, self.header.size - pos


def read_map(
    reader: RangeReader, header: Qcow2Header, *, workers: int = 4, max_piece: int = 4 << 20
) -> Qcow2Map:
    """Fetch the L1 and L2 tables and build the extent map."""
    if header.extended_l2:
        raise NotNative("extended L2 entries (subclusters)")
    file_size = reader.size
    cluster = header.cluster_size
    l2_entries = cluster // 8
    needed_l1 = -(-header.size // (cluster * l2_entries))
    if header.l1_size < needed_l1:
        raise _invalid(f"L1 table has {header.l1_size} entries, {needed_l1} needed for {header.size} bytes")
    l1_bytes = header.l1_size * 8
    if header.l1_table_offset + l1_bytes > file_size:
        raise _invalid("L1 table lies beyond the end of the file")
    raw_l1 = bytearray(l1_bytes)
    if l1_bytes:
        reader.read_into(header.l1_table_offset, memoryview(raw_l1))
    l1 = array("Q", bytes(raw_l1))
    if struct.pack("=H", 1) != struct.pack(">H", 1):
        l1.byteswap()
    tables: list[tuple[int, int]] = []  # (host offset of L2 table, L1 index)
    for index in range(min(header.l1_size, needed_l1)):
        offset = l1[index] & _L1_OFFSET_MASK
        if offset:
            if offset % cluster or offset + cluster > file_size:
                raise _invalid(f"L2 table {index} at {offset} is misaligned or beyond the end of the file")
            tables.append((offset, index))
    tables.sort()
    spans = [Span(i, off, cluster) for i, (off, _) in enumerate(tables)]
    result = Qcow2Map(header, file_size)
    runs: list[tuple[int, int, int, int]] = []
    for span, buf in RangeFetcher(reader, spans, workers=workers, window=max(8, workers * 2)):
        _parse_l2(header, tables[span.index][1], buf, runs, file_size)
        if len(runs) > MAX_EXTENTS:
            raise NotNative(f"more than {MAX_EXTENTS} extents")
    runs.sort()
    starts = sorted({r[0] for r in runs})
    next_start = {a: b for a, b in itertools.pairwise(starts)}
    for host, guest, length, csize in runs:
        if csize:
            # the descriptor rounds a compressed cluster up to the end of its last sector, where the
            # next compressed cluster already begins: those bytes belong to the next one
            end = next_start.get(host)
            _append(result, host, guest, length, min(csize, end - host) if end is not None else csize)
            continue
        while length > 0:  # pieces of at most max_piece, so that spans (and buffers) stay bounded
            n = min(length, max_piece)
            _append(result, host, guest, n, 0)
            host, guest, length = host + n, guest + n, length - n
    return result


def _append(m: Qcow2Map, host: int, guest: int, length: int, csize: int) -> None:
    m.host.append(host)
    m.guest.append(guest)
    m.length.append(length)
    m.csize.append(csize)


def _parse_l2(
    header: Qcow2Header,
    l1_index: int,
    table: bytearray,
    runs: list[tuple[int, int, int, int]],
    file_size: int,
) -> None:
    cluster = header.cluster_size
    bits = header.cluster_bits
    entries = array("Q", bytes(table[:cluster]))
    if struct.pack("=H", 1) != struct.pack(">H", 1):
        entries.byteswap()
    csize_shift = 70 - bits
    offset_mask = (1 << csize_shift) - 1
    sectors_mask = (1 << (bits - 8)) - 1
    base = l1_index * (cluster // 8) * cluster
    size = header.size
    v2 = header.version == 2
    run_host = run_guest = run_len = -1
    for i, entry in enumerate(entries):
        if not entry:
            continue
        guest = base + i * cluster
        if guest >= size:
            break
        length = min(cluster, size - guest)
        if entry & _COMPRESSED:
            coffset = entry & offset_mask
            csize = ((entry >> csize_shift) & sectors_mask) * 512 + 512 - (coffset & 511)
            if coffset >= file_size:
                raise _invalid(f"compressed cluster at guest offset {guest} lies beyond the end of the file")
            runs.append((coffset, guest, length, min(csize, file_size - coffset)))
            continue
        if not v2 and entry & _ZERO_FLAG:
            continue  # reads as zeros
        host = entry & _L2_OFFSET_MASK
        if not host:
            continue  # unallocated, no backing file: zeros
        if host % cluster:
            raise _invalid(f"data cluster at guest offset {guest} is misaligned")
        if host + length > file_size:
            raise _invalid(f"data cluster at guest offset {guest} lies beyond the end of the file")
        if run_len > 0 and host == run_host + run_len and guest == run_guest + run_len:
            run_len += length
            continue
        if run_len > 0:
            runs.append((run_host, run_guest, run_len, 0))
        run_host, run_guest, run_len = host, guest, length
    if run_len > 0:
        runs.append((run_host, run_guest, run_len, 0))


def plan_spans(m: Qcow2Map, span_target: int, *, cover_all: bool, gap: int = 1 << 20) -> list[QSpan]:
    """Host-order spans of about `span_target` bytes, never cutting an extent.

    `cover_all`: the spans tile the whole file (a checksum needs every byte in order); otherwise
    they cover the extents only, with gaps under `gap` bytes fetched rather than split on."""
    spans: list[QSpan] = []
    n = len(m)

    def add(start: int, end: int, first: int, last: int) -> None:
        if end > start:
            spans.append(QSpan(len(spans), start, end - start, first, last))

    def add_gap(start: int, end: int, at: int) -> None:
        pos = start
        while pos < end:
            stop = min(end, pos + span_target)
            add(pos, stop, at, at)
            pos = stop

    cur: int | None = 0 if cover_all else None
    first = 0
    max_end = 0
    for i in range(n):
        h = m.host[i]
        he = h + (m.csize[i] or m.length[i])
        if cur is None:
            cur, first, max_end = h, i, he
            continue
        if h >= max_end:
            if cover_all:
                if he - cur > span_target:
                    if h - max_end > span_target:
                        add(cur, max_end, first, i)
                        add_gap(max_end, h, i)
                    else:
                        add(cur, h, first, i)
                    cur, first = h, i
            elif h - max_end > gap or he - cur > span_target:
                add(cur, max_end, first, i)
                cur, first = h, i
        max_end = max(max_end, he)
    if cur is not None:
        if cover_all:
            if m.file_size - max_end > span_target:
                add(cur, max_end, first, n)
                add_gap(max_end, m.file_size, n)
            else:
                add(cur, max(max_end, m.file_size), first, n)
        else:
            add(cur, max_end, first, n)
    return spans


class ClusterWriter:
    """Writes the extents of a fetched span (run in the range workers: inflating is parallel)."""

    def __init__(self, m: Qcow2Map, writer: SparseWriter) -> None:
        self.m = m
        self.writer = writer
        self.cluster = m.header.cluster_size
        self.zstd = m.header.compression_type == 1

    def __call__(self, span: Span, buf: bytearray) -> None:
        assert isinstance(span, QSpan)
        m = self.m
        # inflated clusters that follow each other on the disk go out in one write: a 64 KiB write
        # each (a streamOptimized vmdk, a compressed qcow2) is 16384 direct writes per GiB
        pending = bytearray()
        pending_at = 0
        for i in range(span.first, span.last):
            rel = m.host[i] - span.offset
            csize = m.csize[i]
            if not csize:
                self.writer.write_at(m.guest[i], buf, rel, rel + m.length[i])
                continue
            guest, length = m.guest[i], m.length[i]
            data = self._inflate(memoryview(buf)[rel : rel + csize], guest)
            if len(data) < length:
                raise _invalid(f"compressed cluster at guest offset {guest} inflates to {len(data)} bytes")
            if pending and (guest != pending_at + len(pending) or len(pending) >= _COALESCE):
                self.writer.write_at(pending_at, pending)
                pending = bytearray()
            if not pending:
                pending_at = guest
            pending += memoryview(data)[:length]
        if pending:
            self.writer.write_at(pending_at, pending)

    def _inflate(self, data: memoryview, guest: int) -> bytes:
        try:
            if self.zstd:
                import zstandard

                return zstandard.ZstdDecompressor().decompressobj().decompress(data)
            return isal_zlib.decompressobj(-12).decompress(data, self.cluster)
        except (zlib.error, ISAL_ERROR, _zstd_error()) as exc:
            raise _invalid(f"compressed cluster at guest offset {guest} is corrupt: {exc}") from exc
