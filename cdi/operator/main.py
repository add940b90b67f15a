"""`cdi-operator` (the cdi-operator image's entrypoint): runs the operator in its namespace with the
pod's service account, or with `--kubeconfig`. Images come from CDI's operator env vars
(`CONTROLLER_IMAGE`, `OPERATOR_VERSION`, ...) as `cdi manifests` sets them; `/readyz` and `/healthz`
on `--listen`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from aiohttp import web

from cdi.common import aioloop
from cdi.kube import KubeClient
from cdi.operator.reconciler import Operator
from cdi.operator.resources import Images


def images_from_env() -> Images:
    """Registry and tag from `CONTROLLER_IMAGE` (`REGISTRY/cdi-controller:TAG`), else the defaults."""
    image = os.environ.get("CONTROLLER_IMAGE", "")
    if "/cdi-controller:" in image:
        registry, tag = image.rsplit("/cdi-controller:", 1)
        return Images(registry, tag)
    defaults = Images()
    return Images(defaults.registry, os.environ.get("OPERATOR_VERSION") or defaults.tag)


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with await KubeClient.connect(args.kubeconfig) as client:
        operator = Operator(client, args.namespace, images_from_env(), resync=args.resync)
        app = web.Application()
        app.router.add_get("/healthz", lambda _: _ok())
        app.router.add_get("/readyz", lambda _: _ok())
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, _, port = args.listen.rpartition(":")
        await web.TCPSite(runner, host.strip("[]"), int(port)).start()
        print(f"cdi-operator: reconciling CDI into namespace {args.namespace}", flush=True)
        try:
            await operator.run(stop)
        finally:
            await runner.cleanup()


async def _ok() -> web.Response:
    return web.Response(text="ok")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cdi-operator", description="CDI's operator")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, then in-cluster)")
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "cdi"),
                        help="namespace of CDI's components")
    parser.add_argument("--listen", default="0.0.0.0:8080", help="HOST:PORT of /healthz and /readyz")
    parser.add_argument("--resync", type=float, default=15.0, help="seconds between full passes")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO - 10 * min(args.verbose, 1),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    aioloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
