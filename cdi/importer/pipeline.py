"""The import pipeline: detection -> validation -> write or convert -> resize -> fsync -> result.

Sources hand over an `Origin` (first bytes, size, optional range reader, sequential stream); the
pipeline picks the route from what the first bytes say and what the source can do, before a byte
is written:

=================  ===========================================================  =========  =======
route              when                                                         scratch    resume
=================  ===========================================================  =========  =======
ranges             raw / iso, server serves ranges: parallel Range GETs          no         yes
                   written in place
qcow2-ranges       qcow2, server serves ranges: native map, clusters fetched     no         yes
                   in host order and written at guest offsets
vmdk-ranges        vmdk (monolithicSparse, streamOptimized), server serves       no         yes
                   ranges: grain tables first, grains fetched in file order
                   (inflated in the workers) and written at disk offsets
vdi-ranges,        vdi, vhd (dynamic, or fixed: raw + footer), vhdx, server     no         yes
vhd-ranges,        serves ranges: the block map first, allocated blocks
vhdx-ranges        fetched in file order and written at disk offsets
xz-blocks          raw in a multi-block .xz, server serves ranges: blocks       no         yes
                   decoded in parallel, written at their offsets
stream             raw / iso, compressed (gz/xz/zst) or no Range support:        no         no
                   decompressed and written while downloading
qcow2-stream       qcow2 that cannot be range-read (compressed, registry        rarely     no
                   layer, upload, no Range support): converted in one pass,
                   scratch only for bytes that precede their tables
nbdkit-convert     an unusual qcow2/vmdk/vhd/vhdx/vdi (a vhdx with a log, a      no         no
                   vdi with block extra data), server serves
                   ranges: qemu-img reads through nbdkit-curl
scratch-convert    vmdk/vhd/vhdx/vdi that cannot be range-read (compressed,     yes        no
                   server without ranges, registry layer, upload): stream to
                   scratch, then qemu-img
archive            content type archive: tar extracted onto the volume          no         no
=================  ===========================================================  =========  =======

Each route is a module of `routes/` (named after what it holds), a function of the
`routes.context.ImportContext` the routes share (writer, progress plan, checkpoints, span fetching,
target checks); `_kubevirt` below picks one for a disk image (`_compressed` for a compressed one).

When a route needs scratch and none is mounted, the import stops with `ScratchSpaceRequired`
after reading only the first MiBs. Checksums are verified over the bytes as the source delivered
them, before the target is finalized, and their sha256 is reported (`ImportResult.source_sha256`: hashed
by the thread that reads or collects them, in the same pass); a mismatch (or any other permanent failure) removes what
was written, so the next attempt starts clean.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from cdi.api import env as envnames
from cdi.common.imageprobe import ACCESS_RANGES, ACCESS_STREAM, QCOW2, RAW, VMDK, needs_scratch

from . import compression, formats, xz_blocks
from .errors import ImporterError, Reason
from .formats import HEAD_SIZE, ImageInfo
from .options import ImportOptions
from .progress import PREALLOCATE, RESIZE, SYNC, Progress
from .routes.archive import archive_route
from .routes.blockmap import BLOCK_MAPS, block_map_ranges, fixed_vhd, qcow2_ranges, vmdk_ranges
from .routes.context import CHUNK, ROUTE_BLANK, ROUTE_STREAM, ImportContext
from .routes.nbdkit import nbdkit_convert
from .routes.qcow2stream import qcow2_stream_route
from .routes.ranges import ranges_raw
from .routes.scratch import scratch_convert
from .routes.stream import stream_raw
from .routes.xzblocks import xz_blocks_route, xz_layout
from .source import Origin, StreamOrigin
from .streams import PeekStream, Stream
from .target import FILESYSTEM, Target, preallocate_block

# qemu (subprocess) and archive (tarfile) are imported by the routes that use them: every import is
# a new Python process, and a raw import should not pay for what only a vmdk or a tar needs

log = logging.getLogger(__name__)

Route = tuple[int, bool]  # (image size, preallocation applied)

_PEEK_LIMIT = 8 << 20


@dataclass
class ImportResult:
    virtual_size: int
    preallocation_applied: bool
    source_format: str
    route: str
    checksum: str | None = None  # `algorithm:hex` of the checksum asked for, verified
    source_sha256: str | None = None  # hex sha256 of the source's bytes as received (None: not every byte was seen)
    bytes_transferred: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    resumed_bytes: int = 0
    scratch_bytes: int = 0


def run_import(
    origin: Origin,
    target: Target,
    options: ImportOptions,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    *,
    resume_offset: int = 0,
) -> ImportResult:
    """Import an opened source into the target (the importer's and the upload server's entry point)."""
    return _Import(
        origin, target, options, progress or Progress(), stop or threading.Event(), resume_offset
    ).run()


def import_stream(
    stream: Stream,
    target: Target,
    options: ImportOptions,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    *,
    name: str = "upload",
    size: int | None = None,
    resume_offset: int = 0,
) -> ImportResult:
    """Import a plain sequential byte stream (an upload's request body) into the target.

    Same detection, validation, sizing, conversion, preallocation and checksum as an HTTP import;
    non-raw formats need `options.scratch_dir` (ScratchSpaceRequired otherwise).

    Resuming (the upload server's resumable uploads): a raw image (raw or iso, uncompressed) goes
    through the `stream` route, which writes every chunk it reads at its offset before it reads the
    next, so when the stream fails (the client went away) the target holds exactly the bytes read
    from it so far, and a retryable failure leaves them there. `resume_offset=N` continues such an
    import: the stream starts at byte N of the image, the first N bytes are taken as already on the
    target (whatever a file target holds beyond N is cut off), and there is no format detection."""
    origin = StreamOrigin(stream, name=name, size=size)
    try:
        return run_import(origin, target, options, progress, stop, resume_offset=resume_offset)
    finally:
        origin.close()


def import_blank(target: Target, options: ImportOptions, progress: Progress | None = None) -> ImportResult:
    """A blank raw disk of the usable size (Filesystem), or an (optionally zeroed) device (Block)."""
    progress = progress or Progress()
    if options.content_type != envnames.CONTENT_KUBEVIRT:
        raise ImporterError(
            Reason.INVALID_CONFIGURATION, f"a blank disk cannot have content type {options.content_type!r}"
        )
    usable = target.usable(options.requested_size, options.filesystem_overhead)
    if target.kind == FILESYSTEM:
        progress.plan([(RESIZE, 1), (PREALLOCATE, 8), (SYNC, 1)] if options.preallocation else
                      [(RESIZE, 1), (SYNC, 1)])
        progress.begin(RESIZE)
        fd = target.open(True, usable)
        os.close(fd)
        applied = target.finalize(usable, usable, options.preallocation, progress.begin)
    else:
        if options.preallocation:  # zeroing the whole device is the work
            progress.plan([(PREALLOCATE, 1)])
            progress.begin(PREALLOCATE, usable)
            fd = target.open(False, None)
            try:
                preallocate_block(fd, usable, progress.update)
            finally:
                os.close(fd)
        applied = options.preallocation
    progress.complete()
    return ImportResult(
        virtual_size=usable, preallocation_applied=applied, source_format="raw", route=ROUTE_BLANK
    )


def _extended_l2(info: ImageInfo) -> bool:
    return info.format == QCOW2 and bool(info.details["header"].extended_l2)


class _Import:
    """One import: the route chosen and run, the result reported, the partial target kept or dropped."""

    def __init__(
        self,
        origin: Origin,
        target: Target,
        options: ImportOptions,
        progress: Progress,
        stop: threading.Event,
        resume_offset: int = 0,
    ) -> None:
        self.ctx = ImportContext(origin, target, options, progress, stop, resume_offset)

    def run(self) -> ImportResult:
        ctx = self.ctx
        try:
            if ctx.options.content_type == envnames.CONTENT_ARCHIVE:
                size = archive_route(ctx)
                image_size, applied = size, False
            else:
                image_size, applied = _kubevirt(ctx)
        except BaseException as exc:
            # keep what a retry can resume from (a checkpoint on disk, or the prefix of a raw stream
            # that the upload server continues with `resume_offset`), drop everything else: a
            # permanent failure must not leave data behind, and a partial image nothing can resume
            # from is of no use to the next attempt
            retryable = not isinstance(exc, ImporterError) or exc.retryable
            resumable = (ctx.state_path is not None and ctx.state_path.exists()) or (
                ctx.route == ROUTE_STREAM and isinstance(ctx.origin, StreamOrigin)
            )
            if not (retryable and resumable):
                ctx.discard()
            raise
        finally:
            ctx.remove_scratch()
        ctx.progress.complete()
        return ImportResult(
            virtual_size=image_size,
            preallocation_applied=applied,
            source_format=ctx.format,
            route=ctx.route,
            checksum=ctx.hasher.actual(),
            source_sha256=ctx.source_sha256(),
            bytes_transferred=ctx.origin.meter.total,
            labels=dict(ctx.origin.labels),
            resumed_bytes=ctx.resumed_bytes,
            scratch_bytes=ctx.scratch_bytes,
        )


# -- the route choice -------------------------------------------------------------------------------
def _kubevirt(ctx: ImportContext) -> Route:
    """The route for a disk image, from its first bytes and what the source can do."""
    if ctx.resume_offset:  # an upload continued: the rest of a raw stream
        return stream_raw(ctx, ctx.wire(), ImageInfo(RAW, None), start=ctx.resume_offset,
                          pushed=ctx.wire_is_pushed)
    head = ctx.origin.head
    if not head:
        raise ImporterError(Reason.INVALID_IMAGE, f"{ctx.origin.name} is empty")
    kind = compression.detect(head)
    if kind is not None:
        return _compressed(ctx, kind)
    info = formats.probe(head, ctx.origin.size, ctx.read_at)
    ctx.format = info.format
    log.info(
        "%s is %s%s",
        ctx.origin.name,
        info.format,
        f", virtual size {info.virtual_size}" if info.virtual_size is not None else "",
    )
    ranges = ctx.origin.ranges is not None
    if not info.needs_conversion:
        if not ranges:
            return stream_raw(ctx, ctx.wire(), info, pushed=ctx.wire_is_pushed)  # no Range support
        # a fixed vhd looks raw but for its footer; anything else raw: parallel Range GETs
        return fixed_vhd(ctx, info) or ranges_raw(ctx, info)
    ctx.check_size(info.virtual_size, info.format)
    if ranges:
        # the formats whose map the importer reads itself (None: it cannot, qemu-img converts)
        done: Route | None = None
        if info.format == QCOW2:
            done = qcow2_ranges(ctx, info)
        elif info.format == VMDK:
            done = vmdk_ranges(ctx)
        elif info.format in BLOCK_MAPS:
            done = block_map_ranges(ctx, info)
        if done is not None:
            return done
        spec = ctx.origin.nbd()  # qemu-img reads through nbdkit-curl
        if spec is not None:
            return nbdkit_convert(ctx, info, spec)
    access = ACCESS_RANGES if ranges else ACCESS_STREAM  # nbdkit was tried above
    if not needs_scratch(info.format, None, access, extended_l2=_extended_l2(info)):
        return qcow2_stream_route(ctx, ctx.wire(), info)  # a qcow2 converted in one pass
    return scratch_convert(ctx, ctx.wire(), info, "the source cannot be read by ranges")


def _compressed(ctx: ImportContext, kind: str) -> Route:
    """The route for a compressed image: xz blocks decoded in parallel, else a decompressed stream."""
    if kind == compression.XZ and ctx.origin.ranges is not None:
        layout = xz_layout(ctx.origin.ranges)
        if layout is not None:
            head = xz_blocks.decode_head(ctx.origin.ranges, layout, HEAD_SIZE)
            if compression.detect(head) is None:
                info = formats.probe(head, layout.uncompressed, None)
                if not info.needs_conversion:
                    ctx.format = f"{info.format}.xz"
                    log.info(
                        "%s is %s compressed with xz in %d blocks: decoding them in parallel",
                        ctx.origin.name,
                        info.format,
                        len(layout.blocks),
                    )
                    return xz_blocks_route(ctx, layout, info)
    stream: Stream = ctx.wire()
    kinds = []
    while True:
        kinds.append(kind)
        stream = PeekStream(compression.open_stream(stream, kind, CHUNK))
        head = stream.peek(HEAD_SIZE)
        nested = compression.detect(head)
        if nested is None or len(kinds) >= 3:
            break
        kind = nested
    if not head:
        raise ImporterError(Reason.INVALID_IMAGE, f"{ctx.origin.name} decompresses to nothing")
    peek = stream

    def fetch(offset: int, length: int) -> bytes | None:
        if offset + length > _PEEK_LIMIT:
            return None
        data = peek.peek(offset + length)
        return data[offset : offset + length] if len(data) >= offset + length else None

    info = formats.probe(head, None, fetch)
    ctx.format = f"{info.format}.{'.'.join(reversed(kinds))}"
    log.info("%s is %s compressed with %s", ctx.origin.name, info.format, "+".join(kinds))
    if info.needs_conversion:
        if not needs_scratch(info.format, kinds[0], ACCESS_STREAM, extended_l2=_extended_l2(info)):
            return qcow2_stream_route(ctx, peek, info)  # the one converted format streamed in one pass
        return scratch_convert(
            ctx, peek, info, f"{info.format} compressed with {'+'.join(kinds)} cannot be streamed"
        )
    return stream_raw(ctx, peek, info)
