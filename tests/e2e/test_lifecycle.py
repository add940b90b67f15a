"""`cdi up` stopping and starting again: no process outlives it, volumes and their bytes survive,
pods are resumed as a node reboot resumes them. And the optional real-filesystem (ext4) mode."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from tests.e2e.workloads import get, new_namespace, pod, processes_mentioning, pvc, run_to_completion, wait_phase
from tests.support.cluster import CdiUp, Kubectl, wait_for


def test_sigterm_leaves_no_process_and_data_survives_restart(cdi_up: CdiUp, kubectl: Kubectl) -> None:
    k = kubectl
    ns = new_namespace(k, "life")
    marker = f"marker-{uuid.uuid4().hex}"
    k.apply(pvc("keep", "32Mi"), "-n", ns)
    k.apply(pvc("raw", "16Mi", block=True), "-n", ns)
    run_to_completion(k, ns, pod("fill", "echo survives > /data/file", "keep"))
    run_to_completion(k, ns, pod("fill-raw", "printf raw-bytes | dd of=/dev/cdi-block-volume bs=1 seek=4096 "
                                             "conv=notrunc", "raw", block=True))
    # a mix of what may be running when cdi up is stopped
    stubborn = pod("stubborn", f"trap '' TERM; (sleep 1000; echo {marker}) & while :; do sleep 0.1; done # {marker}",
                   restart="Always")
    sleeper = pod("sleeper", f"exec sleep 1000 # {marker}", "keep", restart="Always")
    server = pod("server", f"exec python3 -m http.server 8080 --bind $(POD_IP) # {marker}", restart="Always",
                 labels={"app": "server"}, extra={
                     "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]})
    for manifest in (stubborn, sleeper, server):
        k.apply(manifest, "-n", ns)
    k.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "server"},
             "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]}}, "-n", ns)
    for name in ("stubborn", "sleeper", "server"):
        wait_phase(k, ns, name, "Running")
    assert len(processes_mentioning(marker)) >= 3
    data_dir = str(cdi_up.data_dir)

    assert cdi_up.stop(signal.SIGTERM) == 0
    assert processes_mentioning(marker) == []
    assert [p for p in processes_mentioning(data_dir) if "pytest" not in p] == []
    assert "stopped" in cdi_up.output

    cdi_up.start()
    assert run_to_completion(k, ns, pod("read", "cat /data/file", "keep")).strip() == "survives"
    raw = run_to_completion(k, ns, pod("read-raw", "dd if=/dev/cdi-block-volume bs=1 skip=4096 count=9 "
                                                   "2>/dev/null", "raw", block=True))
    assert raw == "raw-bytes"

    def resumed() -> dict | None:  # type: ignore[type-arg]
        obj = get(k, "pod", "sleeper", ns)
        status = ((obj or {}).get("status") or {}).get("containerStatuses") or [{}]
        return obj if status[0].get("restartCount") == 1 and "running" in status[0].get("state", {}) else None

    resumed_pod = wait_for(resumed, 30, 0.1, message="sleeper resumed after restart")
    last = resumed_pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["reason"] == "ContainerStatusUnknown"
    assert resumed_pod["status"]["podIP"] == get(k, "pod", "sleeper", ns)["status"]["podIP"]

    # even SIGKILL, which gives cdi up no chance to clean up, takes its containers down with it
    wait_phase(k, ns, "stubborn", "Running")
    wait_for(lambda: len(processes_mentioning(marker)) >= 2, 30, 0.1, message="containers running again")
    cdi_up.stop(signal.SIGKILL)
    wait_for(lambda: processes_mentioning(marker) == [], 10, 0.1, message="no container outlives cdi up")


def _loop_devices_usable() -> bool:
    import os
    import shutil

    return os.geteuid() == 0 and Path("/dev/loop-control").exists() and shutil.which("mkfs.ext4") is not None


@pytest.mark.skipif(not _loop_devices_usable(), reason="ext4 volumes need root, loop devices and mkfs.ext4")
def test_ext4_volumes_fill_up_like_real_disks(tmp_path: Path) -> None:
    up = CdiUp(tmp_path / "cdi", "--ext4-volumes")
    up.start()
    try:
        k = Kubectl(up.kubeconfig, tmp_path / "kubectl-cache")
        ns = new_namespace(k, "ext4")
        k.apply(pvc("small", "24Mi"), "-n", ns)
        out = run_to_completion(k, ns, pod(
            "fill", "df -B1 --output=fstype,size /data | tail -1; "
                    "dd if=/dev/zero of=/data/big bs=1M count=40 2>&1 | grep -o 'No space left on device' | head -1; "
                    "echo kept > /data/small-file; sync", "small"))
        fstype, size, message = out.split("\n")[0].split()[0], int(out.split()[1]), out.split("\n")[1]
        assert fstype == "ext4"
        assert 16 * 1024 * 1024 < size <= 24 * 1024 * 1024  # the filesystem's own overhead shows
        assert message == "No space left on device"
        k.apply(pvc("copy", "48Mi", source={"kind": "PersistentVolumeClaim", "name": "small"}), "-n", ns)
        out = run_to_completion(k, ns, pod("check", "cat /data/small-file; df -B1 --output=size /data | tail -1",
                                           "copy"))
        kept, grown = out.split()
        assert kept == "kept" and int(grown) > 40 * 1024 * 1024  # cloned then grown to the larger claim
        up.stop()
        mounts = Path("/proc/self/mountinfo").read_text()
        assert str(tmp_path) not in mounts  # stopping unmounts every volume
        up.start()
        assert run_to_completion(k, ns, pod("again", "cat /data/small-file", "small")).strip() == "kept"
    finally:
        up.stop()
