"""vdi, vhd and vhdx read by their block maps: real images made by qemu-img import with the bytes of
qemu-img's own conversion, in a few large ranges, and images whose tables an attacker wrote end
Failed with a reason that says what is wrong, before anything is left on the volume."""

from __future__ import annotations

import hashlib
import random
import struct
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdi.importer.vhdx import crc32c
from tests.support.images import sha256_file
from tests.support.servers import FileServer

from .harness import USABLE_BIG, Volume, assert_failed, run_importer

SIZE = 24 << 20


@dataclass(frozen=True)
class Made:
    name: str
    path: Path
    sha256: str  # of `qemu-img convert -O raw` of the image
    virtual_size: int
    file_size: int


# name -> (qemu-img convert options, qemu format to read it back as, route)
KINDS: dict[str, tuple[list[str], str, str]] = {
    "dynamic.vdi": (["-O", "vdi"], "vdi", "vdi-ranges"),
    "static.vdi": (["-O", "vdi", "-o", "static=on"], "vdi", "vdi-ranges"),
    "dynamic.vhd": (["-O", "vpc"], "vpc", "vhd-ranges"),
    "force-size.vhd": (["-O", "vpc", "-o", "force_size=on"], "vpc", "vhd-ranges"),
    "fixed.vhd": (["-O", "vpc", "-o", "subformat=fixed"], "vpc", "vhd-ranges"),
    "default.vhdx": (["-O", "vhdx"], "vhdx", "vhdx-ranges"),
    "small-blocks.vhdx": (["-O", "vhdx", "-o", "block_size=1M"], "vhdx", "vhdx-ranges"),
}


@pytest.fixture(scope="module")
def made(served_dir: Path) -> Iterator[dict[str, Made]]:
    """A 24 MiB disk (data in half of its MiBs, one run off the MiB grid) in every kind above."""
    rng = random.Random(20)
    base = served_dir / "blockmap-base.img"
    with open(base, "wb") as f:
        f.truncate(SIZE)
        for mib in range(0, SIZE >> 20, 2):
            f.seek(mib << 20)
            f.write(rng.randbytes(1 << 20) if mib % 4 else b"block map test line\n" * 52428)
        f.seek((7 << 20) + 4608)
        f.write(rng.randbytes(300 << 10))
    out: dict[str, Made] = {}
    for name, (options, qemu_format, _) in KINDS.items():
        path = served_dir / f"blockmap-{name}"
        subprocess.run(["qemu-img", "convert", "-f", "raw", *options, str(base), str(path)], check=True)
        expected = served_dir / f"blockmap-{name}.expected"
        subprocess.run(["qemu-img", "convert", "-f", qemu_format, "-O", "raw", str(path), str(expected)], check=True)
        out[name] = Made(path.name, path, sha256_file(expected), expected.stat().st_size, path.stat().st_size)
        expected.unlink()
    yield out
    for m in out.values():
        m.path.unlink(missing_ok=True)
    base.unlink()


def env(server: FileServer, name: str) -> dict[str, str]:
    return {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{server.url}/{name}",
        "IMPORTER_IMAGE_SIZE": str(256 << 20),
    }


@pytest.mark.parametrize("kind", list(KINDS))
def test_block_map_images_import_as_qemu_img_converts_them(
    kind: str, made: dict[str, Made], range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = made[kind]
    volume = make_volume("fs")
    range_server.reset_counters()
    result = run_importer(volume, env(range_server, image.name))
    assert result.code == 0, result
    msg = result.message
    assert msg["route"] == KINDS[kind][2], msg
    assert msg["sourceFormat"] == kind.rsplit(".", 1)[1], msg
    assert msg["virtualSize"] == image.virtual_size, msg
    assert sha256_file(volume.target, image.virtual_size) == image.sha256, "imported bytes differ from qemu-img's"
    disk = volume.target.stat()
    assert disk.st_size == USABLE_BIG
    assert disk.st_blocks * 512 < SIZE * 0.75, "the zero half of the disk was written"
    # what came over the wire: the 1 MiB head, the tables and the data blocks, never much more
    assert msg["bytesTransferred"] <= image.file_size + (2 << 20), msg
    requests = [r for r in range_server.requests if r[1] == image.name]
    # (the spans tile the whole file, gaps included, so that its sha256 is recorded: a few more requests)
    assert len(requests) <= 8 + image.file_size // (2 << 20), f"{len(requests)} requests for {image.file_size} bytes"
    assert msg["sourceSha256"] == hashlib.sha256(image.path.read_bytes()).hexdigest(), msg


# -- hostile headers ----------------------------------------------------------------------------------------
def u32(data: bytearray, offset: int, value: int, fmt: str = "<I") -> None:
    struct.pack_into(fmt, data, offset, value)


def vdi_map(data: bytearray) -> tuple[int, list[int]]:
    offset_bmap = struct.unpack_from("<I", data, 0x154)[0]
    count = struct.unpack_from("<I", data, 0x180)[0]
    return offset_bmap, list(struct.unpack_from(f"<{count}I", data, offset_bmap))


def vdi_entry_out_of_range(data: bytearray) -> None:
    offset, entries = vdi_map(data)
    first = next(i for i, e in enumerate(entries) if e < 0xFFFFFFFE)
    u32(data, offset + 4 * first, 0x7FFFFFF0)


def vdi_map_beyond_file(data: bytearray) -> None:
    u32(data, 0x154, len(data) + (1 << 20))
    u32(data, 0x158, len(data) + (2 << 20))


def vdi_blocks_share_bytes(data: bytearray) -> None:
    offset, entries = vdi_map(data)
    allocated = [i for i, e in enumerate(entries) if e < 0xFFFFFFFE]
    u32(data, offset + 4 * allocated[1], entries[allocated[0]])


def vdi_map_too_small(data: bytearray) -> None:
    u32(data, 0x180, 3)


def vhd_bat(data: bytearray) -> tuple[int, int]:
    dyn = struct.unpack_from(">Q", data, 16)[0]
    table, entries = struct.unpack_from(">QI", data, dyn + 16)
    return table, entries


def vhd_block_beyond_file(data: bytearray) -> None:
    table, _ = vhd_bat(data)
    u32(data, table, (len(data) >> 9) + 64, ">I")


def vhd_block_over_its_header(data: bytearray) -> None:
    table, _ = vhd_bat(data)
    u32(data, table, 0, ">I")  # its bitmap would be the footer copy, its data the dynamic disk header


def vhd_table_beyond_file(data: bytearray) -> None:
    dyn = struct.unpack_from(">Q", data, 16)[0]
    struct.pack_into(">Q", data, dyn + 16, len(data) + (1 << 20))


def vhd_footer_checksum(data: bytearray) -> None:
    data[70] ^= 0x01  # a byte of the unique id changes, the checksum does not


def vhdx_regions(data: bytearray) -> dict[bytes, int]:
    """Offset in the file of each region entry of the first region table, by its GUID."""
    count = struct.unpack_from("<I", data, (192 << 10) + 8)[0]
    return {bytes(data[(192 << 10) + 16 + 32 * i : (192 << 10) + 32 + 32 * i]): (192 << 10) + 16 + 32 * i
            for i in range(count)}


BAT_GUID = bytes.fromhex("6677c22d23f600429d64115e9bfd4a08")


def vhdx_bat(data: bytearray) -> int:
    return struct.unpack_from("<Q", data, vhdx_regions(data)[BAT_GUID] + 16)[0]


def vhdx_first_present(data: bytearray) -> int:
    bat = vhdx_bat(data)
    return next(bat + 8 * i for i in range(64) if struct.unpack_from("<Q", data, bat + 8 * i)[0] & 7 == 6)


def vhdx_block_beyond_file(data: bytearray) -> None:
    struct.pack_into("<Q", data, vhdx_first_present(data), ((len(data) >> 20) + 8) << 20 | 6)


def vhdx_partially_present(data: bytearray) -> None:
    at = vhdx_first_present(data)
    struct.pack_into("<Q", data, at, struct.unpack_from("<Q", data, at)[0] | 7)


def vhdx_bat_region_beyond_file(data: bytearray) -> None:
    entry = vhdx_regions(data)[BAT_GUID]
    struct.pack_into("<Q", data, entry + 16, ((len(data) >> 20) + 4) << 20)
    table = 192 << 10
    struct.pack_into("<I", data, table + 4, 0)
    struct.pack_into("<I", data, table + 4, crc32c(bytes(data[table : table + (64 << 10)])))


def vhdx_headers_corrupt(data: bytearray) -> None:
    data[(64 << 10) + 20] ^= 0xFF
    data[(128 << 10) + 20] ^= 0xFF


HOSTILE: list[tuple[str, Callable[[bytearray], None], str]] = [
    ("dynamic.vdi", vdi_entry_out_of_range, "points at data block"),
    ("dynamic.vdi", vdi_map_beyond_file, "beyond the end of the file"),
    ("dynamic.vdi", vdi_blocks_share_bytes, "overlaps another block"),
    ("dynamic.vdi", vdi_map_too_small, "do not hold"),
    ("dynamic.vhd", vhd_block_beyond_file, "outside the file's data area"),
    ("dynamic.vhd", vhd_block_over_its_header, "overlaps the image's metadata"),
    ("dynamic.vhd", vhd_table_beyond_file, "beyond the end of the file"),
    ("dynamic.vhd", vhd_footer_checksum, "checksum does not match"),
    ("default.vhdx", vhdx_block_beyond_file, "outside the file's data area"),
    ("default.vhdx", vhdx_partially_present, "partially present"),
    ("default.vhdx", vhdx_bat_region_beyond_file, "beyond the end of the file"),
    ("default.vhdx", vhdx_headers_corrupt, "neither header is valid"),
]


@pytest.mark.parametrize(("kind", "patch", "fragment"), HOSTILE, ids=lambda v: getattr(v, "__name__", str(v)))
def test_hostile_block_maps_fail_with_a_clear_reason(
    kind: str,
    patch: Callable[[bytearray], None],
    fragment: str,
    made: dict[str, Made],
    served_dir: Path,
    range_server: FileServer,
    make_volume: Callable[..., Volume],
) -> None:
    data = bytearray(made[kind].path.read_bytes())
    patch(data)
    name = f"hostile-{patch.__name__}-{hashlib.sha256(data).hexdigest()[:8]}.{kind.rsplit('.', 1)[1]}"
    (served_dir / name).write_bytes(data)
    try:
        volume = make_volume("fs")
        result = run_importer(volume, env(range_server, name))
    finally:
        (served_dir / name).unlink()
    assert_failed(result, "InvalidImage", kind.rsplit(".", 1)[1], fragment, retryable=False)
    assert not volume.target.exists(), "a failed import left data on the volume"


def test_vhdx_naming_a_log_is_left_to_qemu_img(
    made: dict[str, Made], served_dir: Path, range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    """A header that names a log may need it replayed, which is qemu's to do (here the log is empty,
    so qemu-img reads the image through nbdkit-curl), and bytesTransferred still counts nbdkit's reads."""
    image = made["default.vhdx"]
    data = bytearray(image.path.read_bytes())
    for header in (64 << 10, 128 << 10):
        data[header + 48 : header + 64] = bytes(range(1, 17))
        struct.pack_into("<I", data, header + 4, 0)
        struct.pack_into("<I", data, header + 4, crc32c(bytes(data[header : header + 4096])))
    name = "blockmap-with-log.vhdx"
    (served_dir / name).write_bytes(data)
    try:
        volume = make_volume("fs")
        result = run_importer(volume, env(range_server, name))
    finally:
        (served_dir / name).unlink()
    assert result.code == 0, result
    assert result.message["route"] == "nbdkit-convert", result.message
    assert sha256_file(volume.target, image.virtual_size) == image.sha256
    assert image.file_size // 3 <= result.message["bytesTransferred"] <= image.file_size + (3 << 20)
