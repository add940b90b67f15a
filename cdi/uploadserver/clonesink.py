"""The receiving end of a host-assisted clone (`cdi.common.clonestream`): extents written in place
through the importer's `SparseWriter` (around the page cache, zero blocks skipped) into the target's
Filesystem `disk.img` (created sparse, then grown to the volume's usable size) or Block device (the
gaps between extents punched, never written as zeros), flushed before the answer. A retried clone
starts over: the image file is truncated, and every byte of a device is rewritten or punched."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from aiohttp import web

from cdi.api.sizing import usable_space
from cdi.common import clonestream
from cdi.importer.sparse_writer import SparseWriter, WriteBehind
from cdi.uploadserver.config import UploadServerConfig

CHUNK = 4 << 20


class CloneRefused(Exception):
    """A stream this target cannot take (400)."""


@dataclass(frozen=True)
class CloneResult:
    virtual_size: int
    data_bytes: int


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
    writer: SparseWriter | None = None
    behind: WriteBehind | None = None
    try:
        if virtual > capacity:
            raise CloneRefused(f"the source ({virtual} bytes) is larger than the target ({capacity} bytes)")
        if not config.is_block:
            os.ftruncate(fd, final)
        writer = SparseWriter(fd, known_zero=not config.is_block, is_block=config.is_block, what="the clone target")
        behind = WriteBehind(writer)
        position, data = 0, 0
        while True:
            offset, length = clonestream.EXTENT.unpack(await content.readexactly(clonestream.EXTENT.size))
            if offset == clonestream.END_OFFSET:
                break
            if offset < position or offset + length > virtual:
                raise CloneRefused(f"extent {offset}+{length} out of order or past the end ({virtual})")
            if config.is_block:  # positional: independent of the writes still queued
                writer.zero_range(position, offset - position)
            done = 0
            while done < length:
                chunk = await content.readexactly(min(CHUNK, length - done))
                behind.write(offset + done, chunk)
                done += len(chunk)
            position, data = offset + length, data + length
        behind.close()
        if config.is_block:
            writer.zero_range(position, capacity - position)
        await asyncio.to_thread(writer.sync)
        return CloneResult(virtual, data)
    finally:
        if writer is not None:
            if behind is not None:
                behind.close(quiet=True)
            writer.close()
        os.close(fd)
