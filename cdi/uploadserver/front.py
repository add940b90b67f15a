"""The upload server's listening socket (`cdi.common.threadfront`): the bodies of raw uploads are read in
a thread per connection from a blocking TLS socket.

Receiving through asyncio (uvloop) streams costs about 1.5 CPU-seconds per GiB in TLS and transport
code before the importer sees a byte; a blocking TLS connection read into 1 MiB buffers about 1.2, with
the GIL released while OpenSSL decrypts, so the importer's threads run meanwhile; each buffer filled in
one call (`cdi.common.tlsfront`'s native path) instead of a `recv_into` per 16 KiB TLS record, 15-20 %
less again, and no wait for the GIL between records.

Host-assisted clone streams (`x-cdi-content-type: filesystem-clone` / `blockdevice-clone`, with a
`Content-Length`) are read here too, in 4 MiB buffers, and written in place (`cdi.uploadserver.clonesink`).

A `POST` with a `Content-Length` to a raw upload path (sync, async, archive) is served here: the request
is checked and admitted by the same code as before (`UploadServer.admit_raw`, on the event loop), the
body is read in 1 MiB chunks and put by the reading thread straight into the importer's queue of the
session (`UploadSession.receive`; `BodyBridge`), and the session's answer is written back. The client's
certificate is checked as before (`getpeercert`). Everything else (healthz, HEAD, forms, chunked bodies,
other methods) goes to the aiohttp application with the client's verified certificate. A connection
that carried an upload is closed after its answer; when the answer comes before the whole body (a
refusal, the importer gave up), the rest is drained briefly first, as aiohttp does."""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import h11

from cdi.api import upload as names
from cdi.common import clonestream, sockfill, sockhttp, threadfront, tlsfront
from cdi.common.threadfront import Conn
from cdi.uploadserver import clonesink
from cdi.uploadserver.feed import Chunk, FedStream
from cdi.uploadserver.session import Outcome

log = logging.getLogger(__name__)

CHUNK = 1 << 20
POLL_SECONDS = 1.0  # a quiet client: look whether the session still wants the body
PAUSE_SECONDS = 0.05  # a client that pauses in the middle of a chunk: what arrived is handed on
_END = object()
_SERVER = b"cdi-uploadserver"
_RAW = {**{p: (False, True) for p in names.SYNC_PATHS}, **{p: (False, False) for p in names.ASYNC_PATHS},
        **{p: (True, True) for p in names.ARCHIVE_PATHS}}  # path -> (archive, wait for durable)
_ALL = {*_RAW, *names.FORM_SYNC_PATHS, *names.FORM_ASYNC_PATHS}  # a clone stream may come to any
CLONE_IDLE_SECONDS = 60.0  # a clone source that sends nothing for this long is gone


class BodyBridge:
    """A body read by a thread and fed straight into the importer's queue, its end seen by the event loop.

    The session attaches its queue before it waits for the body (`attach`); the reading thread then puts
    every chunk into that queue itself, blocking while it is full, with the session's `arrived` and `fed`
    around each (its counters, the head it sniffs, the clock of its idle watchdog). The event loop sees
    no chunk, only the end of the body or the client's error, through this async iterator. Handing each
    MiB through the event loop cost 0.7-1 CPU-s per 4 GiB there; without that hop, A/B through `cdi up`:
    +7 % throughput (4 pairs of 5), -5 % upload-server CPU."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ends: asyncio.Queue[BaseException | object] = asyncio.Queue()
        self.stopped = threading.Event()  # the consumer is gone (done, failed, cancelled)
        self._attached = threading.Event()
        self._feed: tuple[FedStream, Callable[[Chunk], None], Callable[[], None]] | None = None
        self.buffers = ReceiveBuffers(CHUNK)  # the reading thread's; the importer gives them back through the queue

    def attach(self, queue: FedStream, arrived: Callable[[Chunk], None], fed: Callable[[], None]) -> None:
        queue.recycle_with(self.buffers.give_back)
        self._feed = queue, arrived, fed
        self._attached.set()

    # -- the reading thread -----------------------------------------------------------------------------
    def put(self, chunk: Chunk) -> bool:
        """Hand a chunk to the importer, waiting while its queue is full; False once the consumer stopped."""
        while not self._attached.wait(POLL_SECONDS):
            if self.stopped.is_set():
                return False
        assert self._feed is not None
        queue, arrived, fed = self._feed
        arrived(chunk)
        if self.stopped.is_set() or not queue.put_blocking(chunk, self.stopped, POLL_SECONDS):
            return False
        fed()
        return True

    def close(self) -> None:
        """The consumer is done with the body (the reading thread stops)."""
        self.stopped.set()

    def end(self, error: BaseException | None = None) -> None:
        """The body is complete (after its last `put`), or broke with `error`."""
        self.loop.call_soon_threadsafe(self.ends.put_nowait, _END if error is None else error)

    # -- the event loop ---------------------------------------------------------------------------------
    def __aiter__(self) -> BodyBridge:
        return self

    async def __anext__(self) -> Chunk:
        try:
            item = await self.ends.get()
        finally:
            self.stopped.set()
        if isinstance(item, BaseException):
            raise item
        raise StopAsyncIteration


class Front:
    def __init__(self, loop: asyncio.AbstractEventLoop, tls: tlsfront.ServerTLS, server: Any,
                 end_to_end: tlsfront.ServerTLS | None = None) -> None:
        self.loop = loop
        self.server = server  # UploadServer: admit_raw, receive_raw, authorized_peer, request_done
        # the server side of end-to-end TLS with a client (no client certificate)
        self.end_to_end = end_to_end.acceptor() if end_to_end is not None else None
        self._front = threadfront.ThreadFront(loop, tls, self._serve, server.adopt, name="uploadserver")

    def start(self, host: str, port: int) -> int:
        return self._front.start(host, port, backlog=16)

    def stop(self) -> None:
        self._front.stop()

    async def closed(self) -> None:
        await self._front.closed()

    def _serve(self, sock: Conn, conn: h11.Connection, request: h11.Request) -> bool:
        path = request.target.decode("latin-1").partition("?")[0]
        headers = sockhttp.headers(request)
        if request.method == b"POST" and sockhttp.asks_upgrade(request, names.TLS_UPGRADE):
            self._end_to_end(sock, conn, path, headers)
            return True
        if request.method != b"POST" or path not in _ALL or "content-length" not in headers \
                or "transfer-encoding" in headers:  # chunked or ambiguous: aiohttp's to read (and refuse)
            return False
        if headers.get(names.CONTENT_TYPE_HEADER) in clonestream.CONTENT_TYPES:
            self._serve_clone(sock, conn, headers)
            return True
        if path not in _RAW or names.CONTENT_TYPE_HEADER in headers:  # forms; an unknown content type: aiohttp's
            return False
        peer = tlsfront.peer_cert(sock)
        self._serve_raw(sock, conn, path, headers, self.server.authorized_peer(peer))
        return True

    def _serve_clone(self, sock: Conn, conn: h11.Connection, headers: dict[str, str]) -> None:
        """A host-assisted clone stream (`cdi.uploadserver.clonesink`), read and written in this thread."""
        if conn.they_are_waiting_for_100_continue:
            sock.sendall(sockhttp.send(conn, h11.InformationalResponse(status_code=100, headers=[])))
        authorized = self.server.authorized_peer(tlsfront.peer_cert(sock))
        body_done = False
        try:
            outcome = self._call(lambda: self.server.admit_clone(authorized))
            if outcome is None:
                head = bytearray()
                while isinstance(event := conn.next_event(), h11.Data):  # what h11 already holds of the body
                    head += event.data
                filler = sockfill.Filler(sock)
                reader = clonesink.Reader(lambda view: filler.fill(view, CLONE_IDLE_SECONDS, PAUSE_SECONDS),
                                          bytes(head))
                result: clonesink.CloneResult | BaseException
                try:
                    result = clonesink.receive(reader, self.server.config)
                    body_done = reader.received == int(headers["content-length"])
                except (clonesink.CloneRefused, clonesink.StreamCut, OSError) as exc:
                    result = exc
                outcome = self._call(lambda: self.server.clone_finished(result))
            sockhttp.text_answer(sock, conn, outcome.status, outcome.message, server=_SERVER)
        finally:
            self.loop.call_soon_threadsafe(self.server.request_done)
        if not body_done:
            sockhttp.linger(sock)

    def _end_to_end(self, sock: Conn, conn: h11.Connection, path: str, headers: dict[str, str]) -> None:
        """The proxy's upgrade: answer 101, end its TLS session, and serve the one upload of the client's new
        TLS session that carries the nonce the proxy gave (`cdi.api.upload`)."""
        peer = tlsfront.peer_cert(sock)
        nonce = headers.get(names.NONCE_HEADER.lower(), "")
        refusal = None
        if not self.server.authorized_peer(peer):
            refusal = 401, f"a client certificate for {self.server.config.client_name} is required"
        elif self.end_to_end is None:
            refusal = 400, f"this upload server does not offer {names.TLS_UPGRADE}"
        elif path not in _RAW or len(nonce) < 32 or headers.get("content-length", "0") != "0" or \
                not isinstance(conn.next_event(), h11.EndOfMessage):
            refusal = 400, (f"an upgrade to {names.TLS_UPGRADE} needs a raw upload path, no body and a "
                            f"{names.NONCE_HEADER} of at least 32 characters")
        if refusal is not None:
            log.warning("refused an upgrade to end-to-end TLS: %s", refusal[1])
            sockhttp.text_answer(sock, conn, *refusal, server=_SERVER)
            return
        assert self.end_to_end is not None
        plain = sockhttp.switch(sock, conn, [(b"Connection", b"Upgrade"), (b"Upgrade", names.TLS_UPGRADE.encode())])
        try:
            client = self.end_to_end.accept(plain, sockhttp.HEAD_TIMEOUT)
        except (OSError, ValueError) as exc:
            plain.close()
            log.warning("the end-to-end TLS handshake with a client failed: %s", exc)
            return
        with client:
            inner = h11.Connection(h11.SERVER, max_incomplete_event_size=sockhttp.MAX_HEAD)
            try:
                request = sockhttp.read_event(client, inner)
            except h11.RemoteProtocolError as exc:
                sockhttp.text_answer(client, inner, 400, f"a broken request: {exc}", server=_SERVER)
                return
            if not isinstance(request, h11.Request):
                return  # the client went away before its request
            inner_headers = sockhttp.headers(request)
            refusal = None
            if not hmac.compare_digest(inner_headers.get(names.NONCE_HEADER.lower(), "").encode(), nonce.encode()):
                log.warning("refused an end-to-end TLS upload without the proxy's nonce")
                refusal = 401, f"{names.NONCE_HEADER} does not match"
            elif request.method != b"POST" or "content-length" not in inner_headers \
                    or "transfer-encoding" in inner_headers:
                refusal = 400, "an end-to-end TLS upload is a POST with a Content-Length"
            if refusal is not None:
                sockhttp.text_answer(client, inner, *refusal, server=_SERVER)
                sockhttp.linger(client)  # the client may be sending its body: let it see the answer
                return
            self._serve_raw(client, inner, path, inner_headers, True)  # at the path the proxy named

    def _serve_raw(self, sock: Conn, conn: h11.Connection, path: str, headers: dict[str, str],
                   authorized: bool) -> None:
        archive, wait = _RAW[path]
        if conn.they_are_waiting_for_100_continue:  # as aiohttp does, before the handler
            sock.sendall(sockhttp.send(conn, h11.InformationalResponse(status_code=100, headers=[])))
        body_done = False
        try:
            admitted = self._call(lambda: self.server.admit_raw(authorized, headers, archive))
            if isinstance(admitted, Outcome):
                outcome = admitted
            else:
                length = int(headers["content-length"])
                bridge = BodyBridge(self.loop)
                future = asyncio.run_coroutine_threadsafe(
                    self.server.receive_raw(bridge, archive=archive, wait_for_durable=wait, offset=admitted,
                                            length=length), self.loop)
                body_done = _read_body(sock, conn, bridge, length)
                outcome = future.result()
            sockhttp.text_answer(sock, conn, outcome.status, outcome.message,
                                    [(k.encode("latin-1"), v.encode("latin-1")) for k, v in outcome.headers.items()],
                                    server=_SERVER)
        finally:
            self.loop.call_soon_threadsafe(self.server.request_done)
        if not body_done:
            sockhttp.linger(sock)

    def _call(self, make: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return make()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result()


class ReceiveBuffers:
    """The reading thread's 1 MiB buffers, filled again once the importer handed them back: a fresh buffer
    costs a zero fill, page faults and their kernel zeroing, ~10 % of the reading thread, which is the
    busiest of the upload. A buffer is taken again only after `give_back`, which the importer's queue
    calls when the importer said it is done with that chunk (`FedStream.give_back`: written, no view of
    it left); a chunk nobody hands back is simply not reused. Ownership is explicit, never guessed from
    reference counts (which the interpreter does not promise to keep meaningful)."""

    # more than the chunks in flight while the disk keeps up (bridge, importer queue, a write); when it
    # falls behind, the session's queue holds up to QUEUE_BYTES and the extra buffers are fresh ones,
    # which costs the reading thread nothing that matters then: it waits for the disk anyway
    KEEP = 16

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: deque[bytearray] = deque()  # append and pop are atomic: the importer's thread gives back
        self.fresh = 0  # buffers made (the rest were given back and reused)

    def get(self, size: int) -> bytearray:
        if size == self.size:
            try:
                return self._free.pop()
            except IndexError:
                pass
        self.fresh += 1
        return bytearray(size)

    def give_back(self, chunk: Chunk) -> None:
        """`chunk` is free to be filled again: its last holder let go of it."""
        if type(chunk) is bytearray and len(chunk) == self.size and len(self._free) < self.KEEP:
            self._free.append(chunk)


def _read_body(sock: Conn, conn: h11.Connection, bridge: BodyBridge, length: int) -> bool:
    """The body into the bridge; True when all of it was read."""
    remaining = length
    while True:  # what h11 already holds of the body
        event = conn.next_event()
        if isinstance(event, h11.Data):
            remaining -= len(event.data)
            if not bridge.put(event.data):
                return False
        elif isinstance(event, h11.EndOfMessage):
            bridge.end()
            return True
        else:
            break
    buffers = bridge.buffers
    filler = sockfill.Filler(sock)
    while remaining > 0:
        buffer = buffers.get(min(CHUNK, remaining))  # handed on whole, no copy on the way to the importer's writer
        try:
            n = filler.fill(buffer, POLL_SECONDS, PAUSE_SECONDS)
        except TimeoutError:
            if bridge.stopped.is_set():
                return False
            continue
        except OSError as exc:
            bridge.end(ConnectionResetError(f"the connection broke: {exc}"))
            return False
        if not n:
            bridge.end(ConnectionResetError(f"the connection closed with {remaining} bytes of the body still to come"))
            return False
        remaining -= n
        if n < len(buffer):  # a pause or the end of the connection: what arrived, in a buffer of its own
            whole, buffer = buffer, buffer[:n]
            buffers.give_back(whole)  # never handed on: still ours
        if not bridge.put(buffer):
            return False
    bridge.end()
    sock.settimeout(None)
    return True
