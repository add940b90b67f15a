"""Expected checksums (`IMPORTER_CHECKSUM="algo:hex"`) and the hasher that checks them while streaming.

The hash covers the bytes exactly as the source delivers them (the compressed bytes of a .gz, the
qcow2 file of a qcow2), as CDI does, so that users can paste the digest their image provider
publishes."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from .errors import ImporterError, Reason

_HEX_LENGTHS = {"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}
_HEX = re.compile(r"^[0-9a-f]+$")


@dataclass(frozen=True)
class Checksum:
    algorithm: str
    hexdigest: str

    @classmethod
    def parse(cls, spec: str) -> Checksum | None:
        """`sha256:<hex>` (also md5, sha1, sha512); empty means no checksum."""
        spec = spec.strip()
        if not spec:
            return None
        algorithm, sep, digest = spec.partition(":")
        algorithm, digest = algorithm.strip().lower(), digest.strip().lower()
        if not sep or algorithm not in _HEX_LENGTHS:
            raise ImporterError(
                Reason.INVALID_CONFIGURATION,
                f"invalid checksum {spec!r}: expected <algorithm>:<hex> with algorithm one of "
                f"{', '.join(_HEX_LENGTHS)}",
            )
        if len(digest) != _HEX_LENGTHS[algorithm] or not _HEX.match(digest):
            raise ImporterError(
                Reason.INVALID_CONFIGURATION,
                f"invalid checksum {spec!r}: a {algorithm} digest is "
                f"{_HEX_LENGTHS[algorithm]} hex characters",
            )
        return cls(algorithm, digest)

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hexdigest}"


class Hasher:
    """Counts and hashes the source's bytes in order: sha256 always (what every import and upload records,
    `extensions.cdi.dev/source.sha256`), and the expected checksum's algorithm too when one was asked for
    (`verify` raises ChecksumMismatch). One pass over bytes the pipeline touches anyway: a sha256 expected
    is the recorded one, not a second hash."""

    def __init__(self, expected: Checksum | None = None) -> None:
        self.expected = expected
        self._sha256: Any = hashlib.sha256()
        self._hash: Any = None
        if expected is not None:
            self._hash = self._sha256 if expected.algorithm == "sha256" else hashlib.new(expected.algorithm)
        self.count = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._sha256.update(data)
        if self._hash is not None and self._hash is not self._sha256:
            self._hash.update(data)
        self.count += len(data)

    def sha256(self) -> str:
        """The hex sha256 of the bytes so far."""
        return str(self._sha256.hexdigest())

    def actual(self) -> str | None:
        """`algorithm:hex` in the expected checksum's algorithm (None: no checksum was asked for)."""
        if self.expected is None:
            return None
        return f"{self.expected.algorithm}:{self._hash.hexdigest()}"

    def verify(self, what: str) -> str | None:
        """Raise ChecksumMismatch unless the bytes hash to the expected checksum; nothing to do without one."""
        actual = self.actual()
        if self.expected is not None and actual != str(self.expected):
            raise ImporterError(
                Reason.CHECKSUM_MISMATCH,
                f"checksum mismatch for {what}: expected {self.expected}, got {actual} "
                f"over {self.count} bytes",
            )
        return actual
