"""cdi on a cluster of several nodes whose volumes live on one node each (issue 29, "Several nodes"; the realk8s
kit's `up.sh --nodes 2`: node `realk8s` and node `realk8s-n2`, CSI hostpath volumes with topology).

What a user of node-local storage relies on: a WaitForFirstConsumer import, upload or clone is made on the
node of the pod that consumes it (the scheduler picks that node, cdi's worker pods follow it, the volume's
node affinity names it); a host-assisted clone (StorageProfile `cloneStrategy: copy`, as admins set it for
node-local storage, whose CSI clones work only on the source's node) carries its bytes from a volume on one node
to a consumer on the other over the pod network; no worker pod is ever put on a node that cannot reach its
volume; and a node that loses power in the middle of an import leaves the DataVolume ending, Succeeded or
Failed with a reason, never stuck. Every check is what a user sees: phases, the node names of pods and
volumes, the bytes a pod on the right node reads back.

Runs only where the target has two nodes (`CDI_E2E_NODES`) and the node's processes are on this machine
(`CDI_E2E_NODE_LOCAL`); the names below are the kit's."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.e2e.importing import READ_BACK, datavolume, wait_phase
from tests.e2e.target import TARGET, External
from tests.e2e.test_clone import LARGE_WRITE, clone_dv, wait_dv_phase
from tests.e2e.uploading import image_upload, upload_dv, wait_ready
from tests.e2e.workloads import DESCRIBE, SPARSE_WRITE, get, new_namespace, pod, pvc, run_to_completion
from tests.support.cluster import Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer

pytestmark = [pytest.mark.realcluster, pytest.mark.multinode,
              pytest.mark.skipif(TARGET.nodes < 2 or not TARGET.node_local,
                                 reason="needs a cluster of two nodes on this machine (CDI_E2E_NODES=2, "
                                        "CDI_E2E_NODE_LOCAL=1)")]

NODE1, NODE2 = "realk8s", "realk8s-n2"  # the kit's nodes: node 1 carries the control plane
WFFC = "csi-hostpath-wffc"  # WaitForFirstConsumer, snapshots (the kit adds it with --nodes)
COPY_WFFC = "csi-hostpath-nosnap-wffc"  # WaitForFirstConsumer, no VolumeSnapshotClass
COPY_IMMEDIATE = "csi-hostpath-nosnap"  # Immediate: the kit makes these volumes on `realk8s` always
WORKERS = "cdi.kubevirt.io in (importer, cdi-upload-server, cdi-clone-source)"
MIB = 1024 * 1024


class Watch:
    """Every object of a `kubectl get --watch` (all namespaces) as it changes, one line each: `parse` turns
    a line into (key, fields), and later fields overwrite earlier ones unless empty. An object that lived
    for a second is still seen, which a poll could miss."""

    def __init__(self, k: Kubectl, args: list[str], template: str,
                 parse: Callable[[list[str]], tuple[str, dict[str, Any]]]) -> None:
        self.seen: dict[str, dict[str, Any]] = {}
        self._parse = parse
        self._lock = threading.Lock()
        self._args = args
        self._process = k.popen("get", *args, "--watch", "-o", f"jsonpath={template}{{\"\\n\"}}")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # kubectl's complaints are drained as they come (a full stderr pipe would stop the watch silently)
        self.errors: list[str] = []
        self._drain = threading.Thread(target=self._read_errors, daemon=True)
        self._drain.start()

    def _read_errors(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self.errors = [*self.errors[-20:], line.rstrip()]

    def _read(self) -> None:
        assert self._process.stdout is not None
        self._started = time.monotonic()
        for line in self._process.stdout:
            if not line.strip():
                continue
            key, fields = self._parse(line.rstrip("\n").split("|"))
            with self._lock:
                entry = self.seen.setdefault(key, {})
                entry.update({name: value for name, value in fields.items() if value or name not in entry})

    def snapshot(self) -> dict[str, dict[str, Any]]:
        assert self._process.poll() is None, (f"the watch {self._args} ended ({self._process.returncode}) after "
                                              f"{time.monotonic() - self._started:.0f} s, {len(self.seen)} seen: "
                                              f"{self.errors}")
        with self._lock:
            return {key: dict(value) for key, value in self.seen.items()}

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(10)
        self._reader.join(10)


def _pod_line(cols: list[str]) -> tuple[str, dict[str, Any]]:
    uid, namespace, name, node, kind, claims = (cols + [""] * 6)[:6]
    return uid, {"namespace": namespace, "name": name, "node": node, "kind": kind,
                 "claims": claims.split()}


def _claim_line(cols: list[str]) -> tuple[str, dict[str, Any]]:
    namespace, name, volume = (cols + [""] * 3)[:3]
    return f"{namespace}/{name}", {"volume": volume}


def _volume_line(cols: list[str]) -> tuple[str, dict[str, Any]]:
    name, nodes = (cols + [""] * 2)[:2]
    return name, {"nodes": sorted(set(nodes.split()))}


class Placement:
    """Where every worker pod ran and where its volumes are: the pods (their node, their claims), the claims
    (their volume) and the volumes (the nodes of their `spec.nodeAffinity`), each watched from the start, so
    a prime claim deleted once its volume moved to the target is still known."""

    def __init__(self, k: Kubectl) -> None:
        # (a `{range}` in a watch's template ends kubectl's watch after the first object, exit 0: a list instead)
        volumes_of_pod = "{.spec.volumes[*].persistentVolumeClaim.claimName}"
        self.pods = Watch(k, ["pods", "-A", "-l", WORKERS],
                          "{.metadata.uid}|{.metadata.namespace}|{.metadata.name}|{.spec.nodeName}|"
                          "{.metadata.labels.cdi\\.kubevirt\\.io}|" + volumes_of_pod, _pod_line)
        self.claims = Watch(k, ["pvc", "-A"], "{.metadata.namespace}|{.metadata.name}|{.spec.volumeName}",
                            _claim_line)
        self.volumes = Watch(k, ["pv"], "{.metadata.name}|{.spec.nodeAffinity.required.nodeSelectorTerms[*]"
                                        ".matchExpressions[*].values[*]}", _volume_line)

    def workers(self, namespace: str | None = None) -> dict[str, dict[str, Any]]:
        """The worker pods seen (in `namespace`), by uid, with the nodes of each claim's volume."""
        claims, volumes = self.claims.snapshot(), self.volumes.snapshot()
        found = {}
        for uid, worker in self.pods.snapshot().items():
            if namespace is not None and worker["namespace"] != namespace:
                continue
            volume_nodes = {}
            for claim in worker["claims"]:
                volume = claims.get(f"{worker['namespace']}/{claim}", {}).get("volume", "")
                volume_nodes[claim] = volumes.get(volume, {}).get("nodes") if volume else None
            found[uid] = {**worker, "volume_nodes": volume_nodes}
        return found

    def stop(self) -> None:
        for watch in (self.pods, self.claims, self.volumes):
            watch.stop()


@pytest.fixture(scope="module")
def placement(k: Kubectl) -> Iterator[Placement]:
    watched = Placement(k)
    yield watched
    watched.stop()



def cluster_get(k: Kubectl, kind: str, name: str) -> Any:
    """A cluster-scoped object (a node, a volume, a StorageProfile), None when it is not there."""
    result = k("get", kind, name, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def pinned(manifest: dict[str, Any], node: str) -> dict[str, Any]:
    """The pod put on `node`, as a user pins a VM's pod (nodeSelector on the node's hostname label)."""
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return manifest


def reader(name: str, claim: str, size: int, node: str) -> dict[str, Any]:
    """The claim's consumer on `node`: it prints the sha256 of the first `size` bytes of its disk.img."""
    manifest = pinned(pod(name, READ_BACK, claim, python=True), node)
    manifest["spec"]["containers"][0]["args"] = ["/data/disk.img", str(size)]
    return manifest


def ran_on(k: Kubectl, ns: str, name: str, node: str, timeout: float = 300) -> str:
    """What the consumer `name` printed, once it ran (after its claim was filled); it must have run on `node`."""
    def ended() -> dict[str, Any] | None:
        found = get(k, "pod", name, ns) or {}
        return found if (found.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None
    done: dict[str, Any] = wait_for(ended, timeout, 0.5, message=f"the consumer {ns}/{name} to run")
    out = k("logs", name, "-n", ns).stdout
    assert done["status"]["phase"] == "Succeeded", f"the consumer {name} failed: {out}"
    assert done["spec"]["nodeName"] == node, done["spec"].get("nodeName")
    return out.strip()


def describe_on(k: Kubectl, ns: str, claim: str, name: str, node: str, timeout: float = 300) -> dict[str, Any]:
    """The claim's disk.img (sha256, size, allocated bytes) as a pod on `node` reads it."""
    out = run_to_completion(k, ns, pinned(pod(name, DESCRIBE, claim, python=True), node), timeout=timeout)
    assert get(k, "pod", name, ns)["spec"]["nodeName"] == node
    result: dict[str, Any] = json.loads(out)
    return result


def volume_nodes(k: Kubectl, ns: str, claim: str) -> list[str]:
    """The nodes the claim's volume is pinned to (its PV's `spec.nodeAffinity`, In expressions)."""
    volume = get(k, "pvc", claim, ns)["spec"]["volumeName"]
    terms = (((cluster_get(k, "pv", volume) or {}).get("spec") or {}).get("nodeAffinity") or {}).get(
        "required", {}).get("nodeSelectorTerms") or []
    return sorted({value for term in terms for expression in term.get("matchExpressions") or []
                   if expression.get("operator") == "In" for value in expression.get("values") or []})


def worker_nodes(placement: Placement, ns: str, kind: str, since: set[str] | None = None) -> list[str]:
    """The nodes the worker pods of `kind` in `ns` (not among the uids `since`) ran on, once each has one."""
    def scheduled() -> list[str] | None:
        pods = [w for uid, w in placement.workers(ns).items() if w["kind"] == kind and uid not in (since or set())]
        return [w["node"] for w in pods] if pods and all(w["node"] for w in pods) else None
    nodes: list[str] = wait_for(scheduled, 30, 0.2, message=f"a {kind} pod in {ns}, scheduled")
    return nodes


def assert_workers_reach_their_volumes(placement: Placement, namespace: str | None = None) -> int:
    """Every worker pod seen that was given a node ran on a node its volumes are pinned to; how many."""
    checked = 0
    for worker in placement.workers(namespace).values():
        if not worker["node"]:
            continue  # never scheduled
        for claim, nodes in worker["volume_nodes"].items():
            assert nodes, f"{worker['namespace']}/{worker['name']}: the volume of its claim {claim} is not known " \
                          f"or has no node affinity ({worker})"
            assert worker["node"] in nodes, (f"{worker['namespace']}/{worker['name']} ran on {worker['node']}, "
                                             f"its claim {claim}'s volume is on {nodes}")
        checked += 1
    return checked


def waits_for_its_consumer(k: Kubectl, placement: Placement, ns: str, name: str, since: set[str]) -> None:
    """The DataVolume waits for a consumer (as CDI says it, by the path it takes: WaitForFirstConsumer, or
    PendingPopulation for a populator), with no worker pod made for it yet."""
    wait_for(lambda: ((get(k, "datavolume", name, ns) or {}).get("status") or {}).get("phase")
             in ("WaitForFirstConsumer", "PendingPopulation"), 60, 0.5, message=f"{ns}/{name} waiting for a consumer")
    made = {uid: w for uid, w in placement.workers(ns).items() if uid not in since}
    assert not made, f"worker pods before any consumer of {name}: {made}"


@contextmanager
def clone_strategy(k: Kubectl, storage_class: str, strategy: str) -> Iterator[None]:
    """The class's StorageProfile with `spec.cloneStrategy` set, as an admin sets it, then put back."""
    before = (cluster_get(k, "storageprofile", storage_class) or {}).get("spec", {}).get("cloneStrategy")
    k("patch", "storageprofile", storage_class, "--type=merge", "-p",
      json.dumps({"spec": {"cloneStrategy": strategy}}))
    wait_for(lambda: (cluster_get(k, "storageprofile", storage_class) or {}).get("status", {}).get("cloneStrategy")
             == strategy, 60, 0.5, message=f"the StorageProfile of {storage_class} cloning by {strategy}")
    try:
        yield
    finally:
        k("patch", "storageprofile", storage_class, "--type=merge", "-p",
          json.dumps({"spec": {"cloneStrategy": before}}))


# -- a. WaitForFirstConsumer: made on the consumer's node ----------------------------------------------------
def test_a_wffc_import_is_made_on_its_consumers_node(k: Kubectl, placement: Placement, gated_server: FileServer,
                                                     images: dict[str, Image]) -> None:
    image = images["qcow2.qcow2"]
    ns = new_namespace(k, "mn-import")
    k.apply(datavolume("disk", {"http": {"url": f"{gated_server.url}/{image.name}"}}, "64Mi", storage_class=WFFC),
            "-n", ns)
    wait_phase(k, "disk", "PendingPopulation", namespace=ns)  # as CDI: no node yet, nothing imported
    k.apply(reader("consumer", "disk", image.virtual_size, NODE2), "-n", ns)
    assert ran_on(k, ns, "consumer", NODE2) == image.sha256
    assert wait_phase(k, "disk", "Succeeded", namespace=ns)["status"]["progress"] == "100.0%"
    assert worker_nodes(placement, ns, "importer") == [NODE2]
    assert volume_nodes(k, ns, "disk") == [NODE2]
    assert assert_workers_reach_their_volumes(placement, ns) == 1


def test_a_wffc_upload_is_made_on_its_consumers_node(k: Kubectl, cluster: External, placement: Placement,
                                                     images: dict[str, Image]) -> None:
    image = images["raw.img"]
    ns = new_namespace(k, "mn-upload")
    k.apply(upload_dv("disk", storage_class=WFFC), "-n", ns)
    wait_phase(k, "disk", "PendingPopulation", namespace=ns)
    k.apply(reader("consumer", "disk", image.virtual_size, NODE2), "-n", ns)
    wait_ready(k, "disk", ns)  # the consumer's node chosen, the upload server runs there
    sent = image_upload(cluster, "dv", "disk", "--namespace", ns, "--no-create", "--image-path", str(image.path))
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert ran_on(k, ns, "consumer", NODE2) == image.sha256
    wait_phase(k, "disk", "Succeeded", namespace=ns)
    assert worker_nodes(placement, ns, "cdi-upload-server") == [NODE2]
    assert volume_nodes(k, ns, "disk") == [NODE2]
    assert assert_workers_reach_their_volumes(placement, ns) == 1


def test_a_wffc_clone_of_a_volume_on_the_consumers_node_is_made_there(k: Kubectl, placement: Placement) -> None:
    """The source on node 2, the clone's consumer on node 2: the clone (a snapshot and a restore on this class,
    which the kit's driver can do only on the source's node) is made there and holds the source's bytes."""
    ns = new_namespace(k, "mn-clone")
    k.apply(pvc("golden", "64Mi", storage_class=WFFC), "-n", ns)
    run_to_completion(k, ns, pinned(pod("fill", SPARSE_WRITE, "golden", python=True), NODE2), timeout=180)
    original = describe_on(k, ns, "golden", "describe-golden", NODE2)
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class=WFFC), "-n", ns)
    copied = describe_on(k, ns, "copy", "consumer", NODE2)
    assert (copied["sha256"], copied["size"]) == (original["sha256"], original["size"])
    wait_dv_phase(k, ns, "copy", "Succeeded", timeout=120)
    assert volume_nodes(k, ns, "golden") == volume_nodes(k, ns, "copy") == [NODE2]
    assert_workers_reach_their_volumes(placement, ns)


# -- b. a host-assisted clone from a volume on one node to a consumer on the other -------------------------------
def test_b_a_host_assisted_clone_carries_its_bytes_across_nodes(k: Kubectl, placement: Placement,
                                                                record_property: Any) -> None:
    ns = new_namespace(k, "mn-across")
    k.apply(pvc("golden", "320Mi", storage_class=COPY_IMMEDIATE), "-n", ns)  # Immediate: on realk8s
    run_to_completion(k, ns, pinned(pod("fill", LARGE_WRITE, "golden", python=True), NODE1), timeout=180)
    original = describe_on(k, ns, "golden", "describe-golden", NODE1)
    assert volume_nodes(k, ns, "golden") == [NODE1]
    with clone_strategy(k, COPY_WFFC, "copy"):
        for name, node, figure in (("across", NODE2, "across nodes (s)"), ("beside", NODE1, "on one node (s)")):
            before = set(placement.workers(ns))
            k.apply(clone_dv(name, {"pvc": {"namespace": ns, "name": "golden"}}, storage_class=COPY_WFFC), "-n", ns)
            waits_for_its_consumer(k, placement, ns, name, before)
            started = time.monotonic()
            k.apply(pinned(pod(f"consumer-{name}", DESCRIBE, name, python=True), node), "-n", ns)
            dv = wait_dv_phase(k, ns, name, "Succeeded", timeout=300)
            record_property(figure, round(time.monotonic() - started, 1))
            assert dv["status"]["progress"] == "100.0%"
            copied = json.loads(ran_on(k, ns, f"consumer-{name}", node))
            assert (copied["sha256"], copied["size"]) == (original["sha256"], original["size"])
            # the source pod went to the source's volume, the upload server to the consumer's node
            assert worker_nodes(placement, ns, "cdi-clone-source", before) == [NODE1]
            assert worker_nodes(placement, ns, "cdi-upload-server", before) == [node]
            assert volume_nodes(k, ns, name) == [node]
    assert assert_workers_reach_their_volumes(placement, ns) >= 4


# -- d. a node that loses power in the middle of an import -------------------------------------------------------
def test_d_an_import_whose_node_loses_power_ends_and_says_how(k: Kubectl, placement: Placement,
                                                              gated_server: FileServer, images: dict[str, Image],
                                                              record_property: Any) -> None:
    if not TARGET.node_down or not TARGET.node_up:
        pytest.skip("needs commands that cut node 2's power and bring it back (CDI_E2E_NODE_DOWN, CDI_E2E_NODE_UP)")
    image = images["raw.img"]
    ns = new_namespace(k, "mn-powercut")
    gated_server.close_gate(image.file_size // 2)
    k.apply(datavolume("disk", {"http": {"url": f"{gated_server.url}/{image.name}"}}, "64Mi", storage_class=WFFC),
            "-n", ns)
    k.apply(reader("consumer", "disk", image.virtual_size, NODE2), "-n", ns)
    wait_phase(k, "disk", "ImportInProgress", timeout=180, namespace=ns)
    wait_for(lambda: gated_server.served(image.name) > 0, 120, 0.2, message="the import under way")
    assert worker_nodes(placement, ns, "importer") == [NODE2]

    said: list[dict[str, Any]] = []  # each distinct thing the DataVolume said while its node was away

    def node_gone() -> bool:
        dv = get(k, "datavolume", "disk", ns) or {}
        status = dv.get("status") or {}
        running: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Running"), {})
        state = {"phase": status.get("phase"), "progress": status.get("progress"),
                 "running": {key: running.get(key) for key in ("status", "reason", "message")}}
        if not said or said[-1] != state:
            said.append(state)
        node = cluster_get(k, "node", NODE2) or {}
        ready: dict[str, Any] = next((c for c in (node.get("status") or {}).get("conditions") or []
                                      if c.get("type") == "Ready"), {})
        return ready.get("status") != "True"

    down = subprocess.run(TARGET.node_down, capture_output=True, text=True, timeout=300, check=False)
    try:
        assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
        # the node is NotReady once the controller manager's grace period (50 s) has run out
        wait_for(node_gone, 120, 1.0, message=f"{NODE2} NotReady after its power cut")
        print(f"while {NODE2} was down, the DataVolume said: {json.dumps(said)}")
        record_property("while node 2 was down", json.dumps(said))
    finally:
        up = subprocess.run(TARGET.node_up, capture_output=True, text=True, timeout=600, check=False)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    back = time.monotonic()
    gated_server.open_gate()

    def ended() -> dict[str, Any] | None:
        dv = get(k, "datavolume", "disk", ns) or {}
        return dv if (dv.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None
    dv = wait_for(ended, 300, 1.0, message="the DataVolume to end after its node came back (never stuck)")
    record_property("ended after the node came back (s)", round(time.monotonic() - back, 1))
    record_property("ended", dv["status"]["phase"])
    if dv["status"]["phase"] == "Failed":
        running = next(c for c in dv["status"].get("conditions") or [] if c["type"] == "Running")
        assert running.get("reason") and running.get("message"), dv["status"]
        return
    assert dv["status"]["progress"] == "100.0%"
    assert ran_on(k, ns, "consumer", NODE2) == image.sha256
    assert volume_nodes(k, ns, "disk") == [NODE2]


# -- c. across all of the above ----------------------------------------------------------------------------------
def test_c_no_worker_pod_ever_ran_where_its_volume_cannot_be_reached(placement: Placement) -> None:
    """Every importer, upload server and clone source pod the scenarios above made (the watch saw them all,
    however short they lived) ran on the node its volumes are pinned to. Meaningful after them: alone, it
    finds too few."""
    workers = placement.workers()
    kinds = {w["kind"] for w in workers.values() if w["node"]}
    assert kinds >= {"importer", "cdi-upload-server", "cdi-clone-source"}, workers
    assert assert_workers_reach_their_volumes(placement) >= 5
