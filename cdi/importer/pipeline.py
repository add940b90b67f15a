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

When a route needs scratch and none is mounted, the import stops with `ScratchSpaceRequired`
after reading only the first MiBs. Checksums are verified over the bytes as the source delivered
them, before the target is finalized; a mismatch (or any other permanent failure) removes what
was written, so the next attempt starts clean.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cdi.api import env as envnames
from cdi.common.imageprobe import ACCESS_RANGES, ACCESS_STREAM, needs_scratch

from . import compression, formats, qcow2, qcow2_stream, resume, vdi, vhd, vhdx, vmdk, xz_blocks
from .checksum import Checksum, Hasher
from .errors import ImporterError, Reason
from .formats import HEAD_SIZE, ImageInfo
from .progress import (
    CONVERT,
    RESIZE,
    SYNC,
    TRANSFER_DATA_DIR,
    TRANSFER_DATA_FILE,
    TRANSFER_SCRATCH,
    Progress,
)
from .ranges import PrefetchStream, Process, RangeFetcher, RangeReader, Span, SpanList
from .retry import Terminated
from .source import NbdSpec, Origin, StreamOrigin
from .sparse_writer import SparseWriter, WriteBehind
from .streams import Chunk, PeekStream, Stream, TapStream, as_bytes
from .target import FILESYSTEM, SCRATCH_FILE_NAME, FileTarget, Target, preallocate_block, syncfs

# qemu (subprocess) and archive (tarfile) are imported by the routes that use them: every import is
# a new Python process, and a raw import should not pay for what only a vmdk or a tar needs

log = logging.getLogger(__name__)

ROUTE_RANGES = "ranges"
ROUTE_QCOW2 = "qcow2-ranges"
ROUTE_VMDK = "vmdk-ranges"
ROUTE_VDI = "vdi-ranges"
ROUTE_VHD = "vhd-ranges"
ROUTE_VHDX = "vhdx-ranges"
ROUTE_XZ = "xz-blocks"
ROUTE_QCOW2_STREAM = "qcow2-stream"
ROUTE_STREAM = "stream"
ROUTE_NBDKIT = "nbdkit-convert"
ROUTE_SCRATCH = "scratch-convert"
ROUTE_ARCHIVE = "archive"
ROUTE_BLANK = "blank"

_CHUNK = 4 << 20
_PEEK_LIMIT = 8 << 20


@dataclass
class ImportOptions:
    content_type: str = envnames.CONTENT_KUBEVIRT
    requested_size: int | None = None  # IMPORTER_IMAGE_SIZE in bytes
    filesystem_overhead: str = "0"
    preallocation: bool = False
    checksum: Checksum | None = None
    scratch_dir: Path | None = None  # None: no scratch volume mounted
    workers: int = 4  # parallel range requests
    span_size: int = 4 << 20  # bytes per range request
    window: int = 16  # span buffers in flight (memory = window x span_size)
    checkpoint_bytes: int = 256 << 20  # fdatasync + resume checkpoint every ... bytes
    checkpoint_seconds: float = 2.0  # ... or seconds, whichever comes first
    resume: bool = True


@dataclass
class ImportResult:
    virtual_size: int
    preallocation_applied: bool
    source_format: str
    route: str
    checksum: str | None = None
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
    progress.plan([(RESIZE, 1)])
    progress.begin(RESIZE)
    if target.kind == FILESYSTEM:
        fd = target.open(True, usable)
        os.close(fd)
        applied = target.finalize(usable, usable, options.preallocation)
    else:
        if options.preallocation:
            fd = target.open(False, None)
            try:
                preallocate_block(fd, usable)
            finally:
                os.close(fd)
        applied = options.preallocation
    progress.complete()
    return ImportResult(
        virtual_size=usable, preallocation_applied=applied, source_format="raw", route=ROUTE_BLANK
    )


# formats whose block map the importer reads itself: route and map reader
_BLOCK_MAPS: dict[str, tuple[str, Callable[..., qcow2.Qcow2Map]]] = {
    formats.VDI: (ROUTE_VDI, vdi.read_map),
    formats.VHD: (ROUTE_VHD, vhd.read_map),
    formats.VHDX: (ROUTE_VHDX, vhdx.read_map),
}


def _extended_l2(info: ImageInfo) -> bool:
    return info.format == formats.QCOW2 and bool(info.details["header"].extended_l2)


class _Import:
    def __init__(
        self,
        origin: Origin,
        target: Target,
        options: ImportOptions,
        progress: Progress,
        stop: threading.Event,
        resume_offset: int = 0,
    ) -> None:
        self.origin = origin
        self.resume_offset = resume_offset
        self.target = target
        self.options = options
        self.progress = progress
        self.stop = stop
        self.hasher: Hasher | None = options.checksum.hasher() if options.checksum else None
        self.usable = target.usable(options.requested_size, options.filesystem_overhead)
        self.state_path = target.state_path(options.scratch_dir) if options.resume else None
        self.scratch_file = options.scratch_dir / SCRATCH_FILE_NAME if options.scratch_dir else None
        self.format = "raw"
        self.route = ""
        self.resumed_bytes = 0
        self.scratch_bytes = 0
        origin.meter.listeners.append(progress.transferred)

    # -- entry ----------------------------------------------------------------------------------------
    def run(self) -> ImportResult:
        try:
            if self.options.content_type == envnames.CONTENT_ARCHIVE:
                size = self._archive()
                image_size, applied = size, False
            else:
                image_size, applied = self._kubevirt()
        except BaseException as exc:
            # keep what a retry can resume from (a checkpoint on disk, or the prefix of a raw stream
            # that the upload server continues with `resume_offset`), drop everything else: a
            # permanent failure must not leave data behind, and a partial image nothing can resume
            # from is of no use to the next attempt
            retryable = not isinstance(exc, ImporterError) or exc.retryable
            resumable = (self.state_path is not None and self.state_path.exists()) or (
                self.route == ROUTE_STREAM and isinstance(self.origin, StreamOrigin)
            )
            if not (retryable and resumable):
                self._discard()
            raise
        finally:
            self._remove_scratch()
        self.progress.complete()
        return ImportResult(
            virtual_size=image_size,
            preallocation_applied=applied,
            source_format=self.format,
            route=self.route,
            checksum=self.hasher.actual() if self.hasher else None,
            bytes_transferred=self.origin.meter.total,
            labels=dict(self.origin.labels),
            resumed_bytes=self.resumed_bytes,
            scratch_bytes=self.scratch_bytes,
        )

    def _discard(self) -> None:
        log.info("removing the partial import so that the next attempt starts clean")
        with contextlib.suppress(OSError):
            self.target.discard()
        resume.remove(self.state_path)

    def _remove_scratch(self) -> None:
        if self.scratch_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.scratch_file.unlink()

    # -- detection ------------------------------------------------------------------------------------
    def _wire(self) -> Stream:
        """The source's byte stream, hashed as it comes off the wire."""
        stream = self.origin.stream()
        if self.hasher is not None:
            hasher = self.hasher
            return TapStream(stream, hasher.update)
        return stream

    @property
    def _wire_is_pushed(self) -> bool:
        """Whether reading `_wire()` costs nothing but the wait for its producer (`WriteBehind`, depth 0)."""
        return self.origin.pushed and self.hasher is None

    def _read_at(self, offset: int, length: int) -> bytes | None:
        ranges = self.origin.ranges
        if ranges is None:
            head = self.origin.head
            return head[offset : offset + length] if offset + length <= len(head) else None
        if offset + length > ranges.size:
            return None
        buf = bytearray(length)
        ranges.read_into(offset, memoryview(buf))
        return bytes(buf)

    def _kubevirt(self) -> tuple[int, bool]:
        if self.resume_offset:
            return self._stream_raw(self._wire(), ImageInfo(formats.RAW, None), start=self.resume_offset,
                                    pushed=self._wire_is_pushed)
        head = self.origin.head
        if not head:
            raise ImporterError(Reason.INVALID_IMAGE, f"{self.origin.name} is empty")
        kind = compression.detect(head)
        if kind is not None:
            return self._compressed(kind)
        info = formats.probe(head, self.origin.size, self._read_at)
        self.format = info.format
        log.info(
            "%s is %s%s",
            self.origin.name,
            info.format,
            f", virtual size {info.virtual_size}" if info.virtual_size is not None else "",
        )
        if not info.needs_conversion:
            if self.origin.ranges is not None:
                fixed = self._fixed_vhd(info)
                if fixed is not None:
                    return fixed
                return self._ranges_raw(info)
            return self._stream_raw(self._wire(), info, pushed=self._wire_is_pushed)
        self._check_size(info.virtual_size, info.format)
        if self.origin.ranges is not None:
            if info.format == formats.QCOW2:
                try:
                    return self._qcow2(info)
                except qcow2.NotNative as exc:
                    log.info("converting this qcow2 with qemu-img instead: %s", exc)
            if info.format == formats.VMDK:
                try:
                    return self._vmdk()
                except qcow2.NotNative as exc:
                    log.info("converting this vmdk with qemu-img instead: %s", exc)
            if info.format in _BLOCK_MAPS:
                route, reader = _BLOCK_MAPS[info.format]
                try:
                    m = reader(self.origin.ranges, self.origin.head, max_piece=self.options.span_size)
                except qcow2.NotNative as exc:
                    log.info("converting this %s with qemu-img instead: %s", info.format, exc)
                else:
                    return self._mapped(route, m, qcow2.ClusterWriter)
            spec = self.origin.nbd()
            if spec is not None:
                return self._nbdkit(info, spec)
        access = ACCESS_RANGES if self.origin.ranges is not None else ACCESS_STREAM  # nbdkit was tried above
        if not needs_scratch(info.format, None, access, extended_l2=_extended_l2(info)):
            return self._qcow2_stream(self._wire(), info)
        return self._scratch(self._wire(), info, "the source cannot be read by ranges")

    def _compressed(self, kind: str) -> tuple[int, bool]:
        if kind == compression.XZ and self.origin.ranges is not None:
            layout = self._xz_layout(self.origin.ranges)
            if layout is not None:
                head = xz_blocks.decode_head(self.origin.ranges, layout, HEAD_SIZE)
                if compression.detect(head) is None:
                    info = formats.probe(head, layout.uncompressed, None)
                    if not info.needs_conversion:
                        self.format = f"{info.format}.xz"
                        log.info(
                            "%s is %s compressed with xz in %d blocks: decoding them in parallel",
                            self.origin.name,
                            info.format,
                            len(layout.blocks),
                        )
                        return self._xz_blocks(layout, info)
        stream: Stream = self._wire()
        kinds = []
        while True:
            kinds.append(kind)
            stream = PeekStream(compression.open_stream(stream, kind, _CHUNK))
            head = stream.peek(HEAD_SIZE)
            nested = compression.detect(head)
            if nested is None or len(kinds) >= 3:
                break
            kind = nested
        if not head:
            raise ImporterError(Reason.INVALID_IMAGE, f"{self.origin.name} decompresses to nothing")
        peek = stream

        def fetch(offset: int, length: int) -> bytes | None:
            if offset + length > _PEEK_LIMIT:
                return None
            data = peek.peek(offset + length)
            return data[offset : offset + length] if len(data) >= offset + length else None

        info = formats.probe(head, None, fetch)
        self.format = f"{info.format}.{'.'.join(reversed(kinds))}"
        log.info("%s is %s compressed with %s", self.origin.name, info.format, "+".join(kinds))
        if info.needs_conversion:
            if not needs_scratch(info.format, kinds[0], ACCESS_STREAM, extended_l2=_extended_l2(info)):
                return self._qcow2_stream(peek, info)  # the one converted format streamed in one pass
            return self._scratch(
                peek, info, f"{info.format} compressed with {'+'.join(kinds)} cannot be streamed"
            )
        return self._stream_raw(peek, info)

    def _xz_layout(self, ranges: RangeReader) -> xz_blocks.XzLayout | None:
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

    def _check_size(self, size: int | None, what: str) -> None:
        if size is not None and size > self.usable:
            raise ImporterError(
                Reason.IMAGE_TOO_LARGE,
                f"the image's virtual size ({size} bytes, {what}) is larger than the usable "
                f"space of the target ({self.usable} bytes; {self._space_detail()})",
            )

    def _space_detail(self) -> str:
        if self.target.kind != FILESYSTEM:
            return "the block device's size"
        requested = self.options.requested_size
        return (
            f"available {self.target.available(requested)} bytes = min(free space, requested "
            f"{requested if requested else 'unset'}), filesystem overhead {self.options.filesystem_overhead}"
        )

    # -- helpers --------------------------------------------------------------------------------------
    def _plan(self, *phases: tuple[str, float]) -> None:
        plan = list(phases)
        if self.target.kind != FILESYSTEM:
            plan = [p for p in plan if p[0] != RESIZE]
        self.progress.plan(plan)

    def _writer(self, fd: int, known_zero: bool) -> SparseWriter:
        return SparseWriter(
            fd,
            known_zero=known_zero,
            preallocate=self.options.preallocation,
            is_block=self.target.kind != FILESYSTEM,
            what=str(self.target.path),
        )

    def _finish(self, image_size: int) -> bool:
        """Verify what only the end can verify, then resize/preallocate/flush the target."""
        self.origin.finish()
        if self.hasher is not None:
            self.hasher.verify(self.origin.name)
        self.progress.begin(RESIZE)
        applied = self.target.finalize(image_size, self.usable, self.options.preallocation)
        self.progress.begin(SYNC)
        resume.remove(self.state_path)
        return applied

    def _open_resumable(self, plan: dict[str, object], size: int) -> tuple[int, int, int]:
        """(first span to fetch, fd, bytes already done) for a resumable route."""
        identity = self.origin.identity
        state = resume.load(self.state_path) if identity is not None else None
        if state is not None and state.matches(identity, plan) and self._target_intact(size):
            log.info(
                "resuming: %d bytes (%d spans) are already on the target", state.done_bytes, state.done_spans
            )
            self.resumed_bytes = state.done_bytes
            return state.done_spans, self.target.open(False, size), state.done_bytes
        if state is not None:
            log.info("not resuming: the source, the plan or the target changed since the last attempt")
        resume.remove(self.state_path)
        return 0, self.target.open(True, size), 0

    def _target_intact(self, size: int) -> bool:
        if isinstance(self.target, FileTarget):
            try:
                return self.target.path.stat().st_size >= size
            except FileNotFoundError:
                return False
        return True

    def _checkpointer(
        self, writer: SparseWriter, plan: dict[str, object], spans: int, done: int
    ) -> resume.Checkpointer:
        identity = self.origin.identity
        path = self.state_path if identity is not None else None
        return resume.Checkpointer(
            writer,
            path,
            identity or {},
            plan,
            spans=spans,
            done=done,
            every_bytes=self.options.checkpoint_bytes,
            every_seconds=self.options.checkpoint_seconds,
        )

    def _fetch_spans(
        self,
        ranges: RangeReader,
        spans: Sequence[Span],
        process: Callable[[Span, bytearray], None],
        checkpoint: resume.Checkpointer,
        *,
        done: int,
        workers: int | None = None,
        window: int | None = None,
    ) -> None:
        """Fetch and write spans in parallel; hash and checkpoint them in order."""
        fetcher = RangeFetcher(
            ranges,
            spans,
            workers=workers or self.options.workers,
            window=window or self.options.window,
            process=process,
            stop=self.stop,
            on_idle=checkpoint.idle,
            on_cancel=self.origin.abort,
        )
        fetched = done
        try:
            for s, buf in fetcher:
                if self.hasher is not None:
                    self.hasher.update(memoryview(buf)[: s.length])
                fetched += s.length
                self.progress.update(fetched)
                checkpoint.done(s.index + 1, fetched)
        except BaseException as exc:
            if isinstance(exc, Terminated) or (isinstance(exc, ImporterError) and exc.retryable):
                with contextlib.suppress(Exception):
                    checkpoint.save()  # keep what is on the target for the next attempt
            raise

    # -- routes ---------------------------------------------------------------------------------------
    def _ranges_raw(self, info: ImageInfo) -> tuple[int, bool]:
        self.route = ROUTE_RANGES
        ranges = self.origin.ranges
        assert ranges is not None
        size = ranges.size
        self._check_size(size, info.format)
        span = self.options.span_size
        plan: dict[str, object] = {
            "route": self.route,
            "span": span,
            "size": size,
            "target": self.target.kind,
        }
        start, fd, done = self._open_resumable(plan, size)
        try:
            writer = self._writer(fd, self.target.known_zero_when_fresh)
            if start and self.hasher is not None:
                resume.rehash_prefix(fd, start * span, self.hasher)
            self._plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
            self.progress.begin(TRANSFER_DATA_FILE, size)
            self.progress.update(done)
            spans = SpanList(start * span, size, span, first_index=start)

            def process(s: Span, buf: bytearray) -> None:
                writer.write_at(s.offset, buf, 0, s.length)

            checkpoint = self._checkpointer(writer, plan, start, done)
            self._fetch_spans(ranges, spans, process, checkpoint, done=done)
            writer.sync()
        finally:
            os.close(fd)
        return size, self._finish(size)

    def _qcow2(self, info: ImageInfo) -> tuple[int, bool]:
        ranges = self.origin.ranges
        assert ranges is not None
        m = qcow2.read_map(
            ranges, info.details["header"], workers=self.options.workers, max_piece=self.options.span_size
        )
        return self._mapped(ROUTE_QCOW2, m, qcow2.ClusterWriter)

    def _fixed_vhd(self, info: ImageInfo) -> tuple[int, bool] | None:
        """A fixed vhd (raw data, then a 512-byte footer) imported without its footer; None for raw.

        Neither CDI's qemu-img nor a magic at the start recognises it, so CDI writes the footer into
        the disk; its checksummed footer at the end is what tells it from a raw disk."""
        ranges = self.origin.ranges
        if info.format != formats.RAW or ranges is None or ranges.size < 2 * vhd.FOOTER:
            return None
        if ranges.size % (1 << 20) == 0:
            # raw disks are whole MiBs; a fixed vhd is its data and 512 bytes more (whole MiBs only
            # by chance): no request for the tail of a raw disk
            return None
        tail = bytearray(vhd.FOOTER)
        ranges.read_into(ranges.size - vhd.FOOTER, memoryview(tail))
        size = vhd.fixed_footer(bytes(tail), ranges.size)
        if size is None:
            return None
        self.format = formats.VHD
        log.info("%s is a fixed vhd of %d bytes: importing it without its footer", self.origin.name, size)
        return self._mapped(ROUTE_VHD, vhd.fixed_map(size, ranges.size, max_piece=self.options.span_size),
                            qcow2.ClusterWriter)

    def _vmdk(self) -> tuple[int, bool]:
        ranges = self.origin.ranges
        assert ranges is not None
        m = vmdk.read_map(ranges, self.origin.head, workers=self.options.workers, max_piece=self.options.span_size)
        return self._mapped(ROUTE_VMDK, m, vmdk.GrainWriter)

    def _mapped(
        self, route: str, m: qcow2.Qcow2Map, cluster_writer: Callable[[qcow2.Qcow2Map, SparseWriter], Process]
    ) -> tuple[int, bool]:
        """A converted format whose map is read first: its data fetched in host order by ranges and
        written at guest offsets (qcow2, vmdk, vdi, vhd, vhdx)."""
        ranges = self.origin.ranges
        assert ranges is not None
        self.route = route
        size = m.header.size
        self._check_size(size, self.format)
        cover = self.hasher is not None
        spans = qcow2.plan_spans(m, self.options.span_size, cover_all=cover)
        plan: dict[str, object] = {
            "route": self.route,
            "span": self.options.span_size,
            "cover": cover,
            "spans": len(spans),
            "size": size,
            "target": self.target.kind,
        }
        log.info("%s map: %d extents, %d bytes of data in %d spans", self.format, len(m), m.data_bytes, len(spans))
        start, fd, done = self._open_resumable(plan, size)
        total = sum(s.length for s in spans)
        try:
            writer = self._writer(fd, self.target.known_zero_when_fresh)
            self._plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
            self.progress.begin(TRANSFER_DATA_FILE, total)
            if not writer.known_zero:
                for offset, length in m.zero_ranges():
                    writer.zero_range(offset, length)
            if start and self.hasher is not None:  # the image's bytes are not on the target: fetch to hash
                for s, buf in RangeFetcher(
                    ranges,
                    spans[:start],
                    workers=self.options.workers,
                    window=self.options.window,
                    stop=self.stop,
                    on_cancel=self.origin.abort,
                ):
                    self.hasher.update(memoryview(buf)[: s.length])
            self.progress.update(done)
            checkpoint = self._checkpointer(writer, plan, start, done)
            self._fetch_spans(ranges, spans[start:], cluster_writer(m, writer), checkpoint, done=done)
            writer.sync()
        finally:
            os.close(fd)
        return size, self._finish(size)

    def _xz_blocks(self, layout: xz_blocks.XzLayout, info: ImageInfo) -> tuple[int, bool]:
        ranges = self.origin.ranges
        assert ranges is not None
        self.route = ROUTE_XZ
        size = layout.uncompressed
        self._check_size(size, f"{info.format}, uncompressed size from the xz index")
        cover = self.hasher is not None
        spans = layout.spans(cover)
        plan: dict[str, object] = {
            "route": self.route,
            "cover": cover,
            "spans": len(spans),
            "size": size,
            "target": self.target.kind,
        }
        start, fd, done = self._open_resumable(plan, size)
        workers = min(self.options.workers, (os.cpu_count() or 1) + 1)  # decoding is CPU-bound
        try:
            writer = self._writer(fd, self.target.known_zero_when_fresh)
            self._plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
            self.progress.begin(TRANSFER_DATA_FILE, sum(s.length for s in spans))
            if start and self.hasher is not None:  # the compressed bytes are not on the target: refetch
                for s, buf in RangeFetcher(
                    ranges,
                    spans[:start],
                    workers=workers,
                    window=workers + 1,
                    stop=self.stop,
                    on_cancel=self.origin.abort,
                ):
                    self.hasher.update(memoryview(buf)[: s.length])
            checkpoint = self._checkpointer(writer, plan, start, done)
            self._fetch_spans(
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
        return size, self._finish(size)

    def _qcow2_stream(self, stream: Stream, info: ImageInfo) -> tuple[int, bool]:
        self.route = ROUTE_QCOW2_STREAM
        header = info.details["header"]
        size = header.size
        self._check_size(size, info.format)
        resume.remove(self.state_path)
        self._remove_scratch()
        limit = 4 * size + (1 << 30)  # metadata and snapshots make a qcow2 larger than its disk, not 4x
        fd = self.target.open(True, size)
        spill = qcow2_stream.Spill(self.scratch_file, qcow2_stream.SPILL_MEMORY)
        try:
            writer = self._writer(fd, self.target.known_zero_when_fresh)
            converter = qcow2_stream.StreamingQcow2(header, writer, spill)
            self._plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
            self.progress.begin(TRANSFER_DATA_FILE, self.origin.wire_size)
            meter = self.origin.meter
            while True:
                if self.stop.is_set():
                    raise Terminated()
                chunk = stream.read(_CHUNK)
                if not chunk:
                    break
                converter.feed(as_bytes(chunk))
                if converter.pos > limit:
                    raise ImporterError(
                        Reason.IMAGE_TOO_LARGE,
                        f"the qcow2 stream goes on past {limit} bytes for a {size}-byte disk",
                    )
                self.progress.update(meter.total)
            converter.finish()
            self.scratch_bytes = spill.spilled_to_disk
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
        return size, self._finish(size)

    def _stream_raw(self, stream: Stream, info: ImageInfo, start: int = 0, *, pushed: bool = False) -> tuple[int, bool]:
        self.route = ROUTE_STREAM
        self._check_size(info.virtual_size, info.format)
        resume.remove(self.state_path)
        fd = self._open_continued(start) if start else self.target.open(True, None)
        try:
            writer = self._writer(fd, self.target.known_zero_when_fresh)
            if start and self.hasher is not None:
                resume.rehash_prefix(fd, start, self.hasher)
            self._plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
            self.progress.begin(TRANSFER_DATA_FILE, self.origin.wire_size)
            pos = self._copy(stream, writer, self.usable, "the target", start, pushed=pushed)
            if pos == 0:
                raise ImporterError(Reason.INVALID_IMAGE, f"{self.origin.name} holds no data")
            writer.sync()
        finally:
            os.close(fd)
        return pos, self._finish(pos)

    def _open_continued(self, start: int) -> int:
        """The target of a resumed raw stream, holding exactly its first `start` bytes."""
        if isinstance(self.target, FileTarget) and not self.target.path.exists():
            raise ImporterError(Reason.INTERNAL_ERROR, f"cannot resume at byte {start}: {self.target.path} is gone")
        if start > self.usable:
            raise ImporterError(
                Reason.IMAGE_TOO_LARGE,
                f"cannot resume at byte {start}: the usable space of the target is {self.usable} bytes",
            )
        fd = self.target.open(False, None)
        if self.target.kind == FILESYSTEM:
            os.ftruncate(fd, start)  # beyond `start` reads as zeros again, as a fresh file would
        self.resumed_bytes = start
        log.info("resuming a raw stream at byte %d", start)
        return fd

    def _copy(self, stream: Stream, writer: SparseWriter, limit: int, where: str, start: int = 0, *,
              pushed: bool = False) -> int:
        """Copy a stream to offset start.. of the writer, stopping the moment it passes `limit`.

        Reading (which is where decompression happens) and writing run in two threads with a few
        chunks between them: both release the GIL, so a gzip import decompresses while it writes.
        A `pushed` stream (an upload body, read by a thread of its own) is written as it is read, and
        each chunk is handed back to the origin once written (`Origin.give_back`): this is where the
        pipeline lets go of it, and the upload server then refills its buffer."""
        pos = start
        meter = self.origin.meter
        behind = WriteBehind(writer, depth=0) if pushed else WriteBehind(writer)
        try:
            while True:
                if self.stop.is_set():
                    raise Terminated()
                chunk: Chunk = stream.read(_CHUNK)
                if not chunk:
                    break
                if pos + len(chunk) > limit:
                    raise ImporterError(
                        Reason.IMAGE_TOO_LARGE,
                        f"the decompressed image is larger than the usable space of {where} "
                        f"({limit} bytes): stopped after {pos + len(chunk)} bytes",
                    )
                behind.write(pos, as_bytes(chunk))
                pos += len(chunk)
                if pushed:  # written in this thread (depth 0): nothing refers to the chunk any more
                    self.origin.give_back(chunk)
                    del chunk
                self.progress.update(meter.total)
        except BaseException:
            behind.close(quiet=True)
            raise
        behind.close()
        return pos

    def _scratch(self, stream: Stream, info: ImageInfo, why: str) -> tuple[int, bool]:
        from . import qemu

        scratch = self.options.scratch_dir
        if scratch is None or self.scratch_file is None:
            raise ImporterError(
                Reason.SCRATCH_SPACE_REQUIRED,
                f"{self.origin.name} ({why}) must be staged on scratch space before qemu-img "
                "converts it, and no scratch volume is mounted",
                scratch_space_required=True,
            )
        self.route = ROUTE_SCRATCH
        self._check_size(info.virtual_size, info.format)
        resume.remove(self.state_path)
        self._remove_scratch()
        free = os.statvfs(scratch).f_bavail * os.statvfs(scratch).f_bsize
        self._plan((TRANSFER_SCRATCH, 48), (CONVERT, 48), (RESIZE, 1), (SYNC, 3))
        self.progress.begin(TRANSFER_SCRATCH, self.origin.wire_size)
        fd = os.open(self.scratch_file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            writer = SparseWriter(fd, known_zero=True, what="scratch space")
            pos = self._copy(stream, writer, free, "the scratch volume")
            os.ftruncate(fd, pos)
            writer.drop_cache()
            self.scratch_bytes = os.fstat(fd).st_blocks * 512
        finally:
            os.close(fd)
        self.origin.finish()
        if self.hasher is not None:
            self.hasher.verify(self.origin.name)
        qinfo = qemu.info(str(self.scratch_file), info.qemu_format)
        size = formats.check_qemu_info(qinfo, info)
        self._check_size(size, info.format)
        self._convert(str(self.scratch_file), info, size)
        self._remove_scratch()
        return size, self._finish(size)

    def _nbdkit(self, info: ImageInfo, spec: NbdSpec) -> tuple[int, bool]:
        from . import qemu

        self.route = ROUTE_NBDKIT
        resume.remove(self.state_path)
        self._plan((CONVERT, 96), (RESIZE, 1), (SYNC, 3))
        with qemu.nbdkit(spec) as server:
            qinfo = qemu.info(server.uri, info.qemu_format)
            size = formats.check_qemu_info(qinfo, info)
            self._check_size(size, info.format)
            hashing = _HashPass(self) if self.hasher is not None else None
            try:
                self._convert(server.uri, info, size, extra_error=lambda: f" (nbdkit: {server.log()})")
            finally:
                if hashing is not None:
                    hashing.join()
        self.origin.meter.add(server.bytes_read)  # fetched by nbdkit-curl, not through the origin
        return size, self._finish(size)

    def _convert(self, source: str, info: ImageInfo, size: int, extra_error: object = None) -> None:
        from . import qemu

        fd = self.target.open(True, size)
        os.close(fd)
        self.progress.begin(CONVERT, size)
        is_file = self.target.kind == FILESYSTEM
        qemu.convert(
            source,
            info.qemu_format,
            self.target.path,
            target_is_zero=is_file,
            write_zeros=not is_file and self.options.preallocation,
            on_progress=self.progress.advance_fraction,
            stop=self.stop,
            extra_error=extra_error if callable(extra_error) else None,
        )

    def _archive(self) -> int:
        from . import archive

        self.route = ROUTE_ARCHIVE
        if not isinstance(self.target, FileTarget):
            raise ImporterError(
                Reason.INVALID_CONFIGURATION,
                "content type archive needs a Filesystem volume, not a Block volume",
            )
        root = self.target.data_dir
        stream: Stream = self._wire()
        kind = compression.detect(self.origin.head)
        self.format = "tar" + (f".{kind}" if kind else "")
        if kind is not None:
            stream = compression.open_stream(stream, kind, _CHUNK)
        archive.clear_directory(root)
        self._plan((TRANSFER_DATA_DIR, 97), (SYNC, 3))
        self.progress.begin(TRANSFER_DATA_DIR, self.origin.wire_size)
        meter = self.origin.meter
        reader = archive.TarReader(stream, self.origin.name)
        written = archive.extract(reader, root, self.usable, lambda _n: self.progress.update(meter.total))
        reader.drain()
        self.origin.finish()
        if self.hasher is not None:
            try:
                self.hasher.verify(self.origin.name)
            except ImporterError:
                archive.clear_directory(root)
                raise
        self.progress.begin(SYNC)
        syncfs(root)
        return written


class _HashPass:
    """Hashes the whole source in order next to a conversion that reads it out of order."""

    def __init__(self, imp: _Import) -> None:
        self.imp = imp
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="hash-pass", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            ranges = self.imp.origin.ranges
            assert ranges is not None
            assert self.imp.hasher is not None
            stream = PrefetchStream(
                ranges, 0, ranges.size, workers=2, stop=self.imp.stop, on_cancel=self.imp.origin.abort
            )
            while True:
                chunk = stream.read(_CHUNK)
                if not chunk:
                    break
                self.imp.hasher.update(chunk)
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error
