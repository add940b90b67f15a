"""The `algorithm:hex` checksum syntax, CDI's rules and messages, parsed in this one place: a DataVolume
http source's `checksum`, the upload checksum extension (`extensions.cdi.dev/upload.checksum`, admission and
`cdi image-upload --checksum`), and the checksum a worker pod is asked to verify (`cdi.importer.checksum`
turns a syntax error there into the pod's InvalidConfiguration and keeps the hashing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

HEX_LENGTHS: Final = {"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}
_HEX_DIGITS: Final = frozenset("0123456789abcdef")


class ChecksumSyntaxError(ValueError):
    """A checksum string that is not `algorithm:hex` with a supported algorithm."""


@dataclass(frozen=True)
class Checksum:
    """A parsed checksum: the algorithm (lower case, a key of HEX_LENGTHS) and its lower-case hex digest."""

    algorithm: str
    hexdigest: str

    @classmethod
    def parse(cls, text: str) -> Checksum:
        """From `sha256:ABC...` (spaces around either part and upper case are allowed); raises
        ChecksumSyntaxError with CDI's wording."""
        algorithm, sep, digest = text.partition(":")
        if not sep:
            raise ChecksumSyntaxError(f"invalid checksum format: expected 'algorithm:hash', got '{text}'")
        algorithm, digest = algorithm.strip().lower(), digest.strip().lower()
        if not digest:
            raise ChecksumSyntaxError("checksum hash value cannot be empty")
        expected = HEX_LENGTHS.get(algorithm)
        if expected is None:
            raise ChecksumSyntaxError(f"unsupported hash algorithm '{algorithm}': supported algorithms are: "
                                      "md5, sha1, sha256, sha512")
        if len(digest) != expected:
            raise ChecksumSyntaxError(f"invalid {algorithm} hash length: expected {expected} hex characters, "
                                      f"got {len(digest)}")
        bad = next((c for c in digest if c not in _HEX_DIGITS), None)
        if bad is not None:
            raise ChecksumSyntaxError(f"checksum hash is not valid hexadecimal: invalid character {bad!r}")
        return cls(algorithm, digest)

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hexdigest}"


def parse_checksum(text: str) -> tuple[str, str]:
    """(algorithm, lower-case hex) from `sha256:ABC...`; raises ChecksumSyntaxError with CDI's wording."""
    checksum = Checksum.parse(text)
    return checksum.algorithm, checksum.hexdigest
