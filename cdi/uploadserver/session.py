"""One upload into one volume: the upload server's state machine, driven by the connection threads of its
front, and the way of one request body into the importer's pipeline (a thread of its own).

States, as CDI's server keeps them: `idle` (ready for an upload), `uploading` (a request body is
being received), `processing` (an async upload was answered and is being converted or flushed),
`done` (the image is durable on the volume; the server exits). A request while `uploading` or
`processing` gets 503, one after `done` gets 409.

Threads and the one lock: no event loop is involved (CDI's server is synchronous too: a goroutine per
request, a mutex around its state). Whatever the session decides is decided under its lock
(`UploadSession._lock`): admission and the answer to a body (the connection's thread, which calls the
session directly: `admit`, `receive`, then `Upload.put`/`end`/`answer`), the end of an import (the
importer's thread; an async upload that was answered already ends there), and the resume record
(checkpoint threads write it, a new upload or a completed one removes it).

The body goes through the importer (`cdi.importer.import_stream`): one implementation of formats,
validation, conversion, sizing, preallocation and checksums for imports and uploads. It is fed
through a bounded queue (`feed.FedStream`, `QUEUE_BYTES`) that the connection's thread fills as it
reads, so a client faster than the disk waits instead of filling memory (TCP backpressure reaches the
client through the proxy). A connection that goes silent without closing is given up after
`idle_timeout` (`Upload.quiet`), as a cut one.

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

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

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
PUT_POLL_SECONDS = 1.0  # a reading thread waiting for room in the importer's queue looks whether it is still wanted


@dataclass
class Outcome:
    """What to answer the request that carried the body."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)


class _Progress(Progress):
    """The importer's progress, also telling the upload when the body has been validated (the importer
    left its transfer phases) and which transfer route it took."""

    def __init__(self, owner_uid: str, validated: Callable[[], None]) -> None:
        super().__init__(owner_uid)
        self._validated = validated
        self.phases_seen: list[str] = []

    def begin(self, phase: str, total: int | None = None) -> None:
        super().begin(phase, total)
        self.phases_seen.append(phase)
        if phase not in _TRANSFER_PHASES:
            self._validated()


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
    """The upload server's one upload: its state, the resumable offset and its record on the volume, the
    result. Every change happens under `_lock`; the attributes are read without it (each one whole)."""

    def __init__(self, config: UploadServerConfig, *, queue_bytes: int = QUEUE_BYTES,
                 finished: threading.Event | None = None) -> None:
        self.config = config
        self.queue_bytes = queue_bytes
        # the state machine's lock; a condition, for a connection thread waiting for the importer's verdict
        self._lock = threading.Condition(threading.RLock())
        self.state = IDLE
        self.kept_path = config.state_dir / kept.FILE_NAME if config.state_dir is not None else None
        self.kept = kept.load(self.kept_path, config.destination)  # an earlier server's, checked against the volume
        self.offset = self.kept.offset if self.kept else 0  # durable, resumable bytes of a raw upload that was cut off
        self._kept_generation = 0  # bumped whenever the record must go: a checkpoint of an older one is dropped
        self.result: ImportResult | None = None
        self.fatal: ImporterError | None = None  # a failure after an async answer: the server must exit
        self.finished = finished or threading.Event()  # done, or fatal: time to exit
        self.bytes_received = 0
        self._upload: Upload | None = None  # the last body taken (its import may still run)

    # -- admission (a connection's thread) --------------------------------------------------------------
    def describe(self) -> dict[str, str]:
        """Headers answering a HEAD (our resume extension)."""
        with self._lock:
            offset = self.offset if self.state == IDLE else 0
            headers = {names.OFFSET_HEADER: str(offset), names.STATE_HEADER: self.state}
            if offset and self.kept is not None and self.kept.offset == offset:
                headers[names.KEPT_HEADER] = self.kept.header()
            return headers

    def admit(self, offset: int) -> Outcome | None:
        """Take the request (None: the state becomes `uploading`), or the refusal CDI's server answers."""
        with self._lock:
            refusal = None
            if self.state in (UPLOADING, PROCESSING):
                refusal = 503, "another upload is in progress on this upload server; try again when it ends"
            elif self.state == DONE:
                refusal = 409, "the upload is already complete"
            elif offset and offset != self.offset:
                refusal = 409, (f"cannot continue the upload at byte {offset}: the upload server holds {self.offset} "
                                f"resumable bytes (send {names.OFFSET_HEADER}: {self.offset}, or start over without "
                                "the header)")
            if refusal is not None:
                log.warning("refused an upload request: %s", refusal[1])
                return Outcome(*refusal, self.describe())
            self.state = UPLOADING
            return None

    def abandon(self) -> None:
        """An admitted upload whose body turned out unusable (a form without its part `file`): the session
        is free again."""
        with self._lock:
            if self.state == UPLOADING:
                self.state = IDLE

    def receive(self, *, archive: bool, wait_for_durable: bool, offset: int = 0, length: int | None = None,
                recycle: Callable[[Chunk], None] | None = None) -> Upload:
        """Start the import of one request body; the state must be `uploading` (see `admit`). The caller (the
        connection's thread) feeds the body into the `Upload` and takes its answer (`Upload.answer`), in a
        `with` block, which makes sure of both. `recycle`: where the importer's queue hands back the chunks
        it is done with (the reading thread's buffers)."""
        if not offset:
            self._forget()  # starting over: the volume is about to be rewritten
        upload = Upload(self, archive=archive, wait_for_durable=wait_for_durable, offset=offset, length=length,
                        recycle=recycle)
        with self._lock:
            self._upload = upload
        return upload

    def metrics(self) -> str:
        """The progress of the last upload taken, as the importer's metrics (Prometheus text; nothing before the
        first upload): its phases with their bytes, rate and time left, for the controller's Running condition."""
        upload = self._upload
        if upload is None:
            return ""
        from prometheus_client import generate_latest

        return str(generate_latest(upload.progress.registry).decode())

    def stop(self) -> None:
        """The server stops: an import still running is told to stop (its helper processes end)."""
        with self._lock:
            upload = self._upload
        if upload is not None:
            upload.stop()

    # -- the end of an import (the importer's thread) ----------------------------------------------------
    def _completed(self, result: ImportResult, received: int, seconds: float) -> None:
        with self._lock:
            self.result = result
            self.state = DONE
            self._forget()
        log.info("upload complete: %s image, %d bytes received%s, virtual size %d, route %s", result.source_format,
                 received, f" in {seconds:.1f}s" if seconds else "", result.virtual_size, result.route)
        self.finished.set()

    def _failed_after_answer(self, exc: BaseException) -> None:
        """The import of an async upload that was answered already failed: the server must exit, saying why."""
        if isinstance(exc, ImporterError):
            log.error("processing the upload failed after it was accepted: %s", exc)
            fatal = exc
        else:
            log.error("processing the upload failed after it was accepted", exc_info=exc)
            fatal = ImporterError(Reason.INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}")
        self._fail(fatal)

    def _fail(self, fatal: ImporterError) -> None:
        """The server must exit with this failure (its termination message says it to the controller)."""
        with self._lock:
            self.fatal = fatal
        self.finished.set()

    def _cut(self, resumable: int | None) -> dict[str, str]:
        """A body the client cut off: back to `idle`, keeping `resumable` bytes for a resumed upload (None:
        nothing to resume); the headers of the answer."""
        generation = self._forget()
        offset = self._keep(resumable, generation) if resumable is not None else 0
        with self._lock:
            self.offset = offset
            self.state = IDLE
            return self.describe()

    def _keep(self, offset: int, generation: int) -> int:
        """fdatasync the target so that `offset` bytes survive, and record them where a restarted server finds
        them (`kept.py`); the offset, or 0 when the bytes cannot be kept. Runs in a checkpoint's thread or the
        importer's, the slow part (the flush, the digests) outside the lock."""
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
        with self._lock:
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

    def _forget(self) -> int:
        """No bytes to resume from any more (done, starting over, or refused); the record's new generation."""
        with self._lock:
            self._kept_generation += 1
            self.kept = None
            self.offset = 0
            kept.remove(self.kept_path)
            return self._kept_generation

    def _reset(self) -> None:
        with self._lock:
            self.state = IDLE
            self._forget()


class Upload:
    """One request body on its way into the importer, which runs in a thread of its own (`_import`).

    The connection's thread feeds it (`put` each chunk, blocking while the importer's queue is full; `quiet`
    when the client has said nothing for a poll; `end`) and then takes the answer (`answer`), all inside
    `with`: leaving the block cuts a body that did not end and waits for the answer, so the session never
    stays `uploading` behind a connection thread that failed. The rest of the upload's life is decided under
    the session's lock: the answer comes once the import ended, or for an async upload once the body was
    validated (the import then ends alone, in the importer's thread, and ends the server)."""

    def __init__(self, session: UploadSession, *, archive: bool, wait_for_durable: bool, offset: int,
                 length: int | None, recycle: Callable[[Chunk], None] | None) -> None:
        config = session.config
        self._session = session
        self._lock = session._lock
        self.offset = offset  # the body's first byte is the image's byte `offset` (a resumed upload)
        self.length = length
        self.wait_for_durable = wait_for_durable
        self.queue = FedStream(session.queue_bytes)
        if recycle is not None:
            self.queue.recycle_with(recycle)
        self.body = _Counted(self.queue)
        self.progress = _Progress(config.owner_uid, self._on_validated)
        self.head = bytearray()  # the first bytes of a fresh upload: whether it can be resumed
        self.received = 0
        self.client_error: BaseException | None = None  # why the body ended early, when the client's doing
        self.stopped = threading.Event()  # the importer is done with the body: reading more is pointless
        self._ended = False  # the reading thread said how the body ended
        self._silent_since: float | None = time.monotonic()  # when the body last went quiet (None: a put is under way)
        self._stop = threading.Event()  # tells the importer to stop
        # under the session's lock
        self._validated = False  # the importer left its transfer phases
        self._import_ended = False
        self._answered_early = False  # an async upload was answered before its import ended
        self._outcome: Outcome | None = None
        generation = session._kept_generation
        self.checkpoints = _Checkpoints(
            lambda settled: session._keep(settled, generation), self._may_keep, offset,
            every_bytes=config.checkpoint_bytes, every_seconds=CHECKPOINT_SECONDS)
        self.body.on_settled = self.checkpoints.settled
        self.started = time.monotonic()
        options = ImportOptions(
            content_type=envnames.CONTENT_ARCHIVE if archive else envnames.CONTENT_KUBEVIRT,
            requested_size=config.image_size, filesystem_overhead=config.filesystem_overhead,
            preallocation=config.preallocation, scratch_dir=config.scratch_dir, checksum=config.checksum)
        threading.Thread(target=self._import, args=(options,), name="upload-import", daemon=True).start()

    def __enter__(self) -> Upload:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.answer()

    # -- the connection's thread --------------------------------------------------------------------------
    def put(self, chunk: Chunk) -> bool:
        """Hand a chunk to the importer, waiting while its queue is full; False once the importer is done with
        the body (stop reading: its answer is ready)."""
        self._silent_since = None
        if not self.offset and len(self.head) < HEAD_BYTES:
            self.head.extend(chunk[: HEAD_BYTES - len(self.head)])
        self.received += len(chunk)
        self._session.bytes_received += len(chunk)
        if self.stopped.is_set() or not self.queue.put(chunk, self.stopped, PUT_POLL_SECONDS):
            self._ended = True  # the importer closed the body: nothing more to say about it
            return False
        self._silent_since = time.monotonic()
        return True

    def quiet(self) -> bool:
        """Nothing arrived for a while: whether to go on waiting for the body. No, once the importer is done
        with it; no, when the client has said nothing for `idle_timeout`: a connection that goes silent
        without closing (a vanished client, a NAT that forgot it) would hold the server in `uploading` for
        ever and block the resume, so the upload is given up as stalled (resumable as a cut one)."""
        if self.stopped.is_set():
            self._ended = True
            return False
        limit = self._session.config.idle_timeout
        if self._silent_since is not None and time.monotonic() - self._silent_since > limit:
            error = TimeoutError(f"no data for {limit:.0f}s")
            self._end(error, f"the upload stalled after {self.received} bytes: {error}")
            return False
        return True

    def end(self, error: BaseException | None = None) -> None:
        """The body is complete (after its last `put`), or broke with `error` (the client went away, or sent a
        broken body). Only the first end counts; every byte put before it is good, and written."""
        message = "" if error is None else f"the client went away after {self.received} bytes: " \
                                           f"{error or type(error).__name__}"
        self._end(error, message)

    def _end(self, error: BaseException | None, message: str) -> None:
        if self._ended or self.stopped.is_set():
            return
        self._ended = True
        if error is None:
            self.queue.finish()
            return
        self.client_error = error  # before the importer sees the failure: it decides what may be kept
        self.queue.fail(ImporterError(Reason.CONNECTION_FAILED, message, retryable=True))

    def answer(self) -> Outcome:
        """The answer to the request, once the reading stopped (a body that did not end counts as cut off):
        when the import ended (the outcome it left), or for an async upload once the body was validated,
        then `processing` (200, and the import goes on alone). The same every time it is asked."""
        self._end(ConnectionResetError("the body was not read to its end"),
                  f"the upload was interrupted after {self.received} bytes")
        with self._lock:
            self._lock.wait_for(lambda: self._import_ended or self._answered_early or (
                self._validated and not self.wait_for_durable and self.client_error is None))
            if self._import_ended:
                self._lock.wait_for(lambda: self._outcome is not None)
                assert self._outcome is not None
                return self._outcome
            if self._answered_early:
                return Outcome(200, "")
            self._answered_early = True
            self._session.state = PROCESSING
        log.info("received and validated %d bytes in %.1fs; processing continues in the background",
                 self.received, time.monotonic() - self.started)
        return Outcome(200, "")

    def stop(self) -> None:
        """The server stops: the importer is told to stop, and the body to end."""
        self._stop.set()
        self.stopped.set()

    # -- the importer's thread ----------------------------------------------------------------------------
    def _on_validated(self) -> None:
        with self._lock:
            self._validated = True
            self._lock.notify_all()

    def _may_keep(self) -> bool:
        """Whether a checkpoint may keep what was written so far: a raw stream, still being uploaded."""
        return self._session.state == UPLOADING and bool(self.offset or _raw_stream(bytes(self.head), self.progress))

    def _import(self, options: ImportOptions) -> None:
        result: ImportResult | None = None
        failure: BaseException | None = None
        try:
            result = import_stream(self.body, self._session.config.target(), options, self.progress, self._stop,
                                   size=self.length, resume_offset=self.offset)
        except BaseException as exc:  # whatever it is, the upload's answer says it
            failure = exc
        self.stopped.set()
        self.checkpoints.close()
        with self._lock:
            self._import_ended = True
            answered = self._answered_early
            self._lock.notify_all()
        if answered:  # nobody waits for this answer any more: the server exits with it
            if failure is None:
                assert result is not None
                self._session._completed(result, self._session.bytes_received, 0.0)
            else:
                self._session._failed_after_answer(failure)
            return
        try:
            outcome = self._outcome_of(result, failure)
        except Exception as exc:
            log.exception("the upload failed unexpectedly")
            self._session._reset()
            outcome = Outcome(500, f"Saving stream failed: internal error: {type(exc).__name__}: {exc}")
        with self._lock:
            self._outcome = outcome
            self._lock.notify_all()

    def _outcome_of(self, result: ImportResult | None, failure: BaseException | None) -> Outcome:
        if failure is None:
            assert result is not None
            self._session._completed(result, self.received, time.monotonic() - self.started)
            return Outcome(200, "")
        if not isinstance(failure, ImporterError):
            raise failure
        if self.client_error is not None and failure.reason == Reason.CONNECTION_FAILED:
            resumable = self.offset > 0 or _raw_stream(bytes(self.head), self.progress)
            headers = self._session._cut(self.offset + self.body.consumed if resumable else None)
            offset = self._session.offset
            log.warning("%s; %s", failure.message,
                        f"{offset} bytes are kept for a resumed upload" if offset else "nothing to resume")
            return Outcome(400, f"Saving stream failed: {failure.message}", headers)
        self._session._reset()
        log.error("upload refused: %s", failure)
        if failure.reason == Reason.CHECKSUM_MISMATCH:
            # the claim says what the image must be and these bytes are not it: the end, as for an import
            # (the client is told, then the server exits and the DataVolume fails with the reason)
            self._session._fail(failure)
        if failure.reason in _SPACE_REASONS:
            return Outcome(400, f"{TOO_LARGE_PREFIX}: {failure.message}")
        status = 500 if failure.retryable else 400
        return Outcome(status, f"Saving stream failed: {failure.reason}: {failure.message}")


def _raw_stream(head: bytes, progress: _Progress) -> bool:
    """Whether the image was written in place as it arrived (uncompressed raw or ISO on the stream route)."""
    if not head or "TransferDataFile" not in progress.phases_seen:
        return False
    compression, fmt = sniff(bytes(head))
    return compression is None and fmt in (RAW, ISO)

