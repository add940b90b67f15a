"""qcow2 converted to raw in one pass over a plain stream: no range reads, (almost) no scratch.

Where the source cannot be range-read (a registry layer, an upload, a .qcow2.gz, a server without
Range support), CDI stages the whole image on scratch for qemu-img. But a qcow2 written by qemu-img
has its L1 table right after the header and every L2 table before the clusters it maps, so the
image can be converted as it streams by: the L1 table names the L2 tables' offsets, each L2 table
names its clusters' offsets, and each cluster is written (or inflated and written) at its guest
offset the moment its bytes pass.

Bytes that pass before anything refers to them (refcount blocks, or data whose table comes later
in an unusual layout) are kept in a spill: in memory up to SPILL_MEMORY, then on scratch if it is
mounted. Should a layout need more than that without scratch, the import stops with
ScratchSpaceRequired. Zero and unallocated clusters are zeroed on targets that are not known to be
zero (block devices) as soon as their table is read.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import os
import struct
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from isal import isal_zlib

from .compression import ISAL_ERROR
from .compression import zstd_error as _zstd_error
from .errors import ImporterError, Reason
from .formats import Qcow2Header
from .sparse_writer import SparseWriter
from .streams import Stream, as_bytes

SPILL_MEMORY = 64 << 20
_CHUNK = 4 << 20
_L1_OFFSET_MASK = 0x00FFFFFFFFFFFE00
_COMPRESSED = 1 << 62
_BIG_ENDIAN = struct.pack("=H", 1) == struct.pack(">H", 1)

L1, L2, DATA, COMP = 0, 1, 2, 3


def _invalid(message: str) -> ImporterError:
    return ImporterError(Reason.INVALID_IMAGE, f"qcow2: {message}")


@dataclass(order=True)
class _Region:
    start: int
    seq: int
    kind: int = field(compare=False)
    end: int = field(compare=False)
    guest: int = field(compare=False, default=0)  # DATA/COMP: where the bytes go; L2: the L1 index
    length: int = field(compare=False, default=0)  # COMP: bytes it inflates to
    buf: bytearray | None = field(compare=False, default=None)
    taken: int = field(compare=False, default=0)


class Spill:
    """Bytes that went by before anything referred to them, by host offset: memory, then scratch."""

    def __init__(self, scratch_file: Path | None, memory_limit: int = SPILL_MEMORY) -> None:
        self.scratch_file = scratch_file
        self.memory_limit = memory_limit
        self._starts: list[int] = []
        self._chunks: list[bytes] = []
        self.memory = 0
        self._fd: int | None = None
        self._on_disk: list[tuple[int, int]] = []  # (start, end), in order
        self.spilled_to_disk = 0

    def add(self, offset: int, data: bytes) -> None:
        if not data:
            return
        if self.memory + len(data) <= self.memory_limit:
            self._starts.append(offset)
            self._chunks.append(data)
            self.memory += len(data)
            return
        if self.scratch_file is None:
            raise ImporterError(
                Reason.SCRATCH_SPACE_REQUIRED,
                "this qcow2 image stores data before the tables that map it, more than fits in memory; "
                "it must be staged on scratch space and no scratch volume is mounted",
                scratch_space_required=True,
            )
        if self._fd is None:
            self._fd = os.open(self.scratch_file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.pwrite(self._fd, data, offset)
        self._on_disk.append((offset, offset + len(data)))
        self.spilled_to_disk += len(data)

    def read(self, offset: int, length: int) -> bytes | None:
        """The bytes at [offset, offset+length), if they were all spilled."""
        out = bytearray()
        pos, end = offset, offset + length
        while pos < end:
            i = bisect.bisect_right(self._starts, pos) - 1
            if i >= 0 and pos < self._starts[i] + len(self._chunks[i]):
                chunk_start = self._starts[i]
                take = self._chunks[i][
                    pos - chunk_start : min(end, chunk_start + len(self._chunks[i])) - chunk_start
                ]
                out += take
                pos += len(take)
                continue
            j = bisect.bisect_right(self._on_disk, (pos, float("inf"))) - 1
            if j >= 0 and self._fd is not None and pos < self._on_disk[j][1]:
                n = min(end, self._on_disk[j][1]) - pos
                out += os.pread(self._fd, n, pos)
                pos += n
                continue
            return None
        return bytes(out)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.scratch_file is not None and self.scratch_file.exists():
            self.scratch_file.unlink()


class StreamingQcow2:
    """Feed it the qcow2 file from byte 0; it writes the guest bytes through `writer`."""

    def __init__(self, header: Qcow2Header, writer: SparseWriter, spill: Spill) -> None:
        if header.extended_l2:
            raise ImporterError(
                Reason.UNSUPPORTED_FORMAT,
                "qcow2 with extended L2 entries (subclusters) "
                "cannot be streamed; serve it with Range support",
            )
        self.h = header
        self.writer = writer
        self.spill = spill
        self.cluster = header.cluster_size
        self.l2_entries = self.cluster // 8
        self.zstd = header.compression_type == 1
        self._heap: list[_Region] = []
        self._active: list[_Region] = []
        self._seq = itertools.count()
        self._written_host: list[int] = []  # DATA runs already written: host start ...
        self._written: list[tuple[int, int, int]] = []  # ... (host, guest, length)
        self.pos = 0
        self.data_bytes = 0
        self._l1_seen = False
        self._tables_pending = 0  # L2 tables named by the L1 table and not read yet
        self._push(L1, header.l1_table_offset, header.l1_size * 8)

    # -- regions ------------------------------------------------------------------------------------
    def _push(self, kind: int, start: int, length: int, guest: int = 0, out_len: int = 0) -> None:
        region = _Region(start, next(self._seq), kind, start + length, guest, out_len)
        if kind in (L1, L2, COMP):
            region.buf = bytearray(length)
        if start < self.pos:  # some or all of its bytes already went by
            self._fill_from_past(region)
            if region.end <= self.pos:
                self._done(region)
                return
        heapq.heappush(self._heap, region)

    def _fill_from_past(self, region: _Region) -> None:
        """The bytes of a region that went by: from the spill, or copied from where they were written."""
        length = min(region.end, self.pos) - region.start
        data = self.spill.read(region.start, length)
        if data is None and region.kind == DATA:
            i = bisect.bisect_right(self._written_host, region.start) - 1
            if i >= 0:
                host, guest, run = self._written[i]
                if region.start + length <= host + run:  # a cluster shared with one already written
                    data = os.pread(self.writer.fd, length, guest + region.start - host)
        if data is None or len(data) != length:
            raise ImporterError(
                Reason.UNSUPPORTED_FORMAT,
                f"qcow2 layout cannot be streamed: bytes at {region.start} are needed after they went by",
            )
        if region.buf is not None:
            region.buf[:length] = data
        else:
            self.writer.write_at(region.guest, data)
            self.data_bytes += length
        region.taken = length

    def _done(self, region: _Region) -> None:
        if region.kind == L1:
            self._parse_l1(bytes(region.buf or b""))
        elif region.kind == L2:
            self._tables_pending -= 1
            self._parse_l2(region.guest, bytes(region.buf or b""))
        elif region.kind == COMP:
            self._inflate(region)
        else:
            self._written_host.append(region.start)
            self._written.append((region.start, region.guest, region.end - region.start))

    # -- tables -------------------------------------------------------------------------------------
    def _parse_l1(self, raw: bytes) -> None:
        self._l1_seen = True
        table = array("Q", raw)
        if not _BIG_ENDIAN:
            table.byteswap()
        span = self.l2_entries * self.cluster
        needed = -(-self.h.size // span)
        if len(table) < needed:
            raise _invalid(f"L1 table has {len(table)} entries, {needed} needed")
        for index in range(needed):
            offset = table[index] & _L1_OFFSET_MASK
            if offset:
                self._tables_pending += 1
                self._push(L2, offset, self.cluster, guest=index)
            elif not self.writer.known_zero:
                start = index * span
                self.writer.zero_range(start, min(span, self.h.size - start))

    def _parse_l2(self, l1_index: int, raw: bytes) -> None:
        entries = array("Q", raw)
        if not _BIG_ENDIAN:
            entries.byteswap()
        bits = self.h.cluster_bits
        csize_shift = 70 - bits
        offset_mask = (1 << csize_shift) - 1
        sectors_mask = (1 << (bits - 8)) - 1
        base = l1_index * self.l2_entries * self.cluster
        size = self.h.size
        v2 = self.h.version == 2
        run_host = run_guest = run_len = 0
        zero_start = zero_len = 0
        for i, entry in enumerate(entries):
            guest = base + i * self.cluster
            if guest >= size:
                break
            length = min(self.cluster, size - guest)
            host = 0
            if entry & _COMPRESSED:
                coffset = entry & offset_mask
                csize = ((entry >> csize_shift) & sectors_mask) * 512 + 512 - (coffset & 511)
                self._push(COMP, coffset, csize, guest=guest, out_len=length)
            elif (v2 or not entry & 1) and entry & _L1_OFFSET_MASK:
                host = entry & _L1_OFFSET_MASK
                if run_len and host == run_host + run_len and guest == run_guest + run_len:
                    run_len += length
                else:
                    if run_len:
                        self._push(DATA, run_host, run_len, guest=run_guest)
                    run_host, run_guest, run_len = host, guest, length
            elif zero_len and guest == zero_start + zero_len:
                zero_len += length
            else:
                if zero_len and not self.writer.known_zero:
                    self.writer.zero_range(zero_start, zero_len)
                zero_start, zero_len = guest, length
        if run_len:
            self._push(DATA, run_host, run_len, guest=run_guest)
        if zero_len and not self.writer.known_zero:
            self.writer.zero_range(zero_start, zero_len)

    def _inflate(self, region: _Region) -> None:
        data = memoryview(region.buf or b"")
        try:
            if self.zstd:
                import zstandard

                out = zstandard.ZstdDecompressor().decompressobj().decompress(data)
            else:
                out = isal_zlib.decompressobj(-12).decompress(data, self.cluster)
        except (zlib.error, ISAL_ERROR, _zstd_error()) as exc:
            raise _invalid(f"compressed cluster at guest offset {region.guest} is corrupt: {exc}") from exc
        if len(out) < region.length:
            raise _invalid(f"compressed cluster at guest offset {region.guest} inflates to {len(out)} bytes")
        self.writer.write_at(region.guest, out, 0, region.length)
        self.data_bytes += region.length

    # -- the stream ---------------------------------------------------------------------------------
    def feed(self, chunk: bytes | bytearray) -> None:
        p0, p1 = self.pos, self.pos + len(chunk)
        covered: list[tuple[int, int]] = []
        still: list[_Region] = []
        for region in self._active:
            if not self._take(region, chunk, p0, p1, covered):
                still.append(region)
        self._active = still
        while self._heap and self._heap[0].start < p1:
            region = heapq.heappop(self._heap)
            if not self._take(region, chunk, p0, p1, covered):
                self._active.append(region)
        self.pos = p1
        self._spill_uncovered(chunk, p0, p1, covered)

    def _take(
        self, region: _Region, chunk: bytes | bytearray, p0: int, p1: int, covered: list[tuple[int, int]]
    ) -> bool:
        """Give the region its bytes of this chunk; True once the region is complete."""
        a, b = max(region.start + region.taken, p0), min(region.end, p1)
        if b > a:
            covered.append((a, b))
            if region.buf is not None:
                region.buf[a - region.start : b - region.start] = chunk[a - p0 : b - p0]
            else:
                self.writer.write_at(region.guest + a - region.start, chunk, a - p0, b - p0)
                self.data_bytes += b - a
            region.taken = b - region.start
        if region.start + region.taken < region.end:
            return False
        self._done(region)
        return True

    def _spill_uncovered(
        self, chunk: bytes | bytearray, p0: int, p1: int, covered: list[tuple[int, int]]
    ) -> None:
        if self._l1_seen and not self._tables_pending:
            return  # every table has been read: nothing can refer to these bytes any more
        pos = p0
        for a, b in sorted(covered):
            if a > pos:
                self.spill.add(pos, bytes(chunk[pos - p0 : a - p0]))
            pos = max(pos, b)
        if pos < p1:
            self.spill.add(pos, bytes(chunk[pos - p0 : p1 - p0]))

    def run(self, stream: Stream, head: bytes = b"") -> None:
        if head:
            self.feed(head)
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            self.feed(as_bytes(chunk))
        self.finish()

    def finish(self) -> None:
        if not self._l1_seen:
            raise _invalid("the stream ends before the L1 table")
        pending = self._active + self._heap
        for region in pending:
            if region.kind == COMP and region.start < self.pos:
                region.end = self.pos  # the last compressed cluster may be rounded past the end of the file
                if region.buf is not None:
                    del region.buf[region.end - region.start :]
                self._done(region)
                continue
            raise _invalid(f"the stream ends at {self.pos}, before the bytes at {region.start} it refers to")
