"""`cdi-uploadserver`: serve one upload, then exit.

Exit 0 with the termination message `{"message": "Upload Complete", "reason": "Complete", ...}` once
the image is durable. Exit 1 with the failure's reason (and `retryable`) when processing failed after
an async upload was accepted, or when the server cannot run at all (bad configuration): the
controller reads the reason from the termination message (`/dev/termination-log`, or `$TERMINATION_LOG`
outside a pod). SIGTERM stops the server; an upload in progress is abandoned (exit 1, `Terminated`)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import types
from pathlib import Path
from typing import NoReturn

from cdi.api import env as envnames
from cdi.common import podprogram, verbosity
from cdi.importer import ImporterError, Reason
from cdi.importer import termination as term
from cdi.uploadserver.config import UploadServerConfig
from cdi.uploadserver.server import UploadServer

log = logging.getLogger("cdi.uploadserver")
COMPLETE_MESSAGE = "Upload Complete"
SIGNAL_POLL_SECONDS = 0.25  # how soon the main thread sees a SIGTERM while it waits for the end


class _StopSignals:
    """SIGTERM and SIGINT, noted by a handler that takes no lock (the main thread may hold one when the
    handler runs in it), and looked at by the waiting main thread every `SIGNAL_POLL_SECONDS`."""

    def __init__(self) -> None:
        self.received = False
        self._before = {sig: signal.signal(sig, self._note) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _note(self, signum: int, frame: types.FrameType | None) -> None:
        self.received = True

    def restore(self) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)


def serve(config: UploadServerConfig) -> term.TerminationMessage:
    stop = _StopSignals()
    server = UploadServer(config)
    try:
        server.start()
        while not server.ended.wait(SIGNAL_POLL_SECONDS) and not stop.received:
            pass
        server.wait_idle(1.0 if stop.received else 10.0)
    finally:
        stop.restore()
        server.stop()
    if server.clone_result is not None:
        return term.TerminationMessage(message="Clone Complete", reason=Reason.COMPLETE, retryable=False,
                                       virtual_size=server.clone_result.virtual_size,
                                       bytes_transferred=server.clone_result.data_bytes)
    session = server.session
    if session.result is not None:
        result = session.result
        return term.TerminationMessage(
            message=COMPLETE_MESSAGE, reason=Reason.COMPLETE, retryable=False,
            preallocation_applied=result.preallocation_applied, virtual_size=result.virtual_size,
            checksum=result.checksum, source_sha256=result.source_sha256, bytes_transferred=session.bytes_received,
            source_format=result.source_format,
            route=result.route)
    if session.fatal is not None:
        return term.TerminationMessage(message=session.fatal.message, reason=session.fatal.reason,
                                       retryable=session.fatal.retryable)
    return term.TerminationMessage(message="the upload server was stopped before an upload completed",
                                   reason=Reason.TERMINATED, retryable=True)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=verbosity.program_level(sys.argv[1:] if argv is None else argv),
                        stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log_path = Path(os.environ.get(envnames.TERMINATION_LOG) or envnames.TERMINATION_LOG_DEFAULT)
    try:
        config = UploadServerConfig.from_env()
        message = serve(config)
    except ImporterError as exc:
        log.error("the upload server cannot run: %s", exc)
        message = term.TerminationMessage(message=exc.message, reason=exc.reason, retryable=exc.retryable)
    except OSError as exc:
        log.error("the upload server cannot run: %s", exc)
        message = term.TerminationMessage(message=f"cannot serve uploads: {exc}", reason=Reason.INTERNAL_ERROR,
                                          retryable=True)
    line = term.write(log_path, message)
    print(line, flush=True)
    return 0 if message.reason == Reason.COMPLETE else 1


def entry() -> NoReturn:
    """The `cdi-uploadserver` console script: `main`, then out without finalization (`cdi.common.podprogram`)."""
    podprogram.run(main)


if __name__ == "__main__":
    entry()
