"""Sending the image to the upload proxy, resuming after a dropped connection.

The body is sent with plain blocking `http.client` over an `ssl` socket, 1 MiB per write: OpenSSL
encrypts a whole write in one call, with the GIL released, which is several times cheaper than an
asyncio transport for a single bulk stream (the CLI runs this in a worker thread).

Protocol (CDI's, plus our resume extension, `cdi.api.upload`):

1. `HEAD /v1beta1/upload-async` with the token: 200 means the async endpoint exists (as virtctl
   probes it); otherwise the sync endpoint is used.
2. `POST` the file with `Content-Length`, `Authorization: Bearer <token>` and
   `X-CDI-Upload-Target: <namespace>/<pvc>` (the proxy refuses a token for another PVC).
   Before the first `POST`, the same path is asked where to start (`HEAD`, `Upload-Offset`): an
   earlier invocation that was killed (or lost its connection for good) may have left the start of
   this image on the volume. It is skipped only when the regions the server vouches for
   (`Upload-Kept-Sha256`) hold the same bytes in this file; otherwise, or without them, the upload
   starts over.
3. When the connection breaks before an answer: `HEAD` the same path until the upload server
   reports `Upload-State: idle` (it may take a moment to notice the break), read `Upload-Offset`,
   and `POST` the rest of the file with `Upload-Offset: N`. An offset of 0 (an image that cannot
   resume, or a server without the extension) sends the whole file again. While asking, a 502, 503
   or 504 (the proxy cannot reach the upload server: its pod is restarting) and connection errors are
   retried for up to `SETTLE_TIMEOUT` seconds per break; the server keeps the offset on the volume,
   so it answers it again after a restart. Before each question the cluster is asked whether the upload
   can still succeed (`failed`): a DataVolume or PVC deleted meanwhile (its upload server went with it),
   or a failed upload, ends it at once with that reason. At most `attempts` connections carry the
   image. A token older than 4 minutes is replaced before a new request (tokens live 5 minutes and are
   only checked when a request starts).
4. When the proxy offers end-to-end TLS (`Upgrade: cdi-upload-tls/1` on its answer to the probe), the
   `POST` of step 2 is an upgrade: the proxy checks the token and switches the connection, and the
   image goes in a TLS session with the upload server itself (`cdi.api.upload`), so it is encrypted
   once instead of decrypted and encrypted again by the proxy. `CDI_IMAGE_UPLOAD_END_TO_END=0` sends
   through the proxy's TLS instead, as virtctl does.
5. An answer other than 200 is final: it is the server's verdict on the image (too large, corrupt)
   or on the request (token, readiness), and sending again would not change it. After a break, the
   proxy's 503 "already finished uploading" (with `Upload-State: done` on the answer to a `HEAD`), or
   the upload server's 409, means the first attempt did get through.

Through the Kubernetes API server (`cdi.api.upload`, our extension) the same requests go to the same paths
under `/apis/upload.extensions.cdi.dev/.../uploads/<pvc>/proxy`, with the kubeconfig's credentials
(`ApiServerCredentials`: its client certificate is in the TLS context, its token in `Authorization`)
instead of an upload token, and never end to end (the API server offers no protocol switch of ours). A
`403` to the probe is the API server's RBAC refusing the user: its message is read (a `GET`, which RBAC
sees as the same `get`) and the upload ends before a byte is sent."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11

from cdi.api import upload as names
from cdi.cli.imageupload.progress import Progress, human
from cdi.common import pki, sockhttp
from cdi.common.backoff import backoff_delay

log = logging.getLogger(__name__)

CHUNK = 1 << 20
SEND_TIMEOUT = 120.0  # seconds without progress while sending before the connection counts as dropped
TOKEN_MAX_AGE = 240.0
# how long to wait for the upload server to notice a break (a silent one: its 120 s idle limit), or to come back
# after a restart
SETTLE_TIMEOUT = 180.0
RETRIED = frozenset({502, 503, 504})  # while asking where to resume: the upload server is not reachable yet
ASYNC_PATH = "/v1beta1/upload-async"
SYNC_PATH = "/v1beta1/upload"
FINISHED_MARK = "already finished uploading"
END_TO_END_ENV = "CDI_IMAGE_UPLOAD_END_TO_END"  # "0": send through the proxy's TLS, as virtctl does


class UploadFailed(Exception):
    """The upload cannot succeed (the message says why)."""


@dataclass
class Attempt:
    offset: int
    sent: int = 0
    error: str = ""
    end_to_end: bool = False  # TLS with the upload server itself, through the proxy


@dataclass
class TransferStats:
    size: int
    seconds: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)
    path: str = ""
    skipped: int = 0  # bytes an earlier invocation had left on the volume, not sent again
    via_apiserver: bool = False  # through the Kubernetes API server's aggregation layer, not the proxy's URL

    @property
    def sent(self) -> int:
        return sum(a.sent for a in self.attempts)

    @property
    def resumed_at(self) -> int:
        """The offset the last attempt started at (0: nothing was resumed)."""
        return self.attempts[-1].offset if self.attempts else 0


class TokenSource:
    """Upload tokens, renewed before they get old (`fetch` creates an UploadTokenRequest)."""

    def __init__(self, fetch: Callable[[], str]) -> None:
        self._fetch = fetch
        self._token = ""
        self._at = 0.0

    def get(self, *, fresh: bool = False) -> str:
        if fresh or not self._token or time.monotonic() - self._at > TOKEN_MAX_AGE:
            self._token = self._fetch()
            self._at = time.monotonic()
        return self._token

    def header(self, *, fresh: bool = False) -> str | None:
        """The `Authorization` header's value."""
        return f"Bearer {self.get(fresh=fresh)}"


class ApiServerCredentials:
    """The kubeconfig's credentials, for requests through the API server: `fetch` gives the `Authorization`
    value the Kubernetes client would send now (None with a client certificate alone), which the client
    refreshes itself (exec plugins, token files)."""

    def __init__(self, fetch: Callable[[], str | None]) -> None:
        self._fetch = fetch

    def header(self, *, fresh: bool = False) -> str | None:
        return self._fetch()


Credentials = TokenSource | ApiServerCredentials


class _Connection(http.client.HTTPSConnection):
    """An HTTPS connection that checks the server's certificate for `server_hostname` (a kubeconfig's
    `tls-server-name`) rather than the host it connects to."""

    def __init__(self, host: str, port: int, *, context: ssl.SSLContext, timeout: float | None,
                 server_hostname: str) -> None:
        super().__init__(host, port, context=context, timeout=timeout)
        self._server_hostname = server_hostname
        self._tls = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_hostname)


class Transfer:
    def __init__(self, url: str, context: ssl.SSLContext, tokens: Credentials, target: str, path: str,
                 progress: Progress, *, attempts: int = 5, failed: Callable[[], str | None] | None = None,
                 server_hostname: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise UploadFailed(f"the upload proxy URL must be https://HOST[:PORT], not {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 443
        self.prefix = parts.path.rstrip("/")
        self.server_hostname = server_hostname or self.host
        self.via_apiserver = isinstance(tokens, ApiServerCredentials)
        self.what = "the Kubernetes API server" if self.via_apiserver else "the upload proxy"
        self.context = context
        self.tokens = tokens
        self.target = target
        self.file = path
        self.size = os.path.getsize(path) if os.path.isfile(path) else _device_size(path)
        self.progress = progress
        self.max_attempts = max(1, attempts)
        self.failed = failed or (lambda: None)  # the reason the upload failed for good, if it did
        self.end_to_end = False  # TLS with the upload server itself (the proxy offered it)

    # -- requests ---------------------------------------------------------------------------------------
    def _connect(self, timeout: float | None) -> http.client.HTTPSConnection:
        conn = _Connection(self.host, self.port, context=self.context, timeout=timeout,
                           server_hostname=self.server_hostname)
        try:
            conn.connect()
        except ssl.SSLCertVerificationError as exc:
            if self.via_apiserver:
                raise UploadFailed(f"cannot verify the certificate of the Kubernetes API server https://{self.host}:"
                                   f"{self.port} ({exc.verify_message}) with the kubeconfig's CA") from None
            raise UploadFailed(f"cannot verify the certificate of the upload proxy https://{self.host}:{self.port} "
                               f"({exc.verify_message}); give its CA with --uploadproxy-ca, or use --insecure "
                               "(not recommended)") from None
        assert conn.sock is not None
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        return conn

    def _headers(self, **extra: str) -> dict[str, str]:
        authorization = self.tokens.header()
        credentials = {"Authorization": authorization} if authorization else {}
        return {**credentials, names.TARGET_HEADER: self.target, **extra}

    def _head(self, path: str) -> tuple[int, dict[str, str], str]:
        conn = self._connect(30.0)
        try:
            conn.request("HEAD", self.prefix + path, headers=self._headers())
            resp = conn.getresponse()
            resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.reason
        finally:
            conn.close()

    def _refusal(self, path: str) -> str:
        """What a refusal of a `HEAD` (which has no body) says: the same request as a `GET`, whose answer has one
        (the API server's `Status` message, when it is one)."""
        conn = self._connect(30.0)
        try:
            conn.request("GET", self.prefix + path, headers=self._headers())
            resp = conn.getresponse()
            text = resp.read(64 << 10).decode(errors="replace").strip()
        except (OSError, http.client.HTTPException) as exc:
            return f"({exc})"
        finally:
            conn.close()
        with contextlib.suppress(ValueError, TypeError, KeyError):
            return str(json.loads(text)["message"])
        return text or http.client.responses.get(403, "")

    def choose_path(self) -> str:
        """The async endpoint when the proxy has it (CDI's HEAD probe), else the sync one; and whether the proxy
        offers end-to-end TLS with the upload server (`Upgrade` on that answer, `cdi.api.upload`)."""
        try:
            status, headers, _ = self._head(ASYNC_PATH)
        except (OSError, http.client.HTTPException):
            return SYNC_PATH
        if status == 403:  # the API server's RBAC (the proxy itself never answers 403): no use sending the image
            raise UploadFailed(f"{self.what} refused the upload: 403 {self._refusal(ASYNC_PATH)}")
        if status == 401:
            self.tokens.header(fresh=True)
        offered = {p.strip().lower() for p in headers.get("upgrade", "").split(",")}
        wanted = os.environ.get(END_TO_END_ENV, "1").strip().lower() not in ("0", "false", "no")
        self.end_to_end = wanted and status == 200 and names.TLS_UPGRADE in offered and not self.via_apiserver
        return ASYNC_PATH if status == 200 else SYNC_PATH

    def _post(self, path: str, offset: int, attempt: Attempt) -> tuple[int, str]:
        attempt.end_to_end = self.end_to_end
        if self.end_to_end:
            return self._post_end_to_end(path, offset, attempt)
        headers = self._headers(**{"Content-Type": "application/octet-stream",
                                   "Content-Length": str(self.size - offset)})
        if offset:
            headers[names.OFFSET_HEADER] = str(offset)
        conn = self._connect(SEND_TIMEOUT)
        try:
            conn.putrequest("POST", self.prefix + path, skip_accept_encoding=True)
            for key, value in headers.items():
                conn.putheader(key, value)
            conn.endheaders()
            try:
                assert conn.sock is not None
                self._send_body(conn.sock, offset, attempt)
            except OSError as exc:
                early = _early_answer(conn)  # the server may have answered (and closed) before the end
                if early is not None:
                    return early
                raise ConnectionError(f"the connection broke after {human(offset + attempt.sent)}: {exc}") from exc
            assert conn.sock is not None
            conn.sock.settimeout(None)  # a sync upload answers only once the image is converted
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace").strip()
        finally:
            conn.close()

    def _post_end_to_end(self, path: str, offset: int, attempt: Attempt) -> tuple[int, str]:
        """The upload over TLS with the upload server itself, through the proxy (`cdi.api.upload`)."""
        conn = self._connect(SEND_TIMEOUT)
        sock, conn.sock = conn.sock, None
        assert sock is not None
        with sock:
            outer = h11.Connection(h11.CLIENT)
            head = [(b"Host", f"{self.host}:{self.port}".encode()), *_encoded(self._headers()),
                    (b"Content-Length", b"0"), (b"Connection", b"Upgrade"), (b"Upgrade", names.TLS_UPGRADE.encode())]
            sock.sendall(outer.send(h11.Request(method=b"POST", target=self.prefix + path, headers=head)) +
                         (outer.send(h11.EndOfMessage()) or b""))
            answer = _read_event(sock, outer)
            if isinstance(answer, h11.Response):
                return answer.status_code, _read_text(sock, outer)  # a refusal, as for any upload
            given = sockhttp.headers(answer) if isinstance(answer, h11.InformationalResponse) else {}
            nonce, name, ca = (given.get(h.lower()) for h in (names.NONCE_HEADER, names.SERVER_NAME_HEADER,
                                                              names.SERVER_CA_HEADER))
            if not (isinstance(answer, h11.InformationalResponse) and answer.status_code == 101 and nonce and name
                    and ca):
                self.end_to_end = False  # the next attempt goes the classic way
                raise ConnectionError(f"the upload proxy answered {answer!r} to an upgrade to {names.TLS_UPGRADE}")
            plain = sockhttp.unwrap(sock)
        with plain:
            try:
                context = pki.client_context(base64.b64decode(ca).decode())
            except (ValueError, ssl.SSLError) as exc:
                raise UploadFailed(f"the upload proxy gave an unusable upload-server CA: {exc}") from None
            try:
                tls = context.wrap_socket(plain, server_hostname=name)
            except ssl.SSLCertVerificationError as exc:
                raise UploadFailed(f"cannot verify the upload server's certificate ({exc.verify_message}) with the "
                                   "CA the upload proxy gave") from None
        with tls:
            inner = h11.Connection(h11.CLIENT)
            extra = {names.OFFSET_HEADER: str(offset)} if offset else {}
            head = [(b"Host", name.encode()), (b"Content-Type", b"application/octet-stream"),
                    (b"Content-Length", str(self.size - offset).encode()),
                    (names.NONCE_HEADER.encode(), nonce.encode()), *_encoded(extra)]
            tls.sendall(inner.send(h11.Request(method=b"POST", target=path, headers=head)) or b"")
            try:
                self._send_body(tls, offset, attempt)
            except OSError as exc:
                try:  # the server may have answered (and closed) before the end
                    tls.settimeout(5.0)
                    answer = _read_event(tls, inner)
                    if isinstance(answer, h11.Response):
                        return answer.status_code, _read_text(tls, inner)
                except (OSError, h11.ProtocolError):
                    pass
                raise ConnectionError(f"the connection broke after {human(offset + attempt.sent)}: {exc}") from exc
            tls.settimeout(None)  # a sync upload answers only once the image is converted
            answer = _read_event(tls, inner)
            if not isinstance(answer, h11.Response):
                raise ConnectionError("the upload server closed the connection without an answer")
            return answer.status_code, _read_text(tls, inner)

    def _send_body(self, sock: socket.socket, offset: int, attempt: Attempt) -> None:
        sock.settimeout(SEND_TIMEOUT)  # a peer that stops reading is a dropped connection: the upload resumes
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        with open(self.file, "rb", buffering=0) as f:
            f.seek(offset)
            remaining = self.size - offset
            while remaining > 0:
                n = f.readinto(view[:min(CHUNK, remaining)])
                if not n:
                    raise UploadFailed(f"{self.file} became shorter while it was being uploaded")
                sock.sendall(view[:n])
                remaining -= n
                attempt.sent += n
                self.progress.add(n)

    def _resume_offset(self, path: str, *, vouched: bool = False) -> int | None:
        """Where the upload server can continue (None: it already has the whole image). `vouched` (before the
        first POST): continue only at an offset whose kept bytes the server shows to be this file's
        (`Upload-Kept-Sha256`), as for bytes another invocation sent, else 0; and an answer that says
        nothing about resuming (a proxy without the extension, a refused token) is 0 too: the POST gets the
        real verdict."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        waits = 0
        while True:
            why = ""
            if not vouched:  # after a break: a volume deleted meanwhile takes its upload server along for good
                failure = self.failed()
                if failure:
                    raise UploadFailed(failure)
            try:
                status, headers, reason = self._head(path)
            except (OSError, http.client.HTTPException) as exc:
                if vouched:
                    return 0
                status, headers, reason = 0, {}, ""
                why = f"{self.what} is unreachable: {exc}"
            if vouched and status not in (200, 409, *RETRIED):
                return 0
            if status == 401:
                self.tokens.header(fresh=True)
                why = "the token was refused"
            elif status == 200:
                state = headers.get(names.STATE_HEADER.lower(), "idle")
                if state in ("processing", "done"):
                    return None
                if state == "idle":
                    offset = int(headers.get(names.OFFSET_HEADER.lower(), "0") or 0)
                    if vouched and offset and not self._holds_this_file(offset, headers.get(names.KEPT_HEADER.lower())):
                        self.progress.note(f"the volume holds {human(offset)} of a different image; starting over")
                        return 0
                    return offset
                why = "another upload to this volume is in progress" if vouched else \
                    "the upload server has not noticed the break yet"
            elif status == 409 or (status == 503 and headers.get(names.STATE_HEADER.lower()) == "done"):
                return None  # the upload finished (the upload server said so, or the proxy found the PVC Succeeded)
            elif status in RETRIED:  # the upload server is restarting or not ready yet
                failure = self.failed()
                if failure:
                    raise UploadFailed(failure)
                why = f"{self.what} answered {status} {reason}"
            elif status:
                raise UploadFailed(f"{self.what} answered {status} {reason} when asked where to resume")
            if time.monotonic() > deadline:
                raise UploadFailed(f"the upload server did not become ready for a resumed upload within "
                                   f"{SETTLE_TIMEOUT:.0f}s: {why}")
            time.sleep(backoff_delay(waits, 0.2, 2.0, factor=1.5))
            waits += 1

    def _holds_this_file(self, offset: int, kept: str | None) -> bool:
        """Whether the regions the server vouches for hold this file's bytes, up to the offset."""
        regions = names.parse_kept(kept) if kept else None
        if not regions or offset > self.size or max(start + length for start, length, _ in regions) != offset:
            return False
        with open(self.file, "rb", buffering=0) as f:
            for start, length, digest in regions:
                f.seek(start)
                data = f.read(length)
                if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
                    return False
        return True

    # -- the whole transfer -------------------------------------------------------------------------------
    def run(self) -> TransferStats:
        stats = TransferStats(self.size, via_apiserver=self.via_apiserver)
        started = time.monotonic()
        stats.path = path = self.choose_path()
        offset = self._resume_offset(path, vouched=True) or 0  # what an earlier invocation left on the volume
        if offset:
            stats.skipped = offset
            self.progress.restart_at(offset, f"{human(offset)} ({offset} bytes) of this image are already on the "
                                             "volume: resuming there")
        while True:
            attempt = Attempt(offset)
            stats.attempts.append(attempt)
            try:
                status, body = self._post(path, offset, attempt)
            except (OSError, http.client.HTTPException) as exc:
                attempt.error = str(exc)
                if isinstance(exc, ConnectionRefusedError) and not attempt.sent and len(stats.attempts) == 1:
                    raise UploadFailed(f"cannot connect to {self.what} https://{self.host}:{self.port}: "
                                       f"{exc}") from None
                if len(stats.attempts) >= self.max_attempts:
                    raise UploadFailed(f"{exc}; giving up after {len(stats.attempts)} attempts") from None
                self.progress.restart_at(self.progress.done, f"{exc}; asking the upload server where to resume")
                resume = self._resume_offset(path)
                if resume is None:
                    break  # everything had arrived before the connection broke
                offset = resume
                what = f"resuming at {human(offset)} ({offset} bytes)" if offset else "starting over"
                self.progress.restart_at(offset, f"{what}, attempt {len(stats.attempts) + 1} of {self.max_attempts}")
                continue
            if status == 200:
                break
            if status in (409, 503) and FINISHED_MARK in body and len(stats.attempts) > 1:
                break  # a retried request found the upload done
            if status == 401 and "expired" in body and len(stats.attempts) < self.max_attempts:
                self.tokens.header(fresh=True)
                offset = self._resume_offset(path) or 0
                continue
            raise UploadFailed(f"the upload was refused: {status} {body or http.client.responses.get(status, '')}")
        self.progress.finish()
        stats.seconds = time.monotonic() - started
        return stats


def _read_event(sock: socket.socket, conn: h11.Connection) -> h11.Event:
    try:
        event = sockhttp.read_event(sock, conn)
    except h11.RemoteProtocolError as exc:
        raise ConnectionError(f"a broken answer: {exc}") from None
    if event is None:
        raise ConnectionError("the connection closed before an answer")
    return event


def _read_text(sock: socket.socket, conn: h11.Connection) -> str:
    body = bytearray()
    while isinstance(event := _read_event(sock, conn), h11.Data):
        body += event.data
    return body.decode(errors="replace").strip()


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def _early_answer(conn: http.client.HTTPSConnection) -> tuple[int, str] | None:
    try:
        assert conn.sock is not None
        conn.sock.settimeout(5.0)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace").strip()
    except (OSError, http.client.HTTPException, AssertionError):
        return None


def _device_size(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)
