"""`cdi-operator` (the cdi-operator image's entrypoint): runs the operator in its namespace with the
pod's service account, or with `--kubeconfig`. Images and the operator's version come from CDI's operator env
vars (`CONTROLLER_IMAGE`, `OPERATOR_VERSION`, ...) as `cdi manifests` sets them; `/readyz` and `/healthz`
on `--listen`.

One operator reconciles at a time, elected over CDI's operator's Lease (`cdi-operator-leader-election-helper`,
as CDI's controller-runtime manager elects it): while the operator's own Deployment rolls to a new version, the
old pod and the new one run side by side, and two versions applying their components in turn would roll them
back and forth. The leader releases the Lease when it stops, so its successor starts at once; one that loses
the Lease exits (its pod restarts and stands again), as controller-runtime's manager does."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from cdi.api import componentenv
from cdi.common import aioloop
from cdi.kube import KubeClient, LeaderElectionConfig, LeaderElector
from cdi.operator.reconciler import Operator
from cdi.operator.resources import Images


def images_from_env() -> Images:
    """Registry and tag from `CONTROLLER_IMAGE` (`REGISTRY/cdi-controller:TAG`), else the defaults."""
    image = os.environ.get(componentenv.CONTROLLER_IMAGE, "")
    if "/cdi-controller:" in image:
        registry, tag = image.rsplit("/cdi-controller:", 1)
        return Images(registry, tag)
    defaults = Images()
    return Images(defaults.registry, os.environ.get(componentenv.OPERATOR_VERSION) or defaults.tag)


def version_from_env(images: Images) -> str:
    """CDI's `OPERATOR_VERSION` (its release manifests set the image tag; `cdi manifests --operator-version` may
    set another), else the images' tag."""
    return os.environ.get(componentenv.OPERATOR_VERSION) or images.tag


LEASE_NAME = "cdi-operator-leader-election-helper"


async def run_elected(client: KubeClient, namespace: str, identity: str, work: Callable[[], Awaitable[None]],
                      stop: asyncio.Event, config: LeaderElectionConfig | None = None) -> bool:
    """Run `work` while leading CDI's operator Lease, until `stop` (then the Lease is released: True) or the
    Lease is lost (False: the caller exits)."""
    elector = LeaderElector(client, config or LeaderElectionConfig(LEASE_NAME, namespace, identity),
                            on_started_leading=work)
    election = asyncio.create_task(elector.run(), name="leader-election")
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([election, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if election.done():
        with contextlib.suppress(Exception):
            election.result()
        return stop.is_set()
    election.cancel()  # releases the Lease
    with contextlib.suppress(asyncio.CancelledError):
        await election
    return True


async def serve(args: argparse.Namespace) -> bool:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with await KubeClient.connect(args.kubeconfig) as client:
        images = images_from_env()
        operator = Operator(client, args.namespace, images, resync=args.resync, version=version_from_env(images))
        app = web.Application()
        app.router.add_get("/healthz", lambda _: _ok())
        app.router.add_get("/readyz", lambda _: _ok())
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, _, port = args.listen.rpartition(":")
        await web.TCPSite(runner, host.strip("[]"), int(port)).start()
        print(f"cdi-operator {operator.version}: reconciling CDI into namespace {args.namespace}", flush=True)
        try:
            if not args.leader_elect:
                await operator.run(stop)
                return True
            identity = f"{socket.gethostname()}_{uuid.uuid4()}"
            return await run_elected(client, args.namespace, identity, lambda: operator.run(stop), stop)
        finally:
            await runner.cleanup()


async def _ok() -> web.Response:
    return web.Response(text="ok")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cdi-operator", description="CDI's operator")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, then in-cluster)")
    parser.add_argument("--namespace", default=os.environ.get(componentenv.POD_NAMESPACE, "cdi"),
                        help="namespace of CDI's components")
    parser.add_argument("--listen", default="0.0.0.0:8080", help="HOST:PORT of /healthz and /readyz")
    parser.add_argument("--resync", type=float, default=15.0, help="seconds between full passes")
    parser.add_argument("--no-leader-elect", dest="leader_elect", action="store_false",
                        help="reconcile without holding the operator's Lease (one operator only)")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO - 10 * min(args.verbose, 1),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return 0 if aioloop.run(serve(args)) else 1


if __name__ == "__main__":
    sys.exit(main())
