"""The upload server's one HTTP server (`cdi.common.threadfront`): every request is read and answered
in a thread per connection, on a blocking TLS socket, and that thread calls the upload server directly
(`Server`, the front's view of `cdi.uploadserver.server.UploadServer`): no event loop anywhere, as CDI's
server, which serves each request in a goroutine of its own.

Receiving through asyncio (uvloop) streams costs about 1.5 CPU-seconds per GiB in TLS and transport
code before the importer sees a byte; a blocking TLS connection read into 1 MiB buffers about 1.2, with
the GIL released while OpenSSL decrypts, so the importer's threads run meanwhile; each buffer filled in
one call (`cdi.common.tlsfront`'s native path) instead of a `recv_into` per 16 KiB TLS record, 15-20 %
less again, and no wait for the GIL between records.

Host-assisted clone streams (`x-cdi-content-type: filesystem-clone` / `blockdevice-clone`, with a
`Content-Length`) are read here too, in 4 MiB buffers, and written in place (`cdi.uploadserver.clonesink`).

An upload `POST` is checked here (the client certificate, the headers) and admitted by the server's
session (`admit`); its body is read by the connection's thread and put straight into the importer's
queue (`receive` gives the `session.Upload` to feed), and the session's answer is written back. A
body with a `Content-Length` is read in 1 MiB buffers (`ReceiveBuffers`, filled again once the importer
gave them back); a chunked one (trailers allowed) through h11; a form (multipart,
`multipart.PushMultipartParser`, streaming) has its part `file` fed, the parts before it skipped, as
CDI does. While the client is quiet the reading thread asks the upload whether to go on waiting
(`Upload.quiet`: no, once the importer gave up, or after `UPLOAD_IDLE_TIMEOUT`). `GET /healthz`,
`GET /metrics` (the upload's progress), the `HEAD` probe and the 404s of other methods are answered here
too. The client's certificate is checked on every upload request (`getpeercert`): its CN must be
`CLIENT_NAME`. A connection is closed after its
answer; when the answer comes before the whole body (a refusal, the importer gave up), the rest is
drained briefly first, as Go's server does."""

from __future__ import annotations

import hmac
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

import h11
import multipart

from cdi.api import upload as names
from cdi.common import clonestream, sockfill, sockhttp, threadfront, tlsfront
from cdi.common.threadfront import Conn
from cdi.uploadserver import clonesink
from cdi.uploadserver.config import UploadServerConfig
from cdi.uploadserver.feed import Chunk
from cdi.uploadserver.session import Outcome, Upload

log = logging.getLogger(__name__)

CHUNK = 1 << 20
POLL_SECONDS = 1.0  # a quiet client: ask the upload whether it still wants the body
PAUSE_SECONDS = 0.05  # a client that pauses in the middle of a chunk: what arrived is handed on
_SERVER = b"cdi-uploadserver"
_RAW = {**{p: (False, True) for p in names.SYNC_PATHS}, **{p: (False, False) for p in names.ASYNC_PATHS},
        **{p: (True, True) for p in names.ARCHIVE_PATHS}}  # path -> (archive, wait for durable)
_ALL = {*_RAW, *names.FORM_SYNC_PATHS, *names.FORM_ASYNC_PATHS}  # a clone stream may come to any
METRICS_PATH = "/metrics"
CLONE_IDLE_SECONDS = 60.0  # a clone source that sends nothing for this long is gone


class Server(Protocol):
    """What the front asks of the upload server, from a connection's thread: the front speaks HTTP, the
    server decides."""

    @property
    def config(self) -> UploadServerConfig: ...

    def answering(self) -> AbstractContextManager[None]:
        """Around a request from its admission to its answer: the server exits only after the answer."""
        ...

    def describe(self) -> dict[str, str]:
        """The headers answering the `HEAD` probe of an upload path (`Upload-Offset`, `Upload-State`)."""
        ...

    def metrics(self) -> str:
        """The upload's progress, Prometheus text (`GET /metrics`)."""
        ...

    def admit(self, offset: int) -> Outcome | None:
        """Take an upload starting at byte `offset` (None), or refuse it (busy, done, another offset)."""
        ...

    def receive(self, *, archive: bool, wait_for_durable: bool, offset: int, length: int | None,
                recycle: Callable[[Chunk], None] | None) -> Upload:
        """The admitted upload's body, to be fed (`session.UploadSession.receive`)."""
        ...

    def abandon(self) -> None:
        """An admitted upload whose body turned out unusable (a form without its part `file`)."""
        ...

    def admit_clone(self) -> Outcome | None:
        """Take a host-assisted clone stream (None), or refuse it (one at a time, or already complete)."""
        ...

    def clone_finished(self, result: clonesink.CloneResult | BaseException) -> Outcome:
        """The answer to a clone stream that was read (complete, refused, or cut)."""
        ...


class Front:
    def __init__(self, tls: tlsfront.ServerTLS, server: Server, end_to_end: tlsfront.ServerTLS | None = None) -> None:
        self.server = server
        # the server side of end-to-end TLS with a client (no client certificate)
        self.end_to_end = end_to_end.acceptor() if end_to_end is not None else None
        self._front = threadfront.ThreadFront(tls, self._serve, name="uploadserver", server=_SERVER)

    def start(self, host: str, port: int) -> int:
        return self._front.start(host, port, backlog=16)

    def close(self) -> None:
        """Stop serving, and wait (briefly) until the connection threads ended."""
        self._front.close()

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
        if path == METRICS_PATH:  # read by the controller as an importer's, without a client certificate
            if method in (b"GET", b"HEAD"):
                _answer(sock, conn, 200, self.server.metrics(), head=method == b"HEAD")
            else:
                _answer(sock, conn, 405, "405: Method Not Allowed", [(b"Allow", b"GET,HEAD")])
            return
        if path not in _ALL:
            _answer(sock, conn, 404, "404: Not Found", head=method == b"HEAD")
            return
        if method == b"HEAD":
            authorized = self._authorized(sock)
            described = self.server.describe() if authorized else {}
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
        authorized = self._authorized(sock)
        if path in _RAW:
            self._serve_raw(sock, conn, path, headers, authorized)
        else:
            self._serve_form(sock, conn, path in names.FORM_SYNC_PATHS, headers, authorized)

    def _authorized(self, sock: Conn) -> bool:
        """Whether the client presented the certificate of `CLIENT_NAME` (the proxy's, or the clone source's);
        the TLS layer checked that it chains to `CLIENT_CERT_FILE`."""
        peer = tlsfront.peer_cert(sock)
        if not peer:
            return False
        subject = dict(item[0] for item in peer.get("subject", ()))
        return bool(subject.get("commonName") == self.server.config.client_name)

    def _unauthorized(self) -> Outcome:
        return Outcome(401, f"a client certificate for {self.server.config.client_name} is required")

    def _serve_clone(self, sock: Conn, conn: h11.Connection, headers: dict[str, str]) -> None:
        """A host-assisted clone stream (`cdi.uploadserver.clonesink`), read and written in this thread."""
        if conn.they_are_waiting_for_100_continue:
            sock.sendall(sockhttp.send(conn, h11.InformationalResponse(status_code=100, headers=[])))
        authorized = self._authorized(sock)
        body_done = False
        with self.server.answering():
            if authorized:
                outcome = self.server.admit_clone()
            else:
                log.warning("refused a clone stream without the clone source's client certificate")
                outcome = self._unauthorized()
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
                outcome = self.server.clone_finished(result)
            _answer(sock, conn, outcome.status, outcome.message)
        if not body_done:
            sockhttp.linger(sock)

    def _end_to_end(self, sock: Conn, conn: h11.Connection, path: str, headers: dict[str, str]) -> None:
        """The proxy's upgrade: answer 101, end its TLS session, and serve the one upload of the client's new
        TLS session that carries the nonce the proxy gave (`cdi.api.upload`)."""
        nonce = headers.get(names.NONCE_HEADER.lower(), "")
        refusal = None
        if not self._authorized(sock):
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

    def _admit(self, authorized: bool, headers: dict[str, str], *, form: bool, archive: bool) -> Outcome | int:
        """The refusal of an upload request, or the offset it starts at once the session took it (`uploading`)."""
        if not authorized:
            log.warning("refused an upload without the proxy's client certificate")
            return self._unauthorized()
        if clone_type := headers.get(names.CONTENT_TYPE_HEADER):
            return Outcome(400, f"{names.CONTENT_TYPE_HEADER} {clone_type!r} (a clone stream) is not supported by "
                                "this upload server")
        try:
            offset = int(headers.get(names.OFFSET_HEADER.lower()) or 0)
        except ValueError:
            return Outcome(400, f"{names.OFFSET_HEADER} must be a number of bytes")
        if offset < 0 or (offset and (form or archive)):
            return Outcome(400, f"{names.OFFSET_HEADER} {offset} cannot be used here: only raw uploads to the "
                                "upload and upload-async paths resume")
        refusal = self.server.admit(offset)
        return offset if refusal is None else refusal

    def _serve_raw(self, sock: Conn, conn: h11.Connection, path: str, headers: dict[str, str],
                   authorized: bool) -> None:
        archive, wait = _RAW[path]
        if conn.they_are_waiting_for_100_continue:  # before the request is checked, as aiohttp and Go do
            sock.sendall(sockhttp.send(conn, h11.InformationalResponse(status_code=100, headers=[])))
        body_done = False
        with self.server.answering():
            admitted = self._admit(authorized, headers, form=False, archive=archive)
            if isinstance(admitted, Outcome):
                outcome = admitted
            else:
                length = int(headers["content-length"]) if "content-length" in headers else None
                buffers = ReceiveBuffers(CHUNK)  # this thread's; the importer gives them back through its queue
                with self.server.receive(archive=archive, wait_for_durable=wait, offset=admitted, length=length,
                                         recycle=buffers.give_back) as upload:
                    if length is None:
                        body_done = _read_chunked(sock, conn, upload)
                    else:
                        body_done = _read_body(sock, conn, upload, buffers, length)
                outcome = upload.answer()
            _answer(sock, conn, outcome.status, outcome.message, _encoded(outcome.headers))
        if not body_done:
            sockhttp.linger(sock)

    def _serve_form(self, sock: Conn, conn: h11.Connection, wait: bool, headers: dict[str, str],
                    authorized: bool) -> None:
        """A multipart form: its part `file` is the image (parts before it are skipped, as CDI does)."""
        if conn.they_are_waiting_for_100_continue:
            sock.sendall(sockhttp.send(conn, h11.InformationalResponse(status_code=100, headers=[])))
        # until its part `file` begins, no importer watches the form: a client silent that long is gone
        body = _Pieces(sock, conn, silence=self.server.config.idle_timeout)
        with self.server.answering():
            admitted = self._admit(authorized, headers, form=True, archive=False)
            outcome = admitted if isinstance(admitted, Outcome) else self._receive_form(body, headers, wait)
            _answer(sock, conn, outcome.status, outcome.message, _encoded(outcome.headers))
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
            self.server.abandon()
            return Outcome(408, f"the form stalled before its part {names.FORM_FIELD!r}: {exc}")
        except (ValueError, multipart.MultipartError, OSError) as exc:
            self.server.abandon()
            message = str(exc) if isinstance(exc, ValueError) and not isinstance(exc, multipart.MultipartError) \
                else f"the request is not a multipart form: {exc}"
            return Outcome(400, message)
        with self.server.receive(archive=False, wait_for_durable=wait, offset=0, length=None, recycle=None) as upload:
            # from here the upload watches the form as a raw body (its idle timeout says the upload stalled)
            body.silence = None
            body.quiet = upload.quiet
            try:
                for piece in parts.contents():
                    if not upload.put(piece):
                        break
                else:
                    if not upload.stopped.is_set():  # else the importer gave up while the client was quiet
                        upload.end()
                        parts.rest()
            except (multipart.MultipartError, OSError) as exc:
                upload.end(ConnectionResetError(f"the form broke: {exc}"))
        return upload.answer()


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


def _read_body(sock: Conn, conn: h11.Connection, upload: Upload, buffers: ReceiveBuffers, length: int) -> bool:
    """The body into the upload; True when all of it was read."""
    remaining = length
    while True:  # what h11 already holds of the body
        event = conn.next_event()
        if isinstance(event, h11.Data):
            remaining -= len(event.data)
            if not upload.put(event.data):
                return False
        elif isinstance(event, h11.EndOfMessage):
            upload.end()
            return True
        else:
            break
    filler = sockfill.Filler(sock)
    while remaining > 0:
        buffer = buffers.get(min(CHUNK, remaining))  # handed on whole, no copy on the way to the importer's writer
        try:
            n = filler.fill(buffer, POLL_SECONDS, PAUSE_SECONDS)
        except TimeoutError:
            buffers.give_back(buffer)  # never handed on: still ours
            if not upload.quiet():
                return False
            continue
        except OSError as exc:
            upload.end(ConnectionResetError(f"the connection broke: {exc}"))
            return False
        if not n:
            upload.end(ConnectionResetError(f"the connection closed with {remaining} bytes of the body still to come"))
            return False
        remaining -= n
        if n < len(buffer):  # a pause or the end of the connection: what arrived, in a buffer of its own
            whole, buffer = buffer, buffer[:n]
            buffers.give_back(whole)  # never handed on: still ours
        if not upload.put(buffer):
            return False
    upload.end()
    sock.settimeout(None)
    return True


def _read_chunked(sock: Conn, conn: h11.Connection, upload: Upload) -> bool:
    """A chunked body (its trailers dropped) into the upload; True when all of it was read. A chunk's
    boundary is no piece of the body's meaning: the data goes on as it arrives."""
    pieces = _Pieces(sock, conn, quiet=upload.quiet)
    try:
        for piece in pieces:
            if not upload.put(piece):
                return False
    except h11.RemoteProtocolError as exc:
        upload.end(ConnectionResetError(f"a broken chunked body: {exc}"))
        return False
    except OSError as exc:
        upload.end(ConnectionResetError(f"the connection broke: {exc}"))
        return False
    if not pieces.done:  # the upload stopped wanting it
        return False
    upload.end()
    return True


class _Pieces:
    """A request body as h11 gives it (`Content-Length` or chunked), in the pieces the socket delivered.
    Raises `ConnectionResetError` when the connection ends before the body, `h11.RemoteProtocolError`
    on broken framing, `TimeoutError` when the client sent nothing for `silence` seconds (if given); ends
    quietly when `quiet`, asked after every poll without data, says not to wait any more (the consumer is
    gone). Time spent by the consumer between pieces is not the client's silence."""

    def __init__(self, sock: Conn, conn: h11.Connection, quiet: Callable[[], bool] | None = None,
                 silence: float | None = None) -> None:
        self.sock = sock
        self.conn = conn
        self.quiet = quiet
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
                    if self.quiet is not None and not self.quiet():
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


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def _answer(sock: Conn, conn: h11.Connection, status: int, text: str,
            headers: list[tuple[bytes, bytes]] | None = None, *, head: bool = False) -> None:
    sockhttp.text_answer(sock, conn, status, text, headers, server=_SERVER, head=head)
