"""When parts of a real cluster fail under cdi (issue 29, "Fail over"): the controller's leader crashes in the
middle of an import and of a host-assisted clone, and its standby (`cdi-deployment` runs two replicas that
elect a leader over a Lease, as CDI's does) takes over within the lease time and finishes the work with the
same worker pods; the node's kubelet and container runtime restart in the middle of an import, and the
DataVolume still ends, with the right bytes.

A crash is a SIGKILL of the leader's container on its node: no lease is released, so the standby waits it
out. Real clusters only (`realcluster`), with the node's processes on this machine (`CDI_E2E_NODE_LOCAL`);
`cdi up` runs one controller process and no pods of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.importing import datavolume, read_back, wait_phase
from tests.e2e.target import TARGET
from tests.e2e.test_clone import (
    LARGE_WRITE,
    clone_dv,
    describe,
    events_of,
    leftovers,
    stop_mid_copy,
    wait_dv_phase,
)
from tests.e2e.workloads import get, new_namespace, pod, pvc, run_to_completion
from tests.support.cluster import Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer

pytestmark = pytest.mark.realcluster

LEASE = "cdi-controller-leader-election-helper"
LEASE_SECONDS = 15.0  # cdi.kube.leaderelection.LeaderElectionConfig.lease_duration, as CDI's controller-runtime
MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def _node_local() -> None:
    if not TARGET.node_local:
        pytest.skip("needs the node's processes on this machine (CDI_E2E_NODE_LOCAL=1)")



class PodWatch:
    """Every pod with `selector` in `namespace` that ever exists while the watch runs, by uid: a second worker
    pod, however short-lived, is seen (a `kubectl get --watch`, not a poll)."""

    def __init__(self, k: Kubectl, namespace: str, selector: str) -> None:
        self.uids: dict[str, str] = {}
        self._process = k.popen("get", "pods", "-n", namespace, "-l", selector, "--watch", "-o",
                                "jsonpath={.metadata.uid} {.metadata.name}{\"\\n\"}")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.strip():
                uid, name = line.split()
                self.uids[uid] = name

    def stop(self) -> dict[str, str]:
        self._process.terminate()
        self._process.wait(10)
        self._reader.join(10)
        return self.uids


def container_processes(container_id: str) -> list[int]:
    """The pids on this node of a container (`containerd://<id>`): the processes whose cgroup is its own."""
    wanted = "/" + container_id.split("://", 1)[1]
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if any(line.endswith(wanted) for line in (entry / "cgroup").read_text().splitlines()):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def pod_processes(k: Kubectl, namespace: str, name: str) -> list[int]:
    statuses = (k.get("pod", name, namespace).get("status") or {}).get("containerStatuses") or []
    return [pid for s in statuses if s.get("containerID") for pid in container_processes(s["containerID"])]


def holder(k: Kubectl) -> str:
    lease = get(k, "lease", LEASE, TARGET.cdi_namespace) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def crash_leader(k: Kubectl) -> str:
    """SIGKILL the leading controller's container on its node, as a crash (or the OOM killer) would: it
    releases nothing. Returns the identity that led (`<pod name>_<uuid>`)."""
    leader = wait_for(lambda: holder(k), 60, 0.5, message="a controller leading")
    pids = pod_processes(k, TARGET.cdi_namespace, leader.rsplit("_", 1)[0])
    assert pids, f"no process of the leader {leader} on this node"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return leader


def wait_takeover(k: Kubectl, crashed: str, since: float) -> float:
    """Seconds until another controller holds the lease; within the lease time plus one retry and the time
    a watch takes to tell us."""
    wait_for(lambda: holder(k) not in ("", crashed), LEASE_SECONDS + 30, 0.2, message="another controller leading")
    took = time.monotonic() - since
    assert took <= LEASE_SECONDS + 10, f"the standby took {took:.1f} s to lead (lease {LEASE_SECONDS} s)"
    return took


def test_the_standby_finishes_an_import_whose_leader_crashed(k: Kubectl, gated_server: FileServer,
                                                            images: dict[str, Image], record_property: Any) -> None:
    image = images["raw.img"]
    ns = new_namespace(k, "failover-import")
    importers = PodWatch(k, ns, "cdi.kubevirt.io=importer")
    gated_server.close_gate(4 * MIB)  # the import stalls part way, until the standby leads
    k.apply(datavolume("survivor", {"http": {"url": f"{gated_server.url}/{image.name}"}}, "64Mi"), "-n", ns)
    wait_phase(k, "survivor", "ImportInProgress", namespace=ns)
    wait_for(lambda: gated_server.served(image.name) >= 4 * MIB - 256 * 1024, 120, 0.2, message="import under way")
    crashed = crash_leader(k)
    took = wait_takeover(k, crashed, time.monotonic())
    record_property("standby leads after (s)", round(took, 1))
    gated_server.open_gate()
    dv = wait_phase(k, "survivor", "Succeeded", timeout=180, namespace=ns)
    assert dv["status"]["progress"] == "100.0%" and dv["status"].get("restartCount", 0) == 0
    assert read_back(k, "survivor", image.virtual_size, namespace=ns) == image.sha256
    assert len(importers.stop()) == 1, importers.uids  # the standby adopted the running importer


def test_the_standby_finishes_a_host_assisted_clone_whose_leader_crashed(k: Kubectl, record_property: Any) -> None:
    ns = new_namespace(k, "failover-clone")
    k.apply(pvc("golden", "320Mi", storage_class=TARGET.copy_class), "-n", ns)
    run_to_completion(k, ns, pod("fill", LARGE_WRITE, "golden", python=True), timeout=180)
    original = describe(k, ns, "golden", "describe-golden")
    sources = PodWatch(k, ns, "cdi.kubevirt.io=cdi-clone-source")
    uploads = PodWatch(k, ns, "cdi.kubevirt.io=cdi-upload-server")
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class=TARGET.copy_class),
            "-n", ns)

    uid = wait_for(lambda: (get(k, "datavolume", "copy", ns) or {}).get("metadata", {}).get("uid"), 30, 0.05,
                   message="the DataVolume")
    frozen = stop_mid_copy(uid, 32 * MIB)  # the copy stands a part of the way in
    assert get(k, "datavolume", "copy", ns)["status"]["phase"] == "CloneInProgress"
    crashed = crash_leader(k)
    took = wait_takeover(k, crashed, time.monotonic())
    record_property("standby leads after (s)", round(took, 1))
    os.killpg(os.getpgid(frozen), signal.SIGCONT)
    dv = wait_dv_phase(k, ns, "copy", "Succeeded", timeout=300)
    copied = describe(k, ns, "copy", "describe-copy")
    assert (copied["sha256"], copied["size"]) == (original["sha256"], original["size"])
    assert dv["status"]["restartCount"] == 0 and dv["status"]["progress"] == "100.0%"
    assert len(sources.stop()) == 1 and len(uploads.stop()) == 1, (sources.uids, uploads.uids)
    reasons = [r for r, _ in events_of(k, ns, "copy")]
    assert reasons.count("CloneInProgress") == 1 and reasons[-1] == "CloneSucceeded", reasons
    wait_for(lambda: leftovers(k, ns) == [], 60, 0.5, message="no temporary claim left")


def test_an_import_ends_when_the_nodes_kubelet_and_runtime_restart_under_it(
        k: Kubectl, gated_server: FileServer, images: dict[str, Image]) -> None:
    if not TARGET.node_restart:
        pytest.skip("needs a command that restarts the node's kubelet and runtime (CDI_E2E_NODE_RESTART)")
    image = images["qcow2.qcow2"]
    ns = new_namespace(k, "noderestart")
    importers = PodWatch(k, ns, "cdi.kubevirt.io=importer")
    gated_server.close_gate(image.file_size // 2)
    k.apply(datavolume("weathered", {"http": {"url": f"{gated_server.url}/{image.name}"}}, "64Mi"), "-n", ns)
    wait_phase(k, "weathered", "ImportInProgress", namespace=ns)
    wait_for(lambda: gated_server.served(image.name) > 0, 120, 0.2, message="import under way")
    restarted = subprocess.run(TARGET.node_restart, capture_output=True, text=True, timeout=600, check=False)
    assert restarted.returncode == 0, restarted.stdout[-2000:] + restarted.stderr[-2000:]
    gated_server.open_gate()
    dv = wait_phase(k, "weathered", "Succeeded", timeout=300, namespace=ns)
    assert dv["status"]["progress"] == "100.0%"
    assert read_back(k, "weathered", image.virtual_size, namespace=ns) == image.sha256
    assert len(importers.stop()) == 1, importers.uids

