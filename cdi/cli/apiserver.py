"""`cdi apiserver`: CDI's admission webhooks and upload-token API for a real cluster (a Deployment in
CDI's namespace, pods labelled `cdi.kubevirt.io: cdi-apiserver`). `cdi up` runs the same server
in-process."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cdi.apiserver.server import CdiApiServer
from cdi.cli.service import add_cluster_arguments, parse_listen, stop_on_signals
from cdi.common import aioloop
from cdi.kube import KubeClient


def register(commands: Any) -> None:
    parser = commands.add_parser("apiserver", help="run cdi-apiserver (admission webhooks, upload tokens)")
    add_cluster_arguments(parser)
    parser.add_argument("--listen", default="0.0.0.0:8443", help="HOST:PORT to serve HTTPS on")
    parser.add_argument("--state-dir", type=Path, default=Path("/var/run/cdi-apiserver"),
                        help="where the serving CA and certificate are kept")
    parser.add_argument("--endpoint-ip", default=None,
                        help="point the cdi-api Service at this address instead of selecting the pods")
    parser.add_argument("--webhook-client-names", default="",
                        help="comma-separated common names of the client certificates the API server presents to "
                             "admission webhooks (issued by its client CA); given, webhook calls without one are "
                             "refused")
    parser.set_defaults(run=run)


async def serve(args: argparse.Namespace) -> None:
    stop = stop_on_signals()
    host, port = parse_listen(args.listen)
    async with await KubeClient.connect(args.kubeconfig) as client:
        names = tuple(n.strip() for n in args.webhook_client_names.split(",") if n.strip())
        server = CdiApiServer(client, args.namespace, args.state_dir, webhook_client_names=names)
        await server.start(host, port)
        await server.register(args.endpoint_ip)
        print(f"cdi apiserver: serving on {host}:{server.port}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.stop()


def run(args: argparse.Namespace) -> int:
    aioloop.run(serve(args))
    return 0
