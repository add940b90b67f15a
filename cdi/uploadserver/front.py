"""The upload server's one HTTP server (`cdi.common.threadfront`): every request is read and answered
in a thread per connection, on a blocking TLS socket.

Receiving through asyncio (uvloop) streams costs about 1.5 CPU-seconds per GiB in TLS and transport
code before the importer sees a byte; a blocking TLS connection read into 1 MiB buffers about 1.2, with
the GIL released while OpenSSL decrypts, so the importer's threads run meanwhile; each buffer filled in
one call (`cdi.common.tlsfront`'s native path) instead of a `recv_into` per 16 KiB TLS record, 15-20 %
less again, and no wait for the GIL between records.

Host-assisted clone streams (`x-cdi-content-type: filesystem-clone` / `blockdevice-clone`, with a
`Content-Length`) are read here too, in 4 MiB buffers, and written in place (`cdi.uploadserver.clonesink`).

An upload `POST` is checked and admitted by the server (`UploadServer.admit`, on the event loop); its
body is read by the connection's thread and put straight into the importer's queue of the session
(`UploadSession.receive`; `BodyBridge`), and the session's answer is written back. A body with a
`Content-Length` is read in 1 MiB buffers; a chunked one (trailers allowed) through h11; a form
(multipart, `multipart.PushMultipartParser`, streaming) has its part `file` fed, the parts before it
skipped, as CDI does. `GET /healthz`, the `HEAD` probe and the 404s of other methods are answered here
too. The client's certificate is checked on every upload request (`getpeercert`). A connection is
closed after its answer; when the answer comes before the whole body (a refusal, the importer gave up),
the rest is drained briefly first, as Go's server does."""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import h11
import multipart

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
        self._front = threadfront.ThreadFront(loop, tls, self._serve, name="uploadserver", server=_SERVER)

    def start(self, host: str, port: int) -> int:
        return self._front.start(host, port, backlog=16)

    def stop(self) -> None:
        self._front.stop()

    async def closed(self) -> None:
        await self._front.closed()

    def _serve(self, sock: Conn, conn: h11.Connection, request: h11.Request) -> None:
        path = request.target.decode("latin-1").partition("?")[0]
        headers = sockhttp.headers(request)
        method = request.method
        if path == names.HEALTHZ_PATH:
            if method in (b"GET", b"HEAD"):
                _answer(sock, conn, 200, "OK", head=method == b"HEAD")
            else:
                _answer(sock, conn, 405, "405: Method Not Allowed", [(b"Allow", b"GET,HEAD")])
            return
        if path not in _ALL:
            _answer(sock, conn, 404, "404: Not Found", head=method == b"HEAD")
            return
        if method == b"HEAD":
            authorized = self.server.authorized_peer(tlsfront.peer_cert(sock))
            described = self._call(self.server.describe) if authorized else {}
            _answer(sock, conn, 200 if authorized else 401, "", _encoded(described), head=True)
            return
        if method != b"POST":
            _answer(sock, conn, 404, "")
            return
        if sockhttp.asks_upgrade(request, names.TLS_UPGRADE):
            self._end_to_end(sock, conn, path, headers)
            return
        if "transfer-encoding" in headers and "content-length" in headers:
            _answer(sock, conn, 400, "a request with both Transfer-Encoding and Content-Length is ambiguous")
            sockhttp.linger(sock)
            return
        if headers.get(names.CONTENT_TYPE_HEADER) in clonestream.CONTENT_TYPES:
            if "content-length" in headers:
                self._serve_clone(sock, conn, headers)
            else:
                _answer(sock, conn, 400, "a clone stream is a POST with a Content-Length")
                sockhttp.linger(sock)
            return
        authorized = self.server.authorized_peer(tlsfront.peer_cert(sock))
        if path in _RAW:
            self._serve_raw(sock, conn, path, headers, authorized)
        else:
            self._serve_form(sock, conn, path in names.FORM_SYNC_PATHS, headers, authorized)

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
            _answer(sock, conn, outcome.status, outcome.message)
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
            _answer(sock, conn, *refusal)
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
                _answer(client, inner, 400, f"a broken request: {exc}")
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
                _answer(client, inner, *refusal)
                sockhttp.linger(client)  # the client may be sending its body: let it see the answer
                return
            self._serve_raw(client, inner, path, inner_headers, True)  # at the path the proxy named

    def _serve_raw(self, sock: Conn, conn: h11.Connection, path: str, headers: dict[str, str],
                   authorized: bool) -> None:
        archive, wait = _RAW[path]
        if conn.they_are_waiting_for_100_continue:  # before the request is checked, as aiohttp and Go do
            sock.sendall(sockhttp.send(conn, h11.InformationalResponse(status_code=100, headers=[])))
        body_done = False
        try:
            admitted = self._call(lambda: self.server.admit(authorized, headers, form=False, archive=archive))
            if isinstance(admitted, Outcome):
                outcome = admitted
            else:
                length = int(headers["content-length"]) if "content-length" in headers else None
                bridge = BodyBridge(self.loop)
                future = asyncio.run_coroutine_threadsafe(
                    self.server.receive_raw(bridge, archive=archive, wait_for_durable=wait, offset=admitted,
                                            length=length), self.loop)
                if length is None:
                    body_done = _read_chunked(sock, conn, bridge)
                else:
                    body_done = _read_body(sock, conn, bridge, length)
                outcome = future.result()
            _answer(sock, conn, outcome.status, outcome.message, _encoded(outcome.headers))
        finally:
            self.loop.call_soon_threadsafe(self.server.request_done)
        if not body_done:
            sockhttp.linger(sock)

    def _serve_form(self, sock: Conn, conn: h11.Connection, wait: bool, headers: dict[str, str],
                    authorized: bool) -> None:
        """A multipart form: its part `file` is the image (parts before it are skipped, as CDI does)."""
        if conn.they_are_waiting_for_100_continue:
            sock.sendall(sockhttp.send(conn, h11.InformationalResponse(status_code=100, headers=[])))
        # until its part `file` begins, no importer watches the form: a client silent that long is gone
        body = _Pieces(sock, conn, silence=self.server.config.idle_timeout)
        try:
            admitted = self._call(lambda: self.server.admit(authorized, headers, form=True, archive=False))
            if isinstance(admitted, Outcome):
                outcome = admitted
            else:
                outcome = self._receive_form(body, headers, wait)
            _answer(sock, conn, outcome.status, outcome.message, _encoded(outcome.headers))
        finally:
            self.loop.call_soon_threadsafe(self.server.request_done)
        if not body.done:
            sockhttp.linger(sock)

    def _receive_form(self, body: _Pieces, headers: dict[str, str], wait: bool) -> Outcome:
        kind, options = multipart.parse_options_header(headers.get("content-type", ""))
        parts = _FormParts(body, options.get("boundary", "")) \
            if kind.lower().startswith("multipart/") and options.get("boundary") else None
        try:
            if parts is None:
                raise ValueError(f"the request is not a multipart form: {headers.get('content-type')!r}")
            parts.find(names.FORM_FIELD)
        except TimeoutError as exc:
            self._call(self.server.upload_abandoned)
            return Outcome(408, f"the form stalled before its part {names.FORM_FIELD!r}: {exc}")
        except (ValueError, multipart.MultipartError, OSError) as exc:
            self._call(self.server.upload_abandoned)
            message = str(exc) if isinstance(exc, ValueError) and not isinstance(exc, multipart.MultipartError) \
                else f"the request is not a multipart form: {exc}"
            return Outcome(400, message)
        bridge = BodyBridge(self.loop)
        # from here the session watches the form as a raw body (its idle timeout says the upload stalled)
        body.silence = None
        body.stopped = bridge.stopped  # a quiet client: the reading thread looks whether the importer gave up
        future = asyncio.run_coroutine_threadsafe(
            self.server.receive_raw(bridge, archive=False, wait_for_durable=wait, offset=0, length=None),
            self.loop)
        try:
            for piece in parts.contents():
                if not bridge.put(piece):
                    break
            else:
                if bridge.stopped.is_set():  # the importer gave up while the client was quiet
                    return _result(future)
                bridge.end()
                parts.rest()
        except (multipart.MultipartError, OSError) as exc:
            bridge.end(ConnectionResetError(f"the form broke: {exc}"))
        return _result(future)

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


def _read_chunked(sock: Conn, conn: h11.Connection, bridge: BodyBridge) -> bool:
    """A chunked body (its trailers dropped) into the bridge; True when all of it was read. A chunk's
    boundary is no piece of the body's meaning: the data goes on as it arrives."""
    pieces = _Pieces(sock, conn, bridge.stopped)
    try:
        for piece in pieces:
            if not bridge.put(piece):
                return False
    except h11.RemoteProtocolError as exc:
        bridge.end(ConnectionResetError(f"a broken chunked body: {exc}"))
        return False
    except OSError as exc:
        bridge.end(ConnectionResetError(f"the connection broke: {exc}"))
        return False
    if not pieces.done:  # the consumer stopped
        return False
    bridge.end()
    return True


class _Pieces:
    """A request body as h11 gives it (`Content-Length` or chunked), in the pieces the socket delivered.
    Raises `ConnectionResetError` when the connection ends before the body, `h11.RemoteProtocolError`
    on broken framing, `TimeoutError` when the client sent nothing for `silence` seconds (if given); ends
    quietly when `stopped` is set (the consumer is gone). Time spent by the consumer between pieces is not
    the client's silence."""

    def __init__(self, sock: Conn, conn: h11.Connection, stopped: threading.Event | None = None,
                 silence: float | None = None) -> None:
        self.sock = sock
        self.conn = conn
        self.stopped = stopped
        self.silence = silence
        self.done = False  # the whole body was read

    def __iter__(self) -> Iterator[bytes]:
        self.sock.settimeout(POLL_SECONDS if self.silence is None else min(POLL_SECONDS, self.silence))
        silent_since: float | None = None
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                if silent_since is None:
                    silent_since = time.monotonic()
                try:
                    data = self.sock.recv(CHUNK)
                except TimeoutError:
                    if self.stopped is not None and self.stopped.is_set():
                        return
                    if self.silence is not None and time.monotonic() - silent_since >= self.silence:
                        raise TimeoutError(f"nothing arrived for {self.silence:g}s") from None
                    continue
                silent_since = None
                if not data:
                    raise ConnectionResetError("the connection closed before the end of the body")
                self.conn.receive_data(data)
            elif isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.done = True
                self.sock.settimeout(None)
                return
            else:
                raise h11.RemoteProtocolError(f"unexpected {event!r} in a request body")


class _FormParts:
    """The parts of a multipart form, parsed as the body arrives (nothing is buffered whole)."""

    def __init__(self, body: _Pieces, boundary: str) -> None:
        self.parser = multipart.PushMultipartParser(boundary, max_header_count=16, strict=False)
        self.events = self._events(body)

    def _events(self, body: _Pieces) -> Iterator[multipart.MultipartSegment | bytes | None]:
        with self.parser:
            for piece in body:
                yield from self.parser.parse(piece)
            yield from self.parser.parse(b"")  # the end: a form cut short raises

    def find(self, name: str) -> None:
        """Up to the start of the part `name`; ValueError when the form has none."""
        for event in self.events:
            if isinstance(event, multipart.MultipartSegment):
                if event.name == name:
                    return
                log.info("ignoring form part %r", event.name)
        raise ValueError(f"the form has no part named {name!r}")

    def contents(self) -> Iterator[bytes]:
        """The contents of the part found, as they arrive."""
        for event in self.events:
            if event is None:
                return
            if isinstance(event, multipart.MultipartSegment):
                raise multipart.MultipartError("a part began before the end of the previous one")
            if event:
                yield event
        raise multipart.MultipartError("the form ended inside its part")

    def rest(self) -> None:
        """The parts after it, read and dropped."""
        for _ in self.events:
            pass


def _result(future: Any) -> Outcome:
    outcome: Outcome = future.result()
    return outcome


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def _answer(sock: Conn, conn: h11.Connection, status: int, text: str,
            headers: list[tuple[bytes, bytes]] | None = None, *, head: bool = False) -> None:
    sockhttp.text_answer(sock, conn, status, text, headers, server=_SERVER, head=head)
