"""vhdx converted to raw by reading its block allocation table, then its payload blocks by ranges.

A vhdx is a file type identifier, two headers (the current one has the higher sequence number and
a valid CRC-32C), two copies of a region table that says where the block allocation table (BAT)
and the metadata region are, the metadata (block size, disk size, logical sector size, whether
there is a parent) and the payload blocks. Each BAT entry holds a state in its low 3 bits and a
file offset in MiB units above bit 20; after every `chunk ratio` payload entries comes one sector
bitmap entry, which only differencing disks use (they are refused). See `blockmap` for how the
blocks are fetched.

Out of scope (qemu-img over nbdkit instead, which replays or refuses as qemu does): a header that
names a log (an image not closed cleanly may need it replayed).
"""

from __future__ import annotations

import struct
import sys
import uuid
from array import array

from .blockmap import BlockHeader, build_map, check_table, invalid
from .qcow2 import NotNative, Qcow2Map
from .ranges import RangeReader

_KIB64 = 64 << 10
_HEADERS = (64 << 10, 128 << 10)
_REGION_TABLES = (192 << 10, 256 << 10)
_BAT_REGION = uuid.UUID("2dc27766-f623-4200-9d64-115e9bfd4a08")
_METADATA_REGION = uuid.UUID("8b7ca206-4790-4b9a-b8fe-575f050f886e")
_FILE_PARAMETERS = uuid.UUID("caa16737-fa36-4d43-b3b6-33f0aa44e76b")
_VIRTUAL_DISK_SIZE = uuid.UUID("2fa54224-cd1b-4876-b211-5dbed83bf4b8")
_LOGICAL_SECTOR_SIZE = uuid.UUID("8141bf1d-a96f-4709-ba47-f233a8faab5f")
_PHYSICAL_SECTOR_SIZE = uuid.UUID("cda348c7-445d-4471-9cc9-e9885251c556")
_PAGE83 = uuid.UUID("beca12ab-b2e6-4523-93ef-c309e000c746")
_PARENT_LOCATOR = uuid.UUID("a8d35f2d-b30b-454d-abf7-d3d84834ab0c")
_KNOWN_ITEMS = {
    _FILE_PARAMETERS, _VIRTUAL_DISK_SIZE, _LOGICAL_SECTOR_SIZE, _PHYSICAL_SECTOR_SIZE, _PAGE83, _PARENT_LOCATOR
}
_NOT_PRESENT, _UNDEFINED, _ZERO, _UNMAPPED, _FULLY_PRESENT, _PARTIALLY_PRESENT = 0, 1, 2, 3, 6, 7
_MIB = 1 << 20


def _invalid(message: str) -> Exception:
    return invalid("vhdx", message)


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes | bytearray) -> int:
    """CRC-32C (Castagnoli), as the vhdx headers and region tables are checksummed (72 KiB in all)."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _checksum_ok(block: bytes) -> bool:
    (stored,) = struct.unpack_from("<I", block, 4)
    return crc32c(block[:4] + b"\x00\x00\x00\x00" + block[8:]) == int(stored)


def _read(reader: RangeReader, head: bytes, offset: int, length: int) -> bytes:
    if offset + length <= len(head):
        return head[offset : offset + length]
    if offset + length > reader.size:
        raise _invalid(f"{length} bytes at {offset} lie beyond the end of the file")
    buf = bytearray(length)
    reader.read_into(offset, memoryview(buf))
    return bytes(buf)


def read_map(reader: RangeReader, head: bytes, *, max_piece: int = 4 << 20) -> Qcow2Map:
    """Check the headers, region table and metadata, fetch the BAT and build the extent map."""
    file_size = reader.size
    if file_size < 320 << 10 or not head.startswith(b"vhdxfile"):
        raise _invalid("the file type identifier or the headers are missing")
    current: tuple[int, bytes] | None = None
    for offset in _HEADERS:
        h = _read(reader, head, offset, 4096)
        if h[:4] == b"head" and _checksum_ok(h):
            (sequence,) = struct.unpack_from("<Q", h, 8)
            if current is None or sequence > current[0]:
                current = (sequence, h)
    if current is None:
        raise _invalid("neither header is valid (signature and CRC-32C)")
    h = current[1]
    log_guid = h[48:64]
    version, log_length, log_offset = struct.unpack_from("<HIQ", h, 66)
    if version != 1:
        raise _invalid(f"header version {version} is not 1")
    if any(log_guid):
        raise NotNative("the header names a log, which may have to be replayed")
    regions = None
    for offset in _REGION_TABLES:
        table = _read(reader, head, offset, _KIB64)
        if table[:4] == b"regi" and _checksum_ok(table):
            regions = table
            break
    if regions is None:
        raise _invalid("neither region table is valid (signature and CRC-32C)")
    (count,) = struct.unpack_from("<I", regions, 8)
    if count > 2047:
        raise _invalid(f"{count} region table entries is more than a region table holds")
    found: dict[uuid.UUID, tuple[int, int]] = {}
    for i in range(count):
        entry = regions[16 + 32 * i : 48 + 32 * i]
        guid = uuid.UUID(bytes_le=entry[:16])
        offset, length, required = struct.unpack_from("<QII", entry, 16)
        if guid not in (_BAT_REGION, _METADATA_REGION):
            if required & 1:
                raise NotNative(f"required region {guid} is unknown")
            continue
        if guid in found:
            raise _invalid(f"region {guid} is listed twice")
        if offset % _MIB or length % _MIB or offset < _MIB:
            raise _invalid(f"region {guid} ({length} bytes at {offset}) is not MiB-aligned past the headers")
        check_table("vhdx", f"region {guid}", offset, length, file_size)
        found[guid] = (offset, length)
    if _BAT_REGION not in found or _METADATA_REGION not in found:
        raise _invalid("the BAT or metadata region is missing")
    bat_offset, bat_length = found[_BAT_REGION]
    meta_offset, meta_length = found[_METADATA_REGION]
    if bat_offset < meta_offset + meta_length and meta_offset < bat_offset + bat_length:
        raise _invalid("the BAT and metadata regions overlap")
    meta = _read(reader, head, meta_offset, min(meta_length, _KIB64))
    if meta[:8] != b"metadata":
        raise _invalid("the metadata table signature is missing")
    (entries,) = struct.unpack_from("<H", meta, 10)
    if entries > 2047:
        raise _invalid(f"{entries} metadata entries is more than a metadata table holds")
    items: dict[uuid.UUID, bytes] = {}
    for i in range(entries):
        entry = meta[32 + 32 * i : 64 + 32 * i]
        guid = uuid.UUID(bytes_le=entry[:16])
        offset, length, flags = struct.unpack_from("<III", entry, 16)
        if guid not in _KNOWN_ITEMS:
            if flags & 4 and not flags & 1:  # required, and not a user item
                raise NotNative(f"required metadata item {guid} is unknown")
            continue
        if offset < _KIB64 or offset + length > meta_length or length > _KIB64:
            raise _invalid(f"metadata item {guid} ({length} bytes at {offset}) lies outside its region")
        items[guid] = _read(reader, head, meta_offset + offset, length)
    if _PARENT_LOCATOR in items:
        raise _invalid("a differencing disk (parent locator)")  # refused earlier, by the format check
    try:
        block_size, params = struct.unpack_from("<II", items[_FILE_PARAMETERS])
        (size,) = struct.unpack_from("<Q", items[_VIRTUAL_DISK_SIZE])
        (sector,) = struct.unpack_from("<I", items[_LOGICAL_SECTOR_SIZE])
    except (KeyError, struct.error) as exc:
        raise _invalid("the file parameters, disk size or logical sector size is missing") from exc
    if params & 2:
        raise _invalid("a differencing disk (HasParent)")
    if block_size < _MIB or block_size > 256 * _MIB or block_size & (block_size - 1):
        raise _invalid(f"a block size of {block_size} bytes is not valid")
    if sector not in (512, 4096):
        raise _invalid(f"a logical sector size of {sector} bytes is not valid")
    if size % sector or size > 64 << 40:
        raise _invalid(f"a disk size of {size} bytes is not valid")
    chunk_ratio = (1 << 23) * sector // block_size
    blocks_count = -(-size // block_size)
    bat_entries = blocks_count + (blocks_count - 1) // chunk_ratio if blocks_count else 0
    if bat_entries * 8 > bat_length:
        raise _invalid(f"the BAT region ({bat_length} bytes) is too small for {bat_entries} entries")
    check_table("vhdx", "BAT", bat_offset, bat_entries * 8, file_size)
    raw = bytearray(bat_entries * 8)
    if raw:
        reader.read_into(bat_offset, memoryview(raw))
    bat = array("Q", bytes(raw))
    if sys.byteorder == "big":
        bat.byteswap()
    blocks: list[tuple[int, int]] = []
    for index in range(blocks_count):
        entry = bat[index + index // chunk_ratio]
        state = entry & 7
        if state in (_NOT_PRESENT, _UNDEFINED, _ZERO, _UNMAPPED):
            continue
        if state == _PARTIALLY_PRESENT:
            raise _invalid(f"block {index} is partially present, as only in a differencing disk")
        if state != _FULLY_PRESENT:
            raise _invalid(f"block {index} has the undefined state {state}")
        blocks.append((entry >> 20 << 20, index * block_size))
    reserved: tuple[tuple[int, int], ...] = ((meta_offset, meta_length), (bat_offset, bat_length))
    if log_length:
        reserved += ((log_offset, log_length),)
    header = BlockHeader(size, block_size)
    return build_map("vhdx", header, blocks, file_size=file_size, data_start=_MIB, reserved=reserved,
                     max_piece=max_piece)
