"""The values of the worker pods' environment, written and read one way for all of them: the typed
requests (`importrequest`, `uploadrequest`, `clonesourcerequest`, `targetvolume`) build their entries and
parse their variables with these, so a value one program accepts is accepted by the others, and a value
one refuses is refused by all.

A bad value is the pod's configuration, not a failed transfer: `EnvError` says which variable and why,
and each program reports it as its own configuration error (the importer's and upload server's
`InvalidConfiguration`, the clone source's non-retryable failure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from cdi.api import env
from cdi.api.quantity import QuantityError, parse_bytes
from cdi.api.sizing import overhead_fraction

# Go's strconv.ParseBool, as CDI reads its boolean variables
_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class EnvError(ValueError):
    """A worker pod's environment the program cannot run with; the message names the variable."""


def env_value(name: str, value: str) -> dict[str, Any]:
    """One entry of a container's `env`."""
    return {"name": name, "value": value}


def pod_ip_from_status() -> dict[str, Any]:
    """POD_IP, which the kubelet sets to the pod's address (the downward API): servers in pods bind to it."""
    return {"name": env.POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def format_bool(value: bool) -> str:
    """How the controller writes a boolean (as CDI's strconv.FormatBool)."""
    return "true" if value else "false"


def bool_of(text: str) -> bool | None:
    """Go's strconv.ParseBool: None when `text` is no boolean."""
    return True if text in _TRUE else False if text in _FALSE else None


def parse_bool(environ: Mapping[str, str], name: str, default: bool = False, *, strict: bool = True) -> bool:
    """A boolean as Go's strconv.ParseBool reads it; unset or empty is `default`. Anything else is
    refused, unless `strict` is off, which keeps `default` instead (only INSECURE_TLS is read so, as CDI's
    importer reads it)."""
    value = environ.get(name)
    if value is None or value == "":
        return default
    parsed = bool_of(value)
    if parsed is not None:
        return parsed
    if strict:
        raise EnvError(f'{name}={value!r} is not a boolean; should be "true" or "false"')
    return default


def positive_float(environ: Mapping[str, str], name: str) -> float | None:
    """A positive number (seconds, in our tuning variables); None when unset or empty."""
    value = environ.get(name, "")
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        raise EnvError(f"{name}={value!r} is not a number") from None
    if number <= 0:
        raise EnvError(f"{name}={value!r} must be positive")
    return number


def byte_count(environ: Mapping[str, str], name: str) -> int | None:
    """A whole number of bytes, 0 or more; None when unset or empty."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 0:
        raise EnvError(f"{name}={text!r} is not a number of bytes")
    return number


def port(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "") or str(default)
    try:
        return int(text)
    except ValueError:
        raise EnvError(f"{name}={text!r} is not a port number") from None


def quantity(environ: Mapping[str, str], name: str) -> str:
    """A Kubernetes quantity, checked and kept as written (`1Gi`); unset or empty is ""."""
    text = environ.get(name, "").strip()
    if text:
        try:
            parse_bytes(text)
        except QuantityError as exc:
            raise EnvError(f"{name}: {exc}") from None
    return text


def overhead(environ: Mapping[str, str], name: str) -> str:
    """A filesystem overhead fraction in [0, 1), kept as written; unset or empty is "0"."""
    text = environ.get(name, "").strip() or "0"
    try:
        overhead_fraction(text)
    except ValueError as exc:
        raise EnvError(f"{name}={text!r}: {exc}") from None
    return text
