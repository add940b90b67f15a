"""The proxy's one HTTP server (`cdi.common.threadfront`): every request in a thread per connection,
with blocking TLS sockets.

Every byte of an upload crosses TLS twice in the proxy (decrypted from the client, encrypted again for
the upload server with the proxy's client certificate): about 2.7 CPU-seconds per GiB through asyncio
streams here, about 1.8 with blocking `ssl` sockets in a thread.

A request to an upload path (a `POST` carries an image; a `HEAD` is the capability probe) is authorised
and routed by the proxy's coroutine on its event loop (`plan`: the one place where a connection's thread
waits for asyncio, because the answer needs the proxy's Kubernetes client, which lives there), and then
handled here: a refusal is
answered (`text/plain`, CORS headers for a browser) and the connection lingers briefly, as aiohttp's
does; otherwise the thread connects to the upload server over mutual TLS, sends the request head, pumps
the body (a reusable buffer filled by `sockfill`, then one `sendall`; chunked bodies are re-chunked), and
relays the answer (which may come early, before the whole body: then the client's body is drained
briefly and the connection closed). A client that goes away aborts the upstream connection at once,
which is what lets the upload server keep the bytes for a resumed upload. `Expect: 100-continue` is
answered here, before the token is checked, as aiohttp does. `GET /healthz`, CORS preflights (for any
path) and the 404s of other paths are answered here too; every answer to a request with an `Origin`
carries the CORS headers (`proxying.CORS`).

A connection that carried an upload is closed after its answer (`Connection: close`). Memory per
connection is one buffer of `BUFFER` bytes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import select
import socket
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import h11

from cdi.api import upload as names
from cdi.common import pki, sockfill, sockhttp, threadfront, tlsfront
from cdi.uploadproxy import proxying
from cdi.uploadproxy.proxying import ClientGone

log = logging.getLogger(__name__)

BUFFER = 1 << 20  # per connection: filled from the client, then sent on in one `sendall`
SNDBUF = 4 << 20
POLL_SECONDS = 1.0  # a quiet client: pass on what was received, and look whether the upload server answered
CONNECT_TIMEOUT = 10.0
_HOP_BY_HOP = frozenset(name.encode() for name in proxying.HOP_BY_HOP)
_NOT_FORWARDED = frozenset(name.encode() for name in proxying.NOT_FORWARDED)
_IDENTITY_PREFIXES = tuple(prefix.encode() for prefix in proxying.IDENTITY_PREFIXES)
_CORS = [(k.encode(), v.encode()) for k, v in proxying.CORS]
_UPLOAD_PATHS = frozenset(names.PROXY_PATHS)
_SERVER = b"cdi-uploadproxy"


@dataclass(frozen=True)
class Forward:
    """Send the upload to this upload server."""

    url: str
    server_hostname: str
    context: ssl.SSLContext


@dataclass(frozen=True)
class Answer:
    """Answer the request with this (a refusal)."""

    status: int
    text: str
    headers: tuple[tuple[str, str], ...] = ()


# path, authorization, target -> where the request goes: a coroutine of the proxy's event loop
Plan = Callable[[str, "str | None", "str | None"], Coroutine[Any, Any, "Forward | Answer"]]


@dataclass(frozen=True)
class Route:
    """A request whose destination was decided otherwise than by its path and token (the aggregation
    listener: the path names the PVC, the API server vouched for the user): the upload path it stands for,
    and where it goes (asked from the connection's thread, once the request is known to be well-formed)."""

    path: str
    where: Callable[[], Forward | Answer]


class Front:
    """The proxy's listening socket (`cdi.common.threadfront`): POSTs to upload paths served here."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tls: tlsfront.ServerTLS | None, plan: Plan) -> None:
        self.loop = loop  # the proxy's: where `plan` runs
        self.plan = plan
        self._front = threadfront.ThreadFront(tls, self._serve, name="uploadproxy", server=_SERVER)

    def start(self, host: str, port: int) -> int:
        return self._front.start(host, port)

    def set_policy(self, policy: pki.TLSPolicy) -> None:
        self._front.set_policy(policy)

    def reload_certificate(self) -> None:
        self._front.reload_certificate()

    def stop(self) -> None:
        self._front.stop()

    async def closed(self) -> None:
        """Stop, and wait (briefly) until the connection threads ended; in a thread, since one of them may
        be waiting for `plan` on this loop."""
        await asyncio.to_thread(self._front.close)

    def where(self, path: str, authorization: str | None, target: str | None) -> Forward | Answer:
        """Where a request goes, asked from a connection's thread. THE BOUNDARY between the threaded front
        and asyncio: `plan` needs the proxy's Kubernetes client (the token's key, the PVC, the upload
        server's Service, the client certificate), which is async and lives on the proxy's loop; the
        thread waits for it here, and nowhere else."""
        return asyncio.run_coroutine_threadsafe(self.plan(path, authorization, target), self.loop).result()

    def _serve(self, sock: threadfront.Conn, conn: h11.Connection, request: h11.Request) -> None:
        path = request.target.decode("latin-1").partition("?")[0]
        upload = _Upload(self, sock, conn, request)
        method = request.method
        preflight = upload.headers.get("access-control-request-method")
        if method == b"OPTIONS" and upload.origin and preflight:
            answer = proxying.preflight(preflight, upload.headers.get("access-control-request-headers"))
            sockhttp.text_answer(sock, conn, 204, "", [(k.encode(), v.encode()) for k, v in answer.items()],
                                 server=_SERVER)
        elif path in _UPLOAD_PATHS:
            upload.run()
        elif path == names.HEALTHZ_PATH and method in (b"GET", b"HEAD"):
            upload.answer(200, "OK")
        elif path == names.HEALTHZ_PATH:
            upload.answer(405, "405: Method Not Allowed", [(b"Allow", b"GET,HEAD")])
        else:
            upload.answer(404, "404: Not Found")


def serve_routed(sock: threadfront.Conn, conn: h11.Connection, request: h11.Request, route: Route) -> None:
    """A request to an upload path whose destination `route` decides (the aggregation listener), served as
    on the public listener."""
    _Upload(None, sock, conn, request, route).run()


class _Upload:
    """A request to an upload path: authorise, route, pump the body (a `POST`'s), relay the answer.
    With a `route` (the aggregation listener) the destination is the route's, and end-to-end TLS is
    neither offered nor accepted: the API server in between passes no protocol switch of ours on."""

    def __init__(self, front: Front | None, sock: threadfront.Conn, conn: h11.Connection, request: h11.Request,
                 route: Route | None = None) -> None:
        self.front = front
        self.route = route
        self.sock = sock
        self.conn = conn
        self.request = request
        self.headers = sockhttp.headers(request)
        self.origin = self.headers.get("origin")
        self.head = request.method == b"HEAD"
        self.body_done = False  # the client's whole body was read
        self.upstream: socket.socket | None = None

    def run(self) -> None:
        upgrade = self.request.method == b"POST" and sockhttp.asks_upgrade(self.request, names.TLS_UPGRADE)
        if self.conn.they_are_waiting_for_100_continue and not upgrade:  # as aiohttp does, before the handler
            self.sock.sendall(self._send(h11.InformationalResponse(status_code=100, headers=[])))
        target = self.request.target.decode("latin-1")
        path, _, query = target.partition("?")
        if "transfer-encoding" in self.headers and "content-length" in self.headers:
            # which one frames the body is exactly what a request smuggler plays on: refused, as aiohttp does
            self.answer(400, "a request with both Transfer-Encoding and Content-Length is ambiguous")
            self._linger()
            return
        if self.route is not None:
            if upgrade:
                self.answer(400, f"{names.TLS_UPGRADE} is not offered through the Kubernetes API server")
                self._linger()
                return
            plan = self.route.where()
        else:
            assert self.front is not None
            plan = self.front.where(path, self.headers.get("authorization"),
                                    self.headers.get(names.TARGET_HEADER.lower()))
        try:
            if isinstance(plan, Answer):
                self.answer(plan.status, plan.text, [(k.encode(), v.encode()) for k, v in plan.headers])
            elif upgrade:
                self._pass_through(plan, path, query)
            else:
                self._forward(plan, query)
        finally:
            if self.upstream is not None:
                self.upstream.close()
        if not self.body_done:
            self._linger()

    # -- end-to-end TLS (`cdi.api.upload`) ------------------------------------------------------------------
    def _pass_through(self, plan: Forward, path: str, query: str) -> None:
        """The upload server switches this connection to end-to-end TLS with the client; the proxy then
        only splices TCP bytes."""
        if path not in names.RAW_PROXY_PATHS or self.headers.get("content-length", "0") != "0" \
                or "transfer-encoding" in self.headers:
            self.answer(400, f"only a raw upload without a body ({', '.join(names.RAW_PROXY_PATHS)}) can be "
                              f"upgraded to {names.TLS_UPGRADE}")
            return
        self.conn.next_event()  # the end of the (empty) request: h11 lets the connection switch after it
        upstream = self._connect(plan)
        if upstream is None:
            return
        url = urlsplit(plan.url)
        nonce = secrets.token_urlsafe(32)
        headers = self._forwarded_headers(url.netloc)
        headers += [(b"Content-Length", b"0"), (b"Connection", b"Upgrade"),
                    (b"Upgrade", names.TLS_UPGRADE.encode()), (names.NONCE_HEADER.encode(), nonce.encode())]
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=sockhttp.MAX_HEAD)
        target = url.path + (f"?{query}" if query else "")
        try:
            upstream.settimeout(sockhttp.HEAD_TIMEOUT)
            upstream.sendall(up.send(h11.Request(method=b"POST", target=target, headers=headers)) +
                             up.send(h11.EndOfMessage()))
            answer = sockhttp.read_event(upstream, up)
            if not (isinstance(answer, h11.InformationalResponse) and answer.status_code == 101):
                self._relay(upstream, up, answer)  # a refusal (busy, done, ...), as it would answer any upload
                return
            self.upstream = sockhttp.unwrap(upstream)
        except (OSError, h11.ProtocolError) as exc:
            log.warning("switching an upload to %s to end-to-end TLS failed: %s", plan.server_hostname, exc)
            if self.conn.our_state is h11.SEND_RESPONSE:
                self.answer(502, f"error in upload-proxy: {exc}")
            return
        ca = "".join(ssl.DER_cert_to_PEM_cert(der) for der in plan.context.get_ca_certs(binary_form=True))
        self.body_done = True
        try:
            client = sockhttp.switch(self.sock, self.conn, [
                (b"Connection", b"Upgrade"), (b"Upgrade", names.TLS_UPGRADE.encode()),
                (names.NONCE_HEADER.encode(), nonce.encode()),
                (names.SERVER_NAME_HEADER.encode(), plan.server_hostname.encode()),
                (names.SERVER_CA_HEADER.encode(), base64.b64encode(ca.encode()))])
        except OSError as exc:
            log.info("the client went away while an upload to %s switched to end-to-end TLS: %s",
                     plan.server_hostname, exc)
            return
        with client:
            sockhttp.pass_through(client, self.upstream)

    # -- forwarding ---------------------------------------------------------------------------------------
    def _connect(self, plan: Forward) -> ssl.SSLSocket | None:
        """A mutual-TLS connection to the upload server (None: the client was answered 502)."""
        url = urlsplit(plan.url)
        host, port = url.hostname or "", url.port or names.UPLOAD_PORT
        try:
            raw = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
            try:
                upstream = plan.context.wrap_socket(raw, server_hostname=plan.server_hostname)
            except BaseException:
                raw.close()
                raise
        except (OSError, ssl.SSLError) as exc:
            log.warning("forwarding to %s failed: %s", plan.server_hostname, exc)
            self.answer(502, f"error in upload-proxy: {exc}")
            return None
        upstream.settimeout(None)
        self.upstream = upstream
        return upstream

    def _forwarded_headers(self, netloc: str) -> list[tuple[bytes, bytes]]:
        """The client's end-to-end headers for the upload server (framing, credentials and identities are the
        proxy's business: whoever the aggregation layer named, or a client claimed to be, goes no further)."""
        return [(b"Host", netloc.encode("latin-1")),
                *((k, v) for k, v in self.request.headers.raw_items()
                  if k.lower() not in _NOT_FORWARDED and not k.lower().startswith(_IDENTITY_PREFIXES))]

    def _forward(self, plan: Forward, query: str) -> None:
        upstream = self._connect(plan)
        if upstream is None:
            return
        url = urlsplit(plan.url)
        headers = self._forwarded_headers(url.netloc)
        length = self.headers.get("content-length")
        chunked = length is None and "chunked" in self.headers.get("transfer-encoding", "").lower()
        if chunked:
            headers.append((b"Transfer-Encoding", b"chunked"))
        else:
            headers.append((b"Content-Length", (length or "0").encode()))
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=sockhttp.MAX_HEAD)
        target = url.path + (f"?{query}" if query else "")
        broken: OSError | None = None
        early = False
        try:
            upstream.sendall(up.send(h11.Request(method=self.request.method, target=target, headers=headers)))
            early = self._pump(upstream, up, chunked)
        except ClientGone as exc:
            log.info("the client went away during an upload to %s (%s); the upload server was told",
                     plan.server_hostname, exc)
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_RDWR)  # abort: the upload server sees the body cut off
            return
        except OSError as exc:  # the upload server went away; it may have answered first
            broken = exc
        try:
            self._relay(upstream, up, early=early or broken is not None)
        except (OSError, h11.ProtocolError) as exc:
            if self.conn.our_state is h11.SEND_RESPONSE:
                cause = broken or exc
                log.warning("forwarding to %s failed: %s", plan.server_hostname, cause)
                self.answer(502, f"error in upload-proxy: {cause}")
            else:
                log.warning("relaying the answer of %s failed: %s", plan.server_hostname, exc)

    def _pump(self, upstream: socket.socket, up: h11.Connection, chunked: bool) -> bool:
        """The client's body to the upload server; True when the upload server answered before its end."""
        if chunked:
            return self._pump_chunked(upstream, up)
        view = memoryview(bytearray(BUFFER))
        remaining = int(self.headers.get("content-length") or 0)
        while True:  # what h11 already holds of the body
            event = self.conn.next_event()
            if isinstance(event, h11.Data):
                remaining -= len(event.data)
                upstream.sendall(up.send(h11.Data(data=event.data)))
            elif isinstance(event, h11.EndOfMessage):
                self.body_done = True
                upstream.sendall(up.send(h11.EndOfMessage()))
                return False
            else:
                break
        filler = sockfill.Filler(self.sock)
        while remaining > 0:
            try:  # a quiet client: what arrived is passed on, and we look whether the upload server answered
                n = filler.fill(view[:min(BUFFER, remaining)], POLL_SECONDS, POLL_SECONDS)
            except TimeoutError:
                if _answered(upstream, up):
                    return True
                continue
            except OSError as exc:
                raise ClientGone(str(exc)) from exc
            if not n:
                raise ClientGone(f"the connection closed with {remaining} bytes of the body still to come")
            remaining -= n
            if _answered(upstream, up):
                return True
            self._send_up(upstream, up, view[:n])
        self.body_done = True
        self.sock.settimeout(None)
        upstream.sendall(up.send(h11.EndOfMessage()))
        return False

    def _send_up(self, upstream: socket.socket, up: h11.Connection, data: memoryview) -> None:
        # h11 passes the data through untouched (a view of the buffer, never copied); its types say bytes
        for piece in up.send_with_data_passthrough(h11.Data(data=cast(bytes, data))) or ():
            upstream.sendall(piece)

    def _pump_chunked(self, upstream: socket.socket, up: h11.Connection) -> bool:
        self.sock.settimeout(POLL_SECONDS)
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise ClientGone(f"a broken chunked body: {exc}") from exc
            if event is h11.NEED_DATA:
                try:
                    data = self.sock.recv(65536)
                except TimeoutError:
                    if _answered(upstream, up):
                        return True
                    continue
                except OSError as exc:
                    raise ClientGone(str(exc)) from exc
                if not data:
                    raise ClientGone("the connection closed in the middle of a chunked body")
                self.conn.receive_data(data)
            elif isinstance(event, h11.Data):
                if _answered(upstream, up):
                    return True
                upstream.sendall(up.send(h11.Data(data=event.data)))
            elif isinstance(event, h11.EndOfMessage):
                self.body_done = True
                self.sock.settimeout(None)
                upstream.sendall(up.send(h11.EndOfMessage()))
                return False

    def _relay(self, upstream: socket.socket, up: h11.Connection, response: object = None, *,
               early: bool = False) -> None:
        """The upload server's answer (from `response`, when its head was read already), streamed to the client.

        `early`: it answered before the client's whole body was passed on. A refusal may come early; a
        success may not (the upload server cannot have the whole image), so that is answered 502 instead
        of being passed on as if the upload had been taken."""
        response = response or _next(upstream, up)
        while isinstance(response, h11.InformationalResponse):
            response = _next(upstream, up)
        if not isinstance(response, h11.Response):
            raise h11.RemoteProtocolError(f"the upload server sent {response!r} instead of an answer")
        if early and 200 <= response.status_code < 300:
            log.error("the upload server answered %d before the whole body was sent to it", response.status_code)
            self.answer(502, f"error in upload-proxy: the upload server answered {response.status_code} before "
                              "the whole body was sent to it; the upload did not complete")
            return
        headers = [(k, v) for k, v in response.headers.raw_items() if k.lower() not in _HOP_BY_HOP]
        length = next((v for k, v in response.headers.raw_items() if k.lower() == b"content-length"), None)
        if length is not None:
            headers.append((b"Content-Length", length))
        if self.head and response.status_code == 200 and self.route is None and \
                self.request.target.decode("latin-1").partition("?")[0] in names.RAW_PROXY_PATHS:
            headers.append((b"Upgrade", names.TLS_UPGRADE.encode()))  # end-to-end TLS on offer (cdi.api.upload)
        self.sock.settimeout(None)
        self.sock.sendall(self._send(h11.Response(status_code=response.status_code, reason=response.reason,
                                                  headers=self._finish_headers(headers))))
        while True:
            event = _next(upstream, up)
            if isinstance(event, h11.Data):
                self.sock.sendall(self._send(h11.Data(data=event.data)))
            elif isinstance(event, h11.EndOfMessage):
                self.sock.sendall(self._send(h11.EndOfMessage()))
                return
            else:
                raise h11.RemoteProtocolError(f"the upload server's answer ended with {event!r}")

    # -- answering ----------------------------------------------------------------------------------------
    def answer(self, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        sockhttp.text_answer(self.sock, self.conn, status, text, self._finish_headers(headers or [])[:-1],
                             server=_SERVER, head=self.head)

    def _finish_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        if self.origin:
            cors = {k.lower() for k, _ in _CORS}
            headers = [(k, v) for k, v in headers if k.lower() not in cors] + _CORS
        return [*headers, (b"Connection", b"close")]

    def _send(self, event: h11.Event) -> bytes:
        return sockhttp.send(self.conn, event)

    def _linger(self) -> None:
        sockhttp.linger(self.sock)


def _next(upstream: socket.socket, up: h11.Connection) -> h11.Event | type[h11.PAUSED]:
    while True:
        event = up.next_event()
        if event is not h11.NEED_DATA:
            return cast("h11.Event | type[h11.PAUSED]", event)
        data = upstream.recv(65536)
        if not data and up.their_state is h11.SEND_RESPONSE:  # said plainly, not in h11's state names
            raise h11.RemoteProtocolError("the upload server closed the connection without an answer")
        up.receive_data(data)


def _answered(upstream: socket.socket, up: h11.Connection) -> bool:
    """Whether the upload server answered (or closed) already; what it sent is given to `up`, a broken
    connection raises as a send would. (TLS 1.3 session tickets make the socket readable without any
    answer: they are consumed here.)"""
    if not (isinstance(upstream, ssl.SSLSocket) and upstream.pending()) and \
            not select.select([upstream], [], [], 0)[0]:
        return False
    upstream.settimeout(0.0)
    try:
        data = upstream.recv(65536)
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    finally:
        upstream.settimeout(None)
    if data:
        up.receive_data(data)
    return True  # or closed: `_next` says so
