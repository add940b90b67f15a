"""What a worker says it received: the sha256 of the source's bytes next to the checksum asked for (one pass
over the bytes), through the termination message to the claim's annotations (`received`)."""

from __future__ import annotations

import hashlib
import json

import pytest

from cdi.api import annotations as ann
from cdi.controller.datavolume.imports import received
from cdi.importer.checksum import Checksum, Hasher, expected_checksum
from cdi.importer.errors import ImporterError, Reason
from cdi.importer.termination import TerminationMessage

DATA = [b"qcow2 header", bytes(3 << 20), memoryview(b"tail")]
WHOLE = b"".join(bytes(part) for part in DATA)
SHA256 = hashlib.sha256(WHOLE).hexdigest()


def hashed(expected: Checksum | None) -> Hasher:
    hasher = Hasher(expected)
    for part in DATA:
        hasher.update(part)
    return hasher


def test_without_a_checksum_the_sha256_is_still_computed_and_nothing_is_verified() -> None:
    hasher = hashed(None)
    assert (hasher.sha256(), hasher.count, hasher.actual(), hasher.verify("x")) == (SHA256, len(WHOLE), None, None)


@pytest.mark.parametrize("algorithm", ["md5", "sha1", "sha256", "sha512"])
def test_a_checksum_in_any_algorithm_is_verified_beside_the_sha256(algorithm: str) -> None:
    digest = hashlib.new(algorithm, WHOLE).hexdigest()
    hasher = hashed(Checksum.parse(f"{algorithm.upper()}:{digest.upper()}"))
    assert hasher.verify("upload") == f"{algorithm}:{digest}"
    assert hasher.sha256() == SHA256


def test_a_mismatch_is_checksum_mismatch_and_permanent() -> None:
    hasher = hashed(Checksum.parse("sha256:" + "0" * 64))
    with pytest.raises(ImporterError) as caught:
        hasher.verify("upload")
    assert caught.value.reason == Reason.CHECKSUM_MISMATCH and not caught.value.retryable
    assert f"got sha256:{SHA256} over {len(WHOLE)} bytes" in caught.value.message


@pytest.mark.parametrize("spec", ["sha256", "crc32:00", "sha256:abc", "md5:" + "z" * 32])
def test_a_bad_checksum_is_a_configuration_error(spec: str) -> None:
    with pytest.raises(ImporterError) as caught:
        expected_checksum(spec)
    assert caught.value.reason == Reason.INVALID_CONFIGURATION


def test_the_termination_message_carries_what_was_received_to_the_claims_annotations() -> None:
    message = TerminationMessage(message="Import Complete", reason=Reason.COMPLETE, retryable=False,
                                 checksum=f"sha256:{SHA256}", source_sha256=SHA256, source_format="qcow2.gz")
    result = json.loads(message.render())
    assert result["sourceSha256"] == SHA256
    assert received(result) == {ann.IMPORT_CHECKSUM_RESULT: f"sha256:{SHA256}", ann.SOURCE_SHA256: SHA256,
                                ann.SOURCE_FORMAT: "qcow2.gz"}


def test_a_worker_that_did_not_see_every_byte_records_no_sha256() -> None:
    result = json.loads(TerminationMessage(message="Import Complete", reason=Reason.COMPLETE, retryable=False,
                                           source_format="vhdx").render())
    assert "sourceSha256" not in result
    assert received(result) == {ann.SOURCE_FORMAT: "vhdx"}
