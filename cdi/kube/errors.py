"""Typed API errors, built from the `Status` body the API server returns.

Every error of this package derives from `ApiError`, so a caller can catch "anything the API said or
failed to say" in one clause and still tell the cases apart by class. The classes follow the reasons
client-go's `apierrors.IsXxx` helpers test for, because that is how controllers decide what to do:

    ApiError                      code, reason, message, the raw `Status` dict
    ├── TransportError            no HTTP answer at all (refused, reset, TLS, timeout)
    │   └── WatchInactive         a watch stream went silent for longer than allowed
    ├── BadRequest           400
    ├── Unauthorized         401
    ├── Forbidden            403
    ├── NotFound             404
    ├── MethodNotAllowed     405
    ├── Conflict             409  reason Conflict: stale resourceVersion, retry with a fresh read
    ├── AlreadyExists        409  reason AlreadyExists: a create hit an existing name
    ├── Gone                 410  reason Expired/Gone: resourceVersion too old, relist
    ├── UnsupportedMediaType 415
    ├── Invalid              422  with field `causes`
    ├── TooManyRequests      429  with `retry_after`
    └── ServerError          5xx  with `retry_after`

`Conflict` and `AlreadyExists` are siblings, not parent and child: a conflict is retried after a
re-read, an existing name never goes away by retrying, and `retry_on_conflict` must not loop on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Cause:
    """One field-level problem of a 422 Invalid answer (`details.causes[]`)."""

    field: str
    message: str
    reason: str


class ApiError(Exception):
    """Something went wrong talking to the API server."""

    code: int = 0

    def __init__(self, message: str, *, code: int | None = None, reason: str = "",
                 status: Mapping[str, Any] | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.reason = reason
        self.status: dict[str, Any] = dict(status or {})
        self.retry_after = retry_after

    @property
    def details(self) -> dict[str, Any]:
        details = self.status.get("details")
        return details if isinstance(details, dict) else {}

    @property
    def transient(self) -> bool:
        """Whether retrying the same request later can succeed without changing it."""
        return False

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}" if self.code else self.message


class TransportError(ApiError):
    """No HTTP answer: connection refused or reset, TLS failure, request timeout."""

    @property
    def transient(self) -> bool:
        return True


class WatchInactive(TransportError):
    """A watch stream delivered no bytes (not even a bookmark) for longer than the inactivity timeout.

    A half-open TCP connection looks exactly like a quiet resource; only this timer tells them apart."""


class BadRequest(ApiError):
    code = 400


class Unauthorized(ApiError):
    code = 401


class Forbidden(ApiError):
    code = 403

    @property
    def namespace_terminating(self) -> bool:
        """Refused because the namespace is being deleted (the NamespaceLifecycle admission's cause): whatever
        the request would have made there is going with it."""
        return any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating"
                   for c in self.details.get("causes") or [])


class NotFound(ApiError):
    code = 404


class MethodNotAllowed(ApiError):
    code = 405


class Conflict(ApiError):
    """409 Conflict: the object changed since it was read (stale resourceVersion or precondition)."""

    code = 409


class AlreadyExists(ApiError):
    """409 AlreadyExists: a create named an object that exists."""

    code = 409


class Gone(ApiError):
    """410: the resourceVersion asked for is older than the server's history; relist."""

    code = 410


class UnsupportedMediaType(ApiError):
    code = 415


class Invalid(ApiError):
    """422: the object failed validation; `causes` says which fields and why."""

    code = 422

    @property
    def causes(self) -> list[Cause]:
        raw = self.details.get("causes") or []
        return [Cause(str(c.get("field", "")), str(c.get("message", "")), str(c.get("reason", "")))
                for c in raw if isinstance(c, dict)]


class TooManyRequests(ApiError):
    code = 429

    @property
    def transient(self) -> bool:
        return True


class ServerError(ApiError):
    """5xx: the server (or something in front of it) failed; usually worth retrying."""

    code = 500

    @property
    def transient(self) -> bool:
        return True


_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed,
    409: Conflict, 410: Gone, 415: UnsupportedMediaType, 422: Invalid, 429: TooManyRequests,
}


def _retry_after(status: Mapping[str, Any], header: str | None) -> float | None:
    details = status.get("details")
    if isinstance(details, dict) and isinstance(details.get("retryAfterSeconds"), int | float):
        return float(details["retryAfterSeconds"])
    if header:
        try:
            return float(header)
        except ValueError:
            return None
    return None


def error_from_status(status: Mapping[str, Any], code: int | None = None,
                      retry_after_header: str | None = None) -> ApiError:
    """The typed error for a `Status` object (from an HTTP error body or an in-stream ERROR event)."""
    raw_code = status.get("code")
    if code is None:
        code = raw_code if isinstance(raw_code, int) else 500
    reason = str(status.get("reason") or "")
    message = str(status.get("message") or reason or f"HTTP {code}")
    cls: type[ApiError]
    if code == 409 and reason == "AlreadyExists":
        cls = AlreadyExists
    elif code >= 500:
        cls = ServerError
    else:
        cls = _BY_CODE.get(code, ApiError)
    return cls(message, code=code, reason=reason, status=status,
               retry_after=_retry_after(status, retry_after_header))


def error_from_response(code: int, body: bytes, retry_after_header: str | None = None) -> ApiError:
    """The typed error for a non-2xx HTTP answer; tolerates bodies that are not a `Status` (proxies)."""
    status: dict[str, Any] = {}
    try:
        parsed = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        status = parsed
    else:
        text = body.decode("utf-8", "replace").strip()[:500]
        status = {"kind": "Status", "status": "Failure", "code": code, "message": text or f"HTTP {code}"}
    return error_from_status(status, code, retry_after_header)
