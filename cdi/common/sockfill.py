"""Filling a buffer from a blocking socket: how the upload server and the upload proxy read upload bodies.

`Filler.fill` reads until the buffer is full, or until the sender paused, or until the connection ended,
and hands over what arrived. On a TLS socket it does so in one call into `_tlsread` (C, the GIL
released for the whole buffer) instead of one `recv_into` per 16 KiB TLS record: in the upload server's
receiving thread, the busiest of an upload, that is 15-20 % less CPU (`bench/RESULTS.md`). Where the
extension was not built, or the socket is not TLS, the same semantics come from a `recv_into` loop."""

from __future__ import annotations

import os
import socket
import ssl
from types import ModuleType

# why _tlsread.fill stopped (its enum)
_FULL, _PAUSED, _TIMEOUT, _CLOSED, _OS_ERROR, _TLS_ERROR = range(6)


def _bind() -> tuple[ModuleType | None, str]:
    try:
        import _ssl

        from cdi.common import _tlsread
        _tlsread.bind(_ssl.__file__)  # no file (built into the interpreter): AttributeError
    except (ImportError, AttributeError, OSError) as exc:
        return None, f"a TLS record per call ({exc})"
    return _tlsread, "a MiB per call"


_tlsread, HOW = _bind()  # HOW: how TLS bodies are read, for the log of the programs that read them


def accelerated() -> bool:
    """Whether TLS sockets are read by the C loop (the extension was built and found libssl)."""
    return _tlsread is not None


class Filler:
    """Fills buffers from one socket. The end of the connection (or its failure) that comes after some
    bytes is reported by the next call, after those bytes were handed over: every byte that arrived is
    good, which is what a resumed upload relies on."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._end: BaseException | None = None
        self._closed = False
        self._sslobj = getattr(sock, "_sslobj", None) if _tlsread is not None and isinstance(sock, ssl.SSLSocket) \
            else None

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
        self.sock.settimeout(first)  # non-blocking descriptor underneath: the C loop polls it itself
        if self._sslobj is not None:
            return self._fill_tls(buffer, first, pause)
        return self._fill(memoryview(buffer), first, pause)

    def _fill_tls(self, buffer: bytearray | memoryview, first: float, pause: float) -> int:
        assert _tlsread is not None
        got, why, detail = _tlsread.fill(self._sslobj, self.sock.fileno(), buffer, _ms(first), _ms(pause))
        if why in (_FULL, _PAUSED):
            return int(got)
        if why == _TIMEOUT:
            raise TimeoutError("timed out")
        end: BaseException | None = None
        if why == _OS_ERROR:
            end = OSError(detail, os.strerror(detail))
        elif why == _TLS_ERROR:
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


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))
