"""What a pod of `cdi up`'s local node can read and do: pods are sandboxed like pods on a kubelet's
node, not like root on the host. Each pod runs a probe that tries what an attacker would (read the
host's secrets and working trees, `cdi up`'s environment, mount, make a device node, become root
again, write outside its volumes) and reports what happened; the tests assert on that report."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.e2e.workloads import get, new_namespace, pod, pvc, run_to_completion
from tests.support.cluster import ROOT, Kubectl, wait_for

PROBE = r"""
import ctypes, errno, json, os, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
paths, marker = json.loads(sys.argv[1]), sys.argv[2]

def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def call(code):
    if code != 0:
        raise OSError(ctypes.get_errno(), "failed")

def read(path):
    with open(path, "rb") as f:
        return f.read()

def write(path):
    with open(path, "wb") as f:
        f.write(b"x")

leaks = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        if marker.encode() in read(f"/proc/{pid}/environ"):
            leaks.append(pid)
    except OSError:
        pass
status = dict(line.split(":", 1) for line in read("/proc/self/status").decode().splitlines() if ":" in line)
report = {
    "uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
    "CapEff": status["CapEff"].strip(), "CapBnd": status["CapBnd"].strip(), "NoNewPrivs": status["NoNewPrivs"].strip(),
    "read": {path: attempt(lambda path=path: read(path)) for path in paths},
    "listdir": {d: sorted(os.listdir(d)) for d in ("/root", "/home", "/opt", "/srv", "/work") if os.path.isdir(d)},
    "environ_leaks": leaks,
    "write": {path: attempt(lambda path=path: write(path)) for path in ("/data/written", "/tmp/x", "/x", "/etc/x",
                                                                       "/usr/x")},
    "mount": attempt(lambda: call(libc.mount(b"none", b"/mnt", b"tmpfs", 0, None))),
    "mknod": attempt(lambda: os.mknod("/dev/shm/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))),
    "chown": attempt(lambda: os.chown("/data/written", 0, 0)),
}
if os.path.exists("/data/written"):
    data, written = os.stat("/data"), os.stat("/data/written")
    report["data"] = {"mode": stat.S_IMODE(data.st_mode), "gid": data.st_gid, "written_gid": written.st_gid}
try:
    report["init_environ"] = read("/proc/1/environ").decode()
except OSError as exc:
    report["init_environ"] = errno.errorcode[exc.errno]
report["setuid"] = attempt(lambda: os.setuid(0))
report["userns"] = attempt(lambda: call(libc.unshare(0x10000000)))
print(json.dumps(report))
"""

# containerd's default set: CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE NET_RAW
# SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP
DEFAULT_CAPS = sum(1 << bit for bit in (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31))


def _host_secrets() -> list[str]:
    """Files that exist on the host and no pod may read: the password hashes, the home directory of the
    user running the tests (root's here), the repository's working tree outside the cdi package and its
    virtualenv, and the other working trees beside it."""
    candidates = [Path("/etc/shadow"), Path("/etc/gshadow"), ROOT / "README.md", ROOT / "pyproject.toml",
                  ROOT / "tests" / "e2e" / "test_sandbox.py", ROOT / ".git"]
    home = Path.home()
    runtime = Path(sys.base_prefix)
    candidates += [entry for entry in sorted(home.iterdir())[:20] if entry.is_file() and entry not in runtime.parents]
    candidates += [tree / "README.md" for tree in sorted(ROOT.parent.iterdir())
                   if tree != ROOT and not tree.name.startswith(".")]
    return [str(path) for path in candidates if path.exists()]


def _probe(kubectl: Kubectl, ns: str, name: str, claim: str | None = None, *,
           pod_context: dict[str, Any] | None = None, context: dict[str, Any] | None = None) -> dict[str, Any]:
    manifest = pod(name, PROBE, claim, python=True, extra={
        "args": [json.dumps(_host_secrets()), os.environ["PATH"]]})
    if context is not None:
        manifest["spec"]["containers"][0]["securityContext"] = context
    if pod_context is not None:
        manifest["spec"]["securityContext"] = pod_context
    report: dict[str, Any] = json.loads(run_to_completion(kubectl, ns, manifest, timeout=90).splitlines()[-1])
    return report


def _allowed_in_root() -> set[str]:
    """What /root may show: the way down to this Python's installation when it lives there (pyenv's)."""
    runtime = Path(sys.base_prefix)
    root = Path("/root")
    return {runtime.relative_to(root).parts[0]} if root in runtime.parents else set()


def test_an_unprivileged_pod_cannot_read_or_do_what_the_host_can(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "unpriv")
    k.apply(pvc("box"), "-n", ns)
    report = _probe(k, ns, "unprivileged", "box",
                    pod_context={"runAsNonRoot": True, "fsGroup": 2000, "supplementalGroups": [3000]},
                    context={"runAsUser": 1000, "runAsGroup": 1000, "allowPrivilegeEscalation": False,
                             "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True})
    # who it is: the user, group and groups it was given, no capability, no way to gain one
    assert (report["uid"], report["gid"]) == (1000, 1000)
    assert {2000, 3000} <= set(report["groups"])
    assert report["CapEff"] == report["CapBnd"] == f"{0:016x}"
    assert report["NoNewPrivs"] == "1"
    assert report["setuid"] == "EPERM"
    # what it cannot read: the host's secrets, home directories, working trees, cdi up's environment
    assert report["read"] and all(result in ("ENOENT", "EACCES") for result in report["read"].values()), report["read"]
    assert set(report["listdir"]["/root"]) <= _allowed_in_root()
    assert report["listdir"]["/home"] == report["listdir"]["/opt"] == report["listdir"]["/srv"] == []
    assert report["environ_leaks"] == [] and report["init_environ"] in ("", "EACCES")
    # what it cannot do
    assert report["mount"] == "EPERM"
    assert report["mknod"] == "EPERM"
    assert report["userns"] != "ok"
    assert report["chown"] == "EPERM"
    # readOnlyRootFilesystem: its volume is the only place it writes to, and the volume is the fsGroup's
    assert report["write"] == {"/data/written": "ok", "/tmp/x": "EROFS", "/x": "EROFS", "/etc/x": "EROFS",
                               "/usr/x": "EROFS"}
    assert report["data"]["gid"] == report["data"]["written_gid"] == 2000
    assert report["data"]["mode"] & 0o2070 == 0o2070  # setgid, group-writable
    assert report["data"]["mode"] & 0o002 == 0  # not world-writable


def test_a_root_pod_has_the_default_capabilities_only(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "rootpod")
    k.apply(pvc("box"), "-n", ns)
    report = _probe(k, ns, "rooted", "box")
    assert report["uid"] == 0
    assert int(report["CapEff"], 16) == int(report["CapBnd"], 16) == DEFAULT_CAPS
    assert report["NoNewPrivs"] == "1"
    assert report["mount"] == "EPERM"  # no CAP_SYS_ADMIN
    assert report["mknod"] == "EPERM"  # CAP_MKNOD, but only in the pod's user namespace: no device node
    assert report["userns"] != "ok"
    assert all(result in ("ENOENT", "EACCES") for result in report["read"].values()), report["read"]
    assert report["listdir"]["/home"] == report["listdir"]["/opt"] == report["listdir"]["/srv"] == []
    assert report["environ_leaks"] == [] and report["init_environ"] == ""  # the sandbox's init: a clean environment
    # a writable root file system of its own, the host's system directories and /etc read-only
    assert report["write"] == {"/data/written": "ok", "/tmp/x": "ok", "/x": "ok", "/etc/x": "EROFS",
                               "/usr/x": "EROFS"}


def test_capabilities_are_added_and_dropped_as_asked(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "caps")
    report = _probe(k, ns, "caps", context={"capabilities": {"add": ["NET_ADMIN", "CAP_SYS_ADMIN"],
                                                             "drop": ["KILL", "NET_RAW"]}})
    expected = (DEFAULT_CAPS | 1 << 12 | 1 << 21) & ~(1 << 5 | 1 << 13)
    assert int(report["CapEff"], 16) == expected
    assert report["mount"] == "ok"  # CAP_SYS_ADMIN of the pod's user namespace: its own mounts only
    assert report["mknod"] == "EPERM"


def test_run_as_non_root_refuses_root_and_a_fresh_volume_is_not_world_writable(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "nonroot")
    k.apply(pod("rootimage", "id", extra={"securityContext": {"runAsNonRoot": True}}), "-n", ns)

    def refused() -> dict[str, Any] | None:
        statuses = ((get(k, "pod", "rootimage", ns) or {}).get("status") or {}).get("containerStatuses") or []
        waiting = (statuses[0]["state"].get("waiting") or {}) if statuses else {}
        return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

    waiting = wait_for(refused, 60, 0.2, message="CreateContainerConfigError")
    uid = get(k, "pod", "rootimage", ns)["metadata"]["uid"]
    assert waiting["message"].endswith(f'container has runAsNonRoot and image will run as root '
                                       f'(pod: "rootimage_{ns}({uid})", container: main)')
    # without an fsGroup, a non-root user may read a new volume but not write to it, as on a kubelet's node
    k.apply(pvc("fresh"), "-n", ns)
    script = 'stat -c "%a %u %g" /data; touch /data/x 2>&1 || echo refused'
    out = run_to_completion(k, ns, pod("nonroot", script, "fresh", extra={"securityContext": {"runAsUser": 1000}}))
    assert out.splitlines()[0] == "755 0 0"
    assert out.splitlines()[-1] == "refused"
