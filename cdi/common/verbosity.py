"""CDI's log verbosity (klog's `-v=N`, set by CDIConfig `logVerbosity`) as a Python logging level. The
controller applies it to itself and passes it to every worker pod as the container argument `-v=N`, as
CDI's controller does; the pod programs read it back from their arguments."""

from __future__ import annotations

import logging
from collections.abc import Sequence

DEFAULT = 1  # CDI's controller and worker pods run with -v=1 unless told otherwise


def log_level(verbosity: object) -> int:
    """0 and 1 (CDI's default) log informational messages, 2 and more debug ones too (CDI's controller
    turns debug logging on above 1); anything else (unset) is NOTSET: what the command line chose."""
    if not isinstance(verbosity, int) or isinstance(verbosity, bool) or verbosity < 0:
        return logging.NOTSET
    return logging.DEBUG if verbosity > 1 else logging.INFO


def from_args(argv: Sequence[str]) -> int | None:
    """The verbosity in `-v=N` (also `--v=N`, `-v N`), as klog parses it; None when absent or unreadable."""
    for index, arg in enumerate(argv):
        for flag in ("-v", "--v"):
            value = arg[len(flag) + 1:] if arg.startswith(flag + "=") else \
                (argv[index + 1] if arg == flag and index + 1 < len(argv) else None)
            if value is not None and value.isdigit():
                return int(value)
    return None


def program_level(argv: Sequence[str]) -> int:
    """The logging level of a pod program started with `argv`: INFO unless `-v` says more."""
    return log_level(from_args(argv)) or logging.INFO
