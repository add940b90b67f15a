"""vhd (Virtual PC / Hyper-V "vpc") converted to raw by reading its block table, then its blocks by ranges.

A dynamic vhd starts with a copy of its 512-byte footer, then a dynamic disk header that says where
the block allocation table (BAT: one big-endian u32 sector number per block, 0xFFFFFFFF for a
block that reads as zeros) is; each allocated block is a sector bitmap followed by the block's
data. Like qemu, the data of an allocated block is read whole and its sector bitmap is not fetched
(the bitmap only matters for differencing disks, which are refused). A fixed vhd is the raw disk
followed by the footer: it is recognised by that footer (checksum included) and imported without
it, where a plain raw import (CDI's) would have written the footer into the disk. The footer is
looked for only behind ranges and when the file is not a whole number of MiB (a raw disk is; a
fixed vhd is not, but by chance): a stream, or such a chance, imports it as CDI does. See `blockmap` for
how the blocks are fetched.

The disk size is qemu's: the CHS geometry times 512, except for the creators that write the exact
size in the footer's current size (Hyper-V, Disk2vhd, XenServer, XenConverter, qemu with
`force_size`) and for the largest geometry, which cannot say the size.
"""

from __future__ import annotations

import struct
import sys
from array import array

from .blockmap import BlockHeader, build_map, check_table, invalid
from .qcow2 import Qcow2Map
from .ranges import RangeReader

FOOTER = 512
_COOKIE = b"conectix"
_DYNAMIC_COOKIE = b"cxsparse"
_FIXED, _DYNAMIC, _DIFFERENCING = 2, 3, 4
_UNALLOCATED = 0xFFFFFFFF
_MAX_GEOMETRY = 65535 * 16 * 255
_CURRENT_SIZE_CREATORS = (b"win ", b"qem2", b"d2v ", b"CTXS", b"tap\x00")


def _invalid(message: str) -> Exception:
    return invalid("vhd", message)


def footer_checksum_ok(footer: bytes) -> bool:
    (stored,) = struct.unpack_from(">I", footer, 64)
    total = sum(footer[:64]) + sum(footer[68:FOOTER])
    return (~total & 0xFFFFFFFF) == int(stored)


def disk_size(footer: bytes) -> int:
    """The virtual size qemu gives this footer (see the module docstring)."""
    (current_size,) = struct.unpack_from(">Q", footer, 48)
    cylinders, heads, sectors = struct.unpack_from(">HBB", footer, 56)
    chs: int = cylinders * heads * sectors
    if footer[28:32] in _CURRENT_SIZE_CREATORS or chs == _MAX_GEOMETRY:
        return int(current_size)
    return chs * 512


def fixed_footer(tail: bytes, file_size: int) -> int | None:
    """The disk size if `tail` (the last 512 bytes of a file) is the footer of a fixed vhd, else None."""
    if len(tail) != FOOTER or not tail.startswith(_COOKIE) or not footer_checksum_ok(tail):
        return None
    if struct.unpack_from(">I", tail, 60)[0] != _FIXED:
        return None
    size = disk_size(tail)
    return size if 0 < size <= file_size - FOOTER else None


def fixed_map(size: int, file_size: int, *, max_piece: int = 4 << 20) -> Qcow2Map:
    """A fixed vhd's map: the disk is the file's first `size` bytes."""
    header = BlockHeader(size, max_piece)
    blocks = [(offset, offset) for offset in range(0, size, max_piece)]
    return build_map("vhd", header, blocks, file_size=file_size, data_start=0, data_end=file_size - FOOTER,
                     max_piece=max_piece)


def read_map(reader: RangeReader, head: bytes, *, max_piece: int = 4 << 20) -> Qcow2Map:
    """Check the footer copy and the dynamic disk header, fetch the BAT and build the extent map."""
    if len(head) < FOOTER or not head.startswith(_COOKIE):
        raise _invalid("the footer copy at the start of the file is missing")
    footer = head[:FOOTER]
    if not footer_checksum_ok(footer):
        raise _invalid("the footer's checksum does not match")
    data_offset, = struct.unpack_from(">Q", footer, 16)
    (disk_type,) = struct.unpack_from(">I", footer, 60)
    file_size = reader.size
    if disk_type == _FIXED:  # a fixed disk whose data begins with a footer-like sector: still raw + footer
        tail = bytearray(FOOTER)
        reader.read_into(file_size - FOOTER, memoryview(tail))
        size = fixed_footer(bytes(tail), file_size)
        if size is None:
            raise _invalid("a fixed disk without its footer at the end of the file")
        return fixed_map(size, file_size, max_piece=max_piece)
    if disk_type == _DIFFERENCING:
        raise _invalid("a differencing disk")  # refused earlier, by the format check
    if disk_type != _DYNAMIC:
        raise _invalid(f"disk type {disk_type} is not valid")
    size = disk_size(footer)
    check_table("vhd", "dynamic disk header", data_offset, 1024, file_size)
    if data_offset < FOOTER:
        raise _invalid(f"the dynamic disk header at {data_offset} overlaps the footer copy")
    dyn = bytearray(1024)
    reader.read_into(data_offset, memoryview(dyn))
    if not dyn.startswith(_DYNAMIC_COOKIE):
        raise _invalid(f"the dynamic disk header at {data_offset} is missing")
    table_offset, = struct.unpack_from(">Q", dyn, 16)
    max_entries, block_size = struct.unpack_from(">II", dyn, 28)
    if block_size < 512 or block_size & (block_size - 1) or block_size > 256 << 20:
        raise _invalid(f"a block size of {block_size} bytes is not valid")
    if max_entries * block_size < size:
        raise _invalid(f"a table of {max_entries} blocks of {block_size} bytes does not hold a {size}-byte disk")
    bat_bytes = max_entries * 4
    check_table("vhd", "block allocation table", table_offset, bat_bytes, file_size)
    raw = bytearray(bat_bytes)
    if bat_bytes:
        reader.read_into(table_offset, memoryview(raw))
    entries = array("I", bytes(raw))
    if sys.byteorder == "little":
        entries.byteswap()
    bitmap = ((block_size // (8 * 512)) + 511) & ~511  # qemu's: one bit per sector, whole sectors
    blocks = [
        (sector * 512 + bitmap, index * block_size)
        for index, sector in enumerate(entries)
        if sector != _UNALLOCATED
    ]
    end = file_size - FOOTER if file_size >= FOOTER else file_size
    reserved = ((0, FOOTER), (data_offset, 1024), (table_offset, bat_bytes))
    header = BlockHeader(size, block_size)
    return build_map("vhd", header, blocks, file_size=file_size, data_start=FOOTER, data_end=end,
                     reserved=reserved, max_piece=max_piece)
