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
(`cdi.kube.tlswatch`), as CDI's proxy does."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from cdi.common import tlsfront
from cdi.kube import KubeClient
from cdi.kube.tlswatch import TLSProfileWatch
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

    async def certificates_renewed(self) -> None:
        """Its serving certificate was replaced in the files it serves from, or the client certificate and
        upload-server CA bundle in CDI's namespace were: new connections present the new certificate, and the
        next upload goes out with the new client certificate and bundle (not up to a recheck period later).
        What runs the proxy in-process and renews its certificates calls this (`cdi up`); a Deployment is
        rolled instead."""
        if self._front is not None:
            self._front.reload_certificate()
        with contextlib.suppress(NotReady):
            await self.tls.context(refresh=True)

    async def stop(self) -> None:
        if self.tls_profile is not None:
            await self.tls_profile.stop()
        if self._front is not None:
            await self._front.closed()

    async def plan(self, path: str, authorization: str | None, target: str | None) -> Forward | Answer:
        """Where a request for `path` goes (its token checked, the upload server ready), or the refusal."""
        try:
            token = await authorize(authorization, target, self.key)
        except Denied as denied:
            log.info("refused an upload request: %s", denied.message)
            return Answer(denied.status, denied.message)
        try:
            pvc = await wait_until_ready(self.client, token.namespace, token.name, timeout=self.ready_timeout)
            upstream = await upstream_for(self.client, token.namespace, str(pvc["metadata"]["name"]),
                                          upload_path(pvc, path))
            context = await self.tls.context()
        except NotReady as exc:
            log.info("upload into %s/%s not possible now: %s", token.namespace, token.name, exc)
            return Answer(exc.status, str(exc), exc.headers)
        return Forward(upstream.url, upstream.server_hostname, context)
