"""The `algorithm:hex` checksum syntax of DataVolume http sources (CDI's rules and messages)."""

from __future__ import annotations

from typing import Final

HEX_LENGTHS: Final = {"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}


class ChecksumSyntaxError(ValueError):
    """A checksum string that is not `algorithm:hex` with a supported algorithm."""


def parse_checksum(text: str) -> tuple[str, str]:
    """(algorithm, lower-case hex) from `sha256:ABC...`; raises ChecksumSyntaxError with CDI's wording."""
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
    try:
        bytes.fromhex(digest)
    except ValueError as exc:
        raise ChecksumSyntaxError(f"checksum hash is not valid hexadecimal: {exc}") from exc
    return algorithm, digest
