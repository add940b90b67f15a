"""Cloning against `cdi up` through the real kubectl: DataSources and their Ready condition, and
DataVolumes that clone a PVC, a snapshot or a DataSource's source with the strategy the planner
chose, byte for byte, leaving no temporary object behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jwt
import pytest

from cdi.api.sizing import required_space
from tests.e2e.target import TARGET
from tests.e2e.workloads import (
    BLOCK_DESCRIBE,
    DESCRIBE,
    SPARSE_WRITE,
    get,
    new_namespace,
    pod,
    pvc,
    run_to_completion,
)
from tests.support.cluster import ROOT, CdiUp, Kubectl, wait_for

MIB = 1024 * 1024

def describe(k: Kubectl, ns: str, claim: str, name: str) -> dict[str, Any]:
    out = run_to_completion(k, ns, pod(name, DESCRIBE, claim, python=True))
    result: dict[str, Any] = json.loads(out)
    return result


def data_source(name: str, source: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource", "metadata": {"name": name},
            "spec": {"source": source}}


def ready_condition(k: Kubectl, ns: str, name: str) -> dict[str, Any]:
    ds = get(k, "datasource", name, ns) or {}
    return next((c for c in (ds.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})


def wait_ready_reason(k: Kubectl, ns: str, name: str, status: str, reason: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cond = ready_condition(k, ns, name)
        return cond if cond.get("status") == status and cond.get("reason") == reason else None

    result: dict[str, Any] = wait_for(check, 60, 0.1, message=f"DataSource {ns}/{name} Ready={status} {reason}: "
                                                             f"{ready_condition(k, ns, name)}")
    return result


def test_datasource_ready_condition_follows_its_source(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "das")
    k.apply(data_source("golden", {"pvc": {"namespace": ns, "name": "golden-disk"}}), "-n", ns)
    cond = wait_ready_reason(k, ns, "golden", "False", "NotFound")
    assert cond["message"] == "PVC not found"
    assert get(k, "datasource", "golden", ns)["status"].get("source") in ({}, None)

    k.apply(pvc("golden-disk", "16Mi"), "-n", ns)
    k("label", "pvc", "golden-disk", "-n", ns, "instancetype.kubevirt.io/default-instancetype=u1.small",
      "other.example.com/x=y")
    cond = wait_ready_reason(k, ns, "golden", "True", "Ready")
    assert cond["message"] == "DataSource is ready to be consumed"
    ds = get(k, "datasource", "golden", ns)
    assert ds["status"]["source"] == {"pvc": {"namespace": ns, "name": "golden-disk"}}
    assert ds["metadata"]["labels"]["instancetype.kubevirt.io/default-instancetype"] == "u1.small"
    assert "other.example.com/x" not in ds["metadata"]["labels"]

    # one level of indirection: a DataSource naming the ready one is ready with its source
    k.apply(data_source("alias", {"dataSource": {"namespace": ns, "name": "golden"}}), "-n", ns)
    wait_ready_reason(k, ns, "alias", "True", "Ready")
    assert get(k, "datasource", "alias", ns)["status"]["source"] == {"pvc": {"namespace": ns, "name": "golden-disk"}}
    # ... but no more than one, never itself, never in another namespace
    k.apply(data_source("alias2", {"dataSource": {"namespace": ns, "name": "alias"}}), "-n", ns)
    cond = wait_ready_reason(k, ns, "alias2", "False", "MaxReferenceDepthReached")
    assert cond["message"] == "DataSource reference chain exceeds maximum depth of 1"
    k.apply(data_source("me", {"dataSource": {"namespace": ns, "name": "me"}}), "-n", ns)
    assert wait_ready_reason(k, ns, "me", "False", "SelfReference")["message"] == "DataSource cannot self-reference"
    k.apply(data_source("far", {"dataSource": {"name": "golden", "namespace": "default"}}), "-n", ns)
    assert wait_ready_reason(k, ns, "far", "False", "CrossNamespaceReference")["message"] == \
        "DataSource cannot reference a DataSource in another namespace"

    # a snapshot source is ready once the snapshot is
    k.apply(data_source("snap-das", {"snapshot": {"namespace": ns, "name": "snap"}}), "-n", ns)
    assert wait_ready_reason(k, ns, "snap-das", "False", "NotFound")["message"] == "Snapshot not found"
    k.apply({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": "snap"},
             "spec": {"volumeSnapshotClassName": "local", "source": {"persistentVolumeClaimName": "golden-disk"}}},
            "-n", ns)
    wait_ready_reason(k, ns, "snap-das", "True", "Ready")

    # the PVC of a DataVolume still importing is not ready: the reason is the DataVolume's phase
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "pending-disk"},
             "spec": {"source": {"http": {"url": "http://127.0.0.1:9/nothing.img"}},
                      "storage": {"resources": {"requests": {"storage": "16Mi"}}}}}, "-n", ns)
    k.apply(data_source("importing", {"pvc": {"namespace": ns, "name": "pending-disk"}}), "-n", ns)

    def not_ready_with_phase() -> dict[str, Any] | None:
        cond = ready_condition(k, ns, "importing")
        return cond if cond.get("status") == "False" and cond.get("message", "").startswith(
            "Import DataVolume phase ") and cond.get("reason") not in ("NotFound", "") else None

    cond = wait_for(not_ready_with_phase, 60, 0.1, message="DataSource of an importing DataVolume")
    assert cond["message"] == f"Import DataVolume phase {cond['reason']}"
    # when the PVC goes, so does the readiness
    k("delete", "pvc", "golden-disk", "-n", ns, "--wait=false")
    wait_ready_reason(k, ns, "golden", "False", "NotFound")
    assert get(k, "datasource", "golden", ns)["status"].get("source") in ({}, None)


def clone_dv(name: str, source: dict[str, Any] | None = None, *, size: str | None = None,
             storage_class: str | None = None, source_ref: dict[str, Any] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    storage: dict[str, Any] = {}
    if size is not None:
        storage["resources"] = {"requests": {"storage": size}}
    if storage_class is not None:
        storage["storageClassName"] = storage_class
    spec: dict[str, Any] = {"storage": storage}
    if source is not None:
        spec["source"] = source
    if source_ref is not None:
        spec["sourceRef"] = source_ref
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": meta, "spec": spec}


def clone_plan(cluster: CdiUp, manifest: dict[str, Any], ns: str) -> subprocess.CompletedProcess[str]:
    """`cdi clone-plan -f -` as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cdi.cli.main", "clone-plan", "-f", "-", "-n", ns, "--kubeconfig",
                           str(cluster.kubeconfig)], input=json.dumps(manifest), capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def wait_dv_phase(k: Kubectl, ns: str, name: str, phase: str, timeout: float = 120) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        dv = get(k, "datavolume", name, ns) or {}
        return dv if (dv.get("status") or {}).get("phase") == phase else None

    result: dict[str, Any] = wait_for(check, timeout, 0.2, message=f"DataVolume {ns}/{name} {phase}")
    return result


def events_of(k: Kubectl, ns: str, name: str) -> list[tuple[str, str]]:
    items = k.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    return [(e["reason"], e["message"]) for e in sorted(items, key=lambda e: e.get("firstTimestamp") or "")]


def leftovers(k: Kubectl, ns: str) -> list[str]:
    """Temporary clone objects still in `ns`."""
    names = [p["metadata"]["name"] for p in k.json("get", "pvc", "-n", ns)["items"]]
    names += [s["metadata"]["name"] for s in k.json("get", "volumesnapshot", "-n", ns)["items"]]
    # and what they were bound to: a temporary snapshot's content, a temporary claim's volume not handed on
    names += [(c["spec"].get("volumeSnapshotRef") or {}).get("name", "")
              for c in k.json("get", "volumesnapshotcontent")["items"]
              if (c["spec"].get("volumeSnapshotRef") or {}).get("namespace") == ns]
    names += [(v["spec"].get("claimRef") or {}).get("name", "") for v in k.json("get", "pv")["items"]
              if (v["spec"].get("claimRef") or {}).get("namespace") == ns]
    return [n for n in names if n.startswith(("tmp-pvc-", "tmp-snapshot-", "tmp-source-pvc-"))]


def test_snapshot_and_csi_clone_keep_bytes_and_leave_nothing_behind(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "smart")
    k.apply(pvc("golden", "100Mi"), "-n", ns)
    run_to_completion(k, ns, pod("fill", SPARSE_WRITE, "golden", python=True))
    original = describe(k, ns, "golden", "describe-golden")

    def use_strategy(strategy: str) -> None:
        k("patch", "storageprofile", "local", "--type=merge", "-p", json.dumps({"spec": {"cloneStrategy": strategy}}))

        def applied() -> bool:
            return (get(k, "storageprofile", "local", "") or {}).get("status", {}).get("cloneStrategy") == strategy

        wait_for(applied, 30, 0.1, message=f"profile says {strategy}")

    try:
        # snapshot (smart clone) from the StorageProfile; no size: the source's
        use_strategy("snapshot")
        k.apply(clone_dv("smart", {"pvc": {"namespace": ns, "name": "golden"}}), "-n", ns)
        dv = wait_dv_phase(k, ns, "smart", "Succeeded")
        # csi-clone into a larger target (grown after the clone)
        use_strategy("csi-clone")
        k.apply(clone_dv("csi", {"pvc": {"namespace": ns, "name": "golden"}}, size="200Mi"), "-n", ns)
        wait_dv_phase(k, ns, "csi", "Succeeded")
    finally:
        k("patch", "storageprofile", "local", "--type=json", "-p", '[{"op":"remove","path":"/spec/cloneStrategy"}]')
    assert dv["status"]["progress"] == "100.0%"
    target = get(k, "pvc", "smart", ns)
    assert target["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "snapshot"
    assert "cdi.kubevirt.io/cloneFallbackReason" not in target["metadata"]["annotations"]
    assert target["status"]["phase"] == "Bound"
    # no size: the source's capacity with the filesystem overhead on top (CDI's rule for a claim that does not
    # say it holds a disk image), the restored volume grown to it
    assert target["spec"]["resources"]["requests"]["storage"] == \
        str(required_space(filesystem_overhead(k, "local"), 100 * MIB)) == target["status"]["capacity"]["storage"]
    reasons = [r for r, _ in events_of(k, ns, "smart")]
    for reason in ("CloneScheduled", "SnapshotForSmartCloneInProgress", "CloneFromSnapshotSourceInProgress",
                   "RebindInProgress", "CloneSucceeded"):
        assert reason in reasons, reasons
    scheduled = dict(events_of(k, ns, "smart"))["CloneScheduled"]
    assert scheduled.startswith(f"Cloning from {ns}/golden into {ns}/smart scheduled: snapshot"), scheduled
    assert dict(events_of(k, ns, "smart"))["CloneSucceeded"] == \
        f"Successfully cloned from {ns}/golden into {ns}/smart"

    target = get(k, "pvc", "csi", ns)
    assert target["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "csi-clone"
    assert target["status"]["capacity"]["storage"] == target["spec"]["resources"]["requests"]["storage"] != "100Mi"
    reasons = [r for r, _ in events_of(k, ns, "csi")]
    for reason in ("CSICloneInProgress", "PrepClaimInProgress", "CloneSucceeded"):
        assert reason in reasons, reasons
    # the temporary claim's events are repeated on the target (CDI's CopyEvents)
    assert [m for r, m in events_of(k, ns, "csi") if r == "ProvisioningSucceeded" and m.startswith(
        f"[tmp-pvc-{target['metadata']['uid']}] : Successfully provisioned volume")], events_of(k, ns, "csi")

    # a DataSource's source, and a snapshot source
    k.apply(data_source("golden-das", {"pvc": {"namespace": ns, "name": "golden"}}), "-n", ns)
    wait_ready_reason(k, ns, "golden-das", "True", "Ready")
    k.apply(clone_dv("from-ref", source_ref={"kind": "DataSource", "name": "golden-das"}), "-n", ns)
    wait_dv_phase(k, ns, "from-ref", "Succeeded")
    k.apply({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": "golden-snap"},
             "spec": {"volumeSnapshotClassName": "local", "source": {"persistentVolumeClaimName": "golden"}}},
            "-n", ns)
    k.apply(clone_dv("from-snap", {"snapshot": {"namespace": ns, "name": "golden-snap"}}), "-n", ns)
    wait_dv_phase(k, ns, "from-snap", "Succeeded")
    assert get(k, "pvc", "from-snap", ns)["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "snapshot"

    for claim in ("smart", "csi", "from-ref", "from-snap"):
        assert describe(k, ns, claim, f"describe-{claim}")["sha256"] == original["sha256"], claim
    assert leftovers(k, ns) == []
    assert [p["metadata"]["name"] for p in k.json("get", "pvc", "-n", ns)["items"]
            if p["status"].get("phase") != "Bound"] == []


@pytest.mark.anycluster
@pytest.mark.parametrize("smart", [True, False], ids=["smart", "host-assisted"])
def test_clone_into_another_namespace_rebinds_the_volume(shared_kubectl: Kubectl, smart: bool) -> None:
    """On a class with snapshots and CSI clones the planner's smart strategy, on one without a host-assisted
    copy: either way the bytes arrive in the other namespace and nothing temporary stays."""
    k = shared_kubectl
    storage_class = TARGET.storage_class if smart else TARGET.copy_class
    src_ns, ns = new_namespace(k, "src"), new_namespace(k, "dst")
    k.apply(pvc("golden", "64Mi", storage_class=storage_class), "-n", src_ns)
    run_to_completion(k, src_ns, pod("fill", SPARSE_WRITE, "golden", python=True))
    original = describe(k, src_ns, "golden", "describe-golden")
    dv = clone_dv("copy", {"pvc": {"namespace": src_ns, "name": "golden"}}, storage_class=storage_class)
    if smart:  # the source's size exactly (the pvc API adds no overhead): no expansion, which not every class has
        dv["spec"]["pvc"] = {**dv["spec"].pop("storage"), "accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "64Mi"}}}
    k.apply(dv, "-n", ns)
    dv = wait_dv_phase(k, ns, "copy", "Succeeded")
    assert dv["status"]["progress"] == "100.0%"
    assert describe(k, ns, "copy", "describe-copy")["sha256"] == original["sha256"]
    expected = TARGET.smart_clone if smart else "copy"
    assert get(k, "pvc", "copy", ns)["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == expected
    reasons = [r for r, _ in events_of(k, ns, "copy")]
    for reason in ("CloneScheduled", "RebindInProgress", "CloneSucceeded"):
        assert reason in reasons, reasons
    wait_for(lambda: leftovers(k, src_ns) == [] and leftovers(k, ns) == [], 60, 0.5,
             message="no temporary claim or snapshot left")


@pytest.mark.anycluster
def test_a_snapshot_restored_into_a_class_of_another_driver_is_copied_through_a_restored_claim(
        shared_kubectl: Kubectl) -> None:
    """A VolumeSnapshot restored into a class of another driver falls back to a host-assisted copy, which reads
    a claim: as CDI does, the snapshot is restored beside it (`tmp-source-pvc-<uid>`, a class of its own
    driver) and copied from there; the DataVolume shows each step and ends with the snapshot's bytes."""
    k = shared_kubectl
    src_ns, ns = new_namespace(k, "snapsrc"), new_namespace(k, "snapdst")
    k.apply(pvc("golden", "64Mi", storage_class=TARGET.storage_class), "-n", src_ns)
    run_to_completion(k, src_ns, pod("fill", SPARSE_WRITE, "golden", python=True))
    original = describe(k, src_ns, "golden", "describe-golden")
    k.apply({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": "golden-snap"},
             "spec": {"volumeSnapshotClassName": TARGET.snapshot_class,
                      "source": {"persistentVolumeClaimName": "golden"}}}, "-n", src_ns)
    wait_for(lambda: ((get(k, "volumesnapshot", "golden-snap", src_ns) or {}).get("status") or {}).get("readyToUse"),
             60, 0.2, message="the snapshot ready")
    k.apply(clone_dv("restored", {"snapshot": {"namespace": src_ns, "name": "golden-snap"}},
                     storage_class=TARGET.copy_class), "-n", ns)
    dv = wait_dv_phase(k, ns, "restored", "Succeeded", timeout=180)
    assert dv["status"]["progress"] == "100.0%"
    annotations = get(k, "pvc", "restored", ns)["metadata"]["annotations"]
    assert annotations["cdi.kubevirt.io/cloneType"] == "copy"
    assert annotations["cdi.kubevirt.io/cloneFallbackReason"]
    reasons = [r for r, _ in events_of(k, ns, "restored")]
    for reason in ("CloneScheduled", "CloneFromSnapshotSourceInProgress", "CloneInProgress", "RebindInProgress",
                   "CloneSucceeded"):
        assert reason in reasons, reasons
    assert describe(k, ns, "restored", "describe-restored")["sha256"] == original["sha256"]
    wait_for(lambda: leftovers(k, src_ns) == [] and leftovers(k, ns) == [], 60, 0.5,
             message="no temporary claim or snapshot left")


def test_fallback_and_validation_are_explained(shared_cdi_up: CdiUp, shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "fallback")
    k.apply(pvc("golden", "64Mi", storage_class="local-nosnap"), "-n", ns)
    # the profile of a class without snapshots advises copy: host-assisted, as asked, no fallback
    k.apply(clone_dv("slow", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class="local-nosnap"), "-n", ns)
    wait_dv_phase(k, ns, "slow", "Succeeded")
    target = get(k, "pvc", "slow", ns)
    assert target["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"
    assert "cdi.kubevirt.io/cloneFallbackReason" not in target["metadata"]["annotations"]
    assert dict(events_of(k, ns, "slow"))["CloneScheduled"] == (
        f"Cloning from {ns}/golden into {ns}/slow scheduled: host-assisted copy, as asked by the cloneStrategy "
        "of StorageProfile local-nosnap")

    # Filesystem into Block cannot be a CSI clone or a snapshot: host-assisted, and why
    k.apply(pvc("golden-fs", "64Mi"), "-n", ns)
    dv = clone_dv("to-block", {"pvc": {"namespace": ns, "name": "golden-fs"}}, size="64Mi")
    dv["spec"]["storage"]["volumeMode"] = "Block"
    wait_bound_source = wait_for(lambda: (get(k, "pvc", "golden-fs", ns) or {}).get("status", {}).get("phase")
                                 == "Bound", 30, 0.1, message="source bound")
    assert wait_bound_source
    planned = clone_plan(shared_cdi_up, dv, ns)  # before anything moves, the same words as the event
    assert planned.returncode == 0, planned.stderr
    assert "strategy: copy" in planned.stdout.splitlines()
    assert "fallback: IncompatibleVolumeModes: The volume modes of source and target are incompatible" in \
        planned.stdout.splitlines()
    assert get(k, "pvc", "to-block", ns) is None
    k.apply(dv, "-n", ns)
    wait_dv_phase(k, ns, "to-block", "Succeeded")
    assert dict(events_of(k, ns, "to-block"))["CloneScheduled"] == planned.stdout.splitlines()[0]
    target = get(k, "pvc", "to-block", ns)
    assert target["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"
    assert target["metadata"]["annotations"]["cdi.kubevirt.io/cloneFallbackReason"] == \
        "The volume modes of source and target are incompatible"

    def fallback_event() -> bool:
        return ("IncompatibleVolumeModes", "The volume modes of source and target are incompatible") in \
            events_of(k, ns, "to-block")

    wait_for(fallback_event, 30, 0.2, message="fallback event on the target claim")

    # a target smaller than the source is refused with CDI's message, unless permissive
    k.apply(clone_dv("small", {"pvc": {"namespace": ns, "name": "golden"}}, size="32Mi",
                     storage_class="local-nosnap"), "-n", ns)

    def refused() -> bool:
        return any(r == "CloneValidationFailed" for r, _ in events_of(k, ns, "small"))

    wait_for(refused, 30, 0.2, message="CloneValidationFailed")
    small = clone_dv("small", {"pvc": {"namespace": ns, "name": "golden"}}, size="32Mi", storage_class="local-nosnap")
    planned = clone_plan(shared_cdi_up, small, ns)
    assert planned.returncode == 1
    assert planned.stderr.startswith("The clone doesn't meet the validation requirements: target resources requests "
                                     "storage size is smaller than the source"), planned.stderr
    assert any(r == "ErrIncompatiblePVC" and m.startswith("target resources requests storage size is smaller than "
                                                          "the source")
               for r, m in events_of(k, ns, "small"))
    assert get(k, "pvc", "small", ns) is None
    k.apply(clone_dv("small-ok", {"pvc": {"namespace": ns, "name": "golden"}}, size="32Mi",
                     storage_class="local-nosnap", annotations={"cdi.kubevirt.io/permissiveClone": "true"}), "-n", ns)
    wait_for(lambda: get(k, "pvc", "small-ok", ns) is not None, 30, 0.2, message="permissive clone target")


# sha256 of the first 64 MiB of disk.img, and whether the rest (a larger target) reads as zeros
PREFIX_DESCRIBE = """
import hashlib, json, os
f = open("/data/disk.img", "rb")
h = hashlib.sha256(f.read(64 * 1024 * 1024))
rest_zero = all(not any(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
st = os.stat("/data/disk.img")
print(json.dumps({"sha256": h.hexdigest(), "size": st.st_size, "rest_zero": rest_zero}))
"""


def test_host_assisted_copy_across_modes_and_sizes(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    src_ns, ns = new_namespace(k, "hsrc"), new_namespace(k, "host")
    k.apply(pvc("golden", "64Mi", storage_class="local-nosnap"), "-n", src_ns)
    run_to_completion(k, src_ns, pod("fill", SPARSE_WRITE, "golden", python=True))
    original = describe(k, src_ns, "golden", "describe-golden")

    # Filesystem to Filesystem in another namespace, the size the source's
    k.apply(clone_dv("copy", {"pvc": {"namespace": src_ns, "name": "golden"}}, storage_class="local-nosnap"),
            "-n", ns)
    dv = wait_dv_phase(k, ns, "copy", "Succeeded")
    assert dv["status"]["progress"] == "100.0%"
    copied = describe(k, ns, "copy", "describe-copy")
    assert copied["sha256"] == original["sha256"] and copied["size"] == original["size"]
    assert copied["allocated"] <= original["allocated"] + 64 * 1024, "the copy lost its holes"
    target = get(k, "pvc", "copy", ns)
    assert target["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"
    reasons = [r for r, _ in events_of(k, ns, "copy")]
    for reason in ("CloneScheduled", "CloneInProgress", "RebindInProgress", "CloneSucceeded"):
        assert reason in reasons, reasons

    # Filesystem to Block, then Block to a larger Filesystem volume of another storage class
    to_block = clone_dv("to-block", {"pvc": {"namespace": src_ns, "name": "golden"}}, size="64Mi",
                        storage_class="local-nosnap")
    to_block["spec"]["storage"]["volumeMode"] = "Block"
    k.apply(to_block, "-n", ns)
    wait_dv_phase(k, ns, "to-block", "Succeeded")
    out = run_to_completion(k, ns, pod("describe-block", BLOCK_DESCRIBE, "to-block", block=True, python=True))
    assert json.loads(out) == {"sha256": original["sha256"], "size": 64 * MIB}
    k.apply(clone_dv("back", {"pvc": {"namespace": ns, "name": "to-block"}}, size="100Mi",
                     storage_class="local"), "-n", ns)
    wait_dv_phase(k, ns, "back", "Succeeded")
    assert get(k, "pvc", "back", ns)["metadata"]["annotations"]["cdi.kubevirt.io/cloneFallbackReason"] == \
        "Provisioners are incompatible"
    back = json.loads(run_to_completion(k, ns, pod("describe-back", PREFIX_DESCRIBE, "back", python=True)))
    assert back["sha256"] == original["sha256"] and back["rest_zero"] and back["size"] > 64 * MIB

    # nothing of the copy stays: temporary claims, source pods, upload servers and their secrets
    for namespace in (src_ns, ns):
        assert leftovers(k, namespace) == []
        pods = [p["metadata"]["name"] for p in k.json("get", "pods", "-n", namespace)["items"]]
        assert [p for p in pods if p.endswith("-source-pod") or p.startswith("cdi-upload-")] == [], pods
        secrets = [x["metadata"]["name"] for x in k.json("get", "secrets", "-n", namespace)["items"]]
        assert [x for x in secrets if x.endswith("-source-pod") or x.startswith("cdi-upload-")] == [], secrets


def test_host_assisted_clone_waits_while_the_source_is_in_use(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "inuse")
    k.apply(pvc("golden", "64Mi", storage_class="local-nosnap"), "-n", ns)
    run_to_completion(k, ns, pod("fill", SPARSE_WRITE, "golden", python=True))
    original = describe(k, ns, "golden", "describe-golden")
    k.apply(pod("holder", "sleep 600", "golden"), "-n", ns)
    wait_for(lambda: (get(k, "pod", "holder", ns) or {}).get("status", {}).get("phase") == "Running", 60, 0.1,
             message="holder running")
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class="local-nosnap"), "-n", ns)
    message = f"pod {ns}/holder using PersistentVolumeClaim golden"

    def held() -> dict[str, Any] | None:
        dv = get(k, "datavolume", "copy", ns) or {}
        running = next((c for c in dv.get("status", {}).get("conditions", []) if c["type"] == "Running"), {})
        return dv if running.get("reason") == "CloneSourceInUse" and running.get("message") == message else None

    dv = wait_for(held, 60, 0.2, message="Running condition says CloneSourceInUse")
    assert dv["status"]["phase"] == "CloneInProgress"
    assert ("CloneSourceInUse", message) in events_of(k, ns, "copy")
    k("delete", "pod", "holder", "-n", ns, "--wait=false")
    wait_dv_phase(k, ns, "copy", "Succeeded")
    assert describe(k, ns, "copy", "describe-copy")["sha256"] == original["sha256"]


def test_cross_namespace_clone_needs_permission_in_the_source_namespace(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    src_ns, ns = new_namespace(k, "authsrc"), new_namespace(k, "authdst")
    k.apply(pvc("golden", "16Mi"), "-n", src_ns)
    run_to_completion(k, src_ns, pod("fill", "echo golden > /data/disk.img", "golden"))

    # kubectl auth can-i (a protobuf SelfSubjectAccessReview) and --as (impersonation headers)
    assert k("auth", "can-i", "create", "pods", "-n", ns).stdout.strip() == "yes"
    denied = k("auth", "can-i", "create", "pods", "-n", ns, "--as", "alice", check=False)
    assert (denied.returncode, denied.stdout.strip()) == (1, "no")
    forbidden = k("get", "pods", "-n", ns, "--as", "alice", check=False)
    assert forbidden.returncode == 1
    assert f'User "alice" cannot list resource "pods" in API group "" in the namespace "{ns}"' in forbidden.stderr

    k.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "dv-maker"},
             "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"],
                        "verbs": ["create", "get", "list"]}]}, "-n", ns)
    k("create", "rolebinding", "alice-dv", "--role=dv-maker", "--user=alice", "-n", ns)
    assert k("auth", "can-i", "create", "datavolumes.cdi.kubevirt.io", "-n", ns, "--as", "alice").stdout.strip() == \
        "yes"
    manifest = clone_dv("stolen", {"pvc": {"namespace": src_ns, "name": "golden"}})
    refused = k("create", "-f", "-", "-n", ns, "--as", "alice", input=json.dumps(manifest), check=False)
    assert refused.returncode == 1
    assert f"User alice has insufficient permissions in clone source namespace {src_ns}" in refused.stderr
    assert get(k, "datavolume", "stolen", ns) is None

    k.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "clone-source"},
             "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes/source"], "verbs": ["create"]}]},
            "-n", src_ns)
    k("create", "rolebinding", "alice-source", "--role=clone-source", "--user=alice", "-n", src_ns)
    assert k("auth", "can-i", "create", "datavolumes.cdi.kubevirt.io", "--subresource=source", "-n", src_ns,
             "--as", "alice").stdout.strip() == "yes"
    manifest["metadata"]["name"] = "granted"
    k("create", "-f", "-", "-n", ns, "--as", "alice", input=json.dumps(manifest))
    granted = wait_dv_phase(k, ns, "granted", "Succeeded")
    out = run_to_completion(k, ns, pod("read", "cat /data/disk.img", "granted"))
    assert out == "golden\n"

    # CDI's DataVolume mutating webhook did the check and signed a clone token for this source and target,
    # which the controller traded for a long-lived one bound to the DataVolume
    hooks = k.json("get", "mutatingwebhookconfiguration", "cdi-api-datavolume-mutate")["webhooks"]
    assert [(h["name"], h["clientConfig"]["service"]["path"]) for h in hooks] == \
        [("datavolume-mutate.cdi.kubevirt.io", "/datavolume-mutate")]
    annotations = granted["metadata"]["annotations"]
    short = jwt.decode(annotations["cdi.kubevirt.io/storage.clone.token"], options={"verify_signature": False})
    assert (short["iss"], short["operation"], short["namespace"], short["name"], short["resource"]["resource"],
            short["params"], short["exp"] - short["iat"]) == (
        "cdi-apiserver", "Clone", src_ns, "golden", "persistentvolumeclaims",
        {"targetNamespace": ns, "targetName": "granted"}, 300)
    extended = jwt.decode(annotations["cdi.kubevirt.io/storage.extended.clone.token"],
                          options={"verify_signature": False})
    assert (extended["iss"], extended["params"]["uid"]) == ("cdi-deployment", granted["metadata"]["uid"])

    # a token taken from another DataVolume is worth nothing: admission drops it (only the webhook's own,
    # written after its checks, stays), and alice, no longer allowed there, gets no new one
    k("delete", "rolebinding", "alice-source", "-n", src_ns)
    manifest["metadata"]["name"] = "granted"
    manifest["metadata"]["annotations"] = {
        "cdi.kubevirt.io/storage.extended.clone.token": annotations["cdi.kubevirt.io/storage.extended.clone.token"],
        "cdi.kubevirt.io/storage.checkStaticVolume": ""}  # which CDI lets through without its own check
    k("delete", "datavolume", "granted", "-n", ns)
    wait_for(lambda: get(k, "pvc", "granted", ns) is None, 60, 0.2, message="the first granted claim gone")
    k("create", "-f", "-", "-n", ns, "--as", "alice", input=json.dumps(manifest))
    stored = get(k, "datavolume", "granted", ns)["metadata"].get("annotations") or {}
    assert "cdi.kubevirt.io/storage.extended.clone.token" not in stored
    assert "cdi.kubevirt.io/storage.clone.token" not in stored

    def refused() -> bool:
        return ("CloneTokenInvalid", "token missing") in events_of(k, ns, "granted")

    wait_for(refused, 60, 0.2, message="the copied token refused")
    assert get(k, "datavolume", "granted", ns)["status"]["phase"] == "Pending"
    assert get(k, "pvc", "granted", ns) is None


# a raw disk image of 40 MiB with three allocated blocks, on a 64 MiB claim: its virtual size is what
# CDI's size rules give a clone without a size, not the claim's capacity
IMAGE_40M = SPARSE_WRITE.replace("64 * 1024 * 1024", "40 * 1024 * 1024")
KUBEVIRT_CONTENT = {"cdi.kubevirt.io/storage.contentType": "kubevirt"}


def disk_claim(name: str, size: str, storage_class: str | None = None) -> dict[str, Any]:
    claim = pvc(name, size, storage_class=storage_class)
    claim["metadata"]["annotations"] = dict(KUBEVIRT_CONTENT)
    return claim


def filesystem_overhead(k: Kubectl, storage_class: str) -> float:
    overhead = (get(k, "cdiconfig", "config", "") or {}).get("status", {}).get("filesystemOverhead") or {}
    return float((overhead.get("storageClass") or {}).get(storage_class) or overhead.get("global") or "0.06")


def test_clone_without_size_takes_the_virtual_size_of_the_source_image(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "vsize")
    k.apply(disk_claim("golden", "64Mi", "local-nosnap"), "-n", ns)
    run_to_completion(k, ns, pod("fill", IMAGE_40M, "golden", python=True))
    original = describe(k, ns, "golden", "describe-golden")
    assert original["size"] == 40 * MIB and original["allocated"] < 40 * MIB

    # Filesystem into Block, no size: a size-detection pod measures disk.img; the target is exactly the image
    to_block = clone_dv("to-block", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class="local-nosnap")
    to_block["spec"]["storage"]["volumeMode"] = "Block"
    k.apply(to_block, "-n", ns)
    dv = wait_dv_phase(k, ns, "to-block", "Succeeded")
    out = run_to_completion(k, ns, pod("describe-block", BLOCK_DESCRIBE, "to-block", block=True, python=True))
    assert json.loads(out) == {"sha256": original["sha256"], "size": 40 * MIB}
    assert get(k, "pvc", "to-block", ns)["spec"]["resources"]["requests"]["storage"] == str(40 * MIB)
    source = get(k, "pvc", "golden", ns)["metadata"]["annotations"]
    assert source["cdi.Kubervirt.io/virtualSize"] == str(40 * MIB)
    assert source["cdi.Kubervirt.io/sourceCapacity"] == get(k, "pvc", "golden", ns)["status"]["capacity"]["storage"]
    # the 64 MiB source is larger than the 40 MiB target: CDI marks such a clone permissive
    assert dv["metadata"]["annotations"]["cdi.kubevirt.io/permissiveClone"] == "true"
    reasons = [r for r, _ in events_of(k, ns, "to-block")]
    assert "SizeDetectionPodCreated" in reasons and "CloneScheduled" in reasons, reasons
    assert ("SizeDetectionPodCreated", "Size-detection pod created") in events_of(k, ns, "to-block")
    assert [p["metadata"]["name"] for p in k.json("get", "pods", "-n", ns)["items"]
            if p["metadata"]["name"].startswith("size-detection-")] == []

    # Filesystem, no size: the virtual size inflated by the target class's filesystem overhead
    k.apply(clone_dv("fs-copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class="local-nosnap"),
            "-n", ns)
    wait_dv_phase(k, ns, "fs-copy", "Succeeded")
    assert get(k, "pvc", "fs-copy", ns)["spec"]["resources"]["requests"]["storage"] == \
        str(required_space(filesystem_overhead(k, "local-nosnap"), 40 * MIB))
    copied = describe(k, ns, "fs-copy", "describe-fs-copy")
    assert (copied["sha256"], copied["size"]) == (original["sha256"], original["size"])

    # a Block target smaller than the source claim but holding the image is permissive and succeeds ...
    smaller = clone_dv("smaller", {"pvc": {"namespace": ns, "name": "golden"}}, size="48Mi",
                       storage_class="local-nosnap")
    smaller["spec"]["storage"]["volumeMode"] = "Block"
    k.apply(smaller, "-n", ns)
    assert wait_dv_phase(k, ns, "smaller", "Succeeded")["metadata"]["annotations"][
        "cdi.kubevirt.io/permissiveClone"] == "true"
    # ... one smaller than the image is refused with CDI's message
    too_small = clone_dv("too-small", {"pvc": {"namespace": ns, "name": "golden"}}, size="32Mi",
                         storage_class="local-nosnap")
    too_small["spec"]["storage"]["volumeMode"] = "Block"
    k.apply(too_small, "-n", ns)
    message = f"target resources requests storage size is smaller than the source {32 * MIB} < {64 * MIB}"

    def refused() -> bool:
        return ("ErrIncompatiblePVC", message) in events_of(k, ns, "too-small") and \
            ("CloneValidationFailed", f"The clone doesn't meet the validation requirements: {message}") in \
            events_of(k, ns, "too-small")

    wait_for(refused, 60, 0.2, message="too-small refused")
    assert get(k, "pvc", "too-small", ns) is None
    assert "cdi.kubevirt.io/permissiveClone" not in (get(k, "datavolume", "too-small", ns)["metadata"].get(
        "annotations") or {})


# 256 MiB of data (a byte pattern, never zeros, so every block is sent) in a 320 MiB disk.img filling its
# claim: enough for
# the test to find the clone source process and stop it part way
LARGE_WRITE = """
import os
with open("/data/disk.img", "wb") as f:
    f.truncate(320 * 1024 * 1024)
    block = bytes(range(256)) * 4096
    for i in range(256):
        f.seek(i * 1024 * 1024 + (i % 7) * 4096)
        f.write(block[i:] + block[:i])
    f.flush()
    os.fsync(f.fileno())
"""


def cloner_process(owner_uid: str) -> int | None:
    """The pid of the clone source program sending for the DataVolume `owner_uid` (its OWNER_UID)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            # the program (`python -m cdi.cloner` on `cdi up`, the image's `cdi-cloner`), not its sandbox
            if b"python" not in argv[0] or not any(a == b"cdi.cloner" or a.endswith(b"/cdi-cloner") for a in argv):
                continue
            if f"OWNER_UID={owner_uid}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    return None


def bytes_written(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def stop_mid_copy(owner_uid: str, past: int) -> int:
    """Freeze the clone source program once it wrote `past` bytes (to the target's socket): its process
    group is stopped as soon as it appears, then let go in short steps until it is past the mark."""
    pid = wait_for(lambda: cloner_process(owner_uid), 120, 0.005, message="the clone source program")
    group = os.getpgid(pid)
    os.killpg(group, signal.SIGSTOP)
    while bytes_written(pid) < past:
        os.killpg(group, signal.SIGCONT)
        wait_for(lambda: bytes_written(pid) >= past, 60, 0.001, message="the clone under way")
        os.killpg(group, signal.SIGSTOP)
    return pid


def container_group(k: Kubectl, ns: str, name: str) -> int:
    container = k.json("get", "pod", name, "-n", ns)["status"]["containerStatuses"][0]
    return int(container["containerID"].removeprefix("bwrap://"))


def restarts(k: Kubectl, ns: str, name: str) -> int:
    statuses = ((get(k, "pod", name, ns) or {}).get("status") or {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount") or 0)


@pytest.mark.parametrize("killed", ["source", "target"])
def test_a_killed_clone_pod_restarts_and_the_bytes_end_identical(shared_kubectl: Kubectl, killed: str) -> None:
    """Host-assisted copy: the clone source pod (or the target's upload server) is SIGKILLed part way; the
    node restarts it, the stream starts over, and the target holds the source's bytes."""
    k = shared_kubectl
    ns = new_namespace(k, f"kill{killed}")
    k.apply(pvc("golden", "320Mi", storage_class="local-nosnap"), "-n", ns)
    run_to_completion(k, ns, pod("fill", LARGE_WRITE, "golden", python=True), timeout=120)
    original = describe(k, ns, "golden", "describe-golden")
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class="local-nosnap"), "-n", ns)
    uid = wait_for(lambda: (get(k, "datavolume", "copy", ns) or {}).get("metadata", {}).get("uid"), 30, 0.05,
                   message="the DataVolume")
    pid = stop_mid_copy(uid, 32 * MIB)
    target_uid = get(k, "pvc", "copy", ns)["metadata"]["uid"]
    temp = k.json("get", "pvc", "-n", ns, "-l", f"cdi.kubevirt.io/OwnedByUID={target_uid}")["items"]
    assert len(temp) == 1, temp
    source_pod = f"{temp[0]['metadata']['uid']}-source-pod"
    upload_pod = f"cdi-upload-{temp[0]['metadata']['name']}"
    assert get(k, "datavolume", "copy", ns)["status"]["phase"] == "CloneInProgress"
    if killed == "source":
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        wait_for(lambda: restarts(k, ns, source_pod) >= 1, 120, 0.2, message="the node to restart the source pod")
    else:
        os.killpg(container_group(k, ns, upload_pod), signal.SIGKILL)
        wait_for(lambda: restarts(k, ns, upload_pod) >= 1, 120, 0.2, message="the node to restart the upload server")
        os.killpg(os.getpgid(pid), signal.SIGCONT)  # its connection is gone: it fails, and is restarted
    dv = wait_dv_phase(k, ns, "copy", "Succeeded", timeout=300)
    copied = describe(k, ns, "copy", "describe-copy")
    assert (copied["sha256"], copied["size"]) == (original["sha256"], original["size"])
    # CDI counts the restarts of the target's pod (the upload server) in the DataVolume's restartCount
    assert dv["status"]["restartCount"] == (1 if killed == "target" else 0)
    assert dv["status"]["progress"] == "100.0%"
    reasons = [r for r, _ in events_of(k, ns, "copy")]
    assert reasons.count("CloneInProgress") == 1 and reasons[-1] == "CloneSucceeded", reasons
    assert leftovers(k, ns) == []


BLOCK_WRITE = """
import os
fd = os.open("/dev/cdi-block-volume", os.O_WRONLY)
for offset in (0, 5 * 1024 * 1024, 32 * 1024 * 1024 - 8192):
    os.pwrite(fd, os.urandom(8192), offset)
os.fsync(fd)
"""


def test_block_to_filesystem_and_back_in_one_class_is_a_forced_copy(shared_kubectl: Kubectl) -> None:
    """Storage class `local` can snapshot and CSI-clone, but not across volume modes: Block to Filesystem
    and back fall back to host-assisted copy with CDI's reason, each phase announced, the bytes kept,
    nothing temporary left."""
    k = shared_kubectl
    ns = new_namespace(k, "modes")
    k.apply(pvc("golden", "32Mi", storage_class="local", block=True), "-n", ns)
    run_to_completion(k, ns, pod("fill", BLOCK_WRITE, "golden", block=True, python=True))
    original = json.loads(run_to_completion(k, ns, pod("describe-golden", BLOCK_DESCRIBE, "golden", block=True,
                                                       python=True)))
    assert original["size"] == 32 * MIB

    # Block into Filesystem, no size: the source's capacity plus the filesystem overhead
    k.apply(clone_dv("to-fs", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class="local"), "-n", ns)
    dv = wait_dv_phase(k, ns, "to-fs", "Succeeded")
    target = get(k, "pvc", "to-fs", ns)
    assert target["spec"]["volumeMode"] == "Filesystem"
    assert target["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"
    assert target["metadata"]["annotations"]["cdi.kubevirt.io/cloneFallbackReason"] == \
        "The volume modes of source and target are incompatible"
    assert target["spec"]["resources"]["requests"]["storage"] == \
        str(required_space(filesystem_overhead(k, "local"), 32 * MIB))
    copied = describe(k, ns, "to-fs", "describe-to-fs")
    assert (copied["sha256"], copied["size"]) == (original["sha256"], original["size"])
    assert (dv["status"]["progress"], dv["status"].get("restartCount", 0)) == ("100.0%", 0)

    # and back into Block: the clone's claim holds a disk image, so its virtual size is the size
    back = clone_dv("back", {"pvc": {"namespace": ns, "name": "to-fs"}}, storage_class="local")
    back["spec"]["storage"]["volumeMode"] = "Block"
    k.apply(back, "-n", ns)
    wait_dv_phase(k, ns, "back", "Succeeded")
    assert get(k, "pvc", "back", ns)["metadata"]["annotations"]["cdi.kubevirt.io/cloneFallbackReason"] == \
        "The volume modes of source and target are incompatible"
    out = run_to_completion(k, ns, pod("describe-back", BLOCK_DESCRIBE, "back", block=True, python=True))
    assert json.loads(out) == original

    for name, source in (("to-fs", "golden"), ("back", "to-fs")):
        events = events_of(k, ns, name)
        reasons = [r for r, _ in events]
        assert ("IncompatibleVolumeModes", "The volume modes of source and target are incompatible") in events
        # each phase of the copy path once, in order
        phases = [r for r in reasons if r in ("CloneScheduled", "CloneInProgress", "RebindInProgress",
                                              "CloneSucceeded")]
        assert phases == ["CloneScheduled", "CloneInProgress", "RebindInProgress", "CloneSucceeded"], reasons
        assert dict(events)["CloneScheduled"].startswith(
            f"Cloning from {ns}/{source} into {ns}/{name} scheduled: host-assisted copy: The volume modes of "
            "source and target are incompatible")
    assert leftovers(k, ns) == []
    names = [p["metadata"]["name"] for p in k.json("get", "pods", "-n", ns)["items"]]
    assert [p for p in names if p.endswith("-source-pod") or p.startswith(("cdi-upload-", "size-detection-"))] == []
    secrets = [x["metadata"]["name"] for x in k.json("get", "secrets", "-n", ns)["items"]]
    assert [x for x in secrets if x.endswith("-source-pod") or x.startswith("cdi-upload-")] == []
