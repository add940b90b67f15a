"""`cdi-importer`: read the environment, import, write the termination message, exit 0 or 1.

Exit status: 0 when the import completed, 1 otherwise (including ScratchSpaceRequired). In both
cases /dev/termination-log holds one line of JSON with `reason` and `retryable`, which is all the
controller needs to decide between done, retry (resuming) and failed (see errors.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback
from types import FrameType
from typing import NoReturn

from cdi.api import env as envnames
from cdi.common import podprogram, verbosity

from . import containerimage, termination
from .config import ImporterConfig
from .errors import ImporterError, Reason
from .options import ImportOptions
from .origins import open_origin
from .pipeline import ImportResult, import_blank, run_import
from .progress import Progress
from .retry import Terminated
from .target import FILESYSTEM, Paths, detect_target

log = logging.getLogger("cdi.importer")


def run(config: ImporterConfig, progress: Progress, stop: threading.Event) -> ImportResult:
    target = detect_target(config.paths)
    log.info("target: %s volume at %s", target.kind, target.path)
    if config.content_type == envnames.CONTENT_ARCHIVE and target.kind != FILESYSTEM:
        raise ImporterError(
            Reason.INVALID_CONFIGURATION, "content type archive needs a Filesystem volume, not a Block volume"
        )
    options = ImportOptions(
        content_type=config.content_type,
        requested_size=config.image_size,
        filesystem_overhead=config.filesystem_overhead,
        preallocation=config.preallocation,
        checksum=config.checksum,
        scratch_dir=config.paths.scratch(),
    )
    if config.source == envnames.SOURCE_BLANK:
        return import_blank(target, options, progress)
    config.retry.listeners.append(lambda exc, attempt: progress.retried(exc.reason, exc.message, attempt))
    config.retry.recovered.append(progress.recovered)
    node_pull = containerimage.node_pull(os.environ)
    if node_pull:
        config.endpoint = containerimage.wait_ready(os.environ, stop)
    origin = open_origin(config, stop)
    try:
        result = run_import(origin, target, options, progress, stop)
        if node_pull:
            result.labels.update(containerimage.info_labels(config.endpoint))
        return result
    finally:
        origin.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == containerimage.INSTALL_FLAG:
        return containerimage.install(args[1])
    logging.basicConfig(
        level=verbosity.program_level(sys.argv[1:] if argv is None else argv), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    paths = Paths.from_env(os.environ)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        raise Terminated()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    progress: Progress | None = None
    try:
        config = ImporterConfig.from_env()
        log.debug("importing %s (content type %s, size %s, overhead %s, preallocation %s)", config.source,
                  config.content_type, config.image_size, config.filesystem_overhead, config.preallocation)
        progress = Progress(config.owner_uid)
        if config.pod_ip:
            try:
                progress.serve(config.pod_ip, envnames.METRICS_PORT)
            except OSError as exc:  # progress is nice to have; the import is what matters
                log.warning("cannot serve metrics on %s:%d: %s", config.pod_ip, envnames.METRICS_PORT, exc)
        if config.poll:
            from .poll import current_digest

            digest = current_digest(config, stop)
            log.info("%s is at %s", config.endpoint, digest)
            line = termination.write(paths.termination_log, termination.TerminationMessage(
                message="Poll complete", reason=Reason.COMPLETE, retryable=False, source_digest=digest))
            print(line, flush=True)
            return 0
        result = run(config, progress, stop)
        message = termination.TerminationMessage(
            message=termination.COMPLETE_MESSAGE,
            reason=Reason.COMPLETE,
            retryable=False,
            preallocation_applied=result.preallocation_applied,
            labels=result.labels,
            virtual_size=result.virtual_size,
            checksum=result.checksum,
            source_sha256=result.source_sha256,
            bytes_transferred=result.bytes_transferred,
            source_format=result.source_format,
            route=result.route,
        )
        code = 0
    except ImporterError as exc:
        log.error("import failed: %s", exc)
        message = termination.TerminationMessage(
            message=exc.message,
            reason=exc.reason,
            retryable=exc.retryable,
            scratch_space_required=exc.scratch_space_required,
        )
        code = 1
    except Terminated:
        stop.set()
        log.error("import stopped by a signal")
        message = termination.TerminationMessage(
            message="the importer was stopped by a signal", reason=Reason.TERMINATED, retryable=True
        )
        code = 1
    except Exception as exc:  # a bug: report it like any failure, with the details
        stop.set()
        log.error("unexpected error:\n%s", traceback.format_exc())
        message = termination.TerminationMessage(
            message=f"internal error: {type(exc).__name__}: {exc}",
            reason=Reason.INTERNAL_ERROR,
            retryable=True,
        )
        code = 1
    if progress is not None:
        message.retries = progress.retries or None  # transient failures this run absorbed, for restartCount
        if code != 0:
            progress.failed()
    line = termination.write(paths.termination_log, message)
    print(line, flush=True)
    containerimage.finished(os.environ)
    return code


def entry() -> NoReturn:
    """The `cdi-importer` console script: `main`, then out without finalization (`cdi.common.podprogram`)."""
    podprogram.run(main)


if __name__ == "__main__":
    entry()
