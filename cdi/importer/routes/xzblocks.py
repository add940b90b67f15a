"""Route `xz-blocks`: a raw image in a multi-block .xz whose server serves ranges; the blocks are
fetched and decoded in parallel and written at their offsets, resumable from its last checkpoint."""

from __future__ import annotations

import logging
import os

from .. import xz_blocks
from ..errors import ImporterError, Reason
from ..formats import ImageInfo
from ..progress import RESIZE, SYNC, TRANSFER_DATA_FILE
from ..ranges import RangeReader
from .context import ROUTE_XZ, ImportContext

log = logging.getLogger(__name__)


def xz_layout(ranges: RangeReader) -> xz_blocks.XzLayout | None:
    """The block layout of a multi-block xz, if blocks are small enough to decode in parallel."""
    try:
        layout = xz_blocks.read_layout(ranges)
    except ImporterError as exc:
        if exc.reason != Reason.INVALID_IMAGE:
            raise
        log.info("reading the xz file as a stream: %s", exc.message)
        return None
    if len(layout.blocks) < 2 or max(b.size for b in layout.blocks) > xz_blocks.MAX_BLOCK:
        return None
    return layout


def xz_blocks_route(ctx: ImportContext, layout: xz_blocks.XzLayout, info: ImageInfo) -> tuple[int, bool]:
    ranges = ctx.origin.ranges
    assert ranges is not None
    ctx.route = ROUTE_XZ
    size = layout.uncompressed
    ctx.check_size(size, f"{info.format}, uncompressed size from the xz index")
    cover = True  # every compressed byte, in order: its sha256 is recorded (and checked, if one was asked for)
    spans = layout.spans(cover)
    plan: dict[str, object] = {
        "route": ctx.route,
        "cover": cover,
        "spans": len(spans),
        "size": size,
        "target": ctx.target.kind,
    }
    start, fd, done = ctx.open_resumable(plan, size)
    workers = min(ctx.options.workers, (os.cpu_count() or 1) + 1)  # decoding is CPU-bound
    try:
        writer = ctx.writer(fd, ctx.target.known_zero_when_fresh)
        ctx.plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
        ctx.progress.begin(TRANSFER_DATA_FILE, sum(s.length for s in spans))
        if start and ctx.verifying:  # the compressed bytes are not on the target: refetch
            ctx.rehash_fetched(ranges, spans[:start], workers=workers, window=workers + 1)
        checkpoint = ctx.checkpointer(writer, plan, start, done)
        ctx.fetch_spans(
            ranges,
            spans[start:],
            xz_blocks.BlockDecoder(layout, writer),
            checkpoint,
            done=done,
            workers=workers,
            window=workers + 1,
        )
        writer.sync()
    finally:
        os.close(fd)
    return size, ctx.finish(size)
