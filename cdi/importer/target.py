"""The volume being filled: `disk.img` on a Filesystem volume, or the raw Block device.

Sizing is CDI's (cdi-datapath.md §4), with one fix:

* Block: the device size is the available and the usable space; no overhead, no resize.
* Filesystem: available = min(statfs free, IMPORTER_IMAGE_SIZE); usable = GetUsableSpace(overhead,
  available) (ceil, then floor to 1 MiB); disk.img ends up exactly `usable` bytes, mode 0660.
* The fix (HVdocs#1113): space held by a previous attempt's disk.img counts as free, because this
  attempt replaces it. A partial disk.img from an OOM-killed attempt no longer makes the next attempt
  fail its size check and crash-loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cdi.api import env as envnames
from cdi.api.sizing import usable_space

from .errors import ImporterError, Reason, is_no_space, no_space
from .progress import PREALLOCATE, SYNC
from .sparse_writer import fallocate, pwrite_all, write_zeros

log = logging.getLogger(__name__)

STATE_FILE_NAME = ".cdi-import-state"
SCRATCH_FILE_NAME = "tmpimage"
FILESYSTEM = "Filesystem"
BLOCK = "Block"


@dataclass(frozen=True)
class Paths:
    """Where the pod's mounts are; overridable for running outside a pod (tests, benchmarks)."""

    data_dir: Path
    block_path: Path
    scratch_dir: Path
    termination_log: Path

    @classmethod
    def from_env(cls, environ: dict[str, str] | os._Environ[str]) -> Paths:
        return cls(
            data_dir=Path(environ.get(envnames.DATA_DIR) or envnames.DATA_DIR_DEFAULT),
            block_path=Path(environ.get(envnames.BLOCK_PATH) or envnames.BLOCK_PATH_DEFAULT),
            scratch_dir=Path(environ.get(envnames.SCRATCH_DIR) or envnames.SCRATCH_DIR_DEFAULT),
            termination_log=Path(environ.get(envnames.TERMINATION_LOG) or envnames.TERMINATION_LOG_DEFAULT),
        )

    def scratch(self) -> Path | None:
        return self.scratch_dir if self.scratch_dir.is_dir() else None


class Target:
    """Common interface of the two volume modes."""

    kind: str
    path: Path
    known_zero_when_fresh: bool

    def available(self, requested: int | None) -> int:
        raise NotImplementedError

    def usable(self, requested: int | None, overhead: str) -> int:
        raise NotImplementedError

    def state_path(self, scratch: Path | None) -> Path | None:
        raise NotImplementedError

    def open(self, fresh: bool, size: int | None) -> int:
        """An fd for writing. `fresh`: previous contents are discarded (file recreated)."""
        raise NotImplementedError

    def finalize(self, image_size: int, usable: int, preallocate: bool,
                 step: Callable[[str], None] | None = None) -> bool:
        """Grow/preallocate/flush/chmod after the data is in; returns whether preallocation was applied.
        `step` is told each progress phase as it begins (`PREALLOCATE`, `SYNC`; the caller began `RESIZE`)."""
        raise NotImplementedError

    def discard(self) -> None:
        """Remove what an attempt that failed permanently wrote, so the next attempt starts clean."""


def _statfs_free(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_bsize


class FileTarget(Target):
    kind = FILESYSTEM
    known_zero_when_fresh = True

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / envnames.DISK_IMAGE_NAME

    def available(self, requested: int | None) -> int:
        free = _statfs_free(self.data_dir)
        with contextlib.suppress(FileNotFoundError):
            free += self.path.stat().st_blocks * 512  # replaced by this attempt (HVdocs#1113)
        return min(free, requested) if requested else free

    def usable(self, requested: int | None, overhead: str) -> int:
        return usable_space(overhead, self.available(requested))

    def state_path(self, scratch: Path | None) -> Path | None:
        return self.data_dir / STATE_FILE_NAME

    def open(self, fresh: bool, size: int | None) -> int:
        if fresh:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if fresh else 0)
        fd = os.open(self.path, flags, 0o660)
        try:
            if size is not None and os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
        except OSError as exc:
            os.close(fd)
            if is_no_space(exc):
                raise no_space(str(self.path), exc) from exc
            raise
        return fd

    def finalize(self, image_size: int, usable: int, preallocate: bool,
                 step: Callable[[str], None] | None = None) -> bool:
        step = step or _no_step
        fd = os.open(self.path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            final = max(image_size, usable)
            if size != final:
                # grow to the usable size like `qemu-img resize` (sparse); a shorter file means the
                # image ended with zeros that were skipped
                os.ftruncate(fd, final)
            if preallocate:
                step(PREALLOCATE)
                preallocate_file(fd, final)
            step(SYNC)
            os.fdatasync(fd)
            os.fchmod(fd, 0o660)
        except OSError as exc:
            if is_no_space(exc):
                raise no_space(str(self.path), exc) from exc
            raise
        finally:
            os.close(fd)
        fsync_dir(self.data_dir)
        return preallocate

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / STATE_FILE_NAME).unlink()


class BlockTarget(Target):
    kind = BLOCK
    known_zero_when_fresh = False  # a device's previous contents are unknown

    def __init__(self, path: Path) -> None:
        self.path = path

    def device_size(self) -> int:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)

    @property
    def is_device(self) -> bool:
        return stat.S_ISBLK(os.stat(self.path).st_mode)

    def available(self, requested: int | None) -> int:
        return self.device_size()

    def usable(self, requested: int | None, overhead: str) -> int:
        return self.device_size()

    def state_path(self, scratch: Path | None) -> Path | None:
        return scratch / STATE_FILE_NAME if scratch is not None else None

    def open(self, fresh: bool, size: int | None) -> int:
        return os.open(self.path, os.O_RDWR)

    def finalize(self, image_size: int, usable: int, preallocate: bool,
                 step: Callable[[str], None] | None = None) -> bool:
        (step or _no_step)(SYNC)
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        return preallocate


def _no_step(phase: str) -> None:
    pass


def detect_target(paths: Paths) -> Target:
    """Block if the block device path exists, else the Filesystem volume (CDI's rule)."""
    if paths.block_path.exists():
        return BlockTarget(paths.block_path)
    if paths.data_dir.is_dir():
        return FileTarget(paths.data_dir)
    raise ImporterError(
        Reason.INVALID_CONFIGURATION,
        f"no target volume: neither {paths.block_path} nor {paths.data_dir} exists",
    )


def preallocate_file(fd: int, size: int) -> None:
    """Allocate every block (fallocate mode 0: 'falloc'), else write zeros into the holes ('full')."""
    try:
        fallocate(fd, 0, 0, size)
        return
    except OSError as exc:
        if is_no_space(exc):
            raise
        log.info("fallocate is not supported here (%s); writing zeros into the holes instead", exc.strerror)
    offset = 0
    while offset < size:
        try:
            hole = os.lseek(fd, offset, os.SEEK_HOLE)
        except OSError:
            hole = offset
        if hole >= size:
            break
        try:
            data = os.lseek(fd, hole, os.SEEK_DATA)
        except OSError:
            data = size
        write_zeros(fd, hole, min(data, size) - hole)
        offset = data


def preallocate_block(fd: int, size: int, on_progress: Callable[[int], None] | None = None) -> None:
    """Zero a whole device the cheapest way it allows (blank block volumes with preallocation); `on_progress`
    is told the bytes zeroed so far."""
    from .sparse_writer import SparseWriter

    writer = SparseWriter(fd, known_zero=False, preallocate=True, is_block=True)
    step = 256 << 20
    for offset in range(0, size, step):
        writer.zero_range(offset, min(step, size - offset))
        if on_progress is not None:
            on_progress(min(offset + step, size))
    os.fdatasync(fd)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(directory: Path) -> None:
    """Flush the whole filesystem of `directory` (an extracted archive is many files)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)
    fsync_dir(directory)
