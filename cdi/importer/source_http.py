"""HTTP/HTTPS sources: one probing request, then pinned parallel range reads or a single stream.

The first request is a GET for the first MiB (`Range: bytes=0-1048575`), following redirects.
Its answer settles everything at once, before any byte is written:

* 206 with a total size: the server serves ranges. The final URL after redirects is pinned and
  used for every later range (CDI#1737, CDI#2809: re-following a mirror redirector for every block
  cost 3/4 of the time and spread ranges over inconsistent mirrors). The body is the head of the
  image, used for format detection.
* 200: no Range support. The same response becomes the image stream (no second request), and
  its first MiB is peeked for detection.

Range reads resume at the byte where a failed attempt stopped, and check that the object has not
changed under us (ETag / Last-Modified of every 206 against the first one).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import ImporterError, Reason, TransientError
from .formats import HEAD_SIZE
from .http_client import HttpClient, Response, origin_of, redact, status_error
from .ranges import PrefetchStream
from .retry import RetryPolicy, transient
from .source import NbdSpec, Origin
from .streams import ChainStream, Chunk, PeekStream, Stream

log = logging.getLogger(__name__)

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def _error_detail(resp: Response) -> str:
    """A short, printable excerpt of an error body (S3 and registries explain themselves there)."""
    try:
        body = resp.read_all(4096)
    except ImporterError:
        return ""
    text = body.decode("utf-8", errors="replace")
    code = re.search(r"<Code>([^<]+)</Code>", text)
    if code:
        message = re.search(r"<Message>([^<]+)</Message>", text)
        return code.group(1) + (f" ({message.group(1)})" if message else "")
    return " ".join(text.split())[:200]


class HttpRangeReader:
    """Range GETs of the pinned URL, each retried from where it stopped."""

    def __init__(self, origin: HttpOrigin, size: int) -> None:
        self.origin = origin
        self.size = size

    def read_into(self, offset: int, view: memoryview) -> None:
        origin = self.origin
        url = origin.url
        if offset + len(view) > self.size:
            raise ImporterError(
                Reason.INVALID_IMAGE,
                f"read beyond the end of {origin.name} ({offset + len(view)} > {self.size})",
            )
        filled = 0

        def attempt() -> None:
            nonlocal filled
            start, end = offset + filled, offset + len(view) - 1
            resp = origin.client.request("GET", url, origin.headers_for(url, f"bytes={start}-{end}"))
            try:
                if resp.status != 206:
                    if resp.status == 200:
                        raise ImporterError(
                            Reason.REQUEST_REJECTED, f"{origin.name} stopped honouring Range requests"
                        )
                    origin.check_auth_expired(resp)
                    raise status_error(resp.status, url, _error_detail(resp))
                check_unchanged(resp, origin.validators, url)
                resp.on_bytes = origin.meter.add
                try:
                    filled += resp.readinto(view[filled:])
                except TransientError as exc:
                    filled += getattr(exc, "partial", 0)
                    raise
                if filled < len(view):
                    raise transient(
                        Reason.CONNECTION_FAILED, f"range response from {origin.name} ended early"
                    )
            finally:
                resp.close()

        origin.retry.run(attempt, f"GET {origin.name} bytes {offset}-{offset + len(view) - 1}", origin.stop)


def validators_of(resp: Response) -> dict[str, str]:
    out = {}
    for name in ("ETag", "Last-Modified"):
        value = resp.header(name)
        if value:
            out[name] = value
    return out


def check_unchanged(resp: Response, validators: dict[str, str], url: str) -> None:
    etag = resp.header("ETag")
    if "ETag" in validators and etag and etag != validators["ETag"]:
        raise transient(
            Reason.SOURCE_CHANGED,
            f"{redact(url)} changed during the import (ETag {validators['ETag']} -> {etag})",
        )


class _BodyStream:
    """The body of a 200 response; on a transient failure, GETs again and skips what was delivered."""

    def __init__(self, origin: HttpOrigin, resp: Response) -> None:
        self.origin = origin
        self.resp: Response | None = resp
        self.delivered = 0

    def read(self, n: int) -> Chunk:
        origin = self.origin

        def attempt() -> bytes:
            if self.resp is None:
                self.resp = origin.reopen(self.delivered)
            try:
                data = self.resp.read(n)
            except TransientError:
                self.resp = None
                raise
            if not data and origin.size is not None and self.delivered < origin.size:
                self.resp.close()
                self.resp = None
                raise transient(
                    Reason.CONNECTION_FAILED,
                    f"{origin.name} ended after {self.delivered} of {origin.size} bytes",
                )
            return data

        data = origin.retry.run(attempt, f"GET {origin.name}", origin.stop)
        self.delivered += len(data)
        return data

    def close(self) -> None:
        if self.resp is not None:
            self.resp.close()


class HttpOrigin(Origin):
    def __init__(
        self,
        client: HttpClient,
        url: str,
        retry: RetryPolicy,
        stop: threading.Event,
        *,
        name: str | None = None,
        identity: dict[str, Any] | None = None,
        request_headers: dict[str, str] | None = None,
        refresh_auth: Callable[[], dict[str, str]] | None = None,
        nbd: NbdSpec | None = None,
        workers: int = 4,
    ) -> None:
        super().__init__()
        self.client = client
        self.endpoint = url
        self.url = url  # the final URL after redirects, once opened
        self.retry = retry
        self.stop = stop
        self.name = name or redact(url)
        self.request_headers = request_headers or {}
        self.refresh_auth = refresh_auth
        self._last_refresh = 0.0
        self._identity_base = identity
        self._nbd = nbd
        self.workers = workers
        self.validators: dict[str, str] = {}
        self._peek: PeekStream | None = None
        self._stream_used = False

    def headers_for(self, url: str, range_header: str | None = None) -> dict[str, str]:
        """Request headers (registry tokens ...) go to the endpoint's own origin only."""
        headers = dict(self.request_headers) if origin_of(url) == origin_of(self.endpoint) else {}
        if range_header:
            headers["Range"] = range_header
        return headers

    def check_auth_expired(self, resp: Response) -> None:
        """A 401 on a later request (an expired registry token): renew it once and retry."""
        if resp.status != 401 or self.refresh_auth is None or time.monotonic() - self._last_refresh < 10:
            return
        resp.close()
        self._last_refresh = time.monotonic()
        self.request_headers = self.refresh_auth()
        raise transient(Reason.UNAUTHORIZED, f"{self.name}: the token expired")

    def open(self) -> HttpOrigin:
        resp = self.retry.run(lambda: self._get(f"bytes=0-{HEAD_SIZE - 1}"), f"GET {self.name}", self.stop)
        self.url = resp.url
        if resp.url != self.endpoint:
            log.info("%s redirects to %s; using that URL for every request", self.name, redact(resp.url))
        self.validators = validators_of(resp)
        if resp.status == 206:
            match = _CONTENT_RANGE.match(resp.header("Content-Range") or "")
            if match and match.group(3) != "*":
                self.size = int(match.group(3))
                self.ranges = HttpRangeReader(self, self.size)
                resp.on_bytes = self.meter.add
                self.head = self._read_head(resp, int(match.group(2)) - int(match.group(1)) + 1)
                self.identity = self._identity()
                return self
            resp.close()
            resp = self.retry.run(lambda: self._get(None), f"GET {self.name}", self.stop)
        if resp.status == 416:  # a Range on an empty object
            self.size = 0
            self.head = b""
            resp.close()
            return self
        self.size = resp.length
        resp.on_bytes = self.meter.add
        self._peek = PeekStream(_BodyStream(self, resp))
        self.head = self._peek.peek(HEAD_SIZE)
        log.info("%s does not serve byte ranges: reading it as one stream", self.name)
        return self

    def _read_head(self, resp: Response, length: int) -> bytes:
        buf = bytearray(length)
        got = 0
        try:
            got = resp.readinto(memoryview(buf))
        except TransientError as exc:
            got = getattr(exc, "partial", 0)
        finally:
            resp.close()
        if got < length and self.ranges is not None:  # finish the head with a plain range read
            self.ranges.read_into(got, memoryview(buf)[got:])
        return bytes(buf)

    def _identity(self) -> dict[str, Any] | None:
        """What a resumed attempt must find unchanged; None (no resume) without ETag or Last-Modified,
        since a changed object of the same size would otherwise be spliced into the old one."""
        if not self.validators:
            log.info(
                "%s sends neither ETag nor Last-Modified: an interrupted import will start over", self.name
            )
            return None
        base: dict[str, Any] = dict(self._identity_base or {"url": redact(self.endpoint)})
        base["size"] = self.size
        base.update({k.lower(): v for k, v in self.validators.items()})
        return base

    def _get(self, range_header: str | None) -> Response:
        resp = self.client.request("GET", self.url, self.headers_for(self.url, range_header))
        if resp.status not in (200, 206, 416):
            self.check_auth_expired(resp)
            raise status_error(resp.status, resp.url, _error_detail(resp))
        return resp

    def reopen(self, skip_bytes: int) -> Response:
        """A new GET of the whole object with the first `skip_bytes` already read and discarded."""
        resp = self._get(None)
        if resp.status != 200:
            resp.close()
            raise transient(Reason.SERVER_ERROR, f"{self.name} answered {resp.status} to a plain GET")
        check_unchanged(resp, self.validators, self.url)
        remaining = skip_bytes
        while remaining:
            data = resp.read(min(remaining, 4 << 20))
            if not data:
                raise transient(Reason.CONNECTION_FAILED, f"{self.name} ended early on a retry")
            remaining -= len(data)
        resp.on_bytes = self.meter.add
        return resp

    def stream(self) -> Stream:
        if self._stream_used:
            raise RuntimeError("the stream of an origin can be read once")
        self._stream_used = True
        if self.ranges is not None and self.size is not None:
            reader, size, head = self.ranges, self.size, self.head
            return ChainStream(
                head,
                lambda: PrefetchStream(
                    reader, len(head), size, workers=self.workers, stop=self.stop, on_cancel=self.abort
                ),
            )
        if self._peek is not None:
            return self._peek
        return ChainStream(self.head, None)

    def nbd(self) -> NbdSpec | None:
        if self.ranges is None or self._nbd is None:
            return None
        spec = self._nbd
        spec.url = self.url
        if origin_of(self.url) != origin_of(self.endpoint):
            spec.user = spec.password = None  # credentials are for the endpoint, not a redirect target
        return spec

    def abort(self) -> None:
        self.client.cancel()

    def close(self) -> None:
        if self._peek is not None:
            self._peek.close()
