"""An admin exposes the upload proxy with an Ingress in CDI's namespace, and CDIConfig `status.uploadProxyURL`
names its host, so that virtctl and `cdi image-upload` find the proxy without `--uploadproxy-url`; deleting
the Ingress takes the URL back to what it was. CDI reads only the Ingress's spec, so no ingress controller
is needed: the scenario runs on `cdi up` and on any cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdi.cli.imageupload.cluster import Cluster
from cdi.kube import KubeClient
from tests.e2e.target import TARGET, External
from tests.support.cluster import CdiUp, Kubectl, wait_for

HOST = "upload.cdi-e2e.invalid"  # never resolves: what matters is that clients are told it
FRONT = "cdi-e2e-uploadproxy"
OTHER = "cdi-e2e-aaa-other"  # listed first, but sends to another Service


def ingress(name: str, host: str, service: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": TARGET.cdi_namespace},
        "spec": {"tls": [{"hosts": [host]}], "rules": [{"host": host, "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": service, "port": {"number": 443}}}}]}}]}}


def published(k: Kubectl) -> str:
    return str(k("get", "cdiconfig", "config", "-o", "jsonpath={.status.uploadProxyURL}").stdout)


@pytest.fixture
def cleanup(shared_kubectl: Kubectl) -> Iterator[None]:
    yield
    shared_kubectl("delete", "ingress", FRONT, OTHER, "-n", TARGET.cdi_namespace, "--ignore-not-found")


async def what_image_upload_reads(cluster: CdiUp | External) -> str:
    """The URL `cdi image-upload` (as virtctl) uploads to when no --uploadproxy-url is given."""
    client = await KubeClient.connect(cluster.kubeconfig)
    try:
        return await Cluster(client, cluster.kubeconfig).proxy_url()
    finally:
        await client.close()


@pytest.mark.anycluster
async def test_an_ingress_in_front_of_the_upload_proxy_publishes_its_host(
        shared_cdi_up: CdiUp | External, shared_kubectl: Kubectl, cleanup: None) -> None:
    k = shared_kubectl
    wait_for(lambda: k.exists("cdiconfig", "config", ""), 30, message="CDIConfig")
    assert not (k.json("get", "cdiconfig", "config").get("spec") or {}).get("uploadProxyURLOverride"), \
        "an uploadProxyURLOverride would hide what the Ingress gives"
    before = published(k)  # none on a cluster; `cdi up`'s own proxy there

    k.apply(ingress(OTHER, "www.cdi-e2e.invalid", "cdi-api"))
    k.apply(ingress(FRONT, HOST, "cdi-uploadproxy"))
    wait_for(lambda: published(k) == HOST, 30, message=f"CDIConfig status.uploadProxyURL {HOST}")
    listed = k("get", "ingress", "-n", TARGET.cdi_namespace).stdout
    assert FRONT in listed and HOST in listed
    assert await what_image_upload_reads(shared_cdi_up) == f"https://{HOST}"

    k("delete", "ingress", FRONT, "-n", TARGET.cdi_namespace)
    wait_for(lambda: published(k) == before, 30, message=f"CDIConfig status.uploadProxyURL back to {before!r}")
