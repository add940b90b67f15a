"""Entry point of the `cdi` command; each sub-command lives in its own module, imported only when it is
the one asked for (`cdi image-upload` does not load the embedded control plane, the API server or the
controller: a third of its start-up time)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from cdi import __version__
from cdi.common.verbosity import log_level

COMMANDS = {  # command -> module with its register(); in `cdi --help` order
    "up": "cdi.cli.up",
    "demo": "cdi.cli.demo",
    "controller": "cdi.cli.controller",
    "apiserver": "cdi.cli.apiserver",
    "image-upload": "cdi.cli.imageupload",
    "uploadproxy": "cdi.cli.uploadproxy",
    "manifests": "cdi.cli.manifests",
    "clone-plan": "cdi.cli.cloneplan",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `only` when that is a command."""
    # no abbreviations: `--v N` (CDI's verbosity flag) after a command must not read as --version/--verbose
    parser = argparse.ArgumentParser(prog="cdi", description="Containerized Data Importer", allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"cdi {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (repeatable)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only not in COMMANDS or only == name:
            importlib.import_module(module).register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)  # the top-level options take no value
    args = build_parser(command).parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    if getattr(args, "klog_v", None) is not None:  # a component's `--v N` (CDI's flag) decides
        level = log_level(args.klog_v)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
