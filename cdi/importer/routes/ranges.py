"""Route `ranges`: a raw (or iso) image whose server serves ranges, fetched by parallel Range GETs
and written in place; resumable from its last checkpoint."""

from __future__ import annotations

import os

from .. import resume
from ..formats import ImageInfo
from ..progress import RESIZE, SYNC, TRANSFER_DATA_FILE
from ..ranges import Span, SpanList
from .context import ROUTE_RANGES, ImportContext


def ranges_raw(ctx: ImportContext, info: ImageInfo) -> tuple[int, bool]:
    ctx.route = ROUTE_RANGES
    ranges = ctx.origin.ranges
    assert ranges is not None
    size = ranges.size
    ctx.check_size(size, info.format)
    span = ctx.options.span_size
    plan: dict[str, object] = {
        "route": ctx.route,
        "span": span,
        "size": size,
        "target": ctx.target.kind,
    }
    start, fd, done = ctx.open_resumable(plan, size)
    try:
        writer = ctx.writer(fd, ctx.target.known_zero_when_fresh)
        if start:
            resume.rehash_prefix(fd, start * span, ctx.hasher)
        ctx.plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
        ctx.progress.begin(TRANSFER_DATA_FILE, size)
        ctx.progress.update(done)
        spans = SpanList(start * span, size, span, first_index=start)

        def process(s: Span, buf: bytearray) -> None:
            writer.write_at(s.offset, buf, 0, s.length)

        checkpoint = ctx.checkpointer(writer, plan, start, done)
        ctx.fetch_spans(ranges, spans, process, checkpoint, done=done)
        writer.sync()
    finally:
        os.close(fd)
    return size, ctx.finish(size)
