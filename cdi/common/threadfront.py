"""A listening socket whose connections are served by threads with blocking (TLS) sockets: the one HTTP
server of the upload proxy and of the upload server.

Why: every byte of an upload crosses TLS several times, and on a small machine the chain is CPU-bound.
Through asyncio (uvloop) streams a TLS byte costs 1.5 to 2.5 CPU-seconds per GiB received; a blocking
`ssl` socket reads and writes with the GIL released and almost no Python per byte (about 1.2 to receive
and 0.6 to send), so the threads barely compete with anything else either.

No event loop is involved: a thread accepts, and each accepted connection gets a thread that does the
TLS handshake and parses the request head with h11; `serve(sock, conn, request)` then answers it
(every request: this is the component's only HTTP server), and the connection is closed afterwards. A
request h11 cannot parse is answered 400 here. (The upload server has no event loop at all; the proxy
asks its own, from the connection thread, only where a request needs its Kubernetes client.)

`stop` stops accepting and cuts the connections being served (their threads end); callers stop once
their last answer went out (the upload server waits until no request is in flight). `close` also
waits, briefly, until the threads have ended."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

import h11

from cdi.common import pki, tlsfront
from cdi.common.sockhttp import HEAD_TIMEOUT, MAX_HEAD, read_event, text_answer

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256  # a thread each: beyond this, new connections are closed at once (not queued)
RCVBUF = 4 << 20  # fewer wake-ups per byte received (measured: -15 % CPU in the receiving threads)
CLOSE_SECONDS = 5.0  # for the threads to end when stopping
ACCEPT_RETRY_SECONDS = 0.1  # after a failed accept (out of descriptors): not a busy loop
Conn = tlsfront.Conn
Serve = Callable[[Conn, h11.Connection, h11.Request], None]


class ThreadFront:
    def __init__(self, tls: tlsfront.ServerTLS | None, serve: Serve, *, name: str = "front",
                 server: bytes = b"cdi") -> None:
        self.acceptor = tls.acceptor() if tls is not None else None
        self.serve = serve
        self.server = server  # the Server header of the answers given here
        self.name = name
        self._listener: socket.socket | None = None
        self._open: set[Conn] = set()
        self._lock = threading.Lock()
        self._threads = 0
        self._ended = threading.Condition(self._lock)  # notified when the last connection thread ends
        self._stopping = False

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
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name=f"{self.name}-accept", daemon=True).start()
        return int(listener.getsockname()[1])

    def stop(self) -> None:
        """Stop accepting and cut the connections being served (their threads end)."""
        self._stopping = True
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the accepting thread (Linux: accept fails at once)
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):  # the TCP socket under a TLS one too, its thread sees the end
                    if isinstance(sock, socket.socket):
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)
                    else:
                        sock.shutdown(socket.SHUT_RDWR)

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Stop, and wait (up to `timeout`) until the connection threads ended."""
        self.stop()
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._threads and (left := deadline - time.monotonic()) > 0:
                self._ended.wait(left)

    def _accept(self, listener: socket.socket) -> None:
        """The accepting thread: a thread per connection, until `stop`."""
        while True:
            try:
                sock, _ = listener.accept()
            except OSError as exc:
                if self._stopping:
                    return
                log.warning("accepting a connection failed: %s", exc)
                time.sleep(ACCEPT_RETRY_SECONDS)
                continue
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
                if not self._threads:
                    self._ended.notify_all()
            raw.close()

    def _request(self, sock: Conn) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        try:
            event = read_event(sock, conn)
        except h11.RemoteProtocolError as exc:
            text_answer(sock, conn, exc.error_status_hint, f"Bad Request: {exc}", server=self.server)
            return
        if isinstance(event, h11.Request):
            self.serve(sock, conn, event)
