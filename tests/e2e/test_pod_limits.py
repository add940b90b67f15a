"""Within a real pod's limits (issue 29): OOM-killed importers are CDI's most reported failure, because the page
cache a slow disk has not taken yet is charged to the writing pod. With CDI's default worker limits (CDIConfig
`defaultPodResourceRequirements`: 600M of memory, 750m of CPU, unless the `CDI` resource says otherwise) a
4 GiB disk of real bytes is imported, uploaded and cloned onto a Filesystem and onto a Block volume: no worker
is killed or restarted, every byte arrives, and the peak of each worker's memory cgroup is printed (for
bench/RESULTS.md).

Real clusters only, with the node on this machine (`CDI_E2E_NODE_LOCAL`): the cgroups are read here."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.importing import datavolume, read_back, wait_phase
from tests.e2e.target import TARGET, External
from tests.e2e.test_clone import clone_dv, wait_dv_phase
from tests.e2e.uploading import image_upload
from tests.e2e.workloads import new_namespace
from tests.support.cluster import CdiUp, Kubectl
from tests.support.servers import FileServer

pytestmark = pytest.mark.realcluster

GIB = 1 << 30
SIZE = 4 * GIB
LIMIT = 600_000_000  # CDI's default worker memory limit, "600M"
MEMORY_CGROUPS = (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup"))  # cgroup v1, v2
WORKERS = "cdi.kubevirt.io in (importer, cdi-upload-server, cdi-clone-source)"


@pytest.fixture(scope="module")
def big_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """4 GiB of raw disk, every MiB different (nothing is zero, nothing compresses or dedups away); removed
    after the module, not left to pytest's retention of old runs (CI's disk is shared with the node's volumes)."""
    path = tmp_path_factory.mktemp("limits") / "big.img"
    block = bytearray(os.urandom(1 << 20))
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for i in range(SIZE >> 20):
            block[:8] = i.to_bytes(8, "little")
            f.write(block)
            digest.update(block)
    yield path, digest.hexdigest()
    path.unlink()


class PeakMemory:
    """The highest memory use of each worker pod's cgroup on this node (`memory.max_usage_in_bytes`, or
    `memory.peak` on cgroup v2), read while the pods run, by pod name; and each one's memory limit."""

    def __init__(self, k: Kubectl, namespace: str) -> None:
        self.k, self.namespace = k, namespace
        self.peaks: dict[str, int] = {}
        self.limits: dict[str, int] = {}
        self.killed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _pods(self) -> dict[str, str]:
        pods = json.loads(self.k("get", "pods", "-n", self.namespace, "-l", WORKERS, "-o", "json").stdout)["items"]
        for p in pods:
            for status in (p.get("status") or {}).get("containerStatuses") or []:
                for state in (status.get("state") or {}, status.get("lastState") or {}):
                    if (state.get("terminated") or {}).get("reason") == "OOMKilled":
                        self.killed.append(p["metadata"]["name"])
        return {p["metadata"]["uid"]: p["metadata"]["name"] for p in pods}

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for uid, name in self._pods().items():
                for root in MEMORY_CGROUPS:
                    found = [*root.glob(f"kubepods*/pod{uid}"), *root.glob(f"kubepods*/*/pod{uid}")]
                    if not found:
                        continue
                    group = found[0]
                    v1 = (group / "memory.max_usage_in_bytes", group / "memory.limit_in_bytes")
                    peak_file, limit_file = v1 if v1[0].exists() else (group / "memory.peak", group / "memory.max")
                    try:
                        self.peaks[name] = max(self.peaks.get(name, 0), int(peak_file.read_text()))
                        self.limits[name] = int(limit_file.read_text())
                    except (OSError, ValueError):
                        pass
                    break

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join(30)
        return self.peaks


def role(pod: str) -> str:
    """What a worker pod does, from the name the controller gives it."""
    if pod.endswith("-source-pod"):
        return "clone source"
    for prefix, what in (("importer-", "importer"), ("size-detection-", "size detection"),
                         ("cdi-upload-tmp-pvc-", "clone target"), ("cdi-upload-", "upload server")):
        if pod.startswith(prefix):
            return what
    return pod


@pytest.mark.timeout(900)  # 12 GiB moved and 12 GiB read back
@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_four_gib_in_and_across_within_cdis_default_worker_limits(
        cluster: CdiUp | External, k: Kubectl, big_disk: tuple[Path, str], mode: str, record_property: Any) -> None:
    if not TARGET.node_local:
        pytest.skip("needs the node's cgroups on this machine (CDI_E2E_NODE_LOCAL=1)")
    if mode == "Block" and not TARGET.block:
        pytest.skip("the target's runtime gives non-root pods no block devices (CDI_E2E_BLOCK=0)")
    path, sha256 = big_disk
    block = mode == "Block"
    ns = new_namespace(k, f"limits-{mode.lower()}")
    server = FileServer(path.parent)
    memory = PeakMemory(k, ns)
    try:
        k.apply(datavolume("imported", {"http": {"url": f"{server.url}/{path.name}"}}, "4Gi", volume_mode=mode,
                           storage_class=TARGET.copy_class), "-n", ns)
        uploaded = image_upload(cluster, "dv", "uploaded", "--namespace", ns, "--size", "4Gi", "--volume-mode",
                                mode.lower(), "--storage-class", TARGET.copy_class, "--image-path", str(path),
                                timeout=900)
        assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
        wait_phase(k, "imported", "Succeeded", timeout=900, namespace=ns)

        def verified(name: str) -> None:
            dv = k.get("dv", name, ns)
            assert dv["status"]["phase"] == "Succeeded" and dv["status"].get("restartCount", 0) == 0, dv["status"]
            assert read_back(k, name, SIZE, block=block, namespace=ns) == sha256, name
        # read back and gone before the clone: two 4 GiB volumes on the node's disk at a time, not three
        verified("uploaded")
        k("delete", "dv", "uploaded", "-n", ns, "--wait=true", "--timeout=300s")
        cloned = clone_dv("cloned", {"pvc": {"namespace": ns, "name": "imported"}}, storage_class=TARGET.copy_class)
        cloned["spec"]["storage"]["volumeMode"] = mode
        k.apply(cloned, "-n", ns)
        wait_dv_phase(k, ns, "cloned", "Succeeded", timeout=900)
        peaks = memory.stop()
        verified("imported")
        verified("cloned")
        assert not memory.killed, f"OOM-killed: {memory.killed}"
        assert peaks, "no worker's cgroup was read"
        assert all(0 < limit <= LIMIT for limit in memory.limits.values()), memory.limits  # CDI's default limit
        for name, peak in sorted(peaks.items()):  # the tier prints them (the e2e run's junit properties)
            record_property(f"{mode} {role(name)}: peak memory (MiB)", round(peak / 2**20))
    finally:
        memory.stop()
        server.close()
        # its volumes freed before the next volume mode's are made
        k("delete", "namespace", ns, "--wait=true", "--timeout=300s", check=False)
