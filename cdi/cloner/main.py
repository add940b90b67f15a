"""`cdi-cloner`: the source side of a host-assisted clone (`cdi.cloner.source`); exits 0 with the
termination message `{"message": "Clone Complete", "reason": "Complete", ...}` once the target said
the bytes are durable, else 1 with the reason."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from cdi.api import env as envnames
from cdi.cloner.source import METRICS_PORT, CloneError, Progress, SourceConfig, send
from cdi.common import podprogram
from cdi.importer import Reason
from cdi.importer import termination as term

log = logging.getLogger("cdi.cloner")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log_path = Path(os.environ.get(envnames.TERMINATION_LOG) or envnames.TERMINATION_LOG_DEFAULT)
    try:
        config = SourceConfig.from_env()
        progress = Progress(config.owner_uid)
        if config.pod_ip:
            progress.serve(config.pod_ip, METRICS_PORT)
        sent = send(config, progress)
        message = term.TerminationMessage(message="Clone Complete", reason=Reason.COMPLETE, retryable=False,
                                          bytes_transferred=sent)
    except CloneError as exc:
        log.error("%s", exc)
        message = term.TerminationMessage(message=str(exc), reason="CloneFailed", retryable=exc.retryable)
    print(term.write(log_path, message), flush=True)
    return 0 if message.reason == Reason.COMPLETE else 1


def entry() -> NoReturn:
    """The `cdi-cloner` console script: `main`, then out without finalization (`cdi.common.podprogram`)."""
    podprogram.run(main)


if __name__ == "__main__":
    entry()
