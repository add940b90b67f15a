"""The upload proxy's HTTPS server: CDI's public upload endpoints, forwarding each upload to the upload
server of the PVC its token names.

| path | |
|---|---|
| `/v1beta1/upload`, `/v1alpha1/upload` | sync raw body |
| `/v1beta1/upload-async`, `/v1alpha1/upload-async` | async raw body (HEAD: capability probe) |
| `/v1beta1/upload-form`, `/v1beta1/upload-form-async` (and alpha) | multipart, part `file` |
| `/healthz` | `OK` |

Each request: token (`auth.py`; checked once, when the request starts, so a long upload is never cut
off by the token's 5 minutes), then the PVC's readiness and the upload server's address
(`routing.py`), then the request is streamed to the upload server and its answer streamed back.
The listening socket belongs to `front.py`, the proxy's only HTTP server: it serves every request with
blocking TLS sockets in a thread per connection (a third of the CPU per byte of going through asyncio
streams), asking `plan` below, on the event loop, where an upload goes. No body is
buffered beyond one batch: a slow disk makes a slow client (the socket buffers fill), and a client that
goes away aborts the upstream connection at once, which is what lets the upload server keep the bytes
for a resumed upload. Headers of our resume extension (`Upload-Offset`, `Upload-State`) pass both ways.
A raw upload can instead be switched to end-to-end TLS with the upload server (`cdi.api.upload`): the
proxy authorises it as any other, then only splices TCP bytes; its answer to the `HEAD` probe offers it.

CORS allows every origin, as CDI's (a browser uploading with the form endpoints).

TLS versions and cipher suites are CDIConfig's `tlsSecurityProfile`, followed as it changes
(`cdi.kube.tlswatch`), as CDI's proxy does.

`start_aggregation` adds the listener the Kubernetes API server's aggregation layer forwards uploads to
(`aggregated.py`, our extension `upload.extensions.cdi.dev`): the same routing (`plan_for`, without a
token: the API server authorized the user for the PVC the path names), the same serving code."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from cdi.api import upload as names
from cdi.common import tlsfront
from cdi.kube import KubeClient
from cdi.kube.requestheader import AuthenticationWatch, Caller
from cdi.kube.tlswatch import TLSProfileWatch
from cdi.uploadproxy.aggregated import AggregatedFront, write_client_ca
from cdi.uploadproxy.auth import Denied, PublicKey, authorize
from cdi.uploadproxy.front import Answer, Forward, Front
from cdi.uploadproxy.routing import NotReady, UpstreamTls, upload_path, upstream_for, wait_until_ready

log = logging.getLogger(__name__)


class UploadProxy:
    def __init__(self, client: KubeClient, namespace: str = "cdi", *, public_key: bytes | None = None,
                 upstream_tls: UpstreamTls | None = None, ready_timeout: float = 10.0) -> None:
        self.client = client
        self.key = PublicKey(client, namespace, public_key)
        self.tls = upstream_tls or UpstreamTls(client, namespace)
        self.ready_timeout = ready_timeout
        self._front: Front | None = None
        self.port = 0
        self.tls_profile: TLSProfileWatch | None = None
        self._aggregated: AggregatedFront | None = None
        self.aggregation_port = 0
        self.authentication: AuthenticationWatch | None = None
        self._client_ca_file: Path | None = None

    async def start(self, host: str, port: int, tls: tlsfront.ServerTLS | None) -> None:
        """Serve on host:port, with `tls` (its certificate; the versions and suites are CDIConfig's) or, in
        tests only, in plain HTTP."""
        if tls is not None:
            self.tls_profile = TLSProfileWatch(self.client)
            await self.tls_profile.start()
            tls = replace(tls, policy=self.tls_profile.policy)
        front = self._front = Front(asyncio.get_running_loop(), tls, self.plan)
        if self.tls_profile is not None:
            self.tls_profile.subscribe(front.set_policy)
        self.port = front.start(host, port)

    async def start_aggregation(self, host: str, port: int, tls: tlsfront.ServerTLS, state_dir: Path) -> None:
        """Also serve the aggregation layer on host:port (after `start`, with the same serving certificate
        `tls`): mutual TLS against the cluster's request-header CA, kept in `state_dir` and followed as
        `kube-system/extension-apiserver-authentication` changes."""
        self._client_ca_file = state_dir / "requestheader-client-ca.crt"
        watch = self.authentication = AuthenticationWatch(self.client)
        await watch.start()
        write_client_ca(self._client_ca_file, watch.config.client_ca)
        tls = replace(tls, client_ca_file=self._client_ca_file,
                      policy=self.tls_profile.policy if self.tls_profile is not None else tls.policy)
        front = self._aggregated = AggregatedFront(asyncio.get_running_loop(), tls, self.plan_for,
                                                   lambda: watch.config)
        if self.tls_profile is not None:
            self.tls_profile.subscribe(front.set_policy)
        watch.subscribe(self._request_headers_changed)
        self.aggregation_port = front.start(host, port)
        log.info("serving uploads through the aggregation layer on %s:%d (front-proxy names: %s)", host,
                 self.aggregation_port, ", ".join(watch.config.allowed_names) or "any")

    def _request_headers_changed(self, _data: Mapping[str, str]) -> None:
        """A rotated request-header CA: new connections are checked against it."""
        if self._aggregated is None or self._client_ca_file is None or self.authentication is None:
            return
        write_client_ca(self._client_ca_file, self.authentication.config.client_ca)
        self._aggregated.reload()

    async def certificates_renewed(self) -> None:
        """Its serving certificate was replaced in the files it serves from, or the client certificate and
        upload-server CA bundle in CDI's namespace were: new connections present the new certificate, and the
        next upload goes out with the new client certificate and bundle (not up to a recheck period later).
        What runs the proxy in-process and renews its certificates calls this (`cdi up`); a Deployment is
        rolled instead."""
        if self._front is not None:
            self._front.reload_certificate()
        if self._aggregated is not None:
            self._aggregated.reload()
        with contextlib.suppress(NotReady):
            await self.tls.context(refresh=True)

    async def stop(self) -> None:
        if self.tls_profile is not None:
            await self.tls_profile.stop()
        if self.authentication is not None:
            await self.authentication.stop()
        if self._aggregated is not None:
            await self._aggregated.closed()
        if self._front is not None:
            await self._front.closed()

    async def plan(self, path: str, authorization: str | None, target: str | None) -> Forward | Answer:
        """Where a request for `path` goes (its token checked, the upload server ready), or the refusal."""
        try:
            token = await authorize(authorization, target, self.key)
        except Denied as denied:
            log.info("refused an upload request: %s", denied.message)
            return Answer(denied.status, denied.message)
        return await self._route(token.namespace, token.name, path)

    async def plan_for(self, namespace: str, name: str, path: str, caller: Caller,
                       target: str | None) -> Forward | Answer:
        """Where a request through the aggregation layer goes: as `plan` for a token of PVC namespace/name
        (the API server authorized `caller` for `uploads/proxy` of that name), or the refusal."""
        if target and target.strip() != f"{namespace}/{name}":
            return Answer(400, f"{names.TARGET_HEADER} says {target.strip()}, the path names {namespace}/{name}")
        log.info("%s for PVC %s/%s from %s, through the aggregation layer", path, namespace, name, caller.describe())
        return await self._route(namespace, name, path)

    async def _route(self, namespace: str, name: str, path: str) -> Forward | Answer:
        try:
            pvc = await wait_until_ready(self.client, namespace, name, timeout=self.ready_timeout)
            upstream = await upstream_for(self.client, namespace, str(pvc["metadata"]["name"]), upload_path(pvc, path))
            context = await self.tls.context()
        except NotReady as exc:
            log.info("upload into %s/%s not possible now: %s", namespace, name, exc)
            return Answer(exc.status, str(exc), exc.headers)
        return Forward(upstream.url, upstream.server_hostname, context)
