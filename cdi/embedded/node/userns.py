"""The user namespace the local node's pods run in.

It maps every user and group to itself, so a file a pod writes as uid 107 belongs to uid 107 on
the host, as on a kubelet's node, and `runAsUser`, `fsGroup` and volume modes mean what they mean
there. What it takes away is the host's privilege: a capability held in it counts only for what
the namespace owns (the pod's mounts, its PID and UTS namespaces), never for the host's devices,
network or kernel, so even a pod's root cannot create a device node, mount, load a module or sniff
the host's loopback. A namespace nested under it holds it, with room for no further user namespace,
so a pod cannot make itself a fresh one to be root in (what RuntimeDefault seccomp refuses a
container).

Only root can map more than its own uid; where `cdi up` is not root, or the kernel allows no user
namespace, `open_user_namespace` answers None and the sandbox does without (see `sandbox.py`)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

log = logging.getLogger(__name__)

IDENTITY_MAP = "0 0 4294967295\n"

# Run as a child: make a user namespace (outer) and wait for the parent to map it; forbid more than
# one user namespace below it; fork a child that makes that one (inner), map it from the outer one
# (only a process there may map it whole), tell the parent the inner's pid, wait until it has a
# descriptor of it.
_HELPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def unshare():
    if libc.unshare(0x10000000) != 0:
        sys.exit("unshare(CLONE_NEWUSER): errno %d" % ctypes.get_errno())
unshare()
print("map", os.getpid(), flush=True)
if sys.stdin.readline() != "go\n":
    sys.exit(1)
with open("/proc/sys/user/max_user_namespaces", "w") as f:
    f.write("1")
ready_r, ready_w = os.pipe()
done_r, done_w = os.pipe()
child = os.fork()
if child == 0:
    unshare()
    os.write(ready_w, b"x")
    os.read(done_r, 1)
    os._exit(0)
if os.read(ready_r, 1) != b"x":
    sys.exit("the inner user namespace was not made")
for name in ("uid_map", "gid_map"):
    with open("/proc/%d/%s" % (child, name), "w") as f:
        f.write(sys.argv[1])
print("open", child, flush=True)
sys.stdin.readline()
os.write(done_w, b"x")
os.waitpid(child, 0)
"""


def open_user_namespace() -> int | None:
    """A descriptor of a fresh identity-mapped user namespace in which no further user namespace can be
    made, or None where that is not possible."""
    if os.geteuid() != 0:
        return None
    try:
        helper = subprocess.Popen([sys.executable, "-S", "-c", _HELPER, IDENTITY_MAP], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={})
    except OSError as exc:
        log.warning("no user namespace for pods: %s", exc)
        return None
    assert helper.stdin is not None and helper.stdout is not None
    fd: int | None = None
    try:
        step, pid = [*helper.stdout.readline().split(), "", ""][:2]
        if step == "map":
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(IDENTITY_MAP)
            helper.stdin.write("go\n")
            helper.stdin.flush()
            step, pid = [*helper.stdout.readline().split(), "", ""][:2]
        if step == "open":
            fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        helper.stdin.close()
        code = helper.wait(10)
        if code != 0 or fd is None:
            raise OSError(helper.stderr.read().strip() if helper.stderr else f"exit {code}")
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("no user namespace for pods (they run in the host's, with fewer capabilities): %s", exc)
        with contextlib.suppress(OSError):
            helper.kill()
        helper.wait()
        if fd is not None:
            os.close(fd)
        return None
    finally:
        for stream in (helper.stdout, helper.stderr):
            if stream is not None:
                stream.close()
    return fd
