"""The `CDI` resource's `spec.certConfig` read the way CDI reads it: per kind of certificate (`ca`,
`server`, `client`) a `duration` and a `renewBefore`, Go duration strings, with CDI's defaults (48h/24h
for CAs, 24h/12h for leaves). cdi-operator issues and rotates the long-lived certificates from it; the
controller gives the per-pod certificates it issues (upload servers, clone sources) the same lifetimes."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

DEFAULTS = {"ca": ("48h", "24h"), "server": ("24h", "12h"), "client": ("24h", "12h")}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> datetime.timedelta:
    """A Go duration (`48h`, `1h30m`, `90s`) as a timedelta."""
    parts = _DURATION.findall(text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return datetime.timedelta(seconds=sum(float(n) * _UNIT[u] for n, u in parts))


def lifetime(cert_config: Mapping[str, Any] | None, which: str) -> tuple[datetime.timedelta, datetime.timedelta]:
    """(duration, renewBefore) of `which` (`ca`, `server` or `client`)."""
    wanted = (cert_config or {}).get(which) or {}
    duration, renew = DEFAULTS[which]
    return parse_duration(wanted.get("duration") or duration), parse_duration(wanted.get("renewBefore") or renew)


def days(cert_config: Mapping[str, Any] | None, which: str) -> float:
    """The duration of `which` in days (what `cdi.common.pki` takes); CDI's default when unreadable."""
    try:
        duration, _ = lifetime(cert_config, which)
    except ValueError:
        duration, _ = lifetime(None, which)
    return duration.total_seconds() / 86400
