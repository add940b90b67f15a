"""Disk image formats: recognised by their magic bytes, their headers checked before any byte is written.

CDI lets `qemu-img info` look at an image and only refuses backing files indirectly (and never
checks external data files or encryption). Here each header is parsed directly, so an unsafe or
oversized image is refused from its first kilobytes, before the rest is even downloaded:

* qcow2: version, backing file, external data file, encryption, corrupt bit, unknown incompatible
  features, cluster size; qcow v1, QED, LUKS are refused outright.
* vmdk: the sparse extent header and its embedded descriptor; descriptor-only vmdks (extents in
  other files), parents (delta disks) and multi-extent layouts are refused.
* vhd / vhdx / vdi: differencing (parent) images are refused.
* Anything else is raw (ISO images included), as in CDI.

For the formats converted by qemu-img, `check_qemu_info` repeats the checks on qemu-img's own view
of the image, since that is what the conversion will read."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdi.common import imageprobe
from cdi.common.imageprobe import ISO, QCOW2, RAW, VDI, VHD, VHDX, VMDK

from .errors import ImporterError, Reason

QEMU_NAMES = {RAW: "raw", ISO: "raw", QCOW2: "qcow2", VMDK: "vmdk", VHD: "vpc", VHDX: "vhdx", VDI: "vdi"}

# bytes read (or peeked) from the start of an image to recognise it: enough for every header here
HEAD_SIZE = 1 << 20

# reads more of the image when a header points beyond the head (vhdx metadata); None if impossible
Fetch = Callable[[int, int], bytes | None]


@dataclass
class ImageInfo:
    format: str
    virtual_size: int | None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def qemu_format(self) -> str:
        return QEMU_NAMES[self.format]

    @property
    def needs_conversion(self) -> bool:
        return self.format not in (RAW, ISO)


def _unsupported(message: str) -> ImporterError:
    return ImporterError(Reason.UNSUPPORTED_FORMAT, message)


def _backing(message: str) -> ImporterError:
    return ImporterError(Reason.BACKING_FILE_NOT_ALLOWED, message)


def _invalid(message: str) -> ImporterError:
    return ImporterError(Reason.INVALID_IMAGE, message)


def probe(head: bytes, size: int | None, fetch: Fetch | None = None) -> ImageInfo:
    """Recognise the image whose first bytes are `head` (total `size` if known) and check it is safe.

    Which format it is comes from `imageprobe.MAGICS`, the table the controller and `cdi
    image-upload` read too; here each format's header is then checked."""
    kind = imageprobe.detect_kind(head)
    if kind == QCOW2:
        return _qcow2(head, size)
    if kind == VMDK:
        return _vmdk(head, fetch)
    if kind == imageprobe.VMDK_DESCRIPTOR:
        raise _backing(
            "vmdk descriptor file: its extents are stored in other files, which cannot be "
            "imported; convert it to a monolithic vmdk or qcow2 first"
        )
    if kind == imageprobe.COWD:
        raise _unsupported("ESX sparse (COWD) vmdk extents are not supported")
    if kind == VHD:
        return _vhd(head)
    if kind == VHDX:
        return _vhdx(head, fetch)
    if kind == VDI:
        return _vdi(head)
    if kind == imageprobe.QED:
        raise _unsupported("QED images are not supported; convert to qcow2 or raw")
    if kind == imageprobe.LUKS:
        raise _unsupported("LUKS-encrypted images are not supported")
    if kind == imageprobe.PARALLELS:
        raise _unsupported("Parallels images are not supported")
    return ImageInfo(kind, size)  # raw or iso


# -- qcow2 ---------------------------------------------------------------------------------------
_QCOW2_INCOMPAT_DIRTY = 1 << 0
_QCOW2_INCOMPAT_CORRUPT = 1 << 1
_QCOW2_INCOMPAT_DATA_FILE = 1 << 2
_QCOW2_INCOMPAT_COMPRESSION = 1 << 3
_QCOW2_INCOMPAT_EXTL2 = 1 << 4
_QCOW2_EXT_BACKING_FORMAT = 0xE2792ACA
_QCOW2_EXT_CRYPTO = 0x0537BE77
_QCOW2_EXT_DATA_FILE = 0x44415441


@dataclass
class Qcow2Header:
    version: int
    cluster_bits: int
    size: int
    l1_size: int
    l1_table_offset: int
    incompatible: int
    compression_type: int
    header_length: int

    @property
    def cluster_size(self) -> int:
        return 1 << self.cluster_bits

    @property
    def extended_l2(self) -> bool:
        return bool(self.incompatible & _QCOW2_INCOMPAT_EXTL2)


def parse_qcow2_header(head: bytes) -> Qcow2Header:
    if len(head) < 72:
        raise _invalid("qcow2 header is truncated")
    (version, backing_offset, backing_size, cluster_bits, size, crypt_method, l1_size, l1_offset) = (
        struct.unpack_from(">IQIIQIIQ", head, 4)
    )
    if version == 1:
        raise _unsupported("qcow (version 1) images are not supported; convert to qcow2 or raw")
    if version not in (2, 3):
        raise _unsupported(f"qcow2 version {version} is not supported")
    if not 9 <= cluster_bits <= 21:
        raise _invalid(f"qcow2 cluster_bits {cluster_bits} is out of range")
    incompatible, header_length, compression_type = 0, 72, 0
    if version == 3:
        if len(head) < 104:
            raise _invalid("qcow2 v3 header is truncated")
        (incompatible,) = struct.unpack_from(">Q", head, 72)
        (header_length,) = struct.unpack_from(">I", head, 100)
        if header_length > 104 and len(head) > 104:
            compression_type = head[104]
    extensions = _qcow2_extensions(head, header_length, 1 << cluster_bits)
    if backing_offset:
        name = (
            head[backing_offset : backing_offset + backing_size].decode(errors="replace")
            if backing_offset + backing_size <= len(head)
            else "?"
        )
        raise _backing(f"qcow2 image has a backing file ({name!r}); images must be self-contained")
    if incompatible & _QCOW2_INCOMPAT_DATA_FILE:
        name = extensions.get(_QCOW2_EXT_DATA_FILE, b"?").decode(errors="replace")
        raise _backing(
            f"qcow2 image keeps its data in an external data file ({name!r}); images must be self-contained"
        )
    if crypt_method or _QCOW2_EXT_CRYPTO in extensions:
        kind = {1: "AES", 2: "LUKS"}.get(crypt_method, "LUKS")
        raise _unsupported(f"qcow2 image is encrypted ({kind}); encrypted images are not supported")
    if incompatible & _QCOW2_INCOMPAT_CORRUPT:
        raise _invalid("qcow2 image is marked corrupt")
    known = (
        _QCOW2_INCOMPAT_DIRTY
        | _QCOW2_INCOMPAT_CORRUPT
        | _QCOW2_INCOMPAT_DATA_FILE
        | _QCOW2_INCOMPAT_COMPRESSION
        | _QCOW2_INCOMPAT_EXTL2
    )
    if incompatible & ~known:
        raise _unsupported(f"qcow2 image uses unknown incompatible features {incompatible & ~known:#x}")
    if compression_type not in (0, 1):
        raise _unsupported(f"qcow2 compression type {compression_type} is not supported")
    return Qcow2Header(
        version, cluster_bits, size, l1_size, l1_offset, incompatible, compression_type, header_length
    )


def _qcow2_extensions(head: bytes, start: int, cluster_size: int) -> dict[int, bytes]:
    """Header extensions (type -> data) found in the head; they live in the first cluster."""
    out: dict[int, bytes] = {}
    pos = start
    end = min(len(head), cluster_size)
    while pos + 8 <= end:
        ext_type, length = struct.unpack_from(">II", head, pos)
        if ext_type == 0:
            break
        out[ext_type] = head[pos + 8 : pos + 8 + length]
        pos += 8 + (length + 7) // 8 * 8
    return out


def _qcow2(head: bytes, size: int | None) -> ImageInfo:
    header = parse_qcow2_header(head)
    return ImageInfo(QCOW2, header.size, {"header": header})


# -- vmdk ----------------------------------------------------------------------------------------
def _vmdk(head: bytes, fetch: Fetch | None) -> ImageInfo:
    if len(head) < 77:
        raise _invalid("vmdk header is truncated")
    (version, _flags, capacity, grain_size, desc_offset, desc_size) = struct.unpack_from("<IIQQQQ", head, 4)
    compress = struct.unpack_from("<H", head, 77)[0]
    descriptor = b""
    if desc_offset and desc_size:
        start, length = desc_offset * 512, desc_size * 512
        if start + length <= len(head):
            descriptor = head[start : start + length]
        elif fetch is not None:
            descriptor = fetch(start, length) or b""
    details: dict[str, Any] = {"version": version, "compress": compress, "grain_size": grain_size}
    if descriptor:
        text = descriptor.split(b"\x00", 1)[0].decode(errors="replace")
        details.update(_check_vmdk_descriptor(text))
    return ImageInfo(VMDK, capacity * 512, details)


def _check_vmdk_descriptor(text: str) -> dict[str, Any]:
    create_type = ""
    parent = ""
    extents: list[str] = []
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep and key.strip() == "createType":
            create_type = value.strip().strip('"')
        elif sep and key.strip() == "parentCID":
            parent = value.strip()
        elif sep and key.strip() == "parentFileNameHint":
            raise _backing(f"vmdk image is a delta disk of {value.strip()}; images must be self-contained")
        elif line.split(" ", 1)[0] in ("RW", "RDONLY", "NOACCESS"):
            extents.append(line)
    if parent and parent.lower() != "ffffffff":
        raise _backing("vmdk image has a parent disk (parentCID is set); images must be self-contained")
    if create_type and create_type not in ("monolithicSparse", "streamOptimized"):
        raise _backing(
            f"vmdk createType {create_type!r} keeps its extents in other files; only "
            "monolithicSparse and streamOptimized vmdk images can be imported"
        )
    if len(extents) > 1 or any(" SPARSE " not in f" {e} " for e in extents):
        raise _backing("vmdk descriptor lists extents in other files: " + "; ".join(extents))
    return {"create_type": create_type}


# -- vhd -----------------------------------------------------------------------------------------
def _vhd(head: bytes) -> ImageInfo:
    if len(head) < 512:
        raise _invalid("vhd footer is truncated")
    (current_size,) = struct.unpack_from(">Q", head, 48)
    (disk_type,) = struct.unpack_from(">I", head, 60)
    if disk_type == 4:
        raise _backing("vhd image is a differencing disk (it has a parent); images must be self-contained")
    if disk_type not in (2, 3):
        raise _invalid(f"vhd disk type {disk_type} is not valid")
    return ImageInfo(VHD, current_size, {"disk_type": disk_type})


# -- vhdx ----------------------------------------------------------------------------------------
_VHDX_METADATA_REGION = uuid.UUID("8b7ca206-4790-4b9a-b8fe-575f050f886e")
_VHDX_FILE_PARAMETERS = uuid.UUID("caa16737-fa36-4d43-b3b6-33f0aa44e76b")
_VHDX_VIRTUAL_DISK_SIZE = uuid.UUID("2fa54224-cd1b-4876-b211-5dbed83bf4b8")
_VHDX_PARENT_LOCATOR = uuid.UUID("a8d35f2d-b30b-454d-abf7-d3d84834ab0c")


def _read(head: bytes, fetch: Fetch | None, offset: int, length: int) -> bytes | None:
    if offset + length <= len(head):
        return head[offset : offset + length]
    return fetch(offset, length) if fetch is not None else None


def _vhdx(head: bytes, fetch: Fetch | None) -> ImageInfo:
    region_table = _read(head, fetch, 192 * 1024, 64 * 1024)
    if region_table is None:
        return ImageInfo(VHDX, None)  # checked by qemu-img info before conversion
    if region_table[:4] != b"regi":
        raise _invalid("vhdx region table signature is missing")
    (count,) = struct.unpack_from("<I", region_table, 8)
    metadata: tuple[int, int] | None = None
    for i in range(min(count, 2047)):
        entry = region_table[16 + 32 * i : 48 + 32 * i]
        if uuid.UUID(bytes_le=entry[:16]) == _VHDX_METADATA_REGION:
            offset, length = struct.unpack_from("<QI", entry, 16)
            metadata = (offset, length)
    if metadata is None:
        raise _invalid("vhdx image has no metadata region")
    table = _read(head, fetch, metadata[0], min(metadata[1], 64 * 1024))
    if table is None:
        return ImageInfo(VHDX, None)
    if table[:8] != b"metadata":
        raise _invalid("vhdx metadata table signature is missing")
    (entries,) = struct.unpack_from("<H", table, 10)
    items: dict[uuid.UUID, tuple[int, int]] = {}
    for i in range(min(entries, 2047)):
        entry = table[32 + 32 * i : 64 + 32 * i]
        offset, length = struct.unpack_from("<II", entry, 16)
        items[uuid.UUID(bytes_le=entry[:16])] = (offset, length)
    if _VHDX_PARENT_LOCATOR in items:
        raise _backing(
            "vhdx image is a differencing disk (it has a parent locator); images must be self-contained"
        )
    if _VHDX_FILE_PARAMETERS in items:
        offset, _ = items[_VHDX_FILE_PARAMETERS]
        params = _read(head, fetch, metadata[0] + offset, 8)
        if params is not None and struct.unpack_from("<I", params, 4)[0] & 2:
            raise _backing("vhdx image is a differencing disk (HasParent); images must be self-contained")
    virtual_size = None
    if _VHDX_VIRTUAL_DISK_SIZE in items:
        offset, _ = items[_VHDX_VIRTUAL_DISK_SIZE]
        raw = _read(head, fetch, metadata[0] + offset, 8)
        if raw is not None:
            virtual_size = struct.unpack("<Q", raw)[0]
    return ImageInfo(VHDX, virtual_size)


# -- vdi -----------------------------------------------------------------------------------------
def _vdi(head: bytes) -> ImageInfo:
    if len(head) < 0x1C8:
        raise _invalid("vdi header is truncated")
    (image_type,) = struct.unpack_from("<I", head, 0x4C)
    (disk_size,) = struct.unpack_from("<Q", head, 0x170)
    link = head[0x1A8:0x1B8]
    if image_type in {4, 3} or link.strip(b"\x00"):
        raise _backing(
            "vdi image is a differencing (or undo) disk with a parent; images must be self-contained"
        )
    if image_type not in (1, 2):
        raise _invalid(f"vdi image type {image_type} is not valid")
    return ImageInfo(VDI, disk_size, {"image_type": image_type})


# -- qemu-img's view -----------------------------------------------------------------------------
def check_qemu_info(info: dict[str, Any], expected: ImageInfo) -> int:
    """Refuse what qemu-img sees as unsafe; returns the virtual size qemu-img will convert."""
    fmt = info.get("format")
    if fmt != expected.qemu_format:
        raise _invalid(f"qemu-img reads the image as {fmt!r}, not {expected.qemu_format!r}")
    if info.get("backing-filename") or info.get("full-backing-filename"):
        raise _backing(
            f"{expected.format} image has a backing file ({info.get('backing-filename')!r}); "
            "images must be self-contained"
        )
    if info.get("encrypted"):
        raise _unsupported(f"{expected.format} image is encrypted; encrypted images are not supported")
    data = (info.get("format-specific") or {}).get("data") or {}
    if data.get("data-file"):
        raise _backing(f"qcow2 image keeps its data in an external data file ({data['data-file']!r})")
    extents = data.get("extents") or []
    if len(extents) > 1:
        raise _backing(
            "vmdk image has several extents: " + ", ".join(str(e.get("filename")) for e in extents)
        )
    size = info.get("virtual-size")
    if not isinstance(size, int) or size < 0:
        raise _invalid("qemu-img reports no virtual size")
    return size
