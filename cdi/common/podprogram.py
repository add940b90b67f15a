"""How a worker-pod program (importer, upload server, clone source, size detection) starts and ends.

A worker program ends while daemon threads may still be inside C code: range fetchers blocked in a TLS read,
the metrics server in a handshake with a scraping controller, the write-behind thread. The interpreter's
finalization frees what they use under them, and the process can die of SIGSEGV (exit 139) after its
termination message said `Complete`; the controller then rightly calls the import failed. By the time
`main` returns, everything that matters is durable (the target fsynced, the termination message written),
so the program leaves with `os._exit` after flushing its streams, and finalization never runs.
`faulthandler` is on, so a crash that still happens prints every thread's stack to the pod's log."""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def run(main: Callable[[], int]) -> NoReturn:
    """Run a program's `main` as the container's process and exit with its code, skipping finalization."""
    faulthandler.enable()
    try:
        code = main()
    except SystemExit as exc:  # argparse and friends
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
