"""The extension `extensions.cdi.dev/clone.allowSourceInUse` (issue #30 point 5, CDI's pain point 22): a
smart clone (CSI clone or snapshot, one instant of the source) of a volume a running pod writes to goes on,
crash-consistent, and says so, instead of waiting with CloneSourceInUse until the VM stops. A host-assisted
copy cannot be taken at one instant, so it still waits, and says the opt-in does not apply to it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.target import TARGET
from tests.e2e.test_clone import clone_dv, describe, events_of
from tests.e2e.test_clone_lifecycle import running, temporaries, wait_dv
from tests.e2e.workloads import SPARSE_WRITE, get, new_namespace, pod, pvc, run_to_completion
from tests.support.cluster import Kubectl, wait_for

ALLOW = "extensions.cdi.dev/clone.allowSourceInUse"
RESOURCES = "extensions.cdi.dev/worker.resources"


def held_source(k: Kubectl, prefix: str, storage_class: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A namespace with claim `golden` (a disk written by a pod) and pod `holder` running with it mounted
    writable; the namespace, what `golden` holds, and the holder as it runs."""
    ns = new_namespace(k, prefix)
    k.apply(pvc("golden", "64Mi", storage_class=storage_class), "-n", ns)
    run_to_completion(k, ns, pod("fill", SPARSE_WRITE, "golden", python=True))
    original = describe(k, ns, "golden", "describe-golden")
    k.apply(pod("holder", "sleep 600", "golden"), "-n", ns)

    def started() -> dict[str, Any] | None:
        holder = get(k, "pod", "holder", ns) or {}
        return holder if holder.get("status", {}).get("phase") == "Running" else None

    return ns, original, wait_for(started, 60, 0.1, message="holder running")


@pytest.mark.anycluster
def test_a_smart_clone_that_allows_it_is_taken_while_a_pod_writes_to_the_source(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns, original, holder = held_source(k, "inuseok", TARGET.storage_class)
    dv = clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class=TARGET.storage_class,
                  annotations={ALLOW: "true"})
    # the source's size exactly (the pvc API adds no overhead): no expansion, which not every class has
    dv["spec"]["pvc"] = {**dv["spec"].pop("storage"), "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "64Mi"}}}
    k.apply(dv, "-n", ns)
    wait_dv(k, ns, "copy", "Succeeded")
    # the writer was never stopped or restarted: the clone did not wait for it
    now = get(k, "pod", "holder", ns) or {}
    assert (now["metadata"]["uid"], now["status"]["phase"]) == (holder["metadata"]["uid"], "Running")
    assert [c.get("restartCount", 0) for c in now["status"].get("containerStatuses", [])] == [0]
    annotations = get(k, "pvc", "copy", ns)["metadata"]["annotations"]
    assert (annotations["cdi.kubevirt.io/cloneType"], annotations[ALLOW]) == (TARGET.smart_clone, "true")
    told = [m for reason, m in events_of(k, ns, "copy") if reason == "CrashConsistentClone"]
    assert told == [f"cloning PersistentVolumeClaim {ns}/golden while pod {ns}/holder may write to it ({ALLOW}): "
                    "the copy is crash-consistent"]
    assert "CloneSourceInUse" not in [reason for reason, _ in events_of(k, ns, "copy")]
    assert describe(k, ns, "copy", "describe-copy")["sha256"] == original["sha256"]
    wait_for(lambda: temporaries(k, ns) == [], 30, 0.2, message="the clone's temporaries gone")
    k("delete", "pod", "holder", "-n", ns, "--wait=false")


def test_a_host_assisted_copy_still_waits_and_says_the_opt_in_does_not_apply(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns, original, _ = held_source(k, "inuscopy", "local-nosnap")
    # with a worker override too: a clone DataVolume's extensions reach its target claim and its worker pods
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class="local-nosnap",
                     annotations={ALLOW: "true", RESOURCES: json.dumps({"limits": {"memory": "700M"}})}), "-n", ns)
    message = (f"pod {ns}/holder using PersistentVolumeClaim golden ({ALLOW} applies to csi-clone and snapshot "
               "clones only)")

    def held() -> dict[str, Any] | None:
        dv = get(k, "datavolume", "copy", ns) or {}
        return dv if running(dv).get("message") == message else None

    dv = wait_for(held, 60, 0.2, message="the copy waits, saying why")
    assert (dv["status"]["phase"], running(dv)["reason"]) == ("CloneInProgress", "CloneSourceInUse")
    assert get(k, "pvc", "copy", ns)["metadata"]["annotations"][ALLOW] == "true"
    servers = k.json("get", "pods", "-n", ns, "-l", "cdi.kubevirt.io=cdi-upload-server")["items"]
    assert [c["resources"]["limits"]["memory"] for p in servers for c in p["spec"]["containers"]] == ["700M"]
    k("delete", "pod", "holder", "-n", ns, "--wait=false")
    wait_dv(k, ns, "copy", "Succeeded")
    assert describe(k, ns, "copy", "describe-copy")["sha256"] == original["sha256"]


@pytest.mark.anycluster
def test_the_opt_in_says_true_or_false(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "inuseval")
    refused = k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, size="64Mi",
                               annotations={ALLOW: "yes"}), "-n", ns, check=False)
    assert refused.returncode != 0
    assert f'denied the request:  {ALLOW}: must be "true" or "false", not \'yes\'' in refused.stderr
    assert get(k, "datavolume", "copy", ns) is None
