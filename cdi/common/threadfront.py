"""A listening socket whose connections are served by threads with blocking (TLS) sockets, for the
bulk byte paths of uploads (the upload proxy and the upload server).

Why: every byte of an upload crosses TLS several times, and on a small machine the chain is CPU-bound.
Through asyncio (uvloop) streams a TLS byte costs 1.5 to 2.5 CPU-seconds per GiB received; a blocking
`ssl` socket reads and writes with the GIL released and almost no Python per byte (about 1.2 to receive
and 0.6 to send), so the threads barely compete with the event loop either.

The listening socket is watched by the event loop; each accepted connection gets a thread that does
the TLS handshake and parses the request head with h11. `serve(sock, conn, request)` then either handles
the request (returns True; the connection is closed afterwards) or declines (False): the connection,
from its first byte, is then handed over a socket pair to an asyncio server (`adopt`), with the
client's verified certificate, so that every request the thread does not serve is answered by one
implementation, unchanged. Requests h11 cannot parse are handed over too (the asyncio server says
what is wrong with them).

Stopping is in two steps around the asyncio server's own shutdown: `stop` stops accepting, cuts the
connections the threads serve, and ends the requests of handed-over ones (the asyncio server reads the
end of their bytes) without cutting them; once the asyncio server has answered and closed its side,
`closed` waits until the threads have passed on its last bytes, then cuts what is left. Cutting a
handed-over connection at once lost an answer the asyncio server had written but the thread had not
passed on yet: an upload server that exits right after answering an upload (a form upload of a small
image) sometimes closed the proxy's connection without an answer, which the proxy reports as 502."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import h11

from cdi.common import tlsfront
from cdi.common.sockhttp import HEAD_TIMEOUT, MAX_HEAD, read_event

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256  # a thread each: beyond this, new connections are closed at once (not queued)
RCVBUF = 4 << 20  # fewer wake-ups per byte received (measured: -15 % CPU in the receiving threads)
CLOSE_SECONDS = 5.0  # for the last answers of handed-over connections to go out when stopping
PeerCert = dict[str, Any] | None
Conn = tlsfront.Conn
Serve = Callable[[Conn, h11.Connection, h11.Request], bool]
Adopt = Callable[[socket.socket, PeerCert], Awaitable[None]]


class ThreadFront:
    def __init__(self, loop: asyncio.AbstractEventLoop, tls: tlsfront.ServerTLS | None, serve: Serve, adopt: Adopt,
                 *, name: str = "front") -> None:
        self.loop = loop
        self.acceptor = tls.acceptor() if tls is not None else None
        self.serve = serve
        self.adopt = adopt
        self.name = name
        self._listener: socket.socket | None = None
        self._open: set[Conn] = set()
        self._handed_over: dict[Conn, socket.socket] = {}  # client connection -> our end of the pair
        self._lock = threading.Lock()
        self._threads = 0
        self._stopping = False
        self._ended = asyncio.Event()  # set (from a thread) when the last connection thread ends

    def start(self, host: str, port: int, backlog: int = 128) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, port), family=family, backlog=backlog)
        listener.setblocking(False)
        self.loop.add_reader(listener.fileno(), self._accept)
        self._listener = listener
        return int(listener.getsockname()[1])

    def stop(self) -> None:
        """Stop accepting, cut the connections being served (their threads end), and end the requests of
        handed-over ones: the asyncio server reads the end of their bytes, its answers still go out."""
        if self._listener is not None:
            self.loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        with self._lock:
            self._stopping = True
            for sock in self._open:
                inner = self._handed_over.get(sock)
                with contextlib.suppress(OSError):  # the TCP socket under a TLS one too, its thread sees the end
                    if inner is not None:
                        inner.shutdown(socket.SHUT_WR)
                    elif isinstance(sock, socket.socket):
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)
                    else:
                        sock.shutdown(socket.SHUT_RDWR)

    async def closed(self, timeout: float = CLOSE_SECONDS) -> None:
        """After the asyncio server closed its connections: wait (up to `timeout`) until the threads passed
        on its last bytes and ended, then cut whatever is still open."""
        deadline = self.loop.time() + timeout
        while self._threads and self.loop.time() < deadline:
            self._ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), deadline - self.loop.time())
        with self._lock:
            for inner in self._handed_over.values():
                with contextlib.suppress(OSError):
                    inner.shutdown(socket.SHUT_RDWR)  # the thread stops waiting for the asyncio server
            self._handed_over.clear()
        self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accepting a connection failed: %s", exc)
                return
            with self._lock:
                crowded = self._threads >= MAX_CONNECTIONS
                if not crowded:
                    self._threads += 1
            if crowded:
                log.warning("%s: %d connections are open already; closing a new one", self.name, MAX_CONNECTIONS)
                sock.close()
                continue
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            threading.Thread(target=self._connection, args=(sock,), name=f"{self.name}-conn", daemon=True).start()

    def _connection(self, raw: socket.socket) -> None:
        sock: Conn = raw
        with self._lock:
            self._open.add(raw)
        try:
            raw.settimeout(HEAD_TIMEOUT)
            try:
                sock = self.acceptor.accept(raw, HEAD_TIMEOUT) if self.acceptor is not None else raw
            except (OSError, ValueError) as exc:
                log.debug("TLS handshake with a client failed: %s", exc)
                return
            with self._lock:  # wrap_socket detached `raw` (the `ssl` path): `stop` reaches it through `sock`
                self._open.discard(raw)
                self._open.add(sock)
            with sock:
                self._request(sock)
        except OSError as exc:
            log.debug("a client connection ended: %s", exc)
        except Exception:
            log.exception("failed to serve a connection")
        finally:
            with self._lock:
                self._open.discard(raw)
                if sock is not raw:
                    self._open.discard(sock)
                self._threads -= 1
                last = not self._threads
            raw.close()
            if last:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    self.loop.call_soon_threadsafe(self._ended.set)

    def _request(self, sock: Conn) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        received = bytearray()
        try:
            event = read_event(sock, conn, received)
        except h11.RemoteProtocolError:
            self._delegate(sock, bytes(received))
            return
        if isinstance(event, h11.Request) and not self.serve(sock, conn, event):
            self._delegate(sock, bytes(received))

    def _delegate(self, sock: Conn, received: bytes) -> None:
        """The connection, from its first byte, to the asyncio server (over a socket pair)."""
        peer = tlsfront.peer_cert(sock)
        ours, theirs = socket.socketpair()
        with ours:
            try:
                asyncio.run_coroutine_threadsafe(self.adopt(theirs, peer), self.loop).result()
            except BaseException:
                theirs.close()
                raise
            ours.sendall(received)
            with self._lock:
                self._handed_over[sock] = ours
                if self._stopping:
                    ours.shutdown(socket.SHUT_WR)
            try:
                splice(sock, ours)
            finally:
                with self._lock:
                    self._handed_over.pop(sock, None)


def splice(client: Conn, inner: socket.socket) -> None:
    """Bytes both ways between the client and the asyncio server until the latter closes."""
    client.settimeout(HEAD_TIMEOUT)
    inner.settimeout(HEAD_TIMEOUT)
    reading_client = True
    while True:
        readers: list[Conn]
        if reading_client and tlsfront.is_tls(client) and client.pending():  # type: ignore[union-attr]
            readers = [client]
        else:
            readers = select.select([client, inner] if reading_client else [inner], [], [])[0]
        if client in readers:
            try:
                data = client.recv(65536)
            except OSError as exc:  # seen as the client's end; said, since the request is then cut short
                log.warning("reading a delegated connection failed: %r", exc)
                data = b""
            if data:
                try:
                    inner.sendall(data)
                except OSError:
                    reading_client = False  # the server closed its side; take what it answered
            else:
                reading_client = False
                with contextlib.suppress(OSError):
                    inner.shutdown(socket.SHUT_WR)
        if inner in readers:
            data = inner.recv(65536)
            if not data:
                return
            client.sendall(data)
