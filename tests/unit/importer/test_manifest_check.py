"""What the importer accepts as an image manifest (issue 27, point 4): a DataImportCron's poller calls
a manifest's digest a version only when the registry's answer is a manifest or an index; anything else
is refused with what is wrong, and no import follows."""

from __future__ import annotations

import json

import pytest

from cdi.importer.errors import ImporterError, Reason
from cdi.importer.source_registry import DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, checked_manifest

LAYER = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + "1" * 64, "size": 3}
CONFIG = {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + "2" * 64, "size": 2}
MANIFEST = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": CONFIG, "layers": [LAYER]}
INDEX = {"schemaVersion": 2, "mediaType": OCI_INDEX,
         "manifests": [{"mediaType": OCI_MANIFEST, "digest": "sha256:" + "3" * 64, "size": 9,
                        "platform": {"architecture": "amd64", "os": "linux"}}]}


def test_manifests_and_indexes_pass() -> None:
    assert checked_manifest(json.dumps(MANIFEST).encode(), OCI_MANIFEST, "r/x:1") == (MANIFEST, False)
    assert checked_manifest(json.dumps(INDEX).encode(), OCI_INDEX, "r/x:1") == (INDEX, True)
    docker = {k: v for k, v in MANIFEST.items() if k != "mediaType"}
    assert checked_manifest(json.dumps(docker).encode(), DOCKER_MANIFEST, "r/x:1")[1] is False
    # a registry that calls every manifest plain JSON: the shape decides
    assert checked_manifest(json.dumps(docker).encode(), "application/json", "r/x:1")[1] is False


@pytest.mark.parametrize(("body", "content_type", "says"), [
    (b"\x00\xffgarbage", "application/octet-stream", "not a JSON object"),
    (b"<html><body>Welcome to nginx!</body></html>", "text/html", "not a JSON object"),
    (b'"a string"', "application/json", "not a JSON object"),
    (json.dumps({**MANIFEST, "mediaType": "application/vnd.cncf.helm.config.v1+json"}).encode(), "", "media type"),
    (json.dumps({"errors": [{"code": "UNKNOWN"}]}).encode(), OCI_MANIFEST, "needs a config and layers"),
    (json.dumps({**MANIFEST, "layers": "none"}).encode(), OCI_MANIFEST, "needs a config and layers"),
    (json.dumps({**INDEX, "manifests": [{"size": 1}]}).encode(), OCI_INDEX, "index without a list of manifests"),
])
def test_anything_else_is_refused_with_why(body: bytes, content_type: str, says: str) -> None:
    with pytest.raises(ImporterError) as caught:
        checked_manifest(body, content_type, "registry.example/golden:latest")
    assert caught.value.reason == Reason.INVALID_IMAGE
    assert "registry.example/golden:latest" in str(caught.value) and says in str(caught.value)
