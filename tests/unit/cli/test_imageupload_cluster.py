"""What `cdi image-upload` reads of the cluster, on FakeKube: the size, mode and overhead of the claim it
will fill, whether an existing claim may be uploaded into, readiness, the proxy URL and token, and why an
upload can no longer succeed."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.cli.imageupload.cluster import Cluster, ClusterError, Request
from tests.support.fakekube import FakeKube

GI = 1 << 30


def _claim(name: str = "disk", *, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, **spec}}


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.add(groups.STORAGECLASSES, {"metadata": {"name": "fast", "annotations": {ann.DEFAULT_STORAGE_CLASS: "true"}},
                                     "provisioner": "x"})
    kube.add(groups.STORAGECLASSES, {"metadata": {"name": "late"}, "provisioner": "x",
                                     "volumeBindingMode": "WaitForFirstConsumer"})
    kube.add(groups.STORAGEPROFILES, {"metadata": {"name": "fast"}, "status": {"claimPropertySets": [
        {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"}]}})
    kube.add(groups.CDICONFIGS, {"metadata": {"name": groups.CDI_CONFIG_NAME},
                                 "spec": {"uploadProxyURLOverride": ""},
                                 "status": {"uploadProxyURL": "proxy.example:31001",
                                            "filesystemOverhead": {"global": "0.1",
                                                                   "storageClass": {"late": "0.2"}}}})
    return kube


async def test_a_bound_claim_counts_its_capacity_and_its_class_overhead(kube: FakeKube) -> None:
    claim = _claim(storageClassName="late")
    claim["status"] = {"phase": "Bound", "capacity": {"storage": "2Gi"}}
    assert await Cluster(kube, None).existing_claim(claim) == (2 * GI, "Filesystem", "0.2")
    del claim["status"]
    assert await Cluster(kube, None).existing_claim(claim) == (GI, "Filesystem", "0.2")


async def test_a_block_claim_has_no_overhead(kube: FakeKube) -> None:
    assert await Cluster(kube, None).existing_claim(_claim(volumeMode="Block")) == (GI, "Block", "0")


async def test_planned_claims(kube: FakeKube) -> None:
    cluster = Cluster(kube, None)
    # a DataVolume renders through the StorageProfile (Block, no overhead); a PVC gets the default class
    assert await cluster.planned_claim(Request("dv", "disk", "default", size="1Gi")) == (GI, "Block", "0")
    assert await cluster.planned_claim(Request("pvc", "disk", "default", size="1Gi")) == (GI, "Filesystem", "0.1")


async def test_an_existing_claim_must_be_an_upload_target(kube: FakeKube) -> None:
    cluster = Cluster(kube, None)
    kube.add(groups.PVCS, _claim("plain"))
    with pytest.raises(ClusterError, match="not available for upload"):
        await cluster.find(Request("pvc", "plain", "default"))
    kube.add(groups.PVCS, _claim("done", annotations={ann.UPLOAD_TARGET: "", ann.POD_PHASE: "Succeeded"}))
    with pytest.raises(ClusterError, match="already successfully"):
        await cluster.find(Request("pvc", "done", "default"))
    populated = _claim("populated", dataSourceRef={"kind": "VolumeUploadSource", "name": "x"})
    kube.add(groups.PVCS, populated)
    assert (await cluster.find(Request("pvc", "populated", "default")) or {})["metadata"]["name"] == "populated"
    await cluster.mark_upload_target(populated, Request("pvc", "populated", "default"))
    assert not [w for w in kube.writes if w.verb == "patch"]  # its populator takes the upload


async def test_readiness_of_a_claim(kube: FakeKube) -> None:
    cluster = Cluster(kube, None)
    kube.add(groups.PVCS, {**_claim(annotations={ann.UPLOAD_TARGET: ""}, storageClassName="late"),
                           "status": {"phase": "Pending"}})
    ready, problem = await cluster._readiness(Request("pvc", "disk", "default"))
    assert not ready and "binds on first consumer" in problem
    kube.add(groups.PVCS, _claim(annotations={ann.UPLOAD_TARGET: "", ann.POD_READY: "true"}, storageClassName="fast"))
    assert await cluster._readiness(Request("pvc", "disk", "default")) == (True, "")
    kube.add(groups.PVCS, _claim(annotations={ann.IMPORT_FATAL_ERROR: "true", ann.CONDITION_RUNNING_REASON: "Boom",
                                              ann.CONDITION_RUNNING_MESSAGE: "it broke"}))
    ready, problem = await cluster._readiness(Request("pvc", "disk", "default"))
    assert not ready and problem.endswith("failed: Boom: it broke")


async def test_readiness_and_failure_of_a_datavolume(kube: FakeKube) -> None:
    cluster = Cluster(kube, None)
    kube.add(groups.DATAVOLUMES, {"metadata": {"name": "disk", "namespace": "default"},
                                  "status": {"phase": "Failed", "conditions": [
                                      {"type": "Running", "reason": "Error", "message": "no space"}]}})
    assert await cluster._readiness(Request("dv", "disk", "default")) == \
        (False, "DataVolume default/disk failed: Error: no space")
    with pytest.raises(ClusterError, match="failed: Error: no space"):
        await cluster.wait_done(Request("dv", "disk", "default"), 1)
    kube.add(groups.DATAVOLUMES, {"metadata": {"name": "disk", "namespace": "default"},
                                  "status": {"phase": "UploadReady"}})
    assert await cluster._readiness(Request("dv", "disk", "default")) == (True, "")
    assert await cluster.failure(Request("dv", "disk", "default")) is None
    kube.add(groups.DATAVOLUMES, {"metadata": {"name": "disk", "namespace": "default",
                                               "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert "is being removed" in (await cluster.failure(Request("dv", "disk", "default")) or "")


async def test_failure_of_a_claim(kube: FakeKube) -> None:
    cluster = Cluster(kube, None)
    assert "was deleted" in (await cluster.failure(Request("pvc", "disk", "default")) or "")
    kube.add(groups.PVCS, _claim(annotations={ann.IMPORT_FATAL_ERROR: "true", ann.CONDITION_RUNNING_REASON: "Boom",
                                              ann.CONDITION_RUNNING_MESSAGE: "it broke"}))
    assert (await cluster.failure(Request("pvc", "disk", "default")) or "").endswith("failed: Boom: it broke")
    kube.add(groups.PVCS, {**_claim(), "metadata": {"name": "disk", "namespace": "default",
                                                    "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert "is being removed" in (await cluster.failure(Request("pvc", "disk", "default")) or "")


async def test_proxy_url_prefers_the_override(kube: FakeKube) -> None:
    cluster = Cluster(kube, None)
    assert await cluster.proxy_url() == "https://proxy.example:31001"
    kube.add(groups.CDICONFIGS, {"metadata": {"name": groups.CDI_CONFIG_NAME},
                                 "spec": {"uploadProxyURLOverride": "http://elsewhere:80"}})
    assert await cluster.proxy_url() == "http://elsewhere:80"


async def test_no_proxy_url_anywhere_means_through_the_api_server(kube: FakeKube) -> None:
    """virtctl stops with "uploadproxy URL not found"; `cdi image-upload` goes through the API server instead."""
    kube.add(groups.CDICONFIGS, {"metadata": {"name": groups.CDI_CONFIG_NAME}, "spec": {}, "status": {}})
    assert await Cluster(kube, None).proxy_url() == ""
    await kube.delete(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
    assert await Cluster(kube, None).proxy_url() == ""  # unreadable or missing: the same
