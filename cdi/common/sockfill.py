"""Filling a buffer from a blocking socket: how the upload server and the upload proxy read upload bodies.

`Filler.fill` reads until the buffer is full, or until the sender paused, or until the connection ended,
and hands over what arrived. On a native TLS connection (`cdi.common.tlsfront`) it does so in one call
(C, the GIL released for the whole buffer) instead of one `recv_into` per 16 KiB TLS record: in the
upload server's receiving thread, the busiest of an upload, that is what keeps it from waiting for the
GIL between records (`bench/RESULTS.md`). On an `ssl.SSLSocket` or a plain socket the same semantics
come from a `recv_into` loop."""

from __future__ import annotations

import os
import socket
import ssl

from cdi.common import tlsfront


class Filler:
    """Fills buffers from one socket. The end of the connection (or its failure) that comes after some
    bytes is reported by the next call, after those bytes were handed over: every byte that arrived is
    good, which is what a resumed upload relies on."""

    def __init__(self, sock: socket.socket | tlsfront.TLSConnection) -> None:
        self.sock = sock
        self._end: BaseException | None = None
        self._closed = False
        self.native = isinstance(sock, tlsfront.TLSConnection)

    def fill(self, buffer: bytearray | memoryview, first: float, pause: float) -> int:
        """Read into `buffer`; the number of bytes read: all of it, or fewer when nothing more came for
        `pause` seconds after the first byte, or when the connection ended (the next call then returns 0
        or raises). 0: the peer closed the connection before anything arrived. TimeoutError: nothing
        arrived within `first` seconds. OSError (`ssl.SSLError` too): the connection failed."""
        if not len(buffer):
            raise ValueError("nothing to fill: 0 would read as the end of the connection")
        if self._end is not None:
            raise self._end
        if self._closed:
            return 0
        if isinstance(self.sock, tlsfront.TLSConnection):
            return self._fill_native(self.sock, buffer, first, pause)
        self.sock.settimeout(first)
        return self._fill(memoryview(buffer), first, pause)

    def _fill_native(self, sock: tlsfront.TLSConnection, buffer: bytearray | memoryview, first: float,
                     pause: float) -> int:
        got, why, detail = sock.fill(buffer, first, pause)
        if why in (tlsfront.FULL, tlsfront.PAUSED):
            return int(got)
        if why == tlsfront.TIMEOUT:
            raise TimeoutError("timed out")
        end: BaseException | None = None
        if why == tlsfront.OS_ERROR:
            end = OSError(detail, os.strerror(detail))
        elif why == tlsfront.TLS_ERROR:
            end = ssl.SSLError(detail)
        return self._ended(int(got), end)

    def _fill(self, view: memoryview, first: float, pause: float) -> int:
        got = 0
        while got < len(view):
            try:
                n = self.sock.recv_into(view[got:])
            except TimeoutError:
                if got:
                    return got  # a pause
                raise
            except OSError as exc:
                return self._ended(got, exc)
            if not n:
                return self._ended(got, None)
            if not got:
                self.sock.settimeout(pause)
            got += n
        return got

    def _ended(self, got: int, error: BaseException | None) -> int:
        """The connection ended after `got` bytes of this call: those now, the end by the next call."""
        if not got and error is not None:
            raise error
        self._end, self._closed = error, True
        return got

