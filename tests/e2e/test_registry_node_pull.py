"""Registry imports with `pullMethod: node` on `cdi up` (issue #15, point 3): CDI's pod shape, in which
the user's containerDisk image is itself a container of the importer pod, pulled and run by the
local node from the test docker-registry; the bytes read back through a pod; a missing image
surfaced on the DataVolume as CDI surfaces it."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.importing import condition, datavolume, read_back, wait_phase
from tests.support import oci
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.sourceservers import PASSWORD, USER

# the legacy path: these tests look at the importer pod named after the DataVolume's claim
LEGACY = {"cdi.kubevirt.io/storage.usePopulator": "false"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp]:
    up = CdiUp(tmp_path_factory.mktemp("nodepull") / "cdi", "--retry-backoff", "0.5")
    up.start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def k(cluster: CdiUp, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("kc"))


def node_pull(url: str) -> dict[str, Any]:
    return {"registry": {"url": url, "pullMethod": "node"}}


def push_disk(registries: Any, registry: Any, repo: str, image: Image) -> str:
    def build(layout: Path) -> None:
        oci.build(layout, [oci.Layer({f"disk/{image.name}": image.path}, compression="gzip")],
                  env=["INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora"])
    return str(registries.push(registry, repo, build))


@pytest.mark.parametrize("name", ["qcow2.qcow2", "raw.img"])
def test_a_containerdisk_is_imported_by_the_node(k: Kubectl, registries: Any, images: dict[str, Image],
                                                 name: str) -> None:
    image = images[name]
    stem = name.partition(".")[0]
    dv_name, repo = f"node-{stem}", f"e2e/node-{stem}"
    url = push_disk(registries, registries.tls, repo, image)
    k.apply(datavolume(dv_name, node_pull(url), "64Mi", annotations={
        "cdi.kubevirt.io/storage.pod.retainAfterCompletion": "true", **LEGACY}))
    wait_phase(k, dv_name, "Succeeded", timeout=240)
    assert read_back(k, dv_name, image.virtual_size) == image.sha256
    labels = k.get("pvc", dv_name)["metadata"].get("labels", {})
    assert labels.get("instancetype.kubevirt.io/default-preference") == "fedora"

    # CDI's pod shape: the user's image runs CDI's server, copied in by the init container
    pod = k.get("pod", f"importer-{dv_name}")
    spec = pod["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["init"]
    assert [c["name"] for c in spec["containers"]] == ["importer", "server"]
    server = spec["containers"][1]
    assert server["image"] == url.removeprefix("docker://")
    assert server["command"] == ["/shared/server", "-p", "8100", "-image-dir", "/disk",
                                 "-ready-file", "/shared/ready", "-done-file", "/shared/done"]
    assert {"name": "shared-volume", "emptyDir": {}} in spec["volumes"]
    importer_env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert importer_env["IMPORTER_SOURCE"] == "http"
    assert importer_env["IMPORTER_PULL_METHOD"] == "node"
    assert importer_env["IMPORTER_READY_FILE"] == "/shared/ready"
    assert importer_env["IMPORTER_DONE_FILE"] == "/shared/done"
    statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
    assert statuses["server"]["state"]["terminated"]["exitCode"] == 0
    assert statuses["server"]["imageID"].endswith(registries.digest(registries.tls, repo))


def test_image_pull_secrets_reach_the_node(k: Kubectl, registries: Any, images: dict[str, Image]) -> None:
    """The basic-auth registry refuses anonymous pulls; CDI's imagePullSecrets (CDIConfig) let the node in."""
    image = images["qcow2.qcow2"]
    registry = registries.basic
    url = push_disk(registries, registry, "e2e/node-auth", image)
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    config = json.dumps({"auths": {registry.host: {"auth": auth}}})
    k.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull-creds"},
             "type": "kubernetes.io/dockerconfigjson", "stringData": {".dockerconfigjson": config}})
    k("patch", "cdi", "cdi", "--type", "merge",
      "-p", json.dumps({"spec": {"config": {"imagePullSecrets": [{"name": "pull-creds"}]}}}))
    wait_for(lambda: "pull-creds" in k("get", "cdiconfig", "config", "-o", "jsonpath={.status}").stdout, 30,
             message="CDIConfig status has the imagePullSecrets")
    try:
        k.apply(datavolume("node-auth", node_pull(url), "64Mi"))
        wait_phase(k, "node-auth", "Succeeded", timeout=240)
        assert read_back(k, "node-auth", image.virtual_size) == image.sha256
    finally:
        k("patch", "cdi", "cdi", "--type", "json", "-p",
          json.dumps([{"op": "remove", "path": "/spec/config/imagePullSecrets"}]), check=False)


def test_a_missing_image_is_reported_as_cdi_does(k: Kubectl, registries: Any) -> None:
    image = f"{registries.tls.host}/e2e/never-pushed:v1"
    k.apply(datavolume("node-missing", node_pull(f"docker://{image}"), "64Mi", annotations=LEGACY))

    def surfaced() -> dict[str, Any] | None:
        dv: dict[str, Any] = k.get("dv", "node-missing")
        running = next((c for c in (dv.get("status") or {}).get("conditions") or [] if c["type"] == "Running"),
                       None)
        return dv if running and running.get("reason") == "ImagePullFailed" else None

    dv = wait_for(surfaced, 90, interval=0.5, message="ImagePullFailed on the DataVolume")
    running = condition(dv, "Running")
    assert running["status"] == "False"
    assert running["message"] == f"failed to pull image: {image}"
    assert dv["status"]["phase"] not in ("", "Succeeded")
    waiting = {s["name"]: (s["state"].get("waiting") or {}).get("reason")
               for s in k.get("pod", "importer-node-missing")["status"]["containerStatuses"]}
    assert waiting["server"] in ("ErrImagePull", "ImagePullBackOff")
