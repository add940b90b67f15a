"""API errors as Kubernetes `Status` objects, so that kubectl and client libraries print the same
messages they print for a real API server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    406: "NotAcceptable", 409: "Conflict", 410: "Expired", 413: "RequestEntityTooLarge", 415: "UnsupportedMediaType",
    422: "Invalid", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}


@dataclass
class Cause:
    """One field-level problem inside a 422 Invalid status."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def render(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


@dataclass
class StatusError(Exception):
    code: int
    message: str
    reason: str | None = None  # None: the usual reason for the code; "": none (as webhook denials may be)
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if self.reason is None:
            self.reason = _REASONS.get(self.code, "Unknown")

    @property
    def headers(self) -> dict[str, str] | None:
        """`Retry-After` when the status asks the client to come back, as kube-apiserver sets it."""
        retry = self.details.get("retryAfterSeconds")
        return {"Retry-After": str(retry)} if retry else None

    def body(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "code": self.code,
        }
        if self.reason:
            status["reason"] = self.reason
        if self.details:
            status["details"] = self.details
        return status


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> StatusError:
    return StatusError(404, f'{_qualified(resource, group)} "{name}" not found',
                       details={"name": name, "group": group, "kind": resource})


def already_exists(resource: str, group: str, name: str) -> StatusError:
    return StatusError(409, f'{_qualified(resource, group)} "{name}" already exists', "AlreadyExists",
                       details={"name": name, "group": group, "kind": resource})


def conflict(resource: str, group: str, name: str, why: str) -> StatusError:
    return StatusError(409, f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {why}',
                       "Conflict", details={"name": name, "group": group, "kind": resource})


def stale(resource: str, group: str, name: str) -> StatusError:
    return conflict(resource, group, name,
                    "the object has been modified; please apply your changes to the latest version and try again")


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> StatusError:
    rendered = [c.render() for c in causes]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    return StatusError(
        422, f'{kind}.{group} "{name}" is invalid: {summary}' if group else f'{kind} "{name}" is invalid: {summary}',
        "Invalid",
        details={"name": name, "group": group, "kind": kind,
                 "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes]},
    )


def bad_request(message: str) -> StatusError:
    return StatusError(400, message, "BadRequest")


def gone(message: str) -> StatusError:
    return StatusError(410, message, "Expired")


def entity_too_large(limit: int) -> StatusError:
    return StatusError(413, f"Request entity too large: limit is {limit}", "RequestEntityTooLarge")


def invalid_resource_version(value: str) -> StatusError:
    """A resourceVersion that is not an unsigned integer, in the words of kube-apiserver's list path
    (storage.ValidateListOptions wrapping APIObjectVersioner.ParseResourceVersion)."""
    return bad_request(f'invalid resource version: resourceVersion: Invalid value: "{value}": '
                       f'strconv.ParseUint: parsing "{value}": invalid syntax')


def too_large_resource_version(requested: int, current: int) -> StatusError:
    """A read at a resourceVersion the store has not reached, as storage.NewTooLargeResourceVersionError
    words it (504 Timeout, cause ResourceVersionTooLarge, retry after a second as the watch cache asks)."""
    return StatusError(504, f"Timeout: Too large resource version: {requested}, current: {current}", "Timeout",
                       details={"causes": [{"reason": "ResourceVersionTooLarge",
                                            "message": "Too large resource version"}],
                                "retryAfterSeconds": 1})
