"""What every route shares: the source, the target, the options and the bookkeeping around them.

A route (one module of this package each) is a function of an `ImportContext`: it checks the
image's size against the target (`check_size`), plans its progress phases (`plan`), writes through
`writer`, fetches spans by ranges with hashing and checkpoints (`fetch_spans`), or copies a stream
(`copy`), and ends with `finish` (verify, resize, flush). The context also carries what the result
reports: the format, the route taken, and the bytes resumed or staged on scratch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence

from .. import resume
from ..behind import Behind
from ..checksum import Hasher
from ..errors import ImporterError, Reason
from ..formats import ImageInfo
from ..options import ImportOptions
from ..progress import CONVERT, PREALLOCATE, RESIZE, SYNC, Progress
from ..ranges import RangeFetcher, RangeReader, Span
from ..retry import Terminated
from ..source import TRAILING_LIMIT, Origin
from ..sparse_writer import SparseWriter, WriteBehind
from ..streams import Chunk, Stream, TapStream, as_bytes
from ..target import FILESYSTEM, SCRATCH_FILE_NAME, FileTarget, Target

log = logging.getLogger(__name__)

# route names, as the termination message's `route` field reports them
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

CHUNK = 4 << 20  # bytes read from a stream at a time


class ImportContext:
    """One import's state, shared by the route that runs it."""

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
        # the source's bytes, hashed in order by the thread that already touches them: sha256 always (the
        # result records it), and the expected checksum's algorithm when one was asked for
        self.hasher = Hasher(options.checksum)
        self.usable = target.usable(options.requested_size, options.filesystem_overhead)
        self.state_path = target.state_path(options.scratch_dir) if options.resume else None
        self.scratch_file = options.scratch_dir / SCRATCH_FILE_NAME if options.scratch_dir else None
        self.format = "raw"
        self.route = ""
        self.resumed_bytes = 0
        self.scratch_bytes = 0
        self._wire: Stream | None = None  # the stream `wire()` handed out, hashed as it is read
        origin.meter.listeners.append(progress.transferred)

    # -- cleanup --------------------------------------------------------------------------------------
    def discard(self) -> None:
        log.info("removing the partial import so that the next attempt starts clean")
        with contextlib.suppress(OSError):
            self.target.discard()
        resume.remove(self.state_path)

    def remove_scratch(self) -> None:
        if self.scratch_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.scratch_file.unlink()

    # -- the source -----------------------------------------------------------------------------------
    @property
    def verifying(self) -> bool:
        """Whether a checksum was asked for: only then is fetching bytes a second time worth it where a
        route would otherwise not see every source byte in order (nbdkit; the prefix of a resumed
        qcow2, vmdk or xz, which is not on the target as it came); without one, such an import records
        no sha256 (`source_sha256`)."""
        return self.hasher.expected is not None

    def wire(self) -> Stream:
        """The source's byte stream, hashed as it comes off the wire (in the reading thread: a chunk of a
        stream may be a view of a buffer refilled at the next read, so it is hashed before it is handed on)."""
        self._wire = TapStream(self.origin.stream(), self.hasher.update)
        return self._wire

    def finish_source(self) -> None:
        """The end of the source: what follows the image in its stream (a gzip's bytes after its last
        member, an upload body's padding after a qcow2's end) is read through the hash too, so that the
        digest and a checksum asked for cover the file as `sha256sum` sees it; then the origin's own end
        checks (`Origin.finish`). More than `TRAILING_LIMIT` such bytes are refused, as an upload's always
        were: an image followed by that much of something else is not what its file claims to be."""
        wire, trailing = self._wire, 0
        while wire is not None and (chunk := wire.read(CHUNK)):
            trailing += len(chunk)
            if self.origin.pushed:
                self.origin.give_back(chunk)  # hashed (the tap runs first): its buffer may be refilled
            del chunk
            if trailing > TRAILING_LIMIT:
                raise ImporterError(Reason.INVALID_IMAGE, f"{self.origin.name} goes on for more than "
                                                          f"{TRAILING_LIMIT} bytes after the end of its image")
        if trailing:
            log.info("%s: %d bytes after the end of the image were read and hashed", self.origin.name, trailing)
        self.origin.finish()

    @property
    def wire_is_pushed(self) -> bool:
        """Whether `wire()` only hands on chunks another thread produced (`WriteBehind`, depth 0: each chunk
        is hashed and written by the thread that reads it, then handed back to its producer)."""
        return self.origin.pushed

    def source_sha256(self) -> str | None:
        """The sha256 of the source's bytes, when the route hashed every one of them: as many as the
        source's stream holds (or, when it never said, as many as came off the wire). For a registry that
        is the disk file inside the layer, as `sha256sum` of the file put in the image says (the layer
        itself is checked against its digest). None where the route saw only part of them: nbdkit
        (qemu-img reads out of order) and a resumed qcow2, vmdk, vhd(x), vdi or xz (its prefix is not on
        the target as the source sent it), unless a checksum was asked for."""
        size = self.origin.size
        whole = self.origin.meter.total if size is None else size
        return self.hasher.sha256() if self.hasher.count == whole else None

    def read_at(self, offset: int, length: int) -> bytes | None:
        ranges = self.origin.ranges
        if ranges is None:
            head = self.origin.head
            return head[offset : offset + length] if offset + length <= len(head) else None
        if offset + length > ranges.size:
            return None
        buf = bytearray(length)
        ranges.read_into(offset, memoryview(buf))
        return bytes(buf)

    # -- the target -----------------------------------------------------------------------------------
    def check_size(self, size: int | None, what: str) -> None:
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

    def plan(self, *phases: tuple[str, float]) -> None:
        """The route's progress phases (no resize phase on a block device; a preallocate phase before the
        sync when a file is preallocated at the end)."""
        plan = list(phases)
        if self.target.kind != FILESYSTEM:
            plan = [p for p in plan if p[0] != RESIZE]
        elif self.options.preallocation and any(p[0] == RESIZE for p in plan):
            at = next((i for i, p in enumerate(plan) if p[0] == SYNC), len(plan))
            plan.insert(at, (PREALLOCATE, 2))
        self.progress.plan(plan)

    def writer(self, fd: int, known_zero: bool) -> SparseWriter:
        return SparseWriter(
            fd,
            known_zero=known_zero,
            preallocate=self.options.preallocation,
            is_block=self.target.kind != FILESYSTEM,
            what=str(self.target.path),
        )

    def finish(self, image_size: int) -> bool:
        """Verify what only the end can verify, then resize/preallocate/flush the target."""
        self.finish_source()
        self.hasher.verify(self.origin.name)
        self.progress.begin(RESIZE)
        # the target begins PREALLOCATE (when asked for) and SYNC as it gets there
        applied = self.target.finalize(image_size, self.usable, self.options.preallocation, self.progress.begin)
        resume.remove(self.state_path)
        return applied

    # -- resumable routes -----------------------------------------------------------------------------
    def open_resumable(self, plan: dict[str, object], size: int) -> tuple[int, int, int]:
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

    def checkpointer(
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

    def fetch_spans(
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
        """Fetch and write spans in parallel; hash and checkpoint them in order.

        The hash runs in a thread of its own (`Behind`), in span order, while this thread hands on the next
        spans and checkpoints: a sha256 of the whole source is ~0.6 s of one core per GiB, the longest
        serial step of a raw import, and done here it held every buffer of the window (the fetch workers
        then waited for one). The fetcher lends its buffers: each goes back to the pool only once hashed
        (`RangeFetcher.give_back` is the hash's last step), never to be refilled before. Checkpoints do
        not wait for the hash: they say what is durably on the target, and a resumed import hashes that
        again from the target (`resume.rehash_prefix`) or from the source (`rehash_fetched`)."""
        window = window or self.options.window
        fetcher = RangeFetcher(
            ranges,
            spans,
            workers=workers or self.options.workers,
            window=window,
            process=process,
            stop=self.stop,
            on_idle=checkpoint.idle,
            on_cancel=self.origin.abort,
            lends=True,
        )

        def hash_span(item: tuple[memoryview, bytearray]) -> None:
            view, buf = item
            self.hasher.update(view)
            view.release()
            fetcher.give_back(buf)

        hashing = Behind(hash_span, window, "hash")
        fetched = done
        try:
            for s, buf in fetcher:
                hashing.put((memoryview(buf)[: s.length], buf))
                fetched += s.length
                self.progress.update(fetched)
                checkpoint.done(s.index + 1, fetched)
            hashing.close()
        except BaseException as exc:
            hashing.close(quiet=True)
            if isinstance(exc, Terminated) or (isinstance(exc, ImporterError) and exc.retryable):
                with contextlib.suppress(Exception):
                    checkpoint.save()  # keep what is on the target for the next attempt
            raise

    def rehash_fetched(self, ranges: RangeReader, spans: Sequence[Span], *, workers: int, window: int) -> None:
        """Hash spans a previous attempt already wrote (their source bytes are not on the target)."""
        for s, buf in RangeFetcher(
            ranges, spans, workers=workers, window=window, stop=self.stop, on_cancel=self.origin.abort
        ):
            self.hasher.update(memoryview(buf)[: s.length])

    # -- streaming routes -----------------------------------------------------------------------------
    def copy(self, stream: Stream, writer: SparseWriter, limit: int, where: str, start: int = 0, *,
             pushed: bool = False) -> int:
        """Copy a stream to offset start.. of the writer, stopping the moment it passes `limit`.

        Reading (which is where decompression happens) and writing run in two threads with a few
        chunks between them: both release the GIL, so a gzip import decompresses while it writes.
        A `pushed` stream (an upload body, read by a thread of its own) is written as it is read, and
        each chunk is handed back to the origin once written (`Origin.give_back`): this is where the
        pipeline lets go of it, and the upload server then refills its buffer. Progress counts from `start`
        too (a continued upload: the bytes before it are on the target already, and no part of the rate)."""
        pos = start
        meter = self.origin.meter
        behind = WriteBehind(writer, depth=0) if pushed else WriteBehind(writer)
        try:
            while True:
                if self.stop.is_set():
                    raise Terminated()
                chunk: Chunk = stream.read(CHUNK)
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
                self.progress.update(start + meter.total)
        except BaseException:
            behind.close(quiet=True)
            raise
        behind.close()
        return pos

    # -- converting routes ----------------------------------------------------------------------------
    def convert(self, source: str, info: ImageInfo, size: int, extra_error: object = None) -> None:
        """qemu-img converts `source` onto the target (the scratch and nbdkit routes)."""
        from .. import qemu

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
