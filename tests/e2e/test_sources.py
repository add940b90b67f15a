"""Every DataVolume source kind CDI defines gets a phase (issue #15 point 3): GCS imports for real
(gcp-storage-emulator, anonymous and with a service-account key), the kinds that cannot work here
end `Failed` with the field and the reason, and external population creates the claim as CDI does.
The clone kinds (`pvc`, `snapshot`, `sourceRef`) belong to the clone tests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.importing import condition, datavolume, phase, read_back, wait_phase
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer, OAuthTokenServer
from tests.support.sourceservers import S3, S3_KEY, S3_SECRET, Gcs

PHASE_DEADLINE = 10.0  # seconds from creation to a phase, for every kind


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp]:
    up = CdiUp(tmp_path_factory.mktemp("sources") / "cdi", "--retry-backoff", "0.5", "--import-retries", "1")
    up.start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def token_server() -> Iterator[OAuthTokenServer]:
    server = OAuthTokenServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def k(cluster: CdiUp, tmp_path_factory: pytest.TempPathFactory, token_server: OAuthTokenServer) -> Kubectl:
    kubectl = Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("kc"))
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gcs-key"},
                   "stringData": {"credentials.json": token_server.key_file()}})
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"},
                   "stringData": {"accessKeyId": S3_KEY, "secretKey": S3_SECRET}})
    return kubectl


def warning_events(k: Kubectl, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = k.json("get", "events", "--field-selector",
                                         f"involvedObject.name={name},type=Warning")["items"]
    return items


def test_gcs_qcow2_with_a_service_account_key(
        k: Kubectl, gcs: Gcs, images: dict[str, Image], token_server: OAuthTokenServer) -> None:
    image = images["qcow2.qcow2"]
    before = len(token_server.grants)
    k.apply(datavolume("gcs-qcow2", {"gcs": {"url": gcs.url(image.name), "secretRef": "gcs-key"}}, "64Mi"))
    wait_phase(k, "gcs-qcow2", "Succeeded")
    assert read_back(k, "gcs-qcow2", image.virtual_size) == image.sha256
    assert len(token_server.grants) > before, "the importer never used the secret's key"


def test_gcs_raw_xz_anonymous_into_a_block_volume(k: Kubectl, gcs: Gcs, images: dict[str, Image]) -> None:
    image = images["raw.img.xz"]
    k.apply(datavolume("gcs-xz", {"gcs": {"url": gcs.url(image.name)}}, "32Mi", api="pvc", volume_mode="Block"))
    wait_phase(k, "gcs-xz", "Succeeded")
    assert read_back(k, "gcs-xz", image.virtual_size, block=True) == image.sha256


def test_gcs_missing_object_fails_as_not_found(k: Kubectl, gcs: Gcs) -> None:
    k.apply(datavolume("gcs-missing", {"gcs": {"url": gcs.url("no-such-object.img")}}, "64Mi"))
    dv = wait_phase(k, "gcs-missing", "Failed")
    running = condition(dv, "Running")
    assert running["reason"] == "NotFound", running
    assert "gs://images/no-such-object.img does not exist" in running["message"]
    assert dv["status"].get("restartCount", 0) == 0
    assert any(e["reason"] == "NotFound" for e in warning_events(k, "gcs-missing"))


UNSUPPORTED = {
    "src-imageio": ({"imageio": {"url": "https://engine.example.com/ovirt-engine/api", "secretRef": "creds",
                                 "certConfigMap": "engine-ca", "diskId": "d1"}}, "spec.source.imageio"),
    "src-vddk": ({"vddk": {"url": "https://vcenter.example.com", "secretRef": "creds", "uuid": "u1",
                           "backingFile": "[ds] vm/vm.vmdk", "thumbprint": "AA:BB"}}, "spec.source.vddk"),
    "src-imagestream": ({"registry": {"imageStream": "fedora", "pullMethod": "node"}},
                        "spec.source.registry.imageStream"),
    "src-oci-archive": ({"registry": {"url": "oci-archive:///images/disk.tar"}}, "spec.source.registry.url"),
}


def test_every_source_kind_gets_a_phase_within_ten_seconds(
        k: Kubectl, gcs: Gcs, s3: S3, range_server: FileServer, images: dict[str, Image]) -> None:
    name = images["raw.img"].name
    populator = {"apiGroup": "populator.example.com", "kind": "ExamplePopulator", "name": "golden"}
    external = datavolume("src-external", {})
    del external["spec"]["source"]
    external["spec"]["storage"]["dataSourceRef"] = populator
    manifests = [
        datavolume("src-http", {"http": {"url": f"{range_server.url}/{name}"}}),
        datavolume("src-s3", {"s3": {"url": s3.endpoint(name), "secretRef": "s3-creds"}}),
        datavolume("src-gcs", {"gcs": {"url": gcs.url(name)}}),
        datavolume("src-registry", {"registry": {"url": "docker://127.0.0.1:9/nothing/here:latest"}}),
        datavolume("src-blank", {"blank": {}}),
        datavolume("src-upload", {"upload": {}}),
        *(datavolume(dv_name, source) for dv_name, (source, _) in UNSUPPORTED.items()),
        external,
    ]
    kinds = {m["metadata"]["name"] for m in manifests}
    created = time.monotonic()
    k.apply({"apiVersion": "v1", "kind": "List", "items": manifests})
    phases: dict[str, str] = {}

    def all_have_a_phase() -> bool:
        listed = k.json("get", "dv")["items"]
        phases.update({dv["metadata"]["name"]: dv.get("status", {}).get("phase", "") for dv in listed
                       if dv["metadata"]["name"] in kinds})
        return all(phases.get(n) for n in kinds)

    wait_for(all_have_a_phase, PHASE_DEADLINE * 3, interval=0.2, message="a phase on every DataVolume")
    elapsed = time.monotonic() - created
    assert elapsed <= PHASE_DEADLINE, f"phases after {elapsed:.1f}s: {phases}"
    for dv_name in UNSUPPORTED:
        assert phases[dv_name] == "Failed", phases
    assert phases["src-external"] in ("Pending", "Succeeded"), phases
    assert phases["src-upload"] in ("Pending", "UploadScheduled", "UploadReady"), phases


@pytest.mark.parametrize("dv_name", sorted(UNSUPPORTED))
def test_sources_that_cannot_work_here_fail_with_the_field_and_the_reason(k: Kubectl, dv_name: str) -> None:
    source, field = UNSUPPORTED[dv_name]
    if not k.exists("dv", dv_name):
        k.apply(datavolume(dv_name, source))
    dv = wait_phase(k, dv_name, "Failed", timeout=PHASE_DEADLINE)
    ready = condition(dv, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "UnsupportedSource", ready
    assert ready["message"].startswith(f"{field}: ") and "not supported" in ready["message"], ready
    assert not k.exists("pvc", dv_name), "a source that cannot work here must not leave a claim behind"
    wait_for(lambda: [e for e in warning_events(k, dv_name) if e["reason"] == "UnsupportedSource"], 10,
             message=f"an UnsupportedSource event on {dv_name}")
    events = [e for e in warning_events(k, dv_name) if e["reason"] == "UnsupportedSource"]
    assert len(events) == 1 and events[0].get("count", 1) == 1, events
    assert field in events[0]["message"]


def test_external_population_creates_the_claim_with_its_data_source_ref(k: Kubectl) -> None:
    populator = {"apiGroup": "populator.example.com", "kind": "ExamplePopulator", "name": "golden"}
    dv = datavolume("ext-populated", {})
    del dv["spec"]["source"]
    dv["spec"]["storage"]["dataSourceRef"] = populator
    k.apply(dv)
    wait_for(lambda: phase(k, "ext-populated") == "Pending", PHASE_DEADLINE, message="ext-populated Pending")
    wait_for(lambda: k.exists("pvc", "ext-populated"), PHASE_DEADLINE, message="the populated claim")
    pvc = k.get("pvc", "ext-populated")
    assert pvc["spec"]["dataSourceRef"] == populator, json.dumps(pvc["spec"])
    annotations = pvc["metadata"]["annotations"]
    assert annotations.get("cdi.kubevirt.io/externalPopulation") == "true"
    assert "cdi.kubevirt.io/storage.import.source" not in annotations
    assert pvc["status"].get("phase") == "Pending"  # no populator of that kind here: it waits, as on Kubernetes
