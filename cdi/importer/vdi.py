"""vdi (VirtualBox, dynamic or static) converted to raw by reading its block map, then its blocks by ranges.

A vdi is a header, a block map (one little-endian u32 per disk block: the block's index in the data
area, or 0xFFFFFFFF / 0xFFFFFFFE for a block that reads as zeros) and the data area. See
`blockmap` for why and how the blocks are fetched. Out of scope (qemu-img over nbdkit instead):
blocks with extra per-block data (`block_extra`), which qemu refuses too.
"""

from __future__ import annotations

import struct
import sys
from array import array

from .blockmap import BlockHeader, build_map, check_table, invalid
from .qcow2 import NotNative, Qcow2Map
from .ranges import RangeReader

_SIGNATURE = 0xBEDA107F
_VERSION_1_1 = 0x00010001
_UNALLOCATED = 0xFFFFFFFF
_DISCARDED = 0xFFFFFFFE
_HEADER_END = 0x190  # the end of a version 1.1 header (the four uuids included)


def _invalid(message: str) -> Exception:
    return invalid("vdi", message)


def read_map(reader: RangeReader, head: bytes, *, max_piece: int = 4 << 20) -> Qcow2Map:
    """Check the header, fetch the block map and build the extent map."""
    if len(head) < _HEADER_END:
        raise _invalid("the header is truncated")
    signature, version, header_size = struct.unpack_from("<III", head, 0x40)
    if signature != _SIGNATURE:
        raise _invalid("the header signature is missing")
    if version != _VERSION_1_1:
        raise NotNative(f"vdi version {version:#x}")
    if not _HEADER_END - 0x48 <= header_size <= 1 << 20:
        raise _invalid(f"a header size of {header_size} bytes is not valid")
    offset_bmap, offset_data = struct.unpack_from("<II", head, 0x154)
    (sector_size,) = struct.unpack_from("<I", head, 0x168)
    disk_size, block_size, block_extra, blocks_in_image = struct.unpack_from("<QIII", head, 0x170)
    if sector_size != 512:
        raise _invalid(f"a sector size of {sector_size} bytes is not valid")
    if block_extra:
        raise NotNative(f"{block_extra} bytes of extra data per block")
    if block_size < 512 or block_size & (block_size - 1) or block_size > 256 << 20:
        raise _invalid(f"a block size of {block_size} bytes is not valid")
    if offset_bmap % 512 or offset_data % 512:
        raise _invalid(f"the block map ({offset_bmap}) or data ({offset_data}) offset is not sector-aligned")
    if offset_bmap < 0x40 + header_size:
        raise _invalid(f"the block map at {offset_bmap} overlaps the header")
    if blocks_in_image * block_size < disk_size:
        raise _invalid(f"{blocks_in_image} blocks of {block_size} bytes do not hold a {disk_size}-byte disk")
    file_size = reader.size
    map_bytes = blocks_in_image * 4
    check_table("vdi", "block map", offset_bmap, map_bytes, file_size)
    if offset_data < offset_bmap + map_bytes:
        raise _invalid(f"the data area at {offset_data} overlaps the block map")
    raw = bytearray(map_bytes)
    if map_bytes:
        reader.read_into(offset_bmap, memoryview(raw))
    entries = array("I", bytes(raw))
    if sys.byteorder == "big":
        entries.byteswap()
    blocks: list[tuple[int, int]] = []
    for index, entry in enumerate(entries):
        if entry >= _DISCARDED:
            continue
        if entry >= blocks_in_image:
            raise _invalid(f"block {index} points at data block {entry} of {blocks_in_image}")
        blocks.append((offset_data + entry * block_size, index * block_size))
    header = BlockHeader(disk_size, block_size)
    return build_map("vdi", header, blocks, file_size=file_size, data_start=offset_data, max_piece=max_piece)
