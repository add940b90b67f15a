"""The test image set: one small disk in every format and compression, built once per test session.

The disk is 12 MiB, about half of it data (random blocks, text-like blocks, a block that is not
64 KiB aligned) and half zeros, so both the bytes and the sparseness of a result can be checked.
Each format is made by qemu-img from that raw disk; its expected result is `qemu-img convert -O
raw` of the formatted image (a vhd's virtual size is rounded to its geometry, so expectations are
per image, never assumed). The set is built once per session under a file lock, so the xdist
workers share it.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zstandard

if TYPE_CHECKING:
    import pytest

VIRTUAL_SIZE = 12 << 20
BUILDER_VERSION = "5"

# name -> qemu-img convert options
FORMATS: dict[str, list[str]] = {
    "raw": [],
    "iso": [],
    "qcow2": ["-O", "qcow2"],
    "qcow2-v2": ["-O", "qcow2", "-o", "compat=0.10"],
    "qcow2-compressed": ["-O", "qcow2", "-c"],
    "qcow2-zstd": ["-O", "qcow2", "-c", "-o", "compression_type=zstd"],
    "vmdk": ["-O", "vmdk"],
    "vmdk-stream": ["-O", "vmdk", "-o", "subformat=streamOptimized"],
    "vhd": ["-O", "vpc"],
    "vhdx": ["-O", "vhdx"],
    "vdi": ["-O", "vdi"],
}
QEMU_FORMAT = {
    "raw": "raw",
    "iso": "raw",
    "qcow2": "qcow2",
    "qcow2-v2": "qcow2",
    "qcow2-compressed": "qcow2",
    "qcow2-zstd": "qcow2",
    "vmdk": "vmdk",
    "vmdk-stream": "vmdk",
    "vhd": "vpc",
    "vhdx": "vhdx",
    "vdi": "vdi",
}
COMPRESSIONS = ["", "gz", "xz", "zst"]


@dataclass(frozen=True)
class Image:
    name: str  # file name, e.g. "qcow2-compressed.qcow2.gz"
    path: Path
    format: str
    compression: str
    sha256: str  # of the raw image the importer must produce
    virtual_size: int
    file_sha256: str
    file_size: int


def _extension(fmt: str) -> str:
    return {"raw": "img", "iso": "iso", "vhd": "vhd", "vhdx": "vhdx", "vdi": "vdi"}.get(
        fmt.split("-", maxsplit=1)[0], fmt.split("-", maxsplit=1)[0]
    )


def file_name(fmt: str, compression: str = "") -> str:
    return f"{fmt}.{_extension(fmt)}" + (f".{compression}" if compression else "")


def sha256_file(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while True:
            n = 4 << 20 if remaining is None else min(4 << 20, remaining)
            if n == 0:
                break
            chunk = f.read(n)
            if not chunk:
                break
            h.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return h.hexdigest()


def write_base_disk(path: Path, size: int = VIRTUAL_SIZE, seed: int = 7) -> None:
    """Half data, half zeros: random blocks (1/8), text-like blocks (3/8), one block off the 64 KiB grid.

    Random data is kept to an eighth because xz compresses it at a few MB/s."""
    rng = random.Random(seed)
    block = 256 << 10
    with open(path, "wb") as f:
        f.truncate(size)
        for i in range(size // block):
            kind = i % 8
            if kind == 0:
                data = rng.randbytes(block)
            elif kind in (1, 3, 6):
                line = f"block {i:05d} of a disk image for cdi's importer tests {rng.random():.6f}\n".encode()
                data = (line * (block // len(line) + 1))[:block]
            else:
                continue
            f.seek(i * block)
            f.write(data)
        f.seek(5 * block + 4608)
        f.write(rng.randbytes(100 * 1024))


def compress(data_path: Path, out: Path, kind: str) -> None:
    data = data_path.read_bytes()
    if kind == "gz":
        out.write_bytes(gzip.compress(data, 6))
    elif kind == "xz":  # several blocks, as `xz -T` makes large files since xz 5.4
        with open(out, "wb") as f:
            subprocess.run(
                ["xz", "-1", "-T2", "--block-size=1MiB", "-c", str(data_path)], stdout=f, check=True
            )
    elif kind == "zst":
        out.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))


def build_image_set(directory: Path) -> dict[str, Image]:
    """Build (or reuse, under a lock shared by the xdist workers) every format x compression."""
    directory.mkdir(parents=True, exist_ok=True)
    manifest = directory / f"manifest-{BUILDER_VERSION}.json"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not manifest.exists():
            _build(directory, manifest)
    data = json.loads(manifest.read_text())
    return {name: Image(name=name, path=directory / name, **fields) for name, fields in data.items()}


def upload_image_set(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Image]:
    """The image set of the upload tests (integration and end-to-end), in a directory of its own per builder
    version, so that worktrees with another version of the image builder never rebuild it under our feet."""
    return build_image_set(tmp_path_factory.getbasetemp().parent / f"cdi-upload-images-v{BUILDER_VERSION}")


def _build(directory: Path, manifest: Path) -> None:
    base = directory / "base.raw"
    write_base_disk(base)
    entries = {}
    pool = ThreadPoolExecutor(4)  # the compressors release the GIL
    jobs = []
    for fmt, options in FORMATS.items():
        target = directory / file_name(fmt)
        if fmt == "raw":
            subprocess.run(["cp", "--sparse=always", str(base), str(target)], check=True)
        elif fmt == "iso":
            subprocess.run(["cp", "--sparse=always", str(base), str(target)], check=True)
            with open(target, "r+b") as f:  # an ISO 9660 primary volume descriptor signature
                f.seek(0x8000)
                f.write(b"\x01CD001\x01")
        else:
            subprocess.run(["qemu-img", "convert", "-f", "raw", *options, str(base), str(target)], check=True)
        expected = directory / f"{fmt}.expected.raw"
        subprocess.run(
            ["qemu-img", "convert", "-f", QEMU_FORMAT[fmt], "-O", "raw", str(target), str(expected)],
            check=True,
        )
        digest, size = sha256_file(expected), expected.stat().st_size
        expected.unlink()
        for kind in COMPRESSIONS:
            jobs.append(pool.submit(_finish, directory, target, fmt, kind, digest=digest, size=size))
    for job in jobs:
        name, entry = job.result()
        entries[name] = entry
    pool.shutdown()
    manifest.write_text(json.dumps(entries, indent=1))


def _finish(
    directory: Path, target: Path, fmt: str, kind: str, *, digest: str, size: int
) -> tuple[str, dict[str, object]]:
    path = target if not kind else directory / file_name(fmt, kind)
    if kind:
        compress(target, path, kind)
    return path.name, {
        "format": fmt,
        "compression": kind,
        "sha256": digest,
        "virtual_size": size,
        "file_sha256": sha256_file(path),
        "file_size": path.stat().st_size,
    }
