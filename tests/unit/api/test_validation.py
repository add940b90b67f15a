"""CDI's DataVolume admission rules, message for message."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.checksum import Checksum, ChecksumSyntaxError, parse_checksum
from cdi.api.validation import (
    rejection_message,
    validate_datavolume,
    validate_volume_import_source,
)

SHA256 = "a" * 64


def dv(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"source": {"http": {"url": "https://example.com/disk.qcow2"}},
                            "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
    body.update(spec)
    return {"metadata": {"name": "disk"}, "spec": {k: v for k, v in body.items() if v is not None}}


@pytest.mark.parametrize(("spec", "field", "message"), [
    ({"storage": None}, "spec.PVC", "Missing Data volume PVC"),
    ({"pvc": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
     "spec.PVC.Storage", "Duplicate storage definition, both target storage and target pvc defined"),
    ({"source": None}, "spec.source", "Data volume should have either Source or SourceRef, or be externally populated"),
    ({"source": {}}, "spec.source", "Missing Data volume source"),
    ({"source": {"http": {"url": "https://x/y"}, "blank": {}}}, "spec.source", "Multiple Data volume sources"),
    ({"storage": {"resources": {"requests": {"storage": "0"}}}}, "spec.Storage.resources.requests.size",
     "Storage size can't be equal or less than zero"),
    ({"storage": {"resources": {"requests": {"storage": "512Ki"}}}}, "spec.Storage.resources.requests.size",
     "Storage size should be at least 1MiB"),
    ({"storage": {}}, "spec.Storage.resources.requests.size", "Storage size is missing"),
    ({"storage": None, "pvc": {"resources": {"requests": {"storage": "1Gi"}}}}, "spec.PVC.accessModes",
     "Required value: at least 1 access mode is required"),
    ({"storage": None, "pvc": {"accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                               "resources": {"requests": {"storage": "1Gi"}}}},
     "spec.PVC.accessModes", "PVC multiple accessModes"),
    ({"contentType": "zip"}, "spec.contentType", "ContentType not one of: kubevirt, archive"),
    ({"source": {"http": {"url": "ftp://x/y"}}}, "spec.source.HTTP.url",
     "spec.source Invalid source URL scheme: ftp://x/y"),
    ({"source": {"http": {"url": ""}}}, "spec.source.HTTP.url", "spec.source source URL is empty"),
    ({"source": {"http": {"url": "https://x/y", "checksum": "sha256:abc"}}}, "spec.source.HTTP.checksum",
     "Invalid checksum format: invalid sha256 hash length: expected 64 hex characters, got 3"),
    ({"source": {"blank": {}}, "contentType": "archive"}, "spec.contentType",
     "SourceType cannot be blank and the contentType be archive"),
    ({"source": {"registry": {"url": "https://quay.io/x"}}}, "spec.source.Registry.URL",
     "Illegal registry source URL scheme https://quay.io/x"),
    ({"source": {"registry": {"url": "docker://quay.io/x"}}, "contentType": "archive"}, "spec.contentType",
     "ContentType must be kubevirt when Source is Registry"),
    ({"source": {"pvc": {"name": "src"}}}, "spec.source.PVC", "spec.source.PVC source PVC is not valid"),
    ({"source": None, "sourceRef": {"kind": "PersistentVolumeClaim", "name": "x"}}, "spec.sourceRef.Kind",
     "Unsupported sourceRef kind PersistentVolumeClaim, currently only DataSource is supported"),
])
def test_refusals_name_the_field_with_cdis_message(spec: dict[str, Any], field: str, message: str) -> None:
    causes = validate_datavolume(dv(**spec))
    assert [(c.field, c.message) for c in causes] == [(field, message)]
    assert rejection_message(causes) == f" {message}"


@pytest.mark.parametrize("spec", [
    {},
    {"source": {"blank": {}}},
    {"source": {"s3": {"url": "https://s3.example.com/bucket/disk.img"}}},
    {"source": {"registry": {"url": "docker://quay.io/containerdisks/fedora:40"}}},
    {"source": {"http": {"url": "https://x/y", "checksum": f"SHA256:{SHA256.upper()}"}}},
    {"source": {"upload": {}}},
    {"source": {"pvc": {"namespace": "a", "name": "b"}}, "storage": {}},  # clones may omit the size
    {"storage": None, "pvc": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}},
])
def test_valid_specs_pass(spec: dict[str, Any]) -> None:
    assert validate_datavolume(dv(**spec)) == []


def test_spec_is_immutable_after_creation() -> None:
    old = dv()
    new = dv(contentType="archive")
    causes = validate_datavolume(new, old)
    assert [(c.field, c.message) for c in causes] == [("DataVolume.Spec", "Cannot update DataVolume Spec")]
    assert validate_datavolume(old, old) == []


def test_checksum_parsing() -> None:
    assert parse_checksum(f" SHA256 : {SHA256.upper()}") == ("sha256", SHA256)
    with pytest.raises(ChecksumSyntaxError, match="expected 'algorithm:hash'"):
        parse_checksum("abc")
    with pytest.raises(ChecksumSyntaxError, match="unsupported hash algorithm 'crc32'"):
        parse_checksum("crc32:00")
    with pytest.raises(ChecksumSyntaxError, match="not valid hexadecimal"):
        parse_checksum("md5:" + "z" * 32)
    with pytest.raises(ChecksumSyntaxError, match="not valid hexadecimal: invalid character ' '"):
        parse_checksum("md5:" + "ab " * 10 + "ab")  # 32 characters, 11 bytes: bytes.fromhex took it
    assert str(Checksum.parse(f"MD5:{'A' * 32}")) == f"md5:{'a' * 32}"


def vddk_source(**spec: Any) -> dict[str, Any]:
    source = {"vddk": {"url": "https://vcenter.example.com", "uuid": "u", "backingFile": "[ds] vm.vmdk",
                       "thumbprint": "t", "secretRef": "s"}}
    return {"metadata": {"name": "warm"}, "spec": {"source": source, **spec}}


def test_a_multi_stage_import_source_may_move_its_checkpoints_and_nothing_else() -> None:
    """CDI's populator webhook lets a warm migration (vddk or imageio with checkpoints) advance its checkpoints
    on a VolumeImportSource whose spec is otherwise frozen, and wants the claim it fills named."""
    first = vddk_source(targetClaim="disk", checkpoints=[{"previous": "", "current": "c1"}])
    later = vddk_source(targetClaim="disk", checkpoints=[{"previous": "", "current": "c1"},
                                                         {"previous": "c1", "current": "c2"}], finalCheckpoint=True)
    assert validate_volume_import_source(later, first) == []
    moved = vddk_source(targetClaim="other", checkpoints=[{"previous": "", "current": "c1"}])
    assert rejection_message(validate_volume_import_source(moved, first)) == " Cannot update VolumeImportSource Spec"
    unnamed = vddk_source(checkpoints=[{"previous": "", "current": "c1"}])
    assert rejection_message(validate_volume_import_source(unnamed)) == \
        " Unable to do multi-stage import without specifying a target claim"


@pytest.mark.parametrize("value", ["true", "false"])
def test_an_extension_switch_is_true_or_false(value: str) -> None:
    body = dv()
    body["metadata"]["annotations"] = {"extensions.cdi.dev/clone.allowSourceInUse": value}
    assert validate_datavolume(body) == []


def test_an_extension_switch_saying_anything_else_is_refused_naming_it() -> None:
    body = dv()
    key = "extensions.cdi.dev/clone.allowSourceInUse"
    body["metadata"]["annotations"] = {key: "yes"}
    assert [(c.field, c.message) for c in validate_datavolume(body)] == [
        (f"metadata.annotations[{key}]", f"{key}: must be \"true\" or \"false\", not 'yes'")]
