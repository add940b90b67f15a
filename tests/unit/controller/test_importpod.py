"""The importer pod carries the whole import request: read back from the pod's env, volumes and
containers it is the request the claim's annotations asked for."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api import env
from cdi.api.importrequest import ImportRequest
from cdi.controller.datavolume.importpod import WorkerSettings, import_request_of, importer_pod
from tests.unit.api.test_importrequest import SOURCES


def claim(annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "disk", "namespace": "ns", "uid": "u1", "annotations": annotations},
            "spec": {"resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem"}}


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
def test_the_importer_pod_carries_the_request(source: dict[str, Any]) -> None:
    request = ImportRequest.from_source(source)
    pvc = claim(request.to_annotations())
    pod = importer_pod(pvc, ImportRequest.from_annotations(pvc["metadata"]["annotations"]), WorkerSettings())
    assert import_request_of(pod) == request
    assert import_request_of(pod).to_source() == source


def test_a_node_pull_runs_the_users_image_and_tells_the_importer() -> None:
    request = ImportRequest.from_source(SOURCES["registry, node pull"])
    pod = importer_pod(claim(request.to_annotations()), request, WorkerSettings())
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert containers["server"]["image"] == "quay.io/containerdisks/fedora:40"
    variables = {e["name"]: e.get("value") for e in containers["importer"]["env"]}
    assert variables[env.PULL_METHOD] == "node"
    assert variables[env.SOURCE] == "http"
    assert [e["name"] for e in containers["importer"]["env"]].count(env.PULL_METHOD) == 1
    assert pod["spec"]["nodeSelector"]["kubernetes.io/arch"] == "arm64"
