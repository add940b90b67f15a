"""The realk8s kit (a real one-node Kubernetes, `../shared/realk8s` or `$REALK8S_DIR`) as tests use it:
everything that talks to the cluster runs inside its network namespace through the kit's `exec.sh`
(kubectl with the admin kubeconfig; `cdi image-upload`; a file server pods can reach on the bridge
address). `RealK8s.prepare()` builds cdi's images (cached by `images/build`), starts the cluster and
loads the images when they changed."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cdi
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
NODE_IP = "10.244.0.1"  # the bridge address: pods reach servers bound to it in the netns
DEBIAN_IMAGE = "localhost/realk8s/debian:bookworm"
IMAGES_DIR = Path(os.environ.get("CDI_IMAGES_DIR", Path.home() / ".cache" / "cdi" / "images"))
PREVIOUS_IMAGES_DIR = IMAGES_DIR.with_name(IMAGES_DIR.name + "-previous")  # the build an upgrade starts from


def kit_dir() -> Path | None:
    """The kit, when it is here and usable (it runs as root and needs its binaries)."""
    candidate = Path(os.environ.get("REALK8S_DIR") or REPO.parent / "shared" / "realk8s")
    if not (candidate / "up.sh").is_file() or not (candidate / "exec.sh").is_file():
        return None
    if os.geteuid() != 0:
        return None
    return candidate


STATE = Path(os.environ.get("REALK8S_STATE", "/var/lib/realk8s"))  # the kit's state directory
CONTAINERD_CONFIG = STATE / "containerd" / "config.toml"
CONTAINERD_SOCKET = Path("/run/realk8s/containerd.sock")
NODE2 = "realk8s-n2"  # the second node of the kit's `up.sh --nodes 2`
NODE2_SOCKET = Path("/run/realk8s/n2/containerd.sock")  # its own containerd, with its own image store
PINNED_KIT_IMAGES = ("registry.k8s.io/pause:", "localhost/realk8s/")  # what the kit's images.sh imports
# the kit's node-driver-registrars: the directory under $STATE/csi of each one's driver socket, and its driver
REGISTRARS = {"csi-hostpath-registrar": ("hostpath", "hostpath.csi.k8s.io"),
              "csi-nosnap-registrar": ("nosnap", "hostpath-nosnap.csi.k8s.io")}
# what every scenario's claims stand on: each of the kit's classes, in each volume mode the suite uses
VOLUME_CHECKS = (("csi-hostpath-sc", "Filesystem"), ("csi-hostpath-sc", "Block"), ("csi-hostpath-nosnap", "Filesystem"))
# what kube-apiserver presents to admission webhooks: the kit's own client certificate of the API server
# (CN kube-apiserver-kubelet-client, issued by the cluster's client CA), as an admin would choose one
WEBHOOK_CLIENT_NAME = "kube-apiserver-kubelet-client"
CROSS_NAMESPACE_GATE = "CrossNamespaceVolumeDataSource=true"


def _sets_device_ownership(config: str) -> bool:
    return any(line.split("#")[0].replace(" ", "") == "device_ownership_from_security_context=true"
               for line in config.splitlines())


def _started_at(pid: int) -> float:
    """When a process started, in seconds since the epoch (its start time in clock ticks after boot)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    """A process that runs: not gone, and not a zombie (a registrar these tests started and never waited for
    stays one after it exits)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _registration(registrar: str) -> str | None:
    """How the kit's `registrar` fares: "registered" while it runs and the kubelet's last word to it was that its
    driver is registered, "exited" once it is gone, None while it waits. The kubelet can report a failure after
    a success (seen: registered, then 2 s later "error updating Node object" across an API server restart),
    after which the registrar exits: only the last word counts."""
    pid = int((STATE / "pids" / f"{registrar}.pid").read_text())
    if not _alive(pid):
        return "exited"
    mark = f" {pid} main.go"
    statuses = [line for line in (STATE / "logs" / f"{registrar}.log").read_text(errors="replace").splitlines()
                if mark in line and "NotifyRegistrationStatus" in line]
    return "registered" if statuses and "plugin_registered:true" in statuses[-1] else None


def _registration_or_none(registrar: str) -> str | None:
    """`_registration` for a report: None too when the registrar has no pid file."""
    try:
        return _registration(registrar)
    except (OSError, ValueError):
        return None


def _pid(name: str) -> int | None:
    """The running kit process `name` by its pid file, if it still runs."""
    try:
        pid = int((STATE / "pids" / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def stop_process(name: str, timeout: float = 30) -> None:
    """The kit's process `name` stopped as the kit stops it: SIGTERM (it drains what it serves), SIGKILL
    after `timeout`."""
    pid = _pid(name)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    try:
        wait_for(lambda: not _alive(pid), timeout=timeout, interval=0.2, message=f"{name} stopped")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _alive(pid), timeout=30, interval=0.2, message=f"{name} killed")


def start_process(name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    """`argv` started as the kit's `start` does: in the cluster's network namespace, in a session of its own,
    its output appended to the kit's log of `name`, its pid in the kit's pid file (so `down.sh` stops it)."""
    with (STATE / "logs" / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(["nsenter", "--net=/run/netns/realk8s", "--", *argv], stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=log, start_new_session=True, env=env)
    (STATE / "pids" / f"{name}.pid").write_text(f"{process.pid}\n")
    return process.pid


def command_of(name: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of the kit's running process `name`."""
    pid = _pid(name)
    assert pid is not None, f"the kit's {name} does not run"
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    env = dict(line.split("=", 1) for line in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
               if "=" in line)
    return argv, env


def restart_process(name: str, extra: list[str] | None = None, drop: tuple[str, ...] = ()) -> int:
    """The kit's running process `name` stopped and started again with the command line and environment it
    had, less the flags starting with `drop`, plus `extra`."""
    argv, env = command_of(name)
    stop_process(name)
    return start_process(name, [a for a in argv if not a.startswith(drop)] + (extra or []), env)


def images(socket: Path = CONTAINERD_SOCKET) -> dict[str, str]:
    """A node's images in containerd's `k8s.io` namespace: reference -> the digest it names."""
    out = subprocess.run(["ctr", "--address", str(socket), "-n", "k8s.io", "images", "ls"],
                         capture_output=True, text=True, check=True).stdout
    return {cols[0]: cols[2] for cols in (line.split() for line in out.splitlines()[1:]) if len(cols) > 2}


def pin_images(ours: list[str], socket: Path = CONTAINERD_SOCKET) -> None:
    """Keep what pods need out of the kubelet's image GC, and drop what nothing names any more (on the node
    of the containerd at `socket`: each node has its own store and its own kubelet collecting it).

    Under disk pressure the kubelet removes every image its CRI does not report pinned. The kit pins the
    pause and Debian images by name only, and containerd's CRI may take the pin from the image's ID
    reference (`sha256:…`), which has no label: CI once lost the pause image that way, and every pod after
    it failed to start ("failed to pull … registry.k8s.io/pause"). So every reference to those images and to
    ours is pinned, and the ID references of earlier cdi builds (named by nothing since a new build took
    their tags, 480 MiB each) are removed rather than left for the GC."""
    refs = images(socket)
    keep = set(ours) | {ref for ref in refs if ref.startswith(PINNED_KIT_IMAGES)}
    wanted = {refs[ref] for ref in keep if ref in refs}
    named = {digest for ref, digest in refs.items() if not ref.startswith("sha256:")}
    ctr = ["ctr", "--address", str(socket), "-n", "k8s.io", "images"]
    for ref in (ref for ref, digest in refs.items() if digest in wanted):
        subprocess.run([*ctr, "label", ref, "io.cri-containerd.pinned=pinned"], capture_output=True, check=True)
    orphans = [ref for ref, digest in refs.items() if ref.startswith("sha256:") and digest not in named]
    if orphans:
        subprocess.run([*ctr, "rm", *orphans], capture_output=True, check=False)


@dataclass
class RealK8s:
    kit: Path
    timings: dict[str, Any] = field(default_factory=dict)  # seconds by step, and what was measured

    def run(self, *argv: str, check: bool = True, timeout: float = 300, input: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """A command inside the cluster's network namespace (KUBECONFIG set)."""
        result = subprocess.run([str(self.kit / "exec.sh"), *argv], capture_output=True, text=True,
                                timeout=timeout, input=input, check=False, cwd=cwd)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def run_logged(self, log: Path, *argv: str, timeout: float, cwd: Path | None = None) -> int:
        """A long command inside the network namespace, its output going to `log` as it comes; past `timeout`
        its process group is killed and the exit code is -9, so the caller reports the log either way."""
        with log.open("wb") as out:
            process = subprocess.Popen([str(self.kit / "exec.sh"), *argv], stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)
            try:
                return process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                out.write(f"\n[killed after {timeout:.0f} s]\n".encode())
                return -9

    def kubectl(self, *argv: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *argv, check=check, input=input, timeout=timeout)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        args = ["get", kind, name, "-o", "json", "--ignore-not-found"]
        if namespace:
            args += ["-n", namespace]
        out = self.kubectl(*args).stdout.strip()
        return json.loads(out) if out else None

    def apply(self, manifest: str) -> str:
        """Server-side apply with strict field validation: the apiserver refuses unknown or duplicate fields
        (taking over fields an earlier install set under another manager, as an upgrade does)."""
        return self.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=cdi-tests",
                            "--validate=strict", "-f", "-", input=manifest).stdout

    def _timed(self, name: str, argv: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
        started = time.monotonic()
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                                env={**os.environ, **(env or {})})
        self.timings[name] = round(time.monotonic() - started, 1)
        if result.returncode != 0:
            raise AssertionError(f"{name} failed ({result.returncode}):\n"
                                 f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result.stdout + result.stderr

    def prepare(self) -> None:
        """Images built (or up to date), the cluster up, and the images loaded when they changed."""
        # up.sh on a running cluster can fail at its bridge-address check (`ip addr show | grep -q` under
        # pipefail: grep's early exit breaks ip's pipe), so a healthy cluster is left alone; a cluster that
        # has to start starts while the images build (they wait for the Debian base up.sh makes)
        starting = None
        if subprocess.run([str(self.kit / "status.sh")], capture_output=True, check=False).returncode != 0:
            # a cluster whose processes died (a machine's session ended) leaves its network namespace and
            # bridge behind, where up.sh's address check can fail: down.sh first clears them (state is kept)
            subprocess.run([str(self.kit / "down.sh")], capture_output=True, check=False, timeout=120)
            up_started = time.monotonic()
            starting = subprocess.Popen([str(self.kit / "up.sh")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        try:
            self._timed("images/build", [str(REPO / "images" / "build"), str(IMAGES_DIR)], 1500,
                        env={"PYTHON": sys.executable, "CDI_BASE_WAIT": "900"})
        finally:
            if starting is not None:
                output, _ = starting.communicate(timeout=900)
                self.timings["up.sh"] = round(time.monotonic() - up_started, 1)
        if starting is not None and starting.returncode != 0:
            raise AssertionError(f"up.sh failed ({starting.returncode}):\n{output[-3000:]}")
        for _ in range(2):
            # up.sh starts the kubelet as soon as containerd answers, and a kubelet that finds containerd's CRI
            # not serving yet exits ("server is not initialized yet") while up.sh goes on content with the
            # node's earlier Ready condition: the kit's next start is clean
            if subprocess.run([str(self.kit / "status.sh")], capture_output=True, check=False).returncode == 0:
                break
            subprocess.run([str(self.kit / "down.sh")], capture_output=True, check=False, timeout=120)
            self._timed("up.sh again", [str(self.kit / "up.sh")], 900)
        status = subprocess.run([str(self.kit / "status.sh")], capture_output=True, text=True, check=False)
        assert status.returncode == 0, f"the kit does not run whole after up.sh:\n{status.stdout}"
        self.timings["disk free at start (GB)"] = round(shutil.disk_usage(STATE).free / 1e9, 1)
        if self.extra_nodes():
            # a run cut short in its several-node phase leaves the kit with two nodes: the tier starts on one
            self.remove_node()
        inputs = (IMAGES_DIR / ".inputs").read_text().strip()
        stamp = STATE / "cdi-images-loaded"
        # the stamp holds the build's inputs, then the references load-image.sh made: a reference the
        # kubelet's image GC took under disk pressure is loaded again, not trusted to the stamp
        recorded = stamp.read_text().split() if stamp.exists() else []
        if recorded[:1] != [inputs] or not set(recorded[1:]) <= set(images()):
            started = time.monotonic()
            loaded = []
            for archive in sorted(IMAGES_DIR.glob("cdi-*.tar")):
                out = self._timed(f"load {archive.name}", [str(self.kit / "load-image.sh"), str(archive)], 600)
                loaded += [line.split()[1] for line in out.splitlines() if line.startswith("loaded ")]
            self.timings["load-image.sh"] = round(time.monotonic() - started, 1)
            stamp.write_text("\n".join([inputs, *loaded]) + "\n")
            # the tags did not change, so pods of an earlier install still run the earlier images
            if self.get("namespace", "cdi") is not None:
                self.kubectl("rollout", "restart", "deployment", "-n", "cdi")
        pin_images(stamp.read_text().split()[1:])

    def previous_build(self, workdir: Path) -> tuple[str, Path]:
        """The build an upgrade starts from: the checkout's parent commit (a `git worktree` of it in `workdir`)
        built with its own tag (`scripts/build-version`: below this build's), loaded and pinned on the node, and
        its `cdi manifests` as its own command line writes them. Returns the tag and the manifests' file. A
        checkout without its parent (a shallow clone) builds this tree under the tag `<version>-dev.0.gparent`:
        the same upgrade path, from identical code."""
        tree = workdir / "previous"
        parent = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "-q", "HEAD^"],
                                capture_output=True, text=True, check=False).stdout.strip()
        if parent:
            self.run("git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(tree), parent)
            tag = self.run(str(REPO / "scripts" / "build-version"), str(tree)).stdout.strip()
        else:
            tree = REPO
            tag = f"{cdi.__version__}-dev.0.gparent"  # the package version, git or not
        self.timings["previous build"] = f"{parent[:12] or 'this tree'} as {tag}"
        try:
            self._timed("previous images/build", [str(tree / "images" / "build"), str(PREVIOUS_IMAGES_DIR)], 1500,
                        env={"PYTHON": sys.executable, "CDI_IMAGE_TAG": tag})
            for archive in sorted(PREVIOUS_IMAGES_DIR.glob("cdi-*.tar")):
                self.run(str(self.kit / "load-image.sh"), str(archive), timeout=600)
            pin_images([ref for ref in images() if ref.startswith("localhost/cdi/") and ref.endswith(f":{tag}")])
            manifests = workdir / "previous-manifests.yaml"
            manifests.write_text(self.run(sys.executable, "-m", "cdi.cli.main", "manifests", "--tag", tag,
                                          cwd=tree).stdout)
        finally:
            if tree != REPO:
                self.run("git", "-C", str(REPO), "worktree", "remove", "--force", str(tree), check=False)
        return tag, manifests

    def drop_images(self, tag: str) -> None:
        """Remove the node's images of a build (by tag): 480 MiB of disk each build."""
        refs = [ref for ref in images() if ref.startswith("localhost/cdi/") and ref.endswith(f":{tag}")]
        if refs:
            subprocess.run(["ctr", "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io", "images", "rm", *refs],
                           capture_output=True, check=False)

    def extra_nodes(self) -> list[str]:
        """The nodes besides `realk8s` that the kit has (a Node object, or a running kubelet of node k)."""
        names = self.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
        running = [f"realk8s-{pid.name.split('-', 1)[0]}" for pid in (STATE / "pids").glob("n[2-9]-kubelet.pid")
                   if _pid(pid.name.removesuffix(".pid")) is not None]
        return sorted({name for name in [*names, *running] if name != "realk8s"})

    def _csinode_drivers(self, node: str) -> set[str]:
        return {d["name"] for d in ((self.get("csinode", node) or {}).get("spec") or {}).get("drivers") or []}

    def add_node(self) -> None:
        """The kit grown to two nodes (`up.sh --nodes 2`, on the running cluster), ready for cdi: node
        `realk8s-n2` Ready, both nodes' CSINodes listing both drivers (going from one node to several restarts
        node 1's CSI processes with topology and deletes node 1's CSINode, which its kubelet makes anew), and
        cdi's images in node 2's own image store, pinned there as on node 1 (`pin_images`: its kubelet
        collects images under disk pressure like node 1's)."""
        self._nodes(2)
        wait_for(lambda: self.condition(self.get("node", NODE2), "Ready") == "True", timeout=180, interval=1.0,
                 message=f"node {NODE2} Ready")
        self.ensure_drivers_registered()  # node 1's registrars were restarted
        drivers = {driver for _, driver in REGISTRARS.values()}
        for node in ("realk8s", NODE2):
            def listed(n: str = node) -> bool:
                return drivers <= self._csinode_drivers(n)
            try:
                wait_for(listed, timeout=120, interval=1.0, message=f"the CSINode of {node} listing {sorted(drivers)}")
            except AssertionError as failed:
                states = {f"n2-{name}": _registration_or_none(f"n2-{name}") for name in REGISTRARS}
                raise AssertionError(f"{failed}\nnode 2's registrars: {states} (logs in {STATE / 'logs'})") from None
        ours = (STATE / "cdi-images-loaded").read_text().split()[1:]

        def node2_has_ours() -> bool:
            on_node1, on_node2 = images(), images(NODE2_SOCKET)
            return all(on_node2.get(ref) == on_node1.get(ref) for ref in ours)
        # node 2's image store outlives the node (`nodes/n2`): an earlier run's load is kept if it is current
        if not node2_has_ours():
            # into node 2's store alone, all at once (the kit's load-image.sh imports into every node, one by one:
            # twice the time for images node 1 has)
            started = time.monotonic()
            imports = [subprocess.Popen(["ctr", "--address", str(NODE2_SOCKET), "-n", "k8s.io", "images", "import",
                                         str(archive)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                       for archive in sorted(IMAGES_DIR.glob("cdi-*.tar"))]
            outputs = [process.communicate(timeout=600)[0] for process in imports]
            errors = [out for process, out in zip(imports, outputs, strict=True) if process.returncode != 0]
            assert not errors, f"importing cdi's images into {NODE2}: {errors}"
            self.timings["images into node 2"] = round(time.monotonic() - started, 1)
            assert node2_has_ours(), f"cdi's images not on {NODE2} after load-image.sh: {sorted(ours)}"
        pin_images(ours, NODE2_SOCKET)
        pin_images(ours)  # imported into node 1 again: its references pinned as before

    def _nodes(self, count: int) -> None:
        """`up.sh --nodes COUNT` on the running cluster. Its bridge-address check (`ip addr show | grep -q` under
        pipefail) fails now and then on a cluster that has the address (grep's early exit breaks ip's pipe),
        and up.sh then stops at `Address already assigned` before it changed anything: that is tried again."""
        for attempt in range(3):
            try:
                self._timed(f"up.sh --nodes {count}", [str(self.kit / "up.sh"), "--nodes", str(count)], 600)
                return
            except AssertionError as failed:
                if "Address already assigned" not in str(failed) or attempt == 2:
                    raise

    def remove_node(self) -> None:
        """The kit back to one node (`up.sh --nodes 1`): node 2 stopped and its Node deleted, node 1's CSI
        processes restarted without topology (its CSINode made anew): back when node 1 is Ready and both
        drivers are registered there."""
        self._nodes(1)
        wait_for(lambda: not self.extra_nodes(), timeout=120, interval=1.0, message="node realk8s alone")
        wait_for(lambda: self.condition(self.get("node", "realk8s"), "Ready") == "True", timeout=120, interval=1.0,
                 message="node realk8s Ready on its own")
        self.ensure_drivers_registered()

    @staticmethod
    def _wait_containerd() -> None:
        wait_for(lambda: subprocess.run(["ctr", "--address", str(CONTAINERD_SOCKET), "version"],
                                        capture_output=True, check=False).returncode == 0,
                 timeout=60, interval=0.5, message="containerd answering")

    def block_devices_owned_by_pod_user(self) -> bool:
        """Does the node's containerd give a pod's block devices to its runAsUser/runAsGroup (CRI
        `device_ownership_from_security_context`)? Without it non-root pods cannot open them. Asks the
        running containerd, not only its file: set in the file and read by the process started after it."""
        if not _sets_device_ownership(CONTAINERD_CONFIG.read_text() if CONTAINERD_CONFIG.exists() else ""):
            return False
        pid = self._containerd_pid()
        # the start time is known to about a second (the boot time is whole seconds)
        return pid is not None and _started_at(pid) >= CONTAINERD_CONFIG.stat().st_mtime - 2

    @staticmethod
    def _containerd_pid() -> int | None:
        """The kit's running containerd, if the process of its pid file is still a containerd (pids are reused)."""
        pid = _pid("containerd")
        try:
            return pid if pid is not None and Path(f"/proc/{pid}/comm").read_text().strip() == "containerd" else None
        except OSError:
            return None

    def hand_block_devices_to_pod_users(self) -> None:
        """What CDI's doc/block_cri_ownership_config.md asks of a cluster's admin: containerd's CRI plugin gives
        a pod's block devices to its runAsUser/runAsGroup (`device_ownership_from_security_context`), so that
        non-root worker pods (CDI's, and ours as uid 107) can write Block volumes. The kit does not set it; its
        `up.sh` writes containerd's config afresh at each start, so this holds until the next one. containerd
        restarts; running containers stay (their shims keep them), and the kubelet reconnects."""
        if self.block_devices_owned_by_pod_user():
            return
        config = CONTAINERD_CONFIG
        section = '[plugins."io.containerd.grpc.v1.cri"]\n'
        text = config.read_text()
        assert section in text, f"no CRI section in {config}"
        if not _sets_device_ownership(text):
            config.write_text(text.replace(section, section + "  device_ownership_from_security_context = true\n", 1))
        if self._containerd_pid() is not None:
            restart_process("containerd")
        else:
            start_process("containerd", ["containerd", "--config", str(config)])
        self._wait_containerd()
        wait_for(lambda: self.condition(self.get("node", "realk8s"), "Ready") == "True", timeout=120, interval=1.0,
                 message="the node Ready after containerd's restart")
        assert self.block_devices_owned_by_pod_user()

    def configure_api_server(self) -> None:
        """What the README's install section asks of an admin who wants cdi-apiserver to answer only the API
        server, plus the CrossNamespaceVolumeDataSource gate (both kube-apiserver flags, which the kit's
        `up.sh` does not set): an AdmissionConfiguration whose webhook kubeconfig presents the API server's
        client certificate to `cdi-api.cdi.svc`. kube-apiserver restarts with them (its command line as the
        kit started it, plus the two flags); this holds until the kit's next start. Nothing is done when the
        running one has them."""
        argv, _ = command_of("kube-apiserver")
        directory = STATE / "cdi-admission"
        config = directory / "admission.yaml"
        wanted = [f"--admission-control-config-file={config}", f"--feature-gates={CROSS_NAMESPACE_GATE}"]
        if all(flag in argv for flag in wanted):
            return
        directory.mkdir(exist_ok=True)
        pki = STATE / "pki"
        kubeconfig = directory / "webhooks.kubeconfig"
        kubeconfig.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "users": [{
            "name": "cdi-api.cdi.svc", "user": {"client-certificate": str(pki / "apiserver-kubelet-client.crt"),
                                                "client-key": str(pki / "apiserver-kubelet-client.key")}}]}))
        plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
                  "kubeConfigFile": str(kubeconfig)}
        config.write_text(json.dumps({"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
                                      "plugins": [{"name": name, "configuration": plugin} for name in
                                                  ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")]}))
        # it drains its requests first; what is still open after 30 s may go
        restart_process("kube-apiserver", wanted, drop=("--admission-control-config-file", "--feature-gates"))
        wait_for(lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, timeout=120,
                 interval=0.5, message="kube-apiserver ready after its restart")

    def restart_node(self) -> None:
        """The node's container runtime and kubelet restarted, as node maintenance (or a crash and its service
        manager) does: running containers stay (their shims keep them), the kubelet finds them again and
        registers the CSI drivers anew. Back when the node is Ready and both drivers are registered."""
        kubelet = command_of("kubelet")
        stop_process("kubelet")
        restart_process("containerd")
        self._wait_containerd()
        since = time.time()

        def back() -> bool:
            if _pid("kubelet") is None:
                # started again while containerd's CRI is not serving yet ("server is not initialized yet"),
                # a kubelet exits: as its service manager would, start it again
                start_process("kubelet", *kubelet)
                return False
            return self._kubelet_heard_since(since)
        wait_for(back, timeout=120, interval=1.0, message="the restarted kubelet renewing its node's lease")
        wait_for(lambda: self.condition(self.get("node", "realk8s"), "Ready") == "True", timeout=120, interval=1.0,
                 message="the node Ready after its kubelet's restart")
        self.ensure_drivers_registered()

    def _kubelet_heard_since(self, since: float) -> bool:
        """Has the node's kubelet renewed its Lease after `since` (a Ready condition can be a dead one's)?"""
        lease = self.get("lease", "realk8s", "kube-node-lease") or {}
        renewed = (lease.get("spec") or {}).get("renewTime")
        return bool(renewed) and datetime.datetime.fromisoformat(renewed.replace("Z", "+00:00")).timestamp() > since

    def ensure_drivers_registered(self) -> None:
        """Both CSI drivers registered with the kubelet, else every claim of theirs stays unmounted (`driver name
        ... not found in the list of registered CSI drivers`) and every scenario waits out its deadline. The
        kubelet registers a driver when its registrar starts and needs kube-apiserver for it: a registration that
        meets an API server restart (ours, a few seconds after `up.sh` started the registrars: `up.sh` is content
        with the CSINode an earlier start left) fails, and the registrar exits as a sidecar container would, for
        its kubelet to restart it; nothing restarts the kit's. Started again (as `up.sh` starts it), it registers.
        Called before the API server restarts (no registration in flight then) and after."""
        for name, (directory, _) in REGISTRARS.items():
            if wait_for(lambda n=name: _registration(n), timeout=60, interval=0.5,
                        message=f"{name} registered or exited") == "registered":
                continue
            socket = STATE / "csi" / directory / "csi.sock"
            start_process(name, [str(STATE / "bin" / "csi-node-driver-registrar"), "--csi-address", str(socket),
                                 "--kubelet-registration-path", str(socket), "--plugin-registration-path",
                                 str(STATE / "kubelet" / "plugins_registry"), "--v", "2"])
            wait_for(lambda n=name: _registration(n) == "registered", timeout=60, interval=0.5,
                     message=f"{name} registered again (see {STATE / 'logs' / name}.log)")
        drivers = {driver for _, driver in REGISTRARS.values()}
        wait_for(lambda: drivers <= {d["name"] for d in ((self.get("csinode", "realk8s") or {}).get("spec") or {})
                                     .get("drivers") or []}, timeout=60, interval=0.5,
                 message=f"the node's CSINode lists {sorted(drivers)}")

    def check_volumes(self) -> None:
        """Each of the kit's classes provisions a claim that a pod mounts and writes (VOLUME_CHECKS): the storage
        every scenario stands on works before half an hour of scenarios rely on it, and when it does not, the
        failure says why (the pods' events, each registrar's state) instead of each scenario timing out."""
        namespace = "realk8s-volume-check"
        self.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", timeout=180)
        self.kubectl("create", "namespace", namespace)
        wait_for(lambda: self.get("serviceaccount", "default", namespace), timeout=60, interval=0.5,
                 message=f"the default ServiceAccount of {namespace}")
        names = []
        for i, (storage_class, mode) in enumerate(VOLUME_CHECKS):
            name = f"check-{i}-{mode.lower()}"
            block = mode == "Block"
            target = "/dev/cdi-block-volume" if block else "/data/check"
            self.apply(json.dumps({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                   "metadata": {"name": name, "namespace": namespace},
                                   "spec": {"storageClassName": storage_class, "volumeMode": mode,
                                            "accessModes": ["ReadWriteOnce"],
                                            "resources": {"requests": {"storage": "1Mi"}}}}))
            self.apply(json.dumps(restricted_pod(name, namespace, f"echo written | dd of={target} conv=fsync",
                                                 name, block)))
            names.append(name)
        for name in names:
            try:
                pod = self.wait_pod_done(name, namespace, timeout=120)
                assert pod["status"]["phase"] == "Succeeded", pod["status"]
            except AssertionError as failed:
                described = self.kubectl("describe", "pod", name, "-n", namespace, check=False).stdout
                states = {n: _registration(n) for n in REGISTRARS}
                raise AssertionError(f"the kit's volumes do not work: pod {name} ({failed})\n{described[-3000:]}\n"
                                     f"registrars: {states}") from None
        self.kubectl("delete", "namespace", namespace, "--wait=false")

    def diagnosis(self) -> str:
        """What a failed run reports last (where a cut CI log still shows it): the kit's processes, each
        registrar's state and what the kubelet last refused."""
        status = subprocess.run([str(self.kit / "status.sh")], capture_output=True, text=True, check=False)
        kubelet = (STATE / "logs" / "kubelet.log").read_text(errors="replace").splitlines()
        errors = [line[:300] for line in kubelet if line.startswith("E")][-8:]
        registrars = {name: _registration(name) for name in REGISTRARS}
        # a full disk shows as pods that cannot start: the kubelet's image GC and evictions say so first
        pressure = [line[:200] for line in kubelet if "Removing image" in line or "Eviction manager" in line][-6:]
        free = shutil.disk_usage(STATE).free / 1e9
        return (f"the kit now:\n{status.stdout[-2500:]}registrars: {registrars}\n"
                f"disk free under {STATE}: {free:.1f} GB; the kubelet under disk pressure:\n" + "\n".join(pressure)
                + "\nthe kubelet's last errors:\n" + "\n".join(errors))

    def wait_pod_done(self, name: str, namespace: str, timeout: float = 180) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            pod = self.get("pod", name, namespace)
            phase = ((pod or {}).get("status") or {}).get("phase")
            return pod if phase in ("Succeeded", "Failed") else None
        pod: dict[str, Any] = wait_for(done, timeout=timeout, interval=1.0, message=f"pod {namespace}/{name} done")
        return pod

    def condition(self, obj: dict[str, Any] | None, kind: str) -> str | None:
        for c in ((obj or {}).get("status") or {}).get("conditions") or []:
            if c.get("type") == kind:
                return str(c.get("status"))
        return None


def restricted_pod(name: str, namespace: str, command: str, claim: str, block: bool) -> dict[str, Any]:
    """A pod of the kit's Debian image that passes the `restricted` Pod Security profile and runs
    `command` with the claim at /data (Filesystem) or /dev/cdi-block-volume (Block)."""
    container: dict[str, Any] = {
        "name": "main", "image": DEBIAN_IMAGE, "imagePullPolicy": "Never", "command": ["bash", "-c", command],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "runAsUser": 107}}
    if block:
        container["volumeDevices"] = [{"name": "v", "devicePath": "/dev/cdi-block-volume"}]
    else:
        container["volumeMounts"] = [{"name": "v", "mountPath": "/data"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"restartPolicy": "Never", "containers": [container],
                     "securityContext": {"runAsNonRoot": True, "fsGroup": 107,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}}


if __name__ == "__main__":
    # the node restart the tier hands the e2e suite (`CDI_E2E_NODE_RESTART`, tests/e2e/target.py)
    assert sys.argv[1:] == ["restart-node"], "usage: python -m tests.support.realk8s restart-node"
    kit = kit_dir()
    assert kit is not None, "no realk8s kit here"
    RealK8s(kit).restart_node()
