"""Route `qcow2-stream`: a qcow2 that cannot be read by ranges (compressed, a registry layer, an
upload, a server without Range support), converted in one pass as it streams; only the bytes that
come before the tables that place them wait, in memory and then on scratch. Not resumable."""

from __future__ import annotations

import logging
import os

from .. import qcow2_stream, resume
from ..errors import ImporterError, Reason
from ..formats import ImageInfo
from ..progress import RESIZE, SYNC, TRANSFER_DATA_FILE
from ..retry import Terminated
from ..streams import Stream, as_bytes
from .context import CHUNK, ROUTE_QCOW2_STREAM, ImportContext

log = logging.getLogger(__name__)


def qcow2_stream_route(ctx: ImportContext, stream: Stream, info: ImageInfo) -> tuple[int, bool]:
    ctx.route = ROUTE_QCOW2_STREAM
    header = info.details["header"]
    size = header.size
    ctx.check_size(size, info.format)
    resume.remove(ctx.state_path)
    ctx.remove_scratch()
    limit = 4 * size + (1 << 30)  # metadata and snapshots make a qcow2 larger than its disk, not 4x
    fd = ctx.target.open(True, size)
    spill = qcow2_stream.Spill(ctx.scratch_file, qcow2_stream.SPILL_MEMORY)
    try:
        writer = ctx.writer(fd, ctx.target.known_zero_when_fresh)
        converter = qcow2_stream.StreamingQcow2(header, writer, spill)
        ctx.plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
        ctx.progress.begin(TRANSFER_DATA_FILE, ctx.origin.wire_size)
        meter = ctx.origin.meter
        while True:
            if ctx.stop.is_set():
                raise Terminated()
            chunk = stream.read(CHUNK)
            if not chunk:
                break
            converter.feed(as_bytes(chunk))
            if converter.pos > limit:
                raise ImporterError(
                    Reason.IMAGE_TOO_LARGE,
                    f"the qcow2 stream goes on past {limit} bytes for a {size}-byte disk",
                )
            ctx.progress.update(meter.total)
        converter.finish()
        ctx.scratch_bytes = spill.spilled_to_disk
        if spill.memory or spill.spilled_to_disk:
            log.info(
                "qcow2 stream: %d bytes held in memory and %d on scratch until their tables came",
                spill.memory,
                spill.spilled_to_disk,
            )
        writer.sync()
    finally:
        spill.close()
        os.close(fd)
    return size, ctx.finish(size)
