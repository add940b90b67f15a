"""The receiving end of a host-assisted clone (`cdi.common.clonestream`): extents written in place
into the target's Filesystem `disk.img` (created sparse, then grown to the volume's usable size) or
Block device (the gaps between extents punched, never written as zeros), flushed before the answer.
A retried clone starts over: the image file is truncated, and every byte of a device is rewritten or
punched."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from dataclasses import dataclass

from aiohttp import web

from cdi.api.sizing import usable_space
from cdi.common import clonestream
from cdi.uploadserver.config import UploadServerConfig

CHUNK = 4 << 20
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class CloneRefused(Exception):
    """A stream this target cannot take (400)."""


@dataclass(frozen=True)
class CloneResult:
    virtual_size: int
    data_bytes: int


def _punch(fd: int, offset: int, length: int) -> None:
    """Zero a range without writing (a hole); where the device cannot, write zeros."""
    if length <= 0:
        return
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, ctypes.c_long(offset),
                       ctypes.c_long(length)) == 0:
        return
    zeros = bytes(min(CHUNK, length))
    done = 0
    while done < length:
        done += os.pwrite(fd, zeros[:min(len(zeros), length - done)], offset + done)


async def receive(request: web.Request, config: UploadServerConfig) -> CloneResult:
    content = request.content
    head = await content.readexactly(len(clonestream.MAGIC) + clonestream.HEADER.size)
    if not head.startswith(clonestream.MAGIC):
        raise CloneRefused("not a clone stream")
    (virtual,) = clonestream.HEADER.unpack(head[len(clonestream.MAGIC):])
    if config.is_block:
        fd = os.open(config.destination, os.O_WRONLY)
        capacity = os.lseek(fd, 0, os.SEEK_END)
        final = capacity
    else:
        available = config.image_size or virtual
        capacity = available
        final = max(virtual, usable_space(config.filesystem_overhead, available))
        fd = os.open(config.destination, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o660)
    try:
        if virtual > capacity:
            raise CloneRefused(f"the source ({virtual} bytes) is larger than the target ({capacity} bytes)")
        if not config.is_block:
            os.ftruncate(fd, final)
        position, data = 0, 0
        while True:
            offset, length = clonestream.EXTENT.unpack(await content.readexactly(clonestream.EXTENT.size))
            if offset == clonestream.END_OFFSET:
                break
            if offset < position or offset + length > virtual:
                raise CloneRefused(f"extent {offset}+{length} out of order or past the end ({virtual})")
            if config.is_block:
                await asyncio.to_thread(_punch, fd, position, offset - position)
            done = 0
            while done < length:
                chunk = await content.readexactly(min(CHUNK, length - done))
                await asyncio.to_thread(os.pwrite, fd, chunk, offset + done)
                done += len(chunk)
            position, data = offset + length, data + length
        if config.is_block:
            await asyncio.to_thread(_punch, fd, position, capacity - position)
        await asyncio.to_thread(os.fsync, fd)
        return CloneResult(virtual, data)
    finally:
        os.close(fd)
