"""The operator's versions, compared the way CDI's operator compares them.

CDI's operator is told its version by `OPERATOR_VERSION` (its release manifests set it to the image tag) and
decides from it and the `CDI` resource's `status.observedVersion` whether a pass is an upgrade
(controller-lifecycle-operator-sdk, `reconciler.ShouldTakeUpdatePath`): versions are semantic versions with an
optional leading `v`; a higher one is an upgrade, an equal one is not, a lower one is a downgrade, which it
refuses to reconcile; versions that are not both semantic versions cannot be ordered, and then any difference
is taken for an upgrade. The ordering here is Semantic Versioning 2.0's (pre-releases below their release,
build metadata ignored), as blang/semver's `Compare` that CDI's operator uses."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBER = r"0|[1-9][0-9]*"
_IDENTIFIER = r"[0-9A-Za-z-]+"
_SEMVER = re.compile(rf"^({_NUMBER})\.({_NUMBER})\.({_NUMBER})"
                     rf"(?:-({_IDENTIFIER}(?:\.{_IDENTIFIER})*))?(?:\+({_IDENTIFIER}(?:\.{_IDENTIFIER})*))?$")
# a Kubernetes label value: what a version must be to label what the operator applies with it
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")


class Downgrade(Exception):
    """The operator is older than what it would reconcile: CDI's operator does nothing then."""


@dataclass(frozen=True)
class SemVer:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()

    def key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        """Sorts as SemVer 2.0 §11: a release above its pre-releases; numeric identifiers numerically and
        below alphanumeric ones; a longer run of equal identifiers above a shorter one."""
        ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.prerelease)
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, ids)


def parse(version: str) -> SemVer | None:
    """`v1.62.0`, `1.62.0`, `0.1.0-dev.541.g3fcd25e` -> SemVer; anything else (`latest`, `devel`, `1.62`) -> None."""
    match = _SEMVER.match(version[1:] if version.startswith("v") else version)
    if not match:
        return None
    major, minor, patch, prerelease, _build = match.groups()
    if prerelease and any(p.isdigit() and len(p) > 1 and p.startswith("0") for p in prerelease.split(".")):
        return None  # SemVer forbids leading zeros in numeric pre-release identifiers
    return SemVer(int(major), int(minor), int(patch), tuple(prerelease.split(".")) if prerelease else ())


def compare(a: str, b: str) -> int | None:
    """-1, 0 or 1 as `a` is lower, equal or higher than `b`; None when either is not a semantic version."""
    pa, pb = parse(a), parse(b)
    if pa is None or pb is None:
        return None
    ka, kb = pa.key(), pb.key()
    return (ka > kb) - (ka < kb)


def should_take_update_path(target: str, current: str, deploying: bool) -> bool:
    """CDI's `ShouldTakeUpdatePath`: is reconciling `target` over `current` (the resource's observedVersion) an
    upgrade? Never while first deploying; no when they are the same version; yes when `current` is unknown or
    either cannot be ordered; `Downgrade` raised when `target` is the lower."""
    if deploying or target == current:
        return False
    if not current:
        return True
    order = compare(target, current)
    if order is None:
        return True
    if order < 0:
        raise Downgrade(f"operator downgraded from {current} to {target}, will not reconcile")
    return order > 0


def newest(candidates: list[str]) -> str | None:
    """The highest of some versions (those that are not semantic versions count only when nothing else is)."""
    ordered = sorted((parsed.key(), v) for v in candidates if (parsed := parse(v)) is not None)
    if ordered:
        return ordered[-1][1]
    return candidates[0] if candidates else None


def label_safe(version: str) -> bool:
    """Can `version` be a label value (63 characters at most, alphanumeric at both ends, `-_.` between)? The
    operator labels what it applies with its version, so a version that cannot be one is refused up front."""
    return bool(version) and bool(_LABEL_VALUE.match(version))
