"""Route `stream`: a raw (or iso) image read as a stream (compressed with gz/xz/zst, or from a
server without Range support, a registry layer, an upload), decompressed and written while it
downloads. Not resumable by checkpoints; an upload continues it at `resume_offset`."""

from __future__ import annotations

import logging
import os

from .. import resume
from ..errors import ImporterError, Reason
from ..formats import ImageInfo
from ..progress import RESIZE, SYNC, TRANSFER_DATA_FILE
from ..streams import Stream
from ..target import FILESYSTEM, FileTarget
from .context import ROUTE_STREAM, ImportContext

log = logging.getLogger(__name__)


def stream_raw(ctx: ImportContext, stream: Stream, info: ImageInfo, start: int = 0, *,
               pushed: bool = False) -> tuple[int, bool]:
    ctx.route = ROUTE_STREAM
    ctx.check_size(info.virtual_size, info.format)
    resume.remove(ctx.state_path)
    fd = _open_continued(ctx, start) if start else ctx.target.open(True, None)
    try:
        writer = ctx.writer(fd, ctx.target.known_zero_when_fresh)
        if start:
            resume.rehash_prefix(fd, start, ctx.hasher)
        ctx.plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
        # a continued upload counts the whole image: its first `start` bytes are done (`copy` counts from there)
        rest = ctx.origin.wire_size
        ctx.progress.begin(TRANSFER_DATA_FILE, None if rest is None else start + rest)
        pos = ctx.copy(stream, writer, ctx.usable, "the target", start, pushed=pushed)
        if pos == 0:
            raise ImporterError(Reason.INVALID_IMAGE, f"{ctx.origin.name} holds no data")
        writer.sync()
    finally:
        os.close(fd)
    return pos, ctx.finish(pos)


def _open_continued(ctx: ImportContext, start: int) -> int:
    """The target of a resumed raw stream, holding exactly its first `start` bytes."""
    if isinstance(ctx.target, FileTarget) and not ctx.target.path.exists():
        raise ImporterError(Reason.INTERNAL_ERROR, f"cannot resume at byte {start}: {ctx.target.path} is gone")
    if start > ctx.usable:
        raise ImporterError(
            Reason.IMAGE_TOO_LARGE,
            f"cannot resume at byte {start}: the usable space of the target is {ctx.usable} bytes",
        )
    fd = ctx.target.open(False, None)
    if ctx.target.kind == FILESYSTEM:
        os.ftruncate(fd, start)  # beyond `start` reads as zeros again, as a fresh file would
    ctx.resumed_bytes = start
    log.info("resuming a raw stream at byte %d", start)
    return fd
