"""Small manifests and waits shared by the node and storage end-to-end tests."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from tests.e2e.target import TARGET
from tests.support.cluster import Kubectl, wait_for

_counter = itertools.count()


def new_namespace(kubectl: Kubectl, prefix: str) -> str:
    name = f"{prefix}-{os.getpid()}-{next(_counter)}"
    kubectl.apply(TARGET.namespace(name))
    return name


def pvc(name: str, size: str = "64Mi", storage_class: str | None = None, block: bool = False,
        source: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    if block:
        spec["volumeMode"] = "Block"
    if source is not None:
        spec["dataSource"] = source
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def pod(name: str, script: str, claim: str | None = None, *, block: bool = False, restart: str = "Never",
        image: str = "debian", labels: dict[str, str] | None = None, python: bool = False,
        extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod running `script` with sh -c (or python3 -c), the claim at /data (or as the device
    /dev/cdi-block-volume); on a real cluster with the target's image, as the `restricted` profile wants."""
    command = ["python3", "-c", script] if python else ["sh", "-c", script]
    container: dict[str, Any] = {"name": "main", "image": image, "command": command}
    spec: dict[str, Any] = {"restartPolicy": restart, "terminationGracePeriodSeconds": 5, "containers": [container]}
    if claim is not None:
        if block:
            container["volumeDevices"] = [{"name": "data", "devicePath": "/dev/cdi-block-volume"}]
        else:
            container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    if extra:
        container.update(extra)
    if not TARGET.embedded:
        TARGET.pod_spec(spec)
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def get(kubectl: Kubectl, kind: str, name: str, ns: str) -> Any:
    result = kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    import json

    return json.loads(result.stdout)


def wait_phase(kubectl: Kubectl, ns: str, name: str, phase: str, timeout: float = 60.0) -> Any:
    def check() -> Any:
        obj = get(kubectl, "pod", name, ns)
        current = ((obj or {}).get("status") or {}).get("phase")
        if current in ("Succeeded", "Failed") and current != phase:
            raise AssertionError(f"pod {ns}/{name} ended {current}, expected {phase}: {obj['status']}")
        return obj if current == phase else None

    result = wait_for(check, timeout, 0.1, message=f"pod {ns}/{name} phase {phase}")
    return result


def wait_bound(kubectl: Kubectl, ns: str, name: str, timeout: float = 30.0) -> Any:
    def bound() -> Any:
        claim = get(kubectl, "pvc", name, ns)
        return claim if ((claim or {}).get("status") or {}).get("phase") == "Bound" else None

    return wait_for(bound, timeout, 0.1, message=f"claim {ns}/{name} bound")


def logs(kubectl: Kubectl, ns: str, name: str, *args: str) -> str:
    return kubectl("logs", name, "-n", ns, *args).stdout


def run_to_completion(kubectl: Kubectl, ns: str, manifest: dict[str, Any], timeout: float = 60.0) -> str:
    """Apply a pod, wait for Succeeded, return its log."""
    kubectl.apply(manifest, "-n", ns)
    wait_phase(kubectl, ns, manifest["metadata"]["name"], "Succeeded", timeout)
    return logs(kubectl, ns, manifest["metadata"]["name"])


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes containing `text` (zombies have none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


# a sparse 64 MiB disk.img with three 4 KiB data blocks (Python, for `pod(..., python=True)`)
SPARSE_WRITE = """
import os
path = "/data/disk.img"
with open(path, "wb") as f:
    f.truncate(64 * 1024 * 1024)
    for offset in (0, 10 * 1024 * 1024, 64 * 1024 * 1024 - 4096):
        f.seek(offset)
        f.write(os.urandom(4096))
    f.flush()
    os.fsync(f.fileno())
"""

# the disk.img's sha256, size and allocated bytes, as one line of JSON
DESCRIBE = """
import hashlib, json, os
path = "/data/disk.img"
digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
st = os.stat(path)
print(json.dumps({"sha256": digest, "size": st.st_size, "allocated": st.st_blocks * 512}))
"""

# a Block volume's sha256 and size, as one line of JSON
BLOCK_DESCRIBE = """
import hashlib, json, os
fd = os.open("/dev/cdi-block-volume", os.O_RDONLY)
size = os.lseek(fd, 0, os.SEEK_END)
h = hashlib.sha256()
os.lseek(fd, 0, os.SEEK_SET)
while chunk := os.read(fd, 1 << 20):
    h.update(chunk)
print(json.dumps({"sha256": h.hexdigest(), "size": size}))
"""
