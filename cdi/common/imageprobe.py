"""What the first bytes of a disk image say (compression, container format), and the one rule
that decides whether an import needs scratch space.

The importer applies the rule when it picks its route (and asks for scratch when it has none); the
upload controller applies it to the format a client declares (`cdi image-upload` sniffs its file
with `sniff`). Keeping it here is what keeps them from disagreeing. The import controller never
reads a source itself: that is the importer's, in a pod with the DataVolume's network and proxy."""

from __future__ import annotations

import lzma
import zlib
from typing import Final

import zstandard

GZIP, XZ, ZSTD = "gz", "xz", "zst"
RAW, QCOW2, VMDK, VHD, VHDX, VDI, ISO = "raw", "qcow2", "vmdk", "vhd", "vhdx", "vdi", "iso"
CONVERTED: Final = frozenset({QCOW2, VMDK, VHD, VHDX, VDI})
HEAD_BYTES: Final = 256 * 1024  # a zstd block is up to 128 KiB compressed: read enough for one whole

# How the importer can read a source: through nbdkit-curl (ranged HTTP, so qemu-img converts in place),
# by ranges in its own code only (S3), or only as one stream (a registry layer, an upload, no Range).
ACCESS_NBD, ACCESS_RANGES, ACCESS_STREAM = "nbd", "ranges", "stream"


def detect_compression(head: bytes) -> str | None:
    if head.startswith(b"\x1f\x8b"):
        return GZIP
    if head.startswith(b"\xfd7zXZ\x00"):
        return XZ
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return ZSTD
    return None


def decompress_head(head: bytes, kind: str, limit: int = HEAD_BYTES) -> bytes:
    """As much decompressed output as the compressed head yields (up to `limit`); b"" if none."""
    try:
        if kind == GZIP:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, limit)
        if kind == XZ:
            return lzma.LZMADecompressor().decompress(head, max_length=limit)
        if kind == ZSTD:  # a reader bounds the output (a few KiB of zstd can stand for gigabytes)
            out = bytearray()
            with zstandard.ZstdDecompressor().stream_reader(head) as reader:
                while len(out) < limit:
                    try:
                        data = reader.read(limit - len(out))
                    except zstandard.ZstdError:  # the head ends inside a frame: keep what came out
                        break
                    if not data:
                        break
                    out += data
            return bytes(out)
    except (zlib.error, lzma.LZMAError, zstandard.ZstdError):
        return b""
    return head


# The one table of what an image's first bytes say: (offset, magic, kind). The kinds beyond the
# formats are images the importer refuses by name (a vmdk descriptor, ESX COWD, QED, LUKS,
# Parallels); `detect_format` folds them into the format they would be read as.
VMDK_DESCRIPTOR, COWD, QED, LUKS, PARALLELS = "vmdk-descriptor", "cowd", "qed", "luks", "parallels"
MAGICS: Final = (
    (0, b"QFI\xfb", QCOW2),
    (0, b"KDMV", VMDK),
    (0, b"# Disk DescriptorFile", VMDK_DESCRIPTOR),
    (0, b"#Disk DescriptorFile", VMDK_DESCRIPTOR),
    (0, b"COWD", COWD),
    (0, b"conectix", VHD),
    (0, b"vhdxfile", VHDX),
    (0x40, b"\x7f\x10\xda\xbe", VDI),
    (0, b"QED\x00", QED),
    (0, b"LUKS\xba\xbe", LUKS),
    (0, b"WithoutFreeSpace", PARALLELS),
    (0, b"WithouFreSpacExt", PARALLELS),
    (0x8001, b"CD001", ISO),
)
_FOLDED: Final = {VMDK_DESCRIPTOR: VMDK, COWD: RAW, QED: RAW, LUKS: RAW, PARALLELS: RAW}


def detect_kind(head: bytes) -> str:
    """What the first bytes say, from `MAGICS`: a format, a refused kind, or raw."""
    for offset, magic, kind in MAGICS:
        if head[offset : offset + len(magic)] == magic:
            return kind
    return RAW


def detect_format(head: bytes) -> str:
    """The container format by magic; anything unrecognised is raw (ISO is raw with a label)."""
    kind = detect_kind(head)
    return _FOLDED.get(kind, kind)


def sniff(head: bytes) -> tuple[str | None, str]:
    """(compression, format) of an image from its first bytes."""
    compression = detect_compression(head)
    inner = decompress_head(head, compression) if compression else head
    return compression, detect_format(inner)


def qcow2_extended_l2(head: bytes) -> bool:
    """Whether a qcow2 header asks for extended L2 entries (subclusters), which the importer's own
    qcow2 reader leaves to qemu-img."""
    if not head.startswith(b"QFI\xfb") or len(head) < 80:
        return False
    version = int.from_bytes(head[4:8], "big")
    return version >= 3 and bool(int.from_bytes(head[72:80], "big") & (1 << 4))


def needs_scratch(fmt: str, compression: str | None, access: str, *, extended_l2: bool = False) -> bool:
    """Scratch is needed only where qemu-img must convert and cannot read the source through nbdkit.

    qcow2 never needs it: the importer reads it by ranges where it can, and otherwise converts it in
    one pass as it streams by (compressed, from a registry layer, an upload, a server without Range),
    holding in memory the rare clusters stored ahead of the tables that map them. Other converted
    formats (vmdk, vhdx, vhd, vdi) need it unless they are uncompressed behind ranged HTTP."""
    if fmt not in CONVERTED:
        return False
    if fmt == QCOW2 and not extended_l2:
        return False
    return compression is not None or access != ACCESS_NBD


def head_needs_scratch(head: bytes, access: str) -> bool:
    """The rule applied to a source's first bytes (decompressed once, for the format and the qcow2 header)."""
    compression = detect_compression(head)
    inner = decompress_head(head, compression) if compression else head
    return needs_scratch(detect_format(inner), compression, access, extended_l2=qcow2_extended_l2(inner))
