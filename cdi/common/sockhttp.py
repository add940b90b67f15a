"""HTTP/1.1 on blocking (TLS) sockets with h11: reading a head, answering, switching a connection to
another protocol, and passing bytes through untouched. Used by the threaded fronts of the upload proxy
and the upload server (`cdi.common.threadfront`) and by `cdi image-upload`, which all move upload bodies
on blocking sockets because that is the cheapest way to move TLS bytes from Python."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import socket
import time
from email.utils import formatdate
from typing import cast

import h11

from cdi.common import tlsfront
from cdi.common.tlsfront import Conn

log = logging.getLogger(__name__)

HEAD_TIMEOUT = 60.0  # for a TLS handshake and a request head
LINGER_SECONDS = 1.0
MAX_HEAD = 64 << 10
PIPE_SIZE = 1 << 20  # bytes a pass-through moves per splice (the default maximum pipe size for a non-root user)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_SPLICE_NONBLOCK = getattr(os, "SPLICE_F_NONBLOCK", 2)


def read_event(sock: Conn, conn: h11.Connection, received: bytearray | None = None) -> h11.Event | None:
    """The next h11 event (a request or response head, typically), reading as needed; None when the peer
    closed first. A TLS socket is read one record at a time, so nothing after the head is consumed from
    the socket unless it came in the same record (what an upgrade relies on)."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return cast(h11.Event, event)
        data = sock.recv(65536)
        if not data:
            return None
        if received is not None:
            received += data
        conn.receive_data(data)


def headers(event: h11.Request | h11.InformationalResponse | h11.Response) -> dict[str, str]:
    """A head's headers by lower-case name (the last, if repeated)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers.raw_items()}


def asks_upgrade(request: h11.Request, protocol: str) -> bool:
    """Whether the request asks to switch this connection to `protocol` (`Connection: Upgrade` with it listed
    in `Upgrade`)."""
    head = headers(request)
    connection = {t.strip().lower() for t in head.get("connection", "").split(",")}
    offered = {t.strip().lower() for t in head.get("upgrade", "").split(",")}
    return "upgrade" in connection and protocol.lower() in offered


def switch(sock: Conn, conn: h11.Connection, headers: list[tuple[bytes, bytes]]) -> socket.socket:
    """Answer `101 Switching Protocols` and end the TLS session (close_notify both ways), keeping the TCP
    connection: the plain socket, from the byte after the peer's close_notify."""
    sock.settimeout(HEAD_TIMEOUT)
    sock.sendall(send(conn, h11.InformationalResponse(status_code=101, headers=headers)))
    return unwrap(sock)


def unwrap(sock: Conn) -> socket.socket:
    """The TCP socket under a TLS socket, once both sides said close_notify (`tlsfront.plain`)."""
    return tlsfront.plain(sock)


def pass_through(client: socket.socket, upstream: socket.socket) -> None:
    """Bytes both ways between two plain TCP sockets, moved by the kernel (`splice` through a pipe each
    way: about a quarter of a CPU-second per GiB, against about two to decrypt and re-encrypt), until
    the upstream side closes. A client that goes away aborts the upstream connection, as a cut body would."""
    client.settimeout(None)
    upstream.settimeout(None)
    routes = {client.fileno(): (client, upstream), upstream.fileno(): (upstream, client)}
    pipes = {fd: _pipe() for fd in routes}
    poller = select.poll()
    for fd in routes:
        poller.register(fd, select.POLLIN)
    try:
        while upstream.fileno() in routes:
            for fd, _ in poller.poll():
                if fd not in routes:
                    continue
                source, sink = routes[fd]
                read_end, write_end = pipes[fd]
                try:
                    n = os.splice(fd, write_end, PIPE_SIZE, flags=_SPLICE_NONBLOCK)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    log.debug("a passed-through connection broke: %s", exc)
                    n = 0
                if not n:
                    poller.unregister(fd)
                    del routes[fd]
                    how = socket.SHUT_RDWR if source is client else socket.SHUT_WR
                    with contextlib.suppress(OSError):
                        sink.shutdown(how)  # the client gone: the upload server sees its body cut
                    continue
                try:
                    while n:
                        n -= os.splice(read_end, sink.fileno(), n)
                except OSError as exc:  # the sink went away: nothing more goes that way
                    log.debug("a passed-through connection broke: %s", exc)
                    if sink is client:
                        with contextlib.suppress(OSError):
                            upstream.shutdown(socket.SHUT_RDWR)
                        return
                    poller.unregister(fd)
                    del routes[fd]
    finally:
        for read_end, write_end in pipes.values():
            os.close(read_end)
            os.close(write_end)


def _pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # a bigger pipe: fewer splices per byte (at most pipe-max-size)
        fcntl.fcntl(write_end, F_SETPIPE_SZ, PIPE_SIZE)
    return read_end, write_end


def send(conn: h11.Connection, event: h11.Event) -> bytes:
    return conn.send(event) or b""


def text_answer(sock: Conn, conn: h11.Connection, status: int, text: str,
                headers: list[tuple[bytes, bytes]] | None = None, *, server: bytes = b"cdi",
                head: bool = False, content_type: bytes = b"text/plain; charset=utf-8") -> None:
    """A plain-text answer (or of `content_type`), as aiohttp's `web.Response(text=...)`, on a connection that
    closes after it (`head`: the answer to a `HEAD`, its headers without the body)."""
    body = text.encode()
    fields = [(b"Content-Type", content_type), (b"Content-Length", str(len(body)).encode()),
            (b"Date", formatdate(usegmt=True).encode()), (b"Server", server), *(headers or []),
            (b"Connection", b"close")]
    try:
        sock.settimeout(None)
        sock.sendall(send(conn, h11.Response(status_code=status, headers=fields)) +
                     (b"" if head or not body else send(conn, h11.Data(data=body))) + send(conn, h11.EndOfMessage()))
    except OSError as exc:
        log.debug("the client went away before its answer: %s", exc)


def linger(sock: Conn, seconds: float = LINGER_SECONDS) -> None:
    """Read (and drop) what the client still sends, briefly, so that it sees the answer before the
    connection closes (closing with unread data would reset it), as aiohttp and Go's server do."""
    deadline = time.monotonic() + seconds
    with contextlib.suppress(OSError):
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(1 << 20):
                return
