"""What every long-running `cdi` command shares: its cluster flags, its listen address, and stopping
cleanly on SIGTERM (a pod being deleted) or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import signal


def add_cluster_arguments(parser: argparse.ArgumentParser, namespace_help: str = "namespace CDI runs in") -> None:
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, then in-cluster)")
    parser.add_argument("--namespace", default="cdi", help=namespace_help)
    add_verbosity_argument(parser)


def add_verbosity_argument(parser: argparse.ArgumentParser) -> None:
    """`--v N`: CDI's klog verbosity, as the CDI resource's `customizeComponents.flags` pass it."""
    parser.add_argument("--v", type=int, default=None, metavar="N", dest="klog_v",
                        help="log verbosity as CDI's components take it (0-1 info, 2+ debug)")


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    """HOST:PORT (IPv6 hosts in brackets) as (host, port)."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"{flag} must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def stop_on_signals() -> asyncio.Event:
    """An event the running loop sets on SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
