"""Route `archive` (content type archive): a tar, optionally compressed, extracted onto a
Filesystem volume as it downloads; a checksum mismatch empties the volume again."""

from __future__ import annotations

from .. import compression
from ..errors import ImporterError, Reason
from ..progress import SYNC, TRANSFER_DATA_DIR
from ..streams import Stream
from ..target import FileTarget, syncfs
from .context import CHUNK, ROUTE_ARCHIVE, ImportContext


def archive_route(ctx: ImportContext) -> int:
    """Extract the archive; the bytes written."""
    from .. import archive  # tarfile: only an archive import pays for it

    ctx.route = ROUTE_ARCHIVE
    if not isinstance(ctx.target, FileTarget):
        raise ImporterError(
            Reason.INVALID_CONFIGURATION,
            "content type archive needs a Filesystem volume, not a Block volume",
        )
    root = ctx.target.data_dir
    stream: Stream = ctx.wire()
    kind = compression.detect(ctx.origin.head)
    ctx.format = "tar" + (f".{kind}" if kind else "")
    if kind is not None:
        stream = compression.open_stream(stream, kind, CHUNK)
    archive.clear_directory(root)
    ctx.plan((TRANSFER_DATA_DIR, 97), (SYNC, 3))
    ctx.progress.begin(TRANSFER_DATA_DIR, ctx.origin.wire_size)
    meter = ctx.origin.meter
    reader = archive.TarReader(stream, ctx.origin.name)
    written = archive.extract(reader, root, ctx.usable, lambda _n: ctx.progress.update(meter.total))
    reader.drain()
    ctx.finish_source()
    try:
        ctx.hasher.verify(ctx.origin.name)
    except ImporterError:
        archive.clear_directory(root)
        raise
    ctx.progress.begin(SYNC)
    syncfs(root)
    return written
