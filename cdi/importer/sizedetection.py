"""`cdi-image-size-detection -image-path /data/disk.img`: the size-detection pod's program (CDI's tool of
the same name, run from the importer image). It writes the image's virtual size, as `qemu-img info`
reports it, as the whole termination message (a decimal number, not JSON: CDI's controller parses it
with ParseInt) and exits 0; else it exits with CDI's code, which the controller turns into the event
reason `ErrBadArguments`, `ErrInvalidFile`, `ErrInvalidPath` or `ErrBadTermFile`.

A clone into a volume with no size, or from a Filesystem disk image into a Block volume, needs the
image's virtual size, not the source claim's capacity: the two differ by the filesystem overhead."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from cdi.api import env as envnames
from cdi.common import podprogram
from cdi.importer import qemu
from cdi.importer.errors import ImporterError

log = logging.getLogger("cdi.sizedetection")

# CDI's size-detection exit codes (pkg/controller/common: NoErr, ErrBadArguments, ...)
ERR_BAD_ARGUMENTS, ERR_INVALID_FILE, ERR_INVALID_PATH, ERR_BAD_TERM_FILE, ERR_UNKNOWN = 1, 2, 3, 4, 5
EXIT_REASONS = {ERR_BAD_ARGUMENTS: "ErrBadArguments", ERR_INVALID_FILE: "ErrInvalidFile",
                ERR_INVALID_PATH: "ErrInvalidPath", ERR_BAD_TERM_FILE: "ErrBadTermFile"}


def image_path(argv: list[str]) -> str | None:
    """`-image-path P`, `--image-path P` or `-image-path=P` (Go's flag syntax)."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.lstrip("-").partition("=")
        if arg.startswith("-") and name == "image-path":
            if eq:
                return value or None
            return argv[i + 1] if i + 1 < len(argv) and argv[i + 1] else None
    return None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    path = image_path(sys.argv[1:] if argv is None else argv)
    if not path:
        log.error("One or more mandatory parameters are missing")
        return ERR_BAD_ARGUMENTS
    if not Path(path).is_file() and not Path(path).is_block_device():
        log.error("Unable to find the image at %r", path)
        return ERR_INVALID_PATH
    try:
        virtual_size = int(qemu.info(path)["virtual-size"])
    except (ImporterError, KeyError, ValueError) as exc:
        log.error("Unable to extract information from %r: %s", path, exc)
        return ERR_INVALID_FILE
    try:
        Path(os.environ.get(envnames.TERMINATION_LOG) or envnames.TERMINATION_LOG_DEFAULT).write_text(
            str(virtual_size))
    except OSError as exc:
        log.error("Unable to write to termination file: %s", exc)
        return ERR_BAD_TERM_FILE
    log.info("Size-detection binary has completed: %d", virtual_size)
    return 0


def entry() -> NoReturn:
    """The `cdi-image-size-detection` console script: `main`, then out without finalization
    (`cdi.common.podprogram`)."""
    podprogram.run(main)


if __name__ == "__main__":
    entry()
