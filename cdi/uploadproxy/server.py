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
The listening socket belongs to `front.py`: it serves the `POST`s of uploads itself, with blocking TLS
sockets in a thread per connection (a third of the CPU per byte of going through asyncio streams), and
hands every other request to the aiohttp application below, which answers them as before. No body is
buffered beyond one batch: a slow disk makes a slow client (the socket buffers fill), and a client that
goes away aborts the upstream connection at once, which is what lets the upload server keep the bytes
for a resumed upload. Headers of our resume extension (`Upload-Offset`, `Upload-State`) pass both ways.
A raw upload can instead be switched to end-to-end TLS with the upload server (`cdi.api.upload`): the
proxy authorises it as any other, then only splices TCP bytes; its answer to the `HEAD` probe offers it.

CORS allows every origin, as CDI's (a browser uploading with the form endpoints)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from cdi.api import upload as names
from cdi.common import tlsfront
from cdi.kube import KubeClient
from cdi.uploadproxy.auth import Denied, PublicKey, authorize
from cdi.uploadproxy.front import Answer, Forward, Front
from cdi.uploadproxy.proxying import CORS, HOP_BY_HOP, NOT_FORWARDED, ClientGone, preflight
from cdi.uploadproxy.routing import NotReady, UpstreamTls, upload_path, upstream_for, wait_until_ready

log = logging.getLogger(__name__)

READ_BUFSIZE = 4 << 20
WRITE_SLICE = 256 << 10
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class UploadProxy:
    def __init__(self, client: KubeClient, namespace: str = "cdi", *, public_key: bytes | None = None,
                 upstream_tls: UpstreamTls | None = None, ready_timeout: float = 10.0) -> None:
        self.client = client
        self.key = PublicKey(client, namespace, public_key)
        self.tls = upstream_tls or UpstreamTls(client, namespace)
        self.ready_timeout = ready_timeout
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._front: Front | None = None
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_cors])
        app.router.add_get(names.HEALTHZ_PATH, _healthz)
        for path in names.PROXY_PATHS:
            app.router.add_route("*", path, self.handle)
        return app

    async def start(self, host: str, port: int, tls: tlsfront.ServerTLS | None) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False)
        # lingering: after the upload server refused a request early, read the rest of the client's body only
        # briefly before closing, so the client sees the answer but does not keep sending
        self._runner = web.AppRunner(self.app(), access_log=None, read_bufsize=READ_BUFSIZE,
                                     handler_cancellation=False, lingering_time=1.0)
        await self._runner.setup()
        self._front = Front(asyncio.get_running_loop(), tls, self.plan, self._adopt)
        self.port = self._front.start(host, port)

    async def _adopt(self, sock: socket.socket, _peer: object) -> None:
        """A connection the front hands over (everything but the bytes of uploads), served by the app."""
        assert self._runner is not None and self._runner.server is not None
        await asyncio.get_running_loop().connect_accepted_socket(self._runner.server, sock)

    async def stop(self) -> None:
        if self._front is not None:
            self._front.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._front is not None:
            await self._front.closed()
        if self._session is not None:
            await self._session.close()
        self.tls.close()

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
            return Answer(exc.status, str(exc))
        return Forward(upstream.url, upstream.server_hostname, context)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Upload paths with methods other than POST (HEAD probes); POSTs are served by the front."""
        plan = await self.plan(request.path, request.headers.get("Authorization"),
                               request.headers.get(names.TARGET_HEADER))
        if isinstance(plan, Answer):
            return web.Response(status=plan.status, text=plan.text)
        return await self._forward(request, plan.url, plan.server_hostname, plan.context)

    async def _forward(self, request: web.Request, url: str, server_hostname: str,
                       context: ssl.SSLContext) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED}
        body: AsyncIterator[bytes | memoryview] | None = None
        if request.body_exists:
            body = _body(request)
            if request.content_length is not None:
                headers["Content-Length"] = str(request.content_length)
        if request.query_string:
            url = f"{url}?{request.query_string}"
        try:
            async with self._session.request(request.method, url, headers=headers, data=body, ssl=context,
                                             server_hostname=server_hostname) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
                if upstream.content_length is not None:
                    response.content_length = upstream.content_length
                if request.method == "HEAD" and upstream.status == 200 and request.path in names.RAW_PROXY_PATHS:
                    response.headers["Upgrade"] = names.TLS_UPGRADE  # end-to-end TLS on offer (cdi.api.upload)
                if request.headers.get("Origin"):
                    _allow(response)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except ClientGone:
            log.info("the client went away during an upload to %s; the upload server was told", server_hostname)
            return web.Response(status=499)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            if isinstance(exc.__cause__, ClientGone) or isinstance(exc.__context__, ClientGone):
                return web.Response(status=499)
            log.warning("forwarding to %s failed: %s", server_hostname, exc)
            return web.Response(status=502, text=f"error in upload-proxy: {exc}")


async def _body(request: web.Request) -> AsyncIterator[bytes | memoryview]:
    """The client's body as it arrives; a broken client connection aborts the upstream request.

    What arrived is passed on in slices of at most `WRITE_SLICE` bytes: on Python 3.11 a transport keeps
    what the socket did not take in one bytearray and moves the rest down after every send, so a
    multi-megabyte write costs quadratic copying; slices the socket takes whole never wait there."""
    try:
        async for chunk, _ in request.content.iter_chunks():  # as received: no joining copy
            if len(chunk) <= WRITE_SLICE:
                yield chunk
                continue
            view = memoryview(chunk)
            for start in range(0, len(view), WRITE_SLICE):
                yield view[start:start + WRITE_SLICE]
    except (ConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
        raise ClientGone(str(exc)) from exc


@web.middleware
async def _cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """CORS for every origin (CDI's proxy uses rs/cors AllowAll)."""
    origin = request.headers.get("Origin")
    if request.method == "OPTIONS" and origin and request.headers.get("Access-Control-Request-Method"):
        return web.Response(status=204, headers=preflight(request.headers["Access-Control-Request-Method"],
                                                          request.headers.get("Access-Control-Request-Headers")))
    response = await handler(request)
    if origin:
        _allow(response)
    return response


def _allow(response: web.StreamResponse) -> None:
    if response.prepared:
        return  # a streamed answer already carries the upload server's headers
    response.headers.update(CORS)


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="OK")

