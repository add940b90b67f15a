"""Entry point of the `cdi` command; each sub-command lives in its own module."""

from __future__ import annotations

import argparse
import logging
import sys

from cdi import __version__
from cdi.cli import apiserver, controller, demo, imageupload, up, uploadproxy


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdi", description="Containerized Data Importer")
    parser.add_argument("--version", action="version", version=f"cdi {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (repeatable)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up.register(commands)
    demo.register(commands)
    controller.register(commands)
    apiserver.register(commands)
    imageupload.register(commands)
    uploadproxy.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
