"""A small blocking HTTP/1.1 client on http.client, built for moving large bodies fast.

Why not aiohttp or requests: the data path runs in worker threads (decompression and writes release
the GIL), and http.client's `readinto` moves a range response from the socket straight into a
preallocated buffer, with no per-chunk Python objects. What this adds on top of http.client:

* one TLS context for everything: system CAs plus every file of IMPORTER_CERT_DIR (and the
  cluster-wide proxy CA dir), or no verification with INSECURE_TLS;
* proxies from http_proxy / https_proxy / no_proxy (either case; the importer's configuration reads
  them and the proxy CA dir, `cdi.api.importrequest.ImporterOptions`), CONNECT-tunnelled for https;
* basic auth sent only to the endpoint's own origin (never leaked to a redirect target), extra
  headers on every request (as CDI sends them);
* keep-alive connection pooling shared by the range workers;
* failures classified once: TLS -> TLSError, 401/403 -> Unauthorized, 404/410 -> NotFound,
  5xx/408/429 and network errors -> transient (retried by the caller's RetryPolicy).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import logging
import socket
import ssl
import threading
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from cdi.common import pki

from .errors import ImporterError, Reason
from .retry import transient

log = logging.getLogger(__name__)

USER_AGENT = "cdi-importer"
MAX_REDIRECTS = 10
_Origin = tuple[str, str, int]


def make_ssl_context(
    cert_dir: Path | None, insecure: bool, proxy_cert_dir: Path | None = None
) -> ssl.SSLContext:
    """System trust plus every (non-dot) file of the cert dirs, each read as a PEM bundle."""
    if insecure:
        return pki.insecure_client_context()
    context = pki.client_context()
    for directory in (proxy_cert_dir, cert_dir):
        for path in ca_files(directory):
            try:
                context.load_verify_locations(cafile=str(path))
            except (ssl.SSLError, OSError, ValueError) as exc:
                log.warning("ignoring %s: not a PEM certificate bundle (%s)", path, exc)
    return context


def ca_files(directory: Path | None) -> list[Path]:
    if directory is None or not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if not p.name.startswith(".") and p.is_file())


def origin_of(url: str) -> _Origin:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


def redact(url: str) -> str:
    """The URL without credentials or query string (presigned signatures), for messages."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return f"{parts.scheme}://{netloc}{parts.path}"


@dataclass
class HttpSettings:
    cert_dir: Path | None = None
    insecure: bool = False
    timeout: float = 60.0
    extra_headers: list[tuple[str, str]] = field(default_factory=list)
    basic_auth: tuple[str, str] | None = None
    auth_origin: _Origin | None = None
    proxies: Mapping[str, str] = field(default_factory=urllib.request.getproxies_environment)
    proxy_cert_dir: Path | None = None  # the proxy's CA bundle (ImporterConfig.proxy_cert_dir), trusted too
    user_agent: str = USER_AGENT
    _context: ssl.SSLContext | None = field(default=None, init=False, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        """Built on first use: loading the system trust store costs ~50 ms a plain-HTTP import never needs."""
        if self._context is None:
            self._context = make_ssl_context(self.cert_dir, self.insecure, self.proxy_cert_dir)
        return self._context


def parse_header_lines(lines: Iterable[str]) -> list[tuple[str, str]]:
    """'Name: value' strings (IMPORTER_EXTRA_HEADER_n, secret header files) as pairs."""
    out = []
    for line in lines:
        name, sep, value = line.partition(":")
        if sep and name.strip():
            out.append((name.strip(), value.strip()))
    return out


class Response:
    """A response whose body is read on demand; `close` returns a fully read connection to the pool."""

    def __init__(
        self,
        client: HttpClient,
        key: _Origin,
        conn: http.client.HTTPConnection,
        raw: http.client.HTTPResponse,
        url: str,
    ) -> None:
        self._client = client
        self._key = key
        self._conn: http.client.HTTPConnection | None = conn
        self.raw = raw
        self.url = url
        self.status = raw.status
        self.headers = raw.headers
        self.on_bytes: Callable[[int], None] | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value and value.isdigit() else None

    def read(self, n: int) -> bytes:
        try:
            data = self.raw.read(n)
        except (OSError, http.client.HTTPException) as exc:
            self._discard()
            raise self._client._failure(exc, self.url) from exc
        if data and self.on_bytes:
            self.on_bytes(len(data))
        return data

    def readinto(self, view: memoryview) -> int:
        """Fill `view` as far as the body goes; returns bytes read (short only at the end of the body)."""
        total = 0
        try:
            while total < len(view):
                n = self.raw.readinto(view[total:])
                if not n:
                    break
                total += n
        except (OSError, http.client.HTTPException) as exc:
            self._discard()
            if total and self.on_bytes:
                self.on_bytes(total)
            err = self._client._failure(exc, self.url)
            err.partial = total  # type: ignore[attr-defined]
            raise err from exc
        if total and self.on_bytes:
            self.on_bytes(total)
        return total

    def read_all(self, limit: int = 1 << 20) -> bytes:
        data = self.read(limit)
        self.close()
        return data

    def close(self) -> None:
        if self._conn is None:
            return
        if self.raw.isclosed() and not self.raw.will_close:
            self._client._release(self._key, self._conn)
            self._conn = None
        else:
            self._discard()

    def _discard(self) -> None:
        if self._conn is not None:
            self._client._forget(self._conn)
            self._conn.close()
            self._conn = None


def classify_network(exc: BaseException, url: str) -> ImporterError:
    where = redact(url)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return ImporterError(
            Reason.TLS_ERROR,
            f"TLS certificate of {where} is not trusted: {exc.verify_message}"
            " (add its CA to the certConfigMap, or set insecureSkipVerify)",
        )
    if isinstance(exc, ssl.SSLError):
        return ImporterError(Reason.TLS_ERROR, f"TLS handshake with {where} failed: {exc.reason or exc}")
    if isinstance(exc, socket.gaierror):
        return transient(Reason.CONNECTION_FAILED, f"cannot resolve the host of {where}: {exc.strerror}")
    if isinstance(exc, TimeoutError | socket.timeout):
        return transient(Reason.CONNECTION_FAILED, f"timed out talking to {where}")
    if isinstance(exc, http.client.IncompleteRead):
        return transient(Reason.CONNECTION_FAILED, f"connection to {where} closed early")
    if isinstance(exc, ConnectionError | http.client.HTTPException | OSError):
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        return transient(Reason.CONNECTION_FAILED, f"connection to {where} failed: {text}")
    return ImporterError(Reason.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


def status_error(status: int, url: str, detail: str = "") -> ImporterError:
    where = redact(url)
    extra = f": {detail}" if detail else ""
    if status in (401, 403):
        return ImporterError(
            Reason.UNAUTHORIZED,
            f"{where} refused access (HTTP {status}){extra}; check the credentials in the secret",
        )
    if status in (404, 410):
        return ImporterError(Reason.NOT_FOUND, f"{where} does not exist (HTTP {status}){extra}")
    if status >= 500 or status in (408, 429):
        return transient(Reason.SERVER_ERROR, f"{where} answered HTTP {status}{extra}")
    return ImporterError(Reason.REQUEST_REJECTED, f"{where} answered HTTP {status}{extra}")


class HttpClient:
    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self._idle: dict[_Origin, list[http.client.HTTPConnection]] = {}
        self._busy: set[http.client.HTTPConnection] = set()
        self._cancelled = False
        self._lock = threading.Lock()

    # -- connections --------------------------------------------------------------------------------
    def _proxy_for(self, scheme: str, host: str) -> str | None:
        proxies = self.settings.proxies
        proxy = proxies.get(scheme)
        if not proxy:
            return None
        if urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]
            return None
        return proxy if "://" in proxy else f"http://{proxy}"

    def _connect(self, key: _Origin) -> tuple[http.client.HTTPConnection, bool]:
        """A new connection, and whether requests on it need the absolute URL (plain-HTTP proxy)."""
        scheme, host, port = key
        proxy = self._proxy_for(scheme, host)
        timeout = self.settings.timeout
        if proxy is None:
            if scheme == "https":
                return http.client.HTTPSConnection(
                    host, port, timeout=timeout, context=self.settings.ssl_context()
                ), False
            return http.client.HTTPConnection(host, port, timeout=timeout), False
        p = urlsplit(proxy)
        proxy_headers = {}
        if p.username:
            token = base64.b64encode(f"{p.username}:{p.password or ''}".encode()).decode()
            proxy_headers["Proxy-Authorization"] = f"Basic {token}"
        if scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                p.hostname or "", p.port or 80, timeout=timeout, context=self.settings.ssl_context()
            )
            conn.set_tunnel(host, port, headers=proxy_headers)
            return conn, False
        conn = http.client.HTTPConnection(p.hostname or "", p.port or 80, timeout=timeout)
        conn._cdi_proxy_headers = proxy_headers  # type: ignore[attr-defined]
        return conn, True

    def _take(self, key: _Origin) -> tuple[http.client.HTTPConnection, bool] | None:
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                conn = idle.pop()
                return conn, bool(getattr(conn, "_cdi_absolute", False))
        return None

    def _release(self, key: _Origin, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._busy.discard(conn)
            if not self._cancelled:
                self._idle.setdefault(key, []).append(conn)
                return
        conn.close()

    def _forget(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._busy.discard(conn)

    def _failure(self, exc: BaseException, url: str) -> ImporterError:
        if self._cancelled:
            return ImporterError(Reason.TERMINATED, f"request to {redact(url)} cancelled")
        return classify_network(exc, url)

    def cancel(self) -> None:
        """Stop everything: in-flight responses fail at once, new requests are refused.

        Called when an import is stopped or failed while range workers are still blocked reading
        from a slow (or stalled) server; shutting their sockets down releases them immediately."""
        with self._lock:
            self._cancelled = True
            busy = list(self._busy)
        for conn in busy:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self.close()

    def close(self) -> None:
        with self._lock:
            for conns in self._idle.values():
                for conn in conns:
                    conn.close()
            self._idle.clear()

    # -- requests -----------------------------------------------------------------------------------
    def _headers(self, url: str, headers: Mapping[str, str] | None) -> dict[str, str]:
        out = {"User-Agent": self.settings.user_agent, "Accept-Encoding": "identity"}
        for name, value in self.settings.extra_headers:
            out[name] = value
        auth = self.settings.basic_auth
        if auth and (self.settings.auth_origin is None or origin_of(url) == self.settings.auth_origin):
            out["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        if headers:
            out.update(headers)
        return out

    def send(self, method: str, url: str, headers: Mapping[str, str] | None = None) -> Response:
        """One request, no redirects followed; network failures raise (transient) ImporterErrors."""
        key = origin_of(url)
        if key[0] not in ("http", "https"):
            raise ImporterError(Reason.INVALID_CONFIGURATION, f"unsupported URL scheme in {redact(url)}")
        parts = urlsplit(url)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        all_headers = self._headers(url, headers)
        for attempt in (0, 1):
            if self._cancelled:
                raise ImporterError(Reason.TERMINATED, f"request to {redact(url)} cancelled")
            pooled = self._take(key) if attempt == 0 else None
            conn, absolute = pooled if pooled else self._connect(key)
            with self._lock:
                self._busy.add(conn)
            if absolute:
                conn._cdi_absolute = True  # type: ignore[attr-defined]
                all_headers.update(getattr(conn, "_cdi_proxy_headers", {}))
            try:
                conn.request(
                    method, f"{key[0]}://{parts.netloc}{target}" if absolute else target, headers=all_headers
                )
                raw = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._forget(conn)
                conn.close()
                if pooled is not None:
                    continue  # a keep-alive connection the server had closed: once more on a fresh one
                raise classify_network(exc, url) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._forget(conn)
                conn.close()
                if self._cancelled:
                    raise ImporterError(Reason.TERMINATED, f"request to {redact(url)} cancelled") from exc
                raise classify_network(exc, url) from exc
            return Response(self, key, conn, raw, url)
        raise AssertionError("unreachable")

    def request(
        self, method: str, url: str, headers: Mapping[str, str] | None = None, follow_redirects: bool = True
    ) -> Response:
        """A request following redirects; `Response.url` is the final URL."""
        first = origin_of(url)
        for _ in range(MAX_REDIRECTS + 1):
            if headers and origin_of(url) != first:
                # a registry token or any Authorization is for the first origin only (a blob store
                # behind a redirect rejects, or worse, records it)
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            resp = self.send(method, url, headers)
            if not follow_redirects or resp.status not in (301, 302, 303, 307, 308):
                return resp
            location = resp.header("Location")
            resp.read_all(64 * 1024)
            if not location:
                raise ImporterError(Reason.REQUEST_REJECTED, f"{redact(url)} redirects without a Location")
            url = urljoin(url, location)
        raise ImporterError(Reason.REQUEST_REJECTED, f"too many redirects from {redact(url)}")


def ca_bundle(files: list[Path], system_bundle: Path) -> Path:
    """A temporary directory holding `ca.pem`: the system's CAs followed by `files`, for clients that
    take one bundle file (boto3, requests). The caller removes the directory."""
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="cdi-ca-"))
    system = [system_bundle.read_bytes()] if system_bundle.exists() else []
    (directory / "ca.pem").write_bytes(b"\n".join(system + [p.read_bytes() for p in files]))
    return directory
