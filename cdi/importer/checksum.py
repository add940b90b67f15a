"""Expected checksums (`IMPORTER_CHECKSUM="algo:hex"`, parsed by `cdi.api.checksum`) and the hasher that
checks them while streaming.

The hash covers the bytes exactly as the source delivers them (the compressed bytes of a .gz, the
qcow2 file of a qcow2), as CDI does, so that users can paste the digest their image provider
publishes."""

from __future__ import annotations

import hashlib
from typing import Any

from cdi.api.checksum import Checksum, ChecksumSyntaxError

from .errors import ImporterError, Reason

__all__ = ["Checksum", "Hasher", "expected_checksum"]


def expected_checksum(spec: str) -> Checksum | None:
    """The checksum a worker is asked to verify (IMPORTER_CHECKSUM, the upload's UPLOAD_CHECKSUM), parsed by
    `cdi.api.checksum`: empty is none, and a malformed one is this pod's InvalidConfiguration (permanent)."""
    spec = spec.strip()
    if not spec:
        return None
    try:
        return Checksum.parse(spec)
    except ChecksumSyntaxError as exc:
        raise ImporterError(Reason.INVALID_CONFIGURATION, f"invalid checksum {spec!r}: {exc}") from None


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
