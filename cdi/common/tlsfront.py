"""The server side of the threaded fronts' TLS (`cdi.common.threadfront`): one way to accept a TLS
connection and read it, with two implementations behind it.

* native (`cdi.common._tlsfront`, C over OpenSSL's public API): its own TLS context from the same
  certificate, key and client CA files, its own connection from the first byte of the handshake on; a
  whole buffer (a MiB) is filled per call with the GIL released. In the upload server's receiving
  thread, the busiest of an upload, that is what keeps it from waiting for the GIL once per 16 KiB
  TLS record (`bench/RESULTS.md`, "One front").
* Python (`ssl.SSLContext.wrap_socket`): where the extension was not built, or with
  `CDI_NO_EXTENSIONS=1` in the environment (as aiohttp's `AIOHTTP_NO_EXTENSIONS`). Same behaviour,
  more CPU per byte.

Both give a socket-like object with what the fronts use (`recv`, `recv_into`, `sendall`,
`settimeout`, `getpeercert`, `pending`, `unwrap`, `shutdown`, `fileno`, `close`), and
`cdi.common.sockfill` fills buffers from either."""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cdi.common import pki

NO_EXTENSIONS_ENV = "CDI_NO_EXTENSIONS"

# why a native fill stopped (the C module's enum)
FULL, PAUSED, TIMEOUT, CLOSED, OS_ERROR, TLS_ERROR = range(6)


def _load() -> tuple[ModuleType | None, str]:
    try:
        from cdi.common import _tlsfront
    except ImportError as exc:
        return None, f"the C extension is not built ({exc})"
    return _tlsfront, "built"


_native, _WHY = _load()


def native_available() -> bool:
    """Whether the C extension was built (whatever the switch says)."""
    return _native is not None


def native_enabled() -> bool:
    """Whether new TLS servers use the C path: built, and not switched off (read each time, so that a
    test can switch it for one server)."""
    return _native is not None and os.environ.get(NO_EXTENSIONS_ENV, "") in ("", "0")


def how() -> str:
    """How TLS bodies are read, for the log."""
    if native_enabled():
        return "a MiB per call (C, OpenSSL)"
    if _native is None:
        return f"a TLS record per call ({_WHY})"
    return f"a TLS record per call ({NO_EXTENSIONS_ENV} is set)"


@dataclass(frozen=True)
class ServerTLS:
    """A server's TLS settings: a certificate and key, optionally the CA that a client certificate
    (optional at the TLS layer) must chain to, and the versions and suites to offer (CDIConfig's TLS
    profile, `cdi.common.pki.TLSPolicy`). Both implementations are set up from these, the C one with the
    Python context's own option bits, so that they offer exactly the same."""

    cert_file: Path
    key_file: Path
    policy: pki.TLSPolicy
    client_ca_file: Path | None = None

    def context(self, policy: pki.TLSPolicy | None = None) -> ssl.SSLContext:
        """The `ssl` module's server context for these files under `policy` (default: this one's)."""
        return pki.server_context_from_files(self.cert_file, self.key_file, client_ca=self.client_ca_file,
                                             client_required=False, policy=policy or self.policy)

    def acceptor(self) -> Acceptor:
        """What a front accepts connections with: native when enabled (decided now, for its lifetime)."""
        return Acceptor(self, native_enabled())


class Acceptor:
    """Accepts the TLS connections of one front with the current policy. `set_policy` (a live change of
    CDIConfig) and `reload` (a renewed certificate in the same files) make new contexts and swap them in one
    assignment: a connection being accepted keeps the contexts it began with, and no context is changed
    while another thread makes a connection from it."""

    def __init__(self, tls: ServerTLS, native: bool) -> None:
        self.tls = tls
        self._native = native
        self._policy = tls.policy
        self._contexts = self._make(tls.policy)

    def _make(self, policy: pki.TLSPolicy) -> tuple[ssl.SSLContext, Any]:
        context = self.tls.context(policy)
        if not self._native:
            return context, None
        assert _native is not None
        native = _native.Context(str(self.tls.cert_file), str(self.tls.key_file),
                                 None if self.tls.client_ca_file is None else str(self.tls.client_ca_file),
                                 int(context.minimum_version), policy.ciphers, options=int(context.options))
        return context, native

    @property
    def context(self) -> ssl.SSLContext:
        return self._contexts[0]

    @property
    def native(self) -> Any:
        return self._contexts[1]

    def set_policy(self, policy: pki.TLSPolicy) -> None:
        self._contexts = self._make(policy)
        self._policy = policy

    def reload(self) -> None:
        """The certificate and key files read again (they were replaced by a renewed pair), under the
        current policy; connections accepted from now on present the new certificate."""
        self._contexts = self._make(self._policy)

    def accept(self, raw: socket.socket, timeout: float) -> socket.socket | TLSConnection:
        """The server's handshake on an accepted connection; OSError or ValueError when it fails."""
        context, native = self._contexts
        if native is None:
            raw.settimeout(timeout)
            return context.wrap_socket(raw, server_side=True)
        return TLSConnection(raw, native.accept(raw.fileno(), _ms(timeout)))


class TLSConnection:
    """A native TLS connection over `raw` (which keeps owning the descriptor), shaped as the parts of
    `ssl.SSLSocket` the fronts use. Timeouts as `socket.settimeout` (None: wait for ever)."""

    def __init__(self, raw: socket.socket, conn: Any) -> None:
        self.raw = raw
        self._conn = conn
        self._timeout: float | None = None

    def fileno(self) -> int:
        return self.raw.fileno()

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def fill(self, buffer: bytearray | memoryview, first: float | None, pause: float) -> tuple[int, int, Any]:
        """(bytes read, why it stopped, detail) as the C module says."""
        return tuple(self._conn.fill(buffer, _ms(first), _ms(pause)))

    def recv_into(self, buffer: bytearray | memoryview, nbytes: int = 0) -> int:
        view = memoryview(buffer)[:nbytes] if nbytes else buffer
        got, why, detail = self.fill(view, self._timeout, 0)
        if got or why in (FULL, PAUSED, CLOSED):
            return got
        if why == TIMEOUT:
            raise TimeoutError("timed out")
        if why == OS_ERROR:
            raise OSError(detail, os.strerror(detail))
        raise ssl.SSLError(detail)

    def recv(self, size: int) -> bytes:
        buffer = bytearray(size)
        return bytes(buffer[:self.recv_into(buffer)])

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        self._conn.sendall(data, _ms(self._timeout))

    def pending(self) -> int:
        return int(self._conn.pending())

    def getpeercert(self) -> dict[str, Any] | None:
        subject = self._conn.peer_subject()
        return None if subject is None else {"subject": subject}

    def unwrap(self) -> socket.socket:
        """close_notify both ways; the plain TCP socket from the byte after the peer's."""
        self._conn.shutdown(_ms(self._timeout))
        self._conn.close()
        self.raw.setblocking(True)
        return self.raw

    def shutdown(self, how: int) -> None:
        self.raw.shutdown(how)

    def close(self) -> None:
        self._conn.close()
        self.raw.close()

    def __enter__(self) -> TLSConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


Conn = socket.socket | TLSConnection  # a client connection, plain or TLS (either implementation)


def is_tls(sock: object) -> bool:
    return isinstance(sock, (ssl.SSLSocket, TLSConnection))


def peer_cert(sock: object) -> dict[str, Any] | None:
    """The client's verified certificate (its subject), or None (plain, or no certificate)."""
    if isinstance(sock, (ssl.SSLSocket, TLSConnection)):
        return sock.getpeercert() or None
    return None


def plain(sock: Conn) -> socket.socket:
    """The TCP socket under a TLS one once both sides said close_notify (no byte beyond the peer's
    close_notify consumed: OpenSSL's read-ahead is off in both implementations)."""
    if isinstance(sock, TLSConnection):
        return sock.unwrap()
    if not isinstance(sock, ssl.SSLSocket):
        return sock
    unwrapped = sock.unwrap()
    return socket.socket(fileno=unwrapped.detach())


def _ms(seconds: float | None) -> int:
    return -1 if seconds is None else max(0, round(seconds * 1000))
