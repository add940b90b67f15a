"""A listening socket whose connections are served by threads with blocking (TLS) sockets: the one HTTP
server of the upload proxy and of the upload server.

Why: every byte of an upload crosses TLS several times, and on a small machine the chain is CPU-bound.
Through asyncio (uvloop) streams a TLS byte costs 1.5 to 2.5 CPU-seconds per GiB received; a blocking
`ssl` socket reads and writes with the GIL released and almost no Python per byte (about 1.2 to receive
and 0.6 to send), so the threads barely compete with the event loop either.

The listening socket is watched by the event loop; each accepted connection gets a thread that does
the TLS handshake and parses the request head with h11; `serve(sock, conn, request)` then answers it
(every request: this is the component's only HTTP server), and the connection is closed afterwards. A
request h11 cannot parse is answered 400 here.

`stop` stops accepting and cuts the connections being served (their threads end); callers stop once
their last answer went out (the upload server waits until no request is in flight). `closed` waits,
briefly, until the threads have ended."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable

import h11

from cdi.common import pki, tlsfront
from cdi.common.sockhttp import HEAD_TIMEOUT, MAX_HEAD, read_event, text_answer

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256  # a thread each: beyond this, new connections are closed at once (not queued)
RCVBUF = 4 << 20  # fewer wake-ups per byte received (measured: -15 % CPU in the receiving threads)
CLOSE_SECONDS = 5.0  # for the threads to end when stopping
Conn = tlsfront.Conn
Serve = Callable[[Conn, h11.Connection, h11.Request], None]


class ThreadFront:
    def __init__(self, loop: asyncio.AbstractEventLoop, tls: tlsfront.ServerTLS | None, serve: Serve, *,
                 name: str = "front", server: bytes = b"cdi") -> None:
        self.loop = loop
        self.acceptor = tls.acceptor() if tls is not None else None
        self.serve = serve
        self.server = server  # the Server header of the answers given here
        self.name = name
        self._listener: socket.socket | None = None
        self._open: set[Conn] = set()
        self._lock = threading.Lock()
        self._threads = 0
        self._ended = asyncio.Event()  # set (from a thread) when the last connection thread ends

    def set_policy(self, policy: pki.TLSPolicy) -> None:
        """New versions and suites for the connections accepted from now on (`tlsfront.Acceptor`)."""
        if self.acceptor is not None:
            self.acceptor.set_policy(policy)

    def reload_certificate(self) -> None:
        """The serving certificate read again from its files, for the connections accepted from now on."""
        if self.acceptor is not None:
            self.acceptor.reload()

    def start(self, host: str, port: int, backlog: int = 128) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, port), family=family, backlog=backlog)
        listener.setblocking(False)
        self.loop.add_reader(listener.fileno(), self._accept)
        self._listener = listener
        return int(listener.getsockname()[1])

    def stop(self) -> None:
        """Stop accepting and cut the connections being served (their threads end)."""
        if self._listener is not None:
            self.loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):  # the TCP socket under a TLS one too, its thread sees the end
                    if isinstance(sock, socket.socket):
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)
                    else:
                        sock.shutdown(socket.SHUT_RDWR)

    async def closed(self, timeout: float = CLOSE_SECONDS) -> None:
        """Stop, and wait (up to `timeout`) until the connection threads ended."""
        self.stop()
        deadline = self.loop.time() + timeout
        while self._threads and self.loop.time() < deadline:
            self._ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), deadline - self.loop.time())

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
        try:
            event = read_event(sock, conn)
        except h11.RemoteProtocolError as exc:
            text_answer(sock, conn, exc.error_status_hint, f"Bad Request: {exc}", server=self.server)
            return
        if isinstance(event, h11.Request):
            self.serve(sock, conn, event)
