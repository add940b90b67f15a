"""`cdi controller`: the CDI controller for a real cluster (in-cluster config or a kubeconfig).
`cdi up` runs the same Manager in-process."""

from __future__ import annotations

import argparse
import os
from typing import Any

from aiohttp import web

from cdi.api import componentenv
from cdi.cli.service import add_cluster_arguments, parse_listen, stop_on_signals
from cdi.common import aioloop
from cdi.controller.manager import Manager
from cdi.controller.runtime import Settings
from cdi.kube import KubeClient


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--importer-image", default="cdi-importer", help="image of importer pods")
    parser.add_argument("--uploadserver-image", default="cdi-uploadserver", help="image of upload-server pods")
    parser.add_argument("--cloner-image", default="cdi-cloner", help="image of clone source pods")
    parser.add_argument("--pull-policy", default=os.environ.get(componentenv.PULL_POLICY) or "IfNotPresent",
                        choices=("Always", "IfNotPresent", "Never"),
                        help="imagePullPolicy of worker pods (default $PULL_POLICY, as CDI's controller reads it; "
                             "cdi-operator passes the CDI resource's spec.imagePullPolicy)")
    parser.add_argument("--import-retries", type=int, default=5,
                        help="retry budget for transient import failures (per import)")
    parser.add_argument("--retry-backoff", type=float, default=2.0,
                        help="first retry delay in seconds; doubles each attempt (max 5 minutes)")
    parser.add_argument("--import-retry-budget", type=float, default=180.0, metavar="SECONDS",
                        help="how long an import may keep failing to get data from its source (refused, "
                             "timed out, reset, 5xx) before its DataVolume fails; passed to importer pods "
                             "as IMPORTER_RETRY_BUDGET (default 180)")
    parser.add_argument("--poller-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="how long a DataImportCron's poller pod may take to report the source's version "
                             "(it may be pulling a large image by the node) before it is deleted and the cron "
                             "says why; the next run starts a new one (default 600)")


def settings_from(args: argparse.Namespace, **extra: Any) -> Settings:
    return Settings(importer_image=args.importer_image, uploadserver_image=args.uploadserver_image,
                    cloner_image=args.cloner_image, pull_policy=args.pull_policy,
                    retry_budget=args.import_retries, retry_base=args.retry_backoff,
                    import_retry_budget=args.import_retry_budget, poller_timeout=args.poller_timeout, **extra)


def register(commands: Any) -> None:
    parser = commands.add_parser("controller", help="run the CDI controller against a cluster")
    add_cluster_arguments(parser, "namespace CDI runs in (its leader-election lease, the Ingresses and Routes "
                                  "in front of its upload proxy)")
    parser.add_argument("--metrics-listen", default="0.0.0.0:8080", help="HOST:PORT of /metrics and /healthz")
    parser.add_argument("--no-leader-election", action="store_true")
    parser.add_argument("--no-cdi-status", action="store_true",
                        help="leave the CDI resource's status to cdi-operator (as its Deployment runs this)")
    add_settings_arguments(parser)
    parser.set_defaults(run=run)


async def serve(args: argparse.Namespace) -> None:
    stop = stop_on_signals()
    async with await KubeClient.connect(args.kubeconfig) as client:
        manager = Manager(client, settings_from(args, namespace=args.namespace,
                                                leader_election=not args.no_leader_election,
                                                report_cdi_status=not args.no_cdi_status))
        runner = web.AppRunner(manager.metrics_app(), access_log=None)
        await runner.setup()
        host, port = parse_listen(args.metrics_listen, "--metrics-listen")
        await web.TCPSite(runner, host, port).start()
        await manager.start()
        print("cdi controller: running", flush=True)
        try:
            await stop.wait()
        finally:
            await manager.stop()
            await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    aioloop.run(serve(args))
    return 0
