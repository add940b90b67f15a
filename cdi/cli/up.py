"""`cdi up`: run the embedded control plane in the foreground until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from cdi.api import referencegrant
from cdi.cli.controller import add_settings_arguments, settings_from
from cdi.cli.service import parse_listen, stop_on_signals
from cdi.cli.stack import CdiStack
from cdi.common import aioloop
from cdi.embedded.cluster import ClusterConfig, EmbeddedCluster

SUPPORTED_GATES = (referencegrant.FEATURE_GATE,)


def feature_gates(text: str) -> frozenset[str]:
    """kube-apiserver's `--feature-gates` syntax: the gates switched on; an unknown gate is refused."""
    on = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in SUPPORTED_GATES:
            raise argparse.ArgumentTypeError(f"unrecognized feature gate: {name} (supported: "
                                             f"{', '.join(SUPPORTED_GATES)})")
        if value.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"invalid value of {name}: {value!r}, expected true or false")
        if value.lower() == "true":
            on.add(name)
    return frozenset(on)


def register(commands: Any) -> None:
    parser = commands.add_parser("up", help="run the embedded control plane (API server, node, storage, CDI)")
    parser.add_argument("--data-dir", type=Path, default=Path(".cdi"), help="state directory (default .cdi)")
    parser.add_argument("--listen", default="127.0.0.1:0",
                        help="address of the API server, HOST:PORT (port 0 picks a free one; default 127.0.0.1:0)")
    parser.add_argument("--watch-history", type=int, default=20_000,
                        help="changes kept for watches to resume from; older resourceVersions get 410 Gone")
    parser.add_argument("--bookmark-interval", type=float, default=10.0, help="seconds between watch bookmarks")
    parser.add_argument("--token-auth-file", type=Path, default=None,
                        help='more users: CSV lines token,user,uid,"group1,group2" (as kube-apiserver)')
    parser.add_argument("--ext4-volumes", action="store_true",
                        default=os.environ.get("CDI_EXT4_VOLUMES", "") not in ("", "0", "false"),
                        help="make each Filesystem volume a real ext4 filesystem of the claimed size on a loop "
                             "device (needs root; also CDI_EXT4_VOLUMES=1)")
    parser.add_argument("--restart-backoff", type=float, default=10.0,
                        help="seconds of the first CrashLoopBackOff delay (doubles up to 300; default 10)")
    parser.add_argument("--shutdown-grace", type=float, default=5.0,
                        help="seconds running containers get to exit when cdi up stops (default 5)")
    parser.add_argument("--feature-gates", type=feature_gates, default=frozenset(),
                        help="kube-apiserver feature gates, GATE=true|false,... (supported: "
                             f"{', '.join(SUPPORTED_GATES)}: a PVC's dataSourceRef may name another namespace, "
                             "honoured where a ReferenceGrant there allows it)")
    parser.add_argument("--no-cdi", action="store_true",
                        help="run only the Kubernetes-compatible control plane, without CDI's components")
    add_settings_arguments(parser)
    parser.set_defaults(run=run)


async def serve(args: argparse.Namespace) -> None:
    host, port = parse_listen(args.listen)
    cluster = EmbeddedCluster(ClusterConfig(args.data_dir.resolve(), host, port, args.watch_history,
                                            args.bookmark_interval, args.token_auth_file,
                                            ext4_volumes=args.ext4_volumes, restart_backoff=args.restart_backoff,
                                            shutdown_grace=args.shutdown_grace, feature_gates=args.feature_gates))
    stop = stop_on_signals()
    await cluster.start()
    stack = None if args.no_cdi else CdiStack(cluster.kubeconfig_path, args.data_dir.resolve(), settings_from(args))
    try:
        if stack is not None:
            await stack.start()
            # the embedded API server is the cluster: CDIConfig's TLS profile is the only one there is
            stack.follow_tls_profile(cluster.apiserver.set_tls_policy)
        print(f"cdi up: ready - API server {cluster.url}, kubeconfig {cluster.kubeconfig_path}", flush=True)
        print(f"  export KUBECONFIG={cluster.kubeconfig_path}", flush=True)
        print(f"  pod IPs {cluster.node.ips.network}, service cluster IPs {cluster.apiserver.service_range.network}",
              flush=True)
        if stack is not None:
            print(f"  controller metrics {stack.metrics_url}", flush=True)
            print(f"  upload proxy {stack.uploadproxy_url} (CA {stack.uploadproxy_ca})", flush=True)
        await stop.wait()
    finally:
        print("cdi up: stopping", flush=True)
        if stack is not None:
            await stack.stop()
        await cluster.stop()
        print("cdi up: stopped", flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        aioloop.run(serve(args))
    except KeyboardInterrupt:
        pass
    sys.stdout.flush()
    return 0
