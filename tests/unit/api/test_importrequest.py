"""One import request through every form it takes: the DataVolume's source, the claim's annotations
and the importer's environment. Every field must come back as it went in (`registry.pullMethod` was
once lost between these forms)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cdi.api import annotations as ann
from cdi.api import env
from cdi.api.importrequest import ImportRequest

SOURCES: dict[str, dict[str, Any]] = {
    "http, every field": {"http": {
        "url": "https://images.example/disk.qcow2", "secretRef": "creds", "certConfigMap": "ca",
        "checksum": "sha256:" + "ab" * 32, "extraHeaders": ["X-Token: 1", "X-Other: two words"],
        "secretExtraHeaders": ["header-secret"], "insecureSkipVerify": True}},
    "registry, node pull": {"registry": {
        "url": "docker://quay.io/containerdisks/fedora:40", "pullMethod": "node", "certConfigMap": "registry-ca",
        "secretRef": "pull", "platform": {"architecture": "arm64"}}},
    "registry, pod pull": {"registry": {"url": "docker://quay.io/disk:1"}},
    "s3": {"s3": {"url": "https://s3.example/bucket/disk.img", "secretRef": "s3-creds"}},
    "gcs": {"gcs": {"url": "gs://bucket/disk.img", "secretRef": "gcs-key"}},
    "blank": {"blank": {}},
}


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
def test_the_datavolume_source_survives_the_claims_annotations(source: dict[str, Any]) -> None:
    request = ImportRequest.from_source(source, "archive")
    assert request.to_source() == source
    back = ImportRequest.from_annotations(request.to_annotations())
    assert back == request
    assert back.to_source() == source
    assert back.content_type == "archive"


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
def test_the_environment_carries_every_field_it_can(source: dict[str, Any]) -> None:
    request = ImportRequest.from_source(source)
    # what only volumes hold (see cdi.api.importrequest): the pod builder's round trip covers them
    by_env = replace(request, cert_configmap="", secret_extra_headers=(),
                     secret=request.secret if request.source != env.SOURCE_GCS else "")
    assert ImportRequest.from_env(request.to_env()) == by_env


def test_the_claim_annotations_are_cdis() -> None:
    request = ImportRequest.from_source(SOURCES["registry, node pull"])
    assert request.to_annotations() == {
        ann.IMPORT_SOURCE: "registry", ann.CONTENT_TYPE: "kubevirt",
        ann.IMPORT_ENDPOINT: "docker://quay.io/containerdisks/fedora:40",
        "cdi.kubevirt.io/storage.import.registryImportMethod": "node",
        "cdi.kubevirt.io/storage.import.registryImageArchitecture": "arm64",
        "cdi.kubevirt.io/storage.import.secretName": "pull",
        "cdi.kubevirt.io/storage.import.certConfigMap": "registry-ca",
    }


def test_a_claim_written_by_a_user_reads_with_cdis_defaults() -> None:
    request = ImportRequest.from_annotations({ann.IMPORT_ENDPOINT: "https://x/disk.img",
                                              ann.IMPORT_EXTRA_HEADERS: "A: 1\nB: 2\n"})
    assert (request.source, request.content_type, request.pull_method) == ("http", "kubevirt", "pod")
    assert request.extra_headers == ("A: 1", "B: 2")
