"""CDI's feature gates and claim annotations end to end on `cdi up` (issue #15 points 2 and 8):
`HonorWaitForFirstConsumer` (on in the CDI resource `cdi up` installs, as CDI's released one),
claim adoption (`DataVolumeClaimAdoption`, `allowClaimAdoption`), claims populated beforehand
(`storage.populatedFor`, `storage.prePopulated`), events recorded once with their type, and a claim
deleted after success created and filled again as CDI does."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.importing import datavolume, phase, read_back, wait_phase
from tests.e2e.workloads import pod, pvc
from tests.e2e.workloads import wait_phase as wait_pod_phase
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer

BIND_IMMEDIATE = "cdi.kubevirt.io/storage.bind.immediate.requested"
MARKER = b"filled before the DataVolume existed\n"


def gates(k: Kubectl) -> list[str]:
    return list(k.get("cdiconfig", "config", "").get("spec", {}).get("featureGates") or [])


def set_gates(k: Kubectl, wanted: list[str]) -> None:
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": {"config": {"featureGates": wanted}}}))
    wait_for(lambda: gates(k) == wanted, 30, message=f"CDIConfig featureGates {wanted}")


@pytest.fixture
def released_gates(shared_kubectl: Kubectl) -> Iterator[Kubectl]:
    """A test that changes the gates leaves them as `cdi up` installed them."""
    yield shared_kubectl
    set_gates(shared_kubectl, ["HonorWaitForFirstConsumer"])


def filled_claim(k: Kubectl, name: str, annotations: dict[str, str] | None = None) -> None:
    """A user's PVC holding MARKER as its disk image, written by a pod (as a restore would leave it)."""
    claim = pvc(name, "64Mi")
    if annotations:
        claim["metadata"]["annotations"] = annotations
    k.apply(claim)
    writer = f"write-{name}"
    k.apply(pod(writer, f"printf '{MARKER.decode().strip()}\\n' > /data/disk.img", name))
    wait_pod_phase(k, "default", writer, "Succeeded")
    k("delete", "pod", writer, "--wait=false")


def expect_marker(k: Kubectl, name: str) -> None:
    assert read_back(k, name, len(MARKER)) == hashlib.sha256(MARKER).hexdigest()


def controller_of(k: Kubectl, name: str) -> dict[str, Any]:
    owners = k.get("pvc", name)["metadata"].get("ownerReferences") or []
    return next(o for o in owners if o.get("controller"))


def events(k: Kubectl, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = k.json("get", "events", "--field-selector", f"involvedObject.name={name}")["items"]
    return items


def test_the_cdi_resource_honours_wait_for_first_consumer_as_released(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    assert k.get("cdi", "cdi", "")["spec"]["config"]["featureGates"] == ["HonorWaitForFirstConsumer"]
    wait_for(lambda: gates(k) == ["HonorWaitForFirstConsumer"], 30, message="CDIConfig has the released gates")
    k.apply(datavolume("wffc-honoured", {"blank": {}}, "16Mi", storage_class="local-wffc"))
    wait_phase(k, "wffc-honoured", "PendingPopulation")  # CSI storage: the populator path's phase, as CDI
    claim = k.get("pvc", "wffc-honoured")
    assert claim["status"]["phase"] == "Pending"
    assert BIND_IMMEDIATE not in claim["metadata"]["annotations"]


def test_without_honor_wait_for_first_consumer_claims_ask_for_immediate_binding(released_gates: Kubectl) -> None:
    k = released_gates
    set_gates(k, [])
    k.apply(datavolume("wffc-ignored", {"blank": {}}, "16Mi", storage_class="local-wffc"))
    wait_for(lambda: k.exists("pvc", "wffc-ignored"), 30, message="claim created")
    assert k.get("pvc", "wffc-ignored")["metadata"]["annotations"][BIND_IMMEDIATE] == ""
    wait_phase(k, "wffc-ignored", "Succeeded")  # the importer pod is the first consumer
    bare = pvc("wffc-bare", "16Mi", storage_class="local-wffc")  # CDI's PVC import API, no DataVolume
    bare["metadata"]["annotations"] = {"cdi.kubevirt.io/storage.import.source": "none"}
    k.apply(bare)
    wait_for(lambda: k.get("pvc", "wffc-bare")["metadata"]["annotations"].get(
        "cdi.kubevirt.io/storage.pod.phase") == "Succeeded", 60, message="the bare claim imported without a consumer")


def test_the_annotation_adopts_a_claim_and_keeps_its_content(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    filled_claim(k, "taken")  # without the annotation (or an adoption gate) a user's claim is refused
    assert "Destination PVC default/taken already exists" in \
        k.apply(datavolume("taken", {"blank": {}}, "16Mi"), check=False).stderr
    declined = datavolume("taken", {"blank": {}}, "16Mi", annotations={"cdi.kubevirt.io/allowClaimAdoption": "no"})
    assert "Destination PVC default/taken already exists" in k.apply(declined, check=False).stderr
    expect_marker(k, "taken")
    filled_claim(k, "adopt-me")
    k.apply(datavolume("adopt-me", {"blank": {}}, "64Mi", annotations={"cdi.kubevirt.io/allowClaimAdoption": "true"}))
    dv = wait_phase(k, "adopt-me", "Succeeded")
    assert dv["status"]["claimName"] == "adopt-me"
    owner = controller_of(k, "adopt-me")
    assert (owner["kind"], owner["name"], owner["uid"]) == ("DataVolume", "adopt-me", dv["metadata"]["uid"])
    assert not k.exists("pod", "importer-adopt-me")
    assert not [e for e in events(k, "adopt-me") if e["type"] == "Warning"]
    expect_marker(k, "adopt-me")


def test_the_gate_adopts_a_claim_unless_the_annotation_says_no(released_gates: Kubectl) -> None:
    k = released_gates
    set_gates(k, ["HonorWaitForFirstConsumer", "DataVolumeClaimAdoption"])
    filled_claim(k, "gate-adopts")
    k.apply(datavolume("gate-adopts", {"blank": {}}, "64Mi"))
    wait_phase(k, "gate-adopts", "Succeeded")
    assert controller_of(k, "gate-adopts")["name"] == "gate-adopts"
    expect_marker(k, "gate-adopts")
    filled_claim(k, "gate-declined")
    declined = datavolume("gate-declined", {"blank": {}}, "64Mi",
                          annotations={"cdi.kubevirt.io/allowClaimAdoption": "false"})
    assert "Destination PVC default/gate-declined already exists" in k.apply(declined, check=False).stderr


def test_a_claim_populated_for_the_datavolume_is_taken_as_it_is(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    filled_claim(k, "restored", {"cdi.kubevirt.io/storage.populatedFor": "restored"})
    k.apply(datavolume("restored", {"blank": {}}, "64Mi"))
    dv = wait_phase(k, "restored", "Succeeded")
    wait_for(lambda: k.get("dv", "restored")["metadata"].get("annotations", {}).get(
        "cdi.kubevirt.io/storage.prePopulated") == "restored", 30, message="DataVolume marked prePopulated")
    assert controller_of(k, "restored")["uid"] == dv["metadata"]["uid"]
    assert not k.exists("pod", "importer-restored")
    expect_marker(k, "restored")


def test_a_pre_populated_datavolume_waits_for_its_claim(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    k.apply(datavolume("awaited", {"blank": {}}, "64Mi",
                       annotations={"cdi.kubevirt.io/storage.prePopulated": "awaited"}))
    wait_phase(k, "awaited", "Pending")
    # a DataVolume to compare with, created after: once it has its claim, the first one had its chance
    k.apply(datavolume("awaited-witness", {"blank": {}}, "16Mi"))
    wait_for(lambda: k.exists("pvc", "awaited-witness"), 30, message="the witness's claim")
    assert not k.exists("pvc", "awaited") and phase(k, "awaited") == "Pending"
    filled_claim(k, "awaited", {"cdi.kubevirt.io/storage.populatedFor": "awaited"})
    wait_phase(k, "awaited", "Succeeded")
    expect_marker(k, "awaited")


def test_a_claim_error_is_one_warning_event(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    k.apply({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "unknown-driver"},
             "provisioner": "example.com/unknown", "volumeBindingMode": "Immediate"})
    message = "Spec is missing accessMode and volumeMode, cannot get access mode from StorageProfile unknown-driver"
    for name in ("no-modes", "no-modes-witness"):
        k.apply(datavolume(name, {"blank": {}}, "16Mi", storage_class="unknown-driver"))
        wait_for(lambda: any(e["reason"] == "ErrClaimNotValid" for e in events(k, name)), 30,  # noqa: B023
                 message=f"ErrClaimNotValid on {name}")
    # events are written in order: the witness's is there, so every event of the first DataVolume is too
    recorded = [(e["type"], e["reason"], e["message"], e["count"]) for e in events(k, "no-modes")
                if e["reason"] == "ErrClaimNotValid"]
    assert recorded == [("Warning", "ErrClaimNotValid", message, 1)]
    dv = k.get("dv", "no-modes")
    bound = next(c for c in dv["status"]["conditions"] if c["type"] == "Bound")
    assert (bound["reason"], bound["message"]) == ("ErrClaimNotValid", message)


def test_a_claim_deleted_after_success_is_created_and_filled_again(
        shared_kubectl: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    k = shared_kubectl
    image = images["raw.img"]
    k.apply(datavolume("refilled", {"http": {"url": f"{range_server.url}/{image.name}"}}, "64Mi"))
    wait_phase(k, "refilled", "Succeeded")
    first = k.get("pvc", "refilled")["metadata"]["uid"]
    k("delete", "pvc", "refilled")

    def recreated() -> bool:
        claim = k("get", "pvc", "refilled", "-o", "jsonpath={.metadata.uid}", check=False).stdout.strip()
        return bool(claim) and claim != first
    wait_for(recreated, 60, message="the claim created again")
    wait_for(lambda: k.get("pvc", "refilled")["metadata"]["annotations"].get(
        "cdi.kubevirt.io/storage.pod.phase") == "Succeeded", 120, message="the claim filled again")
    dv = wait_phase(k, "refilled", "Succeeded")
    assert dv["status"]["claimName"] == "refilled"
    assert read_back(k, "refilled", image.virtual_size) == image.sha256


def test_log_verbosity_turns_on_debug_logs_in_components_and_worker_pods(
        shared_cdi_up: CdiUp, shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    retain = {"cdi.kubevirt.io/storage.pod.retainAfterCompletion": "true",
              "cdi.kubevirt.io/storage.usePopulator": "false"}  # the legacy path: pods named after the claim
    k.apply(datavolume("quiet", {"blank": {}}, "16Mi", annotations=retain))
    wait_phase(k, "quiet", "Succeeded")
    assert "reconciled default/quiet" not in shared_cdi_up.log_path.read_text()
    assert k.get("pod", "importer-quiet")["spec"]["containers"][0]["args"] == ["-v=1"]  # CDI's default
    assert " DEBUG " not in k("logs", "importer-quiet").stderr + k("logs", "importer-quiet").stdout
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": {"config": {"logVerbosity": 3}}}))
    try:
        wait_for(lambda: k.get("cdiconfig", "config", "")["spec"].get("logVerbosity") == 3, 30,
                 message="CDIConfig logVerbosity 3")
        k.apply(datavolume("talkative", {"blank": {}}, "16Mi", annotations=retain))
        wait_phase(k, "talkative", "Succeeded")
        wait_for(lambda: "reconciled default/talkative" in shared_cdi_up.log_path.read_text(), 30,
                 message="the controller's debug log")
        assert k.get("pod", "importer-talkative")["spec"]["containers"][0]["args"] == ["-v=3"]
        assert " DEBUG cdi.importer: importing blank" in k("logs", "importer-talkative").stdout
    finally:
        k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": {"config": {"logVerbosity": None}}}))


def test_check_static_volume_takes_the_volume_pre_bound_to_the_datavolume(
        shared_kubectl: Kubectl, tmp_path: Path) -> None:
    k = shared_kubectl
    directory = tmp_path / "static-volume"
    directory.mkdir()
    (directory / "disk.img").write_bytes(MARKER)
    k.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "static-for-dv"},
             "spec": {"storageClassName": "", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                      "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(directory)},
                      "claimRef": {"namespace": "default", "name": "static-dv"}}})
    wait_for(lambda: k.get("pv", "static-for-dv", "").get("status", {}).get("phase") == "Available", 30,
             message="the pre-bound volume Available")
    static = {"cdi.kubevirt.io/storage.checkStaticVolume": "",
              "cdi.kubevirt.io/storage.usePopulator": "false"}  # the claim filled as usual keeps the import API
    for name in ("static-dv", "static-none"):  # the second has no volume waiting: it is filled as usual
        dv = datavolume(name, {"blank": {}}, "64Mi", api="pvc", annotations=static)
        dv["spec"]["pvc"]["storageClassName"] = ""
        if name == "static-none":
            del dv["spec"]["pvc"]["storageClassName"]
        k.apply(dv)
    wait_phase(k, "static-dv", "Succeeded")
    claim = k.get("pvc", "static-dv")
    assert claim["spec"]["volumeName"] == "static-for-dv"
    assert claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.populatedFor"] == "static-dv"
    assert "cdi.kubevirt.io/storage.persistentVolumeList" not in claim["metadata"]["annotations"]
    assert "cdi.kubevirt.io/storage.import.source" not in claim["metadata"]["annotations"]
    expect_marker(k, "static-dv")
    wait_phase(k, "static-none", "Succeeded")
    assert "cdi.kubevirt.io/storage.import.source" in k.get("pvc", "static-none")["metadata"]["annotations"]
