"""`cdi uploadproxy`: the upload proxy for a real cluster (in `cdi up` it runs in-process).

It needs to read PVCs and Services in every namespace, and in CDI's namespace the Secret
`cdi-uploadserver-client-cert` and the ConfigMaps `cdi-uploadserver-signer-bundle` and
`cdi-api-public-key` (or the key in `$APISERVER_PUBLIC_KEY`, as CDI's proxy takes it).

TLS: `--tls-cert/--tls-key` (a certificate for the names clients use: bring your own or cert-manager's),
else a CA kept in `--state-dir` issues one for `--host` names and is published in ConfigMap
`cdi-uploadproxy-ca`, where `cdi image-upload` finds it.

`--aggregation-listen HOST:PORT` also serves the Kubernetes API server's aggregation layer there
(`upload.extensions.cdi.dev`, the APIService cdi-operator installs), with the same certificate (valid for
`cdi-uploadproxy.<namespace>.svc`); it then also reads ConfigMap `kube-system/extension-apiserver-authentication`
(the `extension-apiserver-authentication-reader` Role) and keeps its request-header CA in `--state-dir`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from cdi.api import componentenv
from cdi.cli.service import add_verbosity_argument, parse_listen, stop_on_signals
from cdi.common import aioloop
from cdi.kube import KubeClient
from cdi.uploadproxy import serving
from cdi.uploadproxy.server import UploadProxy


def register(commands: Any) -> None:
    parser = commands.add_parser("uploadproxy", help="run the upload proxy against a cluster")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, then in-cluster)")
    parser.add_argument("--namespace", default=os.environ.get(componentenv.POD_NAMESPACE, "cdi"),
                        help="CDI's namespace")
    parser.add_argument("--listen", default="0.0.0.0:8443", help="HOST:PORT to serve on (default 0.0.0.0:8443)")
    parser.add_argument("--tls-cert", type=Path, default=None, help="serving certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    parser.add_argument("--state-dir", type=Path, default=Path("/var/run/cdi-uploadproxy"),
                        help="where the self-managed CA lives when no certificate is given")
    parser.add_argument("--host", action="append", default=[],
                        help="extra host name for the self-managed certificate (repeatable)")
    parser.add_argument("--aggregation-listen", default="",
                        help="HOST:PORT to serve the API server's aggregation layer on (uploads with a kubeconfig)")
    add_verbosity_argument(parser)
    parser.set_defaults(run=run)


async def serve(args: argparse.Namespace) -> None:
    stop = stop_on_signals()
    host, port = parse_listen(args.listen)
    async with await KubeClient.connect(args.kubeconfig) as client:
        if args.tls_cert and args.tls_key:
            context = serving.brought(args.tls_cert, args.tls_key)
        else:
            context, ca = serving.self_managed(args.state_dir, serving.default_hosts(args.namespace, args.host))
            await serving.publish_ca(client, args.namespace, ca.cert_pem)
        public_key = os.environ.get(componentenv.APISERVER_PUBLIC_KEY, "").encode() or None
        proxy = UploadProxy(client, args.namespace, public_key=public_key)
        await proxy.start(host, port, context)
        print(f"cdi uploadproxy: serving on https://{host}:{proxy.port}", flush=True)
        if args.aggregation_listen:
            agg_host, agg_port = parse_listen(args.aggregation_listen)
            await proxy.start_aggregation(agg_host, agg_port, context, args.state_dir)
            print(f"cdi uploadproxy: serving the aggregation layer on https://{agg_host}:{proxy.aggregation_port}",
                  flush=True)
        try:
            await stop.wait()
        finally:
            await proxy.stop()


def run(args: argparse.Namespace) -> int:
    aioloop.run(serve(args))
    return 0
