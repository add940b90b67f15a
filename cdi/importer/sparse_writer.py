"""Positional, sparse, page-cache-bounded writes into the target (a file or a block device).

Why each piece exists:

* Zero detection per 64 KiB block (`bytes.startswith(ZEROS, i)`, a memcmp that stops at the first
  non-zero byte, ~18 GiB/s on zeros and instant on data): a fresh file target is already zero, so
  zero blocks are skipped and the file stays sparse; on a target with unknown contents (a block
  device, a resumed file) they are punched/zeroed instead, never just skipped. Unlike CDI, a failed
  hole punch only changes the zeroing method, it never switches zero detection off.
* Data goes around the page cache (O_DIRECT, through a second descriptor of the same file, from a
  page-aligned buffer of the writing thread), as CDI's `qemu-img convert -t none` does: the bytes are
  copied once instead of into dirty pages that the kernel must then account, write back and reclaim
  (measured here: -30 % CPU in the writing thread, -15 % CPU of the whole machine for a 4 GiB write),
  and the page cache of the pod stays empty whatever the image size (CDI#1414, KV#15971: dirty pages
  charged to the pod's cgroup got importers OOM-killed). The unaligned head and tail of a write, and
  every write where O_DIRECT is refused (tmpfs before Linux 6.6, some FUSE filesystems),
  go through the page cache, which then stays bounded: writeback is started every `KICK_BYTES` with
  sync_file_range, and every `DROP_BYTES` the written pages are waited for and dropped with
  POSIX_FADV_DONTNEED.
* The copy into the O_DIRECT buffer is a `ctypes.memmove`, which lets go of the GIL: the upload
  server's receiving thread, the busiest of an upload, takes the GIL again after every TLS record it
  reads, and a 1 MiB copy under the GIL kept it waiting.
* Writes are positional (pwrite) so that range workers can write out of order from several threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import struct
import threading
import weakref
from typing import Final

from .behind import Behind
from .errors import is_no_space, no_space

GRANULARITY: Final = 64 * 1024
ZEROS: Final = bytes(1024 * 1024)
_ZERO_VIEW: Final = memoryview(ZEROS)
KICK_BYTES: Final = 32 * 1024 * 1024
DIRECT_ALIGN: Final = 4096  # offset, length and memory alignment of O_DIRECT writes (any logical block size <= 4 KiB)
BOUNCE_BYTES: Final = 1024 * 1024
DROP_BYTES: Final = 256 * 1024 * 1024

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_FALLOC_FL_ZERO_RANGE = 0x10
_SYNC_FILE_RANGE_WAIT_BEFORE = 1
_SYNC_FILE_RANGE_WRITE = 2
_SYNC_FILE_RANGE_WAIT_AFTER = 4
_BLKZEROOUT = 0x127F  # _IO(0x12, 127)

_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
_fallocate.restype = ctypes.c_int
_sync_file_range = _libc.sync_file_range
_sync_file_range.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
_sync_file_range.restype = ctypes.c_int


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    if _fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def sync_file_range(fd: int, offset: int, length: int, flags: int) -> None:
    if _sync_file_range(fd, offset, length, flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def open_direct(fd: int) -> int | None:
    """A second, O_DIRECT descriptor for writing the file behind `fd`; None where O_DIRECT is refused."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError:
        return None


def _close_quietly(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def punch_hole(fd: int, offset: int, length: int) -> None:
    fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def write_zeros(fd: int, offset: int, length: int) -> None:
    while length > 0:
        n = min(length, len(ZEROS))
        pwrite_all(fd, _ZERO_VIEW[:n], offset)
        offset += n
        length -= n


def _address(buf: bytes | bytearray | mmap.mmap) -> int:
    """Where a (non-empty) buffer's bytes are in memory."""
    if isinstance(buf, bytes):
        return ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value or 0
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class SparseWriter:
    """Writes image bytes at target offsets, keeping the target sparse and the page cache bounded.

    `known_zero`: the target reads as zeros everywhere not written (a freshly created file), so zero
    blocks can be skipped. `preallocate`: zero blocks must end up allocated (written or
    ZERO_RANGE'd), never punched. `direct`: write around the page cache where the target allows it.
    Safe to call from several threads at once; `close` (or garbage collection) releases the second
    descriptor that O_DIRECT needs."""

    def __init__(
        self,
        fd: int,
        *,
        known_zero: bool,
        preallocate: bool = False,
        is_block: bool = False,
        what: str = "the target",
        manage_cache: bool = True,
        direct: bool = True,
    ) -> None:
        self.fd = fd
        self.known_zero = known_zero
        self.preallocate = preallocate
        self.is_block = is_block
        self.what = what
        self.manage_cache = manage_cache
        self.bytes_written = 0
        self.bytes_zeroed = 0
        self.end = 0  # highest offset written or zeroed
        self._lock = threading.Lock()
        self._since_kick = 0
        self._since_drop = 0
        self._punch_ok = True
        self._zero_range_ok = True
        self._blkzeroout_ok = is_block
        self._direct_fd = open_direct(fd) if direct else None
        self._local = threading.local()
        self._close_direct = weakref.finalize(self, _close_quietly, self._direct_fd)

    @property
    def direct(self) -> bool:
        """Whether data is written around the page cache (O_DIRECT was accepted for the target)."""
        return self._direct_fd is not None

    def close(self) -> None:
        """Release the O_DIRECT descriptor (the caller's descriptor stays open); writes after this are
        buffered."""
        self._direct_fd = None
        self._close_direct()

    # -- data -------------------------------------------------------------------------------------
    def write_at(self, offset: int, buf: bytes | bytearray, start: int = 0, end: int | None = None) -> None:
        """Write buf[start:end] at `offset`, skipping or zeroing all-zero 64 KiB blocks."""
        end = len(buf) if end is None else end
        if end <= start:
            return
        if self.preallocate and not self.known_zero:
            self._data(offset, buf, start, end)
            return
        heads = buf[start + (-offset % GRANULARITY) : end : GRANULARITY]  # the first byte of each block
        if buf[start] and 0 not in heads:  # no block is all zeros (the usual case of image data): one run
            self._data(offset, buf, start, end)
            return
        pos = start
        run_start = start
        run_zero: bool | None = None
        toff = offset
        while pos < end:
            nxt = min(end, pos + GRANULARITY - (toff % GRANULARITY))
            zero = buf.startswith(_ZERO_VIEW[: nxt - pos], pos)
            if run_zero is None:
                run_zero = zero
            elif zero != run_zero:
                self._run(offset + (run_start - start), buf, run_start, pos, run_zero)
                run_start, run_zero = pos, zero
            toff += nxt - pos
            pos = nxt
        assert run_zero is not None
        self._run(offset + (run_start - start), buf, run_start, end, run_zero)

    def _run(self, offset: int, buf: bytes | bytearray, start: int, end: int, zero: bool) -> None:
        if not zero:
            self._data(offset, buf, start, end)
        elif not self.known_zero or self.preallocate:
            self.zero_range(offset, end - start)
        else:
            self._advance(offset + end - start, 0)

    def _data(self, offset: int, buf: bytes | bytearray, start: int, end: int) -> None:
        try:
            if self._direct_fd is not None:
                cached = self._write_direct(offset, buf, start, end)
            else:
                pwrite_all(self.fd, memoryview(buf)[start:end], offset)
                cached = end - start
        except OSError as exc:
            if is_no_space(exc):
                raise no_space(self.what, exc) from exc
            raise
        self._advance(offset + end - start, end - start, cached)

    def _write_direct(self, offset: int, buf: bytes | bytearray, start: int, end: int) -> int:
        """Write the aligned middle of buf[start:end] with O_DIRECT and its unaligned ends through the page
        cache; returns how many bytes went through the page cache."""
        stop = offset + end - start
        first = min(stop, offset + (-offset % DIRECT_ALIGN))  # target offsets of the aligned middle
        direct_fd = self._direct_fd
        last = max(first, stop // DIRECT_ALIGN * DIRECT_ALIGN) if direct_fd is not None else first
        view = memoryview(buf)
        if not 0 <= start <= end <= len(buf):  # memmove checks no bounds
            raise ValueError(f"bytes {start}..{end} of a buffer of {len(buf)}")
        source = _address(buf) if last > first else 0
        pos = first
        try:
            while pos < last:
                assert direct_fd is not None
                bounce, bounce_at = self._bounce()
                n = min(last - pos, len(bounce))
                ctypes.memmove(bounce_at, source + start + pos - offset, n)
                pwrite_all(direct_fd, bounce[:n], pos)
                pos += n
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._direct_fd = None  # refused after all: buffered from now on (the descriptor closes with us)
            last = pos
        if first > offset:
            pwrite_all(self.fd, view[start : start + first - offset], offset)
        if last < stop:
            pwrite_all(self.fd, view[start + last - offset : end], last)
        return (end - start) - (last - first)

    def _bounce(self) -> tuple[memoryview, int]:
        """This thread's page-aligned buffer (anonymous mmap) for O_DIRECT writes, and its address."""
        bounce: tuple[memoryview, int] | None = getattr(self._local, "bounce", None)
        if bounce is None:
            area = mmap.mmap(-1, BOUNCE_BYTES)
            bounce = self._local.bounce = (memoryview(area), _address(area))
        return bounce

    def _advance(self, end: int, written: int, cached: int = 0) -> None:
        """Count `written` bytes ending at `end`, `cached` of them through the page cache."""
        kick = drop = False
        with self._lock:
            self.bytes_written += written
            self.end = max(self.end, end)
            if self.manage_cache and cached:
                self._since_kick += cached
                self._since_drop += cached
                if self._since_kick >= KICK_BYTES:
                    self._since_kick = 0
                    kick = True
                if self._since_drop >= DROP_BYTES:
                    self._since_drop = 0
                    drop = True
        if drop:
            self.drop_cache()
        elif kick:
            self._kick()

    # -- zeros ------------------------------------------------------------------------------------
    def zero_range(self, offset: int, length: int) -> None:
        """Make [offset, offset+length) read as zeros: punched (deallocated) unless preallocating."""
        if length <= 0:
            return
        try:
            self._zero(offset, length)
        except OSError as exc:
            if is_no_space(exc):
                raise no_space(self.what, exc) from exc
            raise
        with self._lock:
            self.bytes_zeroed += length
            self.end = max(self.end, offset + length)

    def _zero(self, offset: int, length: int) -> None:
        if not self.preallocate and self._punch_ok:
            try:
                punch_hole(self.fd, offset, length)
                return
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENODEV, errno.ENOSYS):
                    raise
                self._punch_ok = False
        if self._zero_range_ok:
            try:
                mode = (
                    _FALLOC_FL_ZERO_RANGE if self.is_block else _FALLOC_FL_ZERO_RANGE | _FALLOC_FL_KEEP_SIZE
                )
                fallocate(self.fd, mode, offset, length)
                return
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENODEV, errno.ENOSYS):
                    raise
                self._zero_range_ok = False
        if self._blkzeroout_ok:
            try:
                fcntl.ioctl(self.fd, _BLKZEROOUT, struct.pack("QQ", offset, length))
                return
            except OSError:
                self._blkzeroout_ok = False
        write_zeros(self.fd, offset, length)

    # -- durability -------------------------------------------------------------------------------
    def _kick(self) -> None:
        with contextlib.suppress(OSError):
            sync_file_range(self.fd, 0, 0, _SYNC_FILE_RANGE_WRITE)

    def drop_cache(self) -> None:
        """Wait for written pages to reach the device and drop them from the page cache."""
        try:
            sync_file_range(
                self.fd,
                0,
                0,
                _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER,
            )
        except OSError:
            os.fdatasync(self.fd)
        with contextlib.suppress(OSError):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def sync(self) -> None:
        """Make everything written so far durable (fdatasync), then drop it from the page cache."""
        os.fdatasync(self.fd)
        with contextlib.suppress(OSError):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)


class WriteBehind(Behind[tuple[int, bytes | bytearray]]):
    """Writes chunks in a thread of its own, at most `depth` chunks behind the reader (`Behind`).

    `depth=0` writes in the caller's thread instead: for a stream whose reading costs nothing but the
    wait for a producer that already runs in a thread of its own (an upload body), a second thread
    only adds a hand-off per chunk and more threads taking turns at the GIL (measured through
    `cdi up`: +9 % upload throughput without it)."""

    def __init__(self, writer: SparseWriter, depth: int = 4) -> None:
        self.writer = writer
        super().__init__(self._write, depth, "write-behind")

    def _write(self, item: tuple[int, bytes | bytearray]) -> None:
        self.writer.write_at(item[0], item[1])

    def write(self, pos: int, chunk: bytes | bytearray) -> None:
        self.put((pos, chunk))
