"""One upload into one volume: the upload server's state machine, and the bridge from an HTTP request
body (asyncio) to the importer's pipeline (a thread).

States, as CDI's server keeps them: `idle` (ready for an upload), `uploading` (a request body is
being received), `processing` (an async upload was answered and is being converted or flushed),
`done` (the image is durable on the volume; the server exits). A request while `uploading` or
`processing` gets 503, one after `done` gets 409.

The body goes through the importer (`cdi.importer.import_stream`): one implementation of formats,
validation, conversion, sizing, preallocation and checksums for imports and uploads. It is fed
through a bounded queue (`feed.FedStream`, `QUEUE_BYTES`), so a client faster than the disk waits
instead of filling memory (TCP backpressure reaches the client through the proxy).

Sync uploads are answered once the import finished (data converted, resized and fdatasync'ed). Async
uploads are answered when the importer leaves its transfer phase, that is once the whole body was
received and validated (raw: written; other formats: staged on scratch and checked by qemu-img); the
rest (conversion, resize, flush) continues and ends the server. A failure after that answer can no
longer be told to the client: it ends the server with a non-zero exit and a termination message
carrying the reason, which the controller turns into the DataVolume's condition (and `Failed` when
the reason is permanent).

Resuming (our extension, see `cdi.api.upload`): an uncompressed raw or ISO image is written in place
as it arrives, each chunk before the next is read. When the client goes away in the middle (the
pipeline first takes everything that had arrived), the
bytes the pipeline had read are exactly the bytes on the volume; they are flushed (fdatasync) and
that count becomes the resumable offset. A later request with `Upload-Offset` equal to it sends the
rest. A server that is killed never sees the client go, so while the body arrives the bytes written so
far are also flushed and recorded (`_Checkpoints`): every `config.CHECKPOINT_BYTES` written, and after
`CHECKPOINT_SECONDS` without one while bytes keep coming (a slow client). The checkpoint runs beside
the pipeline, which waits for the previous one only when it reaches the next (so its cost is one
fdatasync, a few reads back and a small atomic write per `CHECKPOINT_BYTES`, overlapped with the
writes; bench/RESULTS.md), and a server killed at any point keeps all but at most two
`CHECKPOINT_BYTES` of what it had written: it used to keep nothing of an upload killed in its first
seconds, however many GiB had arrived. The offset is recorded on disk (`kept.py`: next to `disk.img`,
or on scratch or `UPLOAD_STATE_DIR` for a Block volume) with digests of the kept bytes, so a server that
restarted (a killed pod) answers it again once it has checked the volume still holds them; never more
than was flushed before the record was written. Other formats and archives restart from 0: their bytes
are not where they will end up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from cdi.api import env as envnames
from cdi.api import upload as names
from cdi.common.imageprobe import HEAD_BYTES, ISO, RAW, sniff
from cdi.importer import (
    ImporterError,
    ImportOptions,
    ImportResult,
    Progress,
    Reason,
    import_stream,
)
from cdi.uploadserver import kept
from cdi.uploadserver.config import UploadServerConfig
from cdi.uploadserver.feed import Chunk, FedStream

log = logging.getLogger(__name__)

IDLE, UPLOADING, PROCESSING, DONE = "idle", "uploading", "processing", "done"
QUEUE_BYTES = 32 << 20
_TRANSFER_PHASES = frozenset({"Info", "TransferDataFile", "TransferScratch", "TransferDataDir"})
_SPACE_REASONS = frozenset({Reason.IMAGE_TOO_LARGE, Reason.NO_SPACE_LEFT})
TOO_LARGE_PREFIX = "effective image size is larger than the reported available storage"
CHECKPOINT_SECONDS = 5.0  # the longest time between two checkpoints while bytes keep arriving (slowly)


class Refusal(Exception):
    """A request this upload server will not take now (status, message, extra headers)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class Outcome:
    """What to answer the request that carried the body."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)


class _Progress(Progress):
    """The importer's progress, also telling the event loop when the body has been validated (the
    importer left its transfer phases) and which transfer route it took."""

    def __init__(self, owner_uid: str, loop: asyncio.AbstractEventLoop, validated: asyncio.Event) -> None:
        super().__init__(owner_uid)
        self._loop = loop
        self._validated = validated
        self.phases_seen: list[str] = []

    def begin(self, phase: str, total: int | None = None) -> None:
        super().begin(phase, total)
        self.phases_seen.append(phase)
        if phase not in _TRANSFER_PHASES:
            self._loop.call_soon_threadsafe(self._validated.set)


class _Counted:
    """The pipeline's view of the body, counting what it has consumed (the resumable offset once the pipeline
    failed) and what it handed back as written (`give_back`, on the raw stream route: the offset a
    checkpoint may keep while the body still arrives)."""

    def __init__(self, inner: FedStream) -> None:
        self.inner = inner
        self.consumed = 0
        self.settled = 0
        self.on_settled: Callable[[int], None] | None = None  # told `settled` after each chunk written

    def read(self, n: int) -> memoryview | bytes | bytearray:
        chunk = self.inner.read(n)
        self.consumed += len(chunk)
        return chunk

    def give_back(self, chunk: Chunk) -> None:
        self.settled += len(chunk)
        if self.on_settled is not None:
            self.on_settled(self.settled)
        self.inner.give_back(chunk)

    def close(self) -> None:
        self.inner.close()


class _Checkpoints:
    """Flushes and records the bytes of a raw upload written so far while its body still arrives, in a thread
    of its own, so that an upload server killed in the middle (no goodbye from the client, no `_failed`)
    leaves an offset a restarted one can continue from.

    The pipeline reports each chunk it wrote (`settled`, in its thread). Every `every_bytes` it asks for a
    checkpoint of what it wrote by then; if the previous one is still running it waits for it first. So the
    flushes overlap the writes, never pile up, and once the pipeline is past offset `(k + 1) * every_bytes`
    the checkpoint of at least `k * every_bytes` is on disk, whatever the timing. When bytes trickle in
    slower than that, a checkpoint is also taken `every_seconds` after the last one. `keep(offset)` does
    the flush and the record (`UploadSession._keep`) and is only asked for offsets `allowed` says may be
    kept (a raw stream, still being uploaded). `every_bytes=0`: no checkpoints at all."""

    def __init__(self, keep: Callable[[int], object], allowed: Callable[[], bool], start: int, *,
                 every_bytes: int, every_seconds: float) -> None:
        self._keep = keep
        self._allowed = allowed
        self._start = start  # the body's first byte is the image's byte `start` (a resumed upload)
        self._every = every_bytes
        self._seconds = every_seconds
        self._cond = threading.Condition()
        self._written = start  # the image's bytes written so far
        self._asked = start  # the offset of the last checkpoint asked for
        self._pending: int | None = None  # asked for, not started yet
        self._busy = False  # one is running
        self._closed = False
        self.taken = 0
        self.waited = 0.0  # seconds the pipeline waited for a checkpoint (what they cost the upload's throughput)
        if every_bytes > 0:
            threading.Thread(target=self._run, name="upload-checkpoints", daemon=True).start()

    def settled(self, settled: int) -> None:
        """The pipeline's thread: `settled` bytes of the body are written."""
        with self._cond:
            self._written = self._start + settled
            if not self._every or self._written - self._asked < self._every:
                return
            if self._busy or self._pending is not None:
                began = time.monotonic()
                while (self._busy or self._pending is not None) and not self._closed:
                    self._cond.wait()  # the previous checkpoint first: at most one behind
                self.waited += time.monotonic() - began
            if not self._closed:
                self._asked = self._pending = self._written
                self._cond.notify_all()

    def close(self) -> None:
        """The body ended (or the upload failed): no more checkpoints; one running finishes on its own."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self.taken:
            log.info("%d checkpoints while the body arrived; the pipeline waited %.2fs for them", self.taken,
                     self.waited)

    def _run(self) -> None:
        while True:
            with self._cond:
                deadline = time.monotonic() + self._seconds
                while self._pending is None and not self._closed:
                    left = deadline - time.monotonic()
                    if left > 0:
                        self._cond.wait(left)
                    elif self._written > self._asked:  # slow: what arrived since the last one
                        self._asked = self._pending = self._written
                    else:
                        deadline = time.monotonic() + self._seconds
                if self._closed or self._pending is None:
                    return
                offset, self._pending, self._busy = self._pending, None, True
            try:
                if self._allowed():
                    self._keep(offset)
                    self.taken += 1
            except Exception:  # a checkpoint is a best effort: the upload goes on without it
                log.exception("checkpointing the upload at byte %d failed", offset)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class UploadSession:
    def __init__(self, config: UploadServerConfig, *, queue_bytes: int = QUEUE_BYTES) -> None:
        self.config = config
        self.queue_bytes = queue_bytes
        self.state = IDLE
        self.kept_path = config.state_dir / kept.FILE_NAME if config.state_dir is not None else None
        self.kept = kept.load(self.kept_path, config.destination)  # an earlier server's, checked against the volume
        self.offset = self.kept.offset if self.kept else 0  # durable, resumable bytes of a raw upload that was cut off
        self._kept_lock = threading.Lock()  # the record is written by checkpoint threads, removed on the event loop
        self._kept_generation = 0  # bumped whenever the record must go: a checkpoint of an older one is dropped
        self.result: ImportResult | None = None
        self.fatal: ImporterError | None = None  # a failure after an async answer: the server must exit
        self.finished = asyncio.Event()  # done, or fatal: time to exit
        self.bytes_received = 0
        self._background: asyncio.Task[None] | None = None

    # -- admission ------------------------------------------------------------------------------------
    def describe(self) -> dict[str, str]:
        """Headers answering a HEAD (our resume extension)."""
        offset = self.offset if self.state == IDLE else 0
        headers = {names.OFFSET_HEADER: str(offset), names.STATE_HEADER: self.state}
        if offset and self.kept is not None and self.kept.offset == offset:
            headers[names.KEPT_HEADER] = self.kept.header()
        return headers

    def admit(self, offset: int) -> None:
        """Take the request (state becomes `uploading`) or refuse it as CDI's server does."""
        if self.state in (UPLOADING, PROCESSING):
            raise Refusal(503, "another upload is in progress on this upload server; try again when it ends",
                          self.describe())
        if self.state == DONE:
            raise Refusal(409, "the upload is already complete", self.describe())
        if offset and offset != self.offset:
            raise Refusal(409, f"cannot continue the upload at byte {offset}: the upload server holds "
                               f"{self.offset} resumable bytes (send {names.OFFSET_HEADER}: {self.offset}, "
                               "or start over without the header)", self.describe())
        self.state = UPLOADING

    # -- receiving ------------------------------------------------------------------------------------
    async def receive(self, chunks: AsyncIterator[Chunk], *, archive: bool, wait_for_durable: bool,
                      offset: int = 0, length: int | None = None) -> Outcome:
        """Feed one request body through the importer; the state must be `uploading` (see `admit`)."""
        loop = asyncio.get_running_loop()
        if not offset:
            self._forget()  # starting over: the volume is about to be rewritten
        validated = asyncio.Event()
        progress = _Progress(self.config.owner_uid, loop, validated)
        queue = FedStream(self.queue_bytes)
        body = _Counted(queue)
        options = ImportOptions(
            content_type=envnames.CONTENT_ARCHIVE if archive else envnames.CONTENT_KUBEVIRT,
            requested_size=self.config.image_size, filesystem_overhead=self.config.filesystem_overhead,
            preallocation=self.config.preallocation, scratch_dir=self.config.scratch_dir)
        target = self.config.target()
        stop = threading.Event()
        done: asyncio.Future[ImportResult] = loop.create_future()

        def run() -> None:
            try:
                result = import_stream(body, target, options, progress, stop, size=length,
                                       resume_offset=offset)
            except BaseException as exc:  # handed to the event loop, which decides what it means
                loop.call_soon_threadsafe(_settle, done, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, done, result, None)

        started = time.monotonic()
        threading.Thread(target=run, name="upload-import", daemon=True).start()
        head = bytearray()
        received = 0
        client_error: BaseException | None = None

        waiting_since: float | None = None  # when the body last went quiet (None: busy feeding the pipeline)
        stalled = False

        def arrived(chunk: Chunk) -> None:  # before a chunk goes into `queue` (here, or in a reading thread)
            nonlocal received, waiting_since
            waiting_since = None
            if offset == 0 and len(head) < HEAD_BYTES:
                head.extend(chunk[: HEAD_BYTES - len(head)])
            received += len(chunk)
            self.bytes_received += len(chunk)

        def fed() -> None:  # after a reading thread put a chunk into `queue`
            nonlocal waiting_since
            waiting_since = time.monotonic()

        async def pump() -> None:
            nonlocal client_error, waiting_since
            attach = getattr(chunks, "attach", None)
            if attach is not None:
                attach(queue, arrived, fed)  # then only the end (or the client's error) comes through here
            iterator = chunks.__aiter__()
            try:
                while True:
                    waiting_since = time.monotonic()
                    try:
                        chunk = await iterator.__anext__()
                    except StopAsyncIteration:
                        break
                    arrived(chunk)
                    if not await queue.put(chunk):
                        return  # the pipeline stopped early: its error is the answer
                queue.finish()
            except asyncio.CancelledError:
                if not stalled:
                    queue.fail(ImporterError(Reason.CONNECTION_FAILED, "the upload was interrupted", retryable=True))
                    raise
                client_error = TimeoutError(f"no data for {self.config.idle_timeout:.0f}s")
                queue.fail(ImporterError(Reason.CONNECTION_FAILED, f"the upload stalled after {received} bytes: "
                                         f"{client_error}", retryable=True))
            except Exception as exc:  # the client went away, or sent a broken body
                client_error = exc
                queue.fail(ImporterError(Reason.CONNECTION_FAILED, f"the client went away after {received} "
                                         f"bytes: {exc or type(exc).__name__}", retryable=True))

        async def watchdog() -> None:
            """A connection that goes silent without closing (a vanished client, a NAT that forgot it) would
            hold the server in `uploading` forever and block the resume: give it up after `idle_timeout`."""
            nonlocal stalled
            limit = self.config.idle_timeout
            while not feeder.done():
                await asyncio.sleep(min(5.0, limit / 4))
                if waiting_since is not None and time.monotonic() - waiting_since > limit:
                    stalled = True
                    feeder.cancel()
                    return

        generation = self._kept_generation
        checkpoints = _Checkpoints(
            lambda settled: self._keep(settled, generation),
            lambda: self.state == UPLOADING and bool(offset or _raw_stream(bytes(head), progress)),
            offset, every_bytes=self.config.checkpoint_bytes, every_seconds=CHECKPOINT_SECONDS)
        body.on_settled = checkpoints.settled
        feeder = asyncio.ensure_future(pump())
        guard = asyncio.ensure_future(watchdog())
        try:
            await asyncio.wait([feeder, done], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
            if not feeder.done():
                if done.exception() is not None:  # refused early (too large, bad image): stop reading
                    feeder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feeder
            if client_error is None and not wait_for_durable:
                waiter = asyncio.ensure_future(validated.wait())
                await asyncio.wait([waiter, done], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
                waiter.cancel()
                if not done.done():
                    self.state = PROCESSING
                    self._background = asyncio.ensure_future(self._finish_in_background(done))
                    log.info("received and validated %d bytes in %.1fs; processing continues in the background",
                             received, time.monotonic() - started)
                    return Outcome(200, "")
            result = await asyncio.shield(done)
        except asyncio.CancelledError:
            stop.set()
            feeder.cancel()
            raise
        except ImporterError as exc:
            return await self._failed(exc, bytes(head), progress, body, offset, client_error)
        except Exception as exc:
            log.exception("the upload failed unexpectedly")
            self._reset()
            return Outcome(500, f"Saving stream failed: internal error: {type(exc).__name__}: {exc}")
        finally:
            guard.cancel()
            checkpoints.close()
        self._completed(result, received, time.monotonic() - started)
        return Outcome(200, "")

    async def _finish_in_background(self, done: asyncio.Future[ImportResult]) -> None:
        try:
            result = await done
        except ImporterError as exc:
            log.error("processing the upload failed after it was accepted: %s", exc)
            self.fatal = exc
            self.finished.set()
            return
        except Exception as exc:
            log.exception("processing the upload failed after it was accepted")
            self.fatal = ImporterError(Reason.INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}")
            self.finished.set()
            return
        self._completed(result, self.bytes_received, 0.0)

    def _completed(self, result: ImportResult, received: int, seconds: float) -> None:
        self.result = result
        self.state = DONE
        self._forget()
        log.info("upload complete: %s image, %d bytes received%s, virtual size %d, route %s", result.source_format,
                 received, f" in {seconds:.1f}s" if seconds else "", result.virtual_size, result.route)
        self.finished.set()

    async def _failed(self, exc: ImporterError, head: bytes, progress: _Progress, body: _Counted, offset: int,
                      client_error: BaseException | None) -> Outcome:
        if client_error is not None and exc.reason == Reason.CONNECTION_FAILED:
            resumable = offset > 0 or _raw_stream(head, progress)
            self._forget()
            generation = self._kept_generation
            self.offset = await asyncio.to_thread(self._keep, offset + body.consumed, generation) if resumable else 0
            self.state = IDLE
            log.warning("%s; %s", exc.message,
                        f"{self.offset} bytes are kept for a resumed upload" if self.offset else "nothing to resume")
            return Outcome(400, f"Saving stream failed: {exc.message}", self.describe())
        self._reset()
        log.error("upload refused: %s", exc)
        if exc.reason in _SPACE_REASONS:
            return Outcome(400, f"{TOO_LARGE_PREFIX}: {exc.message}")
        status = 500 if exc.retryable else 400
        return Outcome(status, f"Saving stream failed: {exc.reason}: {exc.message}")

    def _keep(self, offset: int, generation: int) -> int:
        """fdatasync the target so that `offset` bytes survive, and record them where a restarted server finds
        them (`kept.py`); the offset, or 0 when the bytes cannot be kept. Runs in a thread."""
        started = time.monotonic()
        try:
            fd = os.open(self.config.destination, os.O_RDWR)
        except OSError as exc:
            log.warning("cannot keep the partial upload (%s)", exc)
            return 0
        try:
            if not self.config.is_block and os.fstat(fd).st_size < offset:
                # the last bytes kept were zeros, skipped on the fresh file: its last byte makes the file as long
                # as what is kept (a zero over a zero whatever the pipeline writes meanwhile, always beyond it)
                os.pwrite(fd, b"\0", offset - 1)
            os.fdatasync(fd)
        except OSError as exc:
            log.warning("cannot flush the partial upload (%s)", exc)
            return 0
        finally:
            os.close(fd)
        try:
            record = kept.record(self.config.destination, offset)
        except OSError as exc:
            log.warning("cannot read back the partial upload (%s)", exc)
            return 0
        with self._kept_lock:
            if generation != self._kept_generation:
                return 0  # the upload completed or started over meanwhile
            self.kept = record
            if self.kept_path is not None:
                try:
                    kept.save(self.kept_path, record)
                except OSError as exc:
                    log.warning("cannot record the partial upload in %s (%s): a restarted upload server will "
                                "not resume it", self.kept_path, exc)
                else:
                    log.info("kept %d bytes on the volume for a resumed upload (%.0f ms)", offset,
                             (time.monotonic() - started) * 1000)
        return offset

    def _forget(self) -> None:
        """No bytes to resume from any more (done, starting over, or refused)."""
        with self._kept_lock:
            self._kept_generation += 1
            self.kept = None
            self.offset = 0
            kept.remove(self.kept_path)

    def _reset(self) -> None:
        self.state = IDLE
        self._forget()


def _settle(future: asyncio.Future[ImportResult], result: ImportResult | None, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        assert result is not None
        future.set_result(result)


def _raw_stream(head: bytes, progress: _Progress) -> bool:
    """Whether the image was written in place as it arrived (uncompressed raw or ISO on the stream route)."""
    if not head or "TransferDataFile" not in progress.phases_seen:
        return False
    compression, fmt = sniff(bytes(head))
    return compression is None and fmt in (RAW, ISO)

