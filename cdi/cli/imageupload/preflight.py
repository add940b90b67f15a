"""Checks made before anything is created in the cluster (KV#4624, KV#4707, CDI#2941: virtctl creates
the DataVolume first and lets the upload fail later, or never).

* The file exists, is a regular file (or a block device) and can be read.
* What it is: compression and format from its first bytes (`cdi.common.imageprobe`, the rule the
  controller and the importer use too), then `qemu-img info` for the virtual size of an
  uncompressed image, and a refusal of images with a backing file (the upload server would refuse
  them after the whole transfer). A compressed qcow2's virtual size is read from its header; other
  compressed images have no cheap virtual size and are checked by the upload server.
* It fits: the virtual size against the bytes the volume will really offer, computed with the
  controller's own rules (`cdi.api.rendering` for a DataVolume's PVC size, CDIConfig's
  filesystem overhead, `cdi.api.sizing`). The refusal names both numbers and the size that would fit.
* The access mode: ReadOnlyMany is refused, as virtctl does (a read-only volume cannot be written).
"""

from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cdi.api.quantity import format_bytes
from cdi.api.sizing import round_up, usable_space
from cdi.cli.imageupload.progress import human
from cdi.common import imageprobe

ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod", "ReadOnlyMany")
_QEMU_NAMES = {imageprobe.RAW: "raw", imageprobe.ISO: "raw", imageprobe.QCOW2: "qcow2", imageprobe.VMDK: "vmdk",
               imageprobe.VHD: "vpc", imageprobe.VHDX: "vhdx", imageprobe.VDI: "vdi"}


class PreflightError(Exception):
    """Something that would make the upload fail; nothing has been created."""


@dataclass(frozen=True)
class ImageFacts:
    path: Path
    size: int  # bytes of the file as it will be sent
    format: str  # raw, iso, qcow2, vmdk, ... ("tar" for an archive)
    compression: str | None
    virtual_size: int | None  # None when it cannot be known cheaply

    @property
    def annotation(self) -> str:
        """The value of `cdi.kubevirt.io/storage.upload.format` (how the controller decides scratch)."""
        return self.format + (f"+{self.compression}" if self.compression else "")

    def describe(self) -> str:
        what = self.format + (f" compressed with {self.compression}" if self.compression else "")
        virtual = f", virtual size {human(self.virtual_size)}" if self.virtual_size is not None else ""
        return f"{what}{virtual}, file {human(self.size)}"


def check_access_mode(mode: str) -> None:
    if not mode:
        return
    if mode == "ReadOnlyMany":
        raise PreflightError("cannot upload to a readonly volume, use either ReadWriteOnce or ReadWriteMany if "
                             "supported")
    if mode not in ACCESS_MODES:
        raise PreflightError(f"unknown access mode {mode!r}; expected one of {', '.join(ACCESS_MODES[:3])}")


def inspect(path: Path, *, archive: bool = False) -> ImageFacts:
    """What the file is, or PreflightError."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise PreflightError(f"cannot read {path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise PreflightError(f"{path} is a directory, not an image file")
    block = stat.S_ISBLK(st.st_mode)
    try:
        with open(path, "rb") as f:
            head = f.read(imageprobe.HEAD_BYTES)
            size = f.seek(0, os.SEEK_END) if block else st.st_size
    except OSError as exc:
        raise PreflightError(f"cannot read {path}: {exc.strerror}") from None
    if size == 0:
        raise PreflightError(f"{path} is empty")
    compression, fmt = imageprobe.sniff(head)
    if archive:
        return ImageFacts(path, size, "tar", compression, None)
    if compression is not None:
        virtual = _compressed_virtual_size(head, compression, fmt)
        return ImageFacts(path, size, fmt, compression, virtual)
    info = _qemu_info(path, fmt)
    backing = info.get("full-backing-filename") or info.get("backing-filename")
    if backing:
        raise PreflightError(f"{path} is a {fmt} image with a backing file ({backing}): upload servers refuse those; "
                             f"flatten it first: qemu-img convert -O {_QEMU_NAMES.get(fmt, fmt)} {path} flat.img")
    virtual = int(str(info.get("virtual-size") or size))
    return ImageFacts(path, size, fmt, None, virtual)


def _qemu_info(path: Path, fmt: str) -> dict[str, object]:
    try:
        result = subprocess.run(["qemu-img", "info", "--output=json", "-f", _QEMU_NAMES.get(fmt, "raw"), str(path)],
                                capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return {}  # without qemu-img, the upload server is the judge
    except subprocess.TimeoutExpired:
        raise PreflightError(f"qemu-img info {path} did not finish within 60s") from None
    if result.returncode != 0:
        raise PreflightError(f"{path} is not a valid {fmt} image: {result.stderr.strip()}")
    info: dict[str, object] = json.loads(result.stdout)
    return info


def _compressed_virtual_size(head: bytes, compression: str, fmt: str) -> int | None:
    if fmt != imageprobe.QCOW2:
        return None
    inner = imageprobe.decompress_head(head, compression)
    if len(inner) < 32:
        return None
    size: int = struct.unpack(">Q", inner[24:32])[0]
    return size


@dataclass(frozen=True)
class Capacity:
    """What a volume will offer an image: `usable` bytes, and how that number came about."""

    usable: int
    claim_bytes: int
    volume_mode: str
    overhead: str

    def explain(self) -> str:
        if self.volume_mode == "Block":
            return f"a {format_bytes(self.claim_bytes)} Block volume holds {human(self.usable)} ({self.usable} bytes)"
        return (f"a {format_bytes(self.claim_bytes)} Filesystem volume holds {human(self.usable)} ({self.usable} "
                f"bytes) after {float(self.overhead) * 100:g}% filesystem overhead")


def capacity(claim_bytes: int, volume_mode: str, overhead: str) -> Capacity:
    if volume_mode == "Block":
        return Capacity(claim_bytes, claim_bytes, volume_mode, "0")
    return Capacity(usable_space(overhead, claim_bytes), claim_bytes, volume_mode, overhead)


def check_fits(image: ImageFacts, room: Capacity, requested: str, *, datavolume_storage_api: bool) -> None:
    """PreflightError when the image's virtual size is larger than the volume's usable bytes."""
    if image.virtual_size is None or image.virtual_size <= room.usable:
        return
    if room.volume_mode == "Block" or datavolume_storage_api:
        needed = round_up(image.virtual_size)  # the storage API adds the overhead itself
    else:
        needed = round_up(-(-int(image.virtual_size * (1 + float(room.overhead))) // 1))
        while usable_space(room.overhead, needed) < image.virtual_size:
            needed += 1 << 20
    raise PreflightError(
        f"{image.path.name} has a virtual size of {human(image.virtual_size)} ({image.virtual_size} bytes), "
        f"larger than the {human(room.usable)} ({room.usable} bytes) it would get: {room.explain()}"
        f"{f' (requested {requested})' if requested else ''}; use --size {format_bytes(needed)} or more")
