"""The host-assisted clone stream between the clone source pod (`cdi.cloner`) and the target's upload
server: only the allocated extents of the source, never its holes, so a half-empty 4 GiB disk moves
2 GiB and the target stays sparse.

    header  b"CDICLONE1\\n" + u64 virtual size (big-endian)
    extent  u64 offset + u64 length + `length` bytes, in increasing offsets
    end     u64 2**64-1 + u64 0

Sent as the body of a `POST` to the upload path with `x-cdi-content-type: filesystem-clone` or
`blockdevice-clone` (CDI's header and values; CDI's body is a snappy-compressed tar or raw stream)."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator

MAGIC = b"CDICLONE1\n"
HEADER = struct.Struct(">Q")
EXTENT = struct.Struct(">QQ")
END_OFFSET = 2 ** 64 - 1
FILESYSTEM_CLONE = "filesystem-clone"
BLOCKDEVICE_CLONE = "blockdevice-clone"
CONTENT_TYPES = (FILESYSTEM_CLONE, BLOCKDEVICE_CLONE)


def extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of the data regions of `fd` up to `size` (SEEK_DATA/SEEK_HOLE); the whole
    range where the file system cannot say."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # only a hole remains
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                yield offset, size - offset
                return
            raise
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end - start
        offset = end


def stream_length(spans: list[tuple[int, int]]) -> int:
    """Bytes of the whole stream (for Content-Length)."""
    return len(MAGIC) + HEADER.size + sum(EXTENT.size + length for _, length in spans) + EXTENT.size
