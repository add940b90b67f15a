"""Helpers for end-to-end import tests: DataVolume manifests, waiting on phases, and reading a
volume's bytes back through a pod, as a user would check them."""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.e2e.workloads import pod
from tests.support.cluster import Kubectl, wait_for


def datavolume(name: str, source: dict[str, Any], size: str = "64Mi", *, api: str = "storage",
               volume_mode: str | None = None, storage_class: str | None = None,
               annotations: dict[str, str] | None = None) -> dict[str, Any]:
    claim: dict[str, Any] = {"resources": {"requests": {"storage": size}}}
    if api == "pvc":
        claim["accessModes"] = ["ReadWriteOnce"]
    if volume_mode:
        claim["volumeMode"] = volume_mode
    if storage_class:
        claim["storageClassName"] = storage_class
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": meta,
            "spec": {"source": source, api: claim}}


def phase(kubectl: Kubectl, name: str, namespace: str = "default") -> str:
    result = kubectl("get", "dv", name, "-n", namespace, "-o", "jsonpath={.status.phase}", check=False)
    return result.stdout.strip()


def wait_phase(kubectl: Kubectl, name: str, wanted: str, timeout: float = 120.0,
               namespace: str = "default") -> dict[str, Any]:
    def reached() -> bool:
        current = phase(kubectl, name, namespace)
        if current == "Failed" and wanted != "Failed":
            raise AssertionError(f"DataVolume {name} failed:\n" +
                                 kubectl("describe", "dv", name, "-n", namespace).stdout)
        return current == wanted
    wait_for(reached, timeout, interval=0.2, message=f"DataVolume {name} {wanted}")
    dv: dict[str, Any] = kubectl.get("dv", name, namespace)
    return dv


READ_BACK = """
import hashlib, sys
path, left = sys.argv[1], int(sys.argv[2])
digest = hashlib.sha256()
with open(path, "rb") as disk:
    while left:
        chunk = disk.read(min(left, 1 << 20))
        if not chunk:
            sys.exit(f"{path}: {left} bytes short")
        digest.update(chunk)
        left -= len(chunk)
print(digest.hexdigest())
"""


def read_back(kubectl: Kubectl, claim: str, size: int, *, block: bool = False, namespace: str = "default") -> str:
    """sha256 of the first `size` bytes of the claim's disk (file or device), read inside a pod; a disk that
    cannot be opened or holds fewer bytes fails the test with the pod's own words (not an empty digest)."""
    name = f"reader-{uuid.uuid4().hex[:8]}"
    path = "/dev/cdi-block-volume" if block else "/data/disk.img"
    manifest = pod(name, READ_BACK, claim, block=block, python=True)
    manifest["spec"]["containers"][0]["args"] = [path, str(size)]
    kubectl.apply(manifest, "-n", namespace)
    phase = wait_for(lambda: (p := kubectl("get", "pod", name, "-n", namespace, "-o",
                                           "jsonpath={.status.phase}").stdout) in ("Succeeded", "Failed") and p,
                     120, message=f"reader pod {name}")
    out = kubectl("logs", name, "-n", namespace).stdout
    if phase != "Succeeded":  # how its container ended (a start that failed leaves no log), and the claim then
        ended = kubectl("get", "pod", name, "-n", namespace, "-o",
                        "jsonpath={.status.containerStatuses[*].state}").stdout
        held = kubectl("get", "pvc", claim, "-n", namespace, "-o",
                       "jsonpath={.status.phase} {.spec.volumeName} {.metadata.deletionTimestamp}", check=False).stdout
        out = f"{out or ended} (claim: {held})"
    kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
    assert phase == "Succeeded", f"reading {claim} back failed: {out}"
    return out.split()[0]


EXT = "extensions.cdi.dev/"


def recorded(dv: dict[str, Any]) -> dict[str, str]:
    """The DataVolume's annotations of our extensions (`extensions.cdi.dev/`), without the prefix."""
    annotations = dv["metadata"].get("annotations") or {}
    return {key.removeprefix(EXT): value for key, value in annotations.items() if key.startswith(EXT)}


def with_record(k: Kubectl, name: str) -> dict[str, Any]:
    """The DataVolume once the sha256 its worker received is on it (the controller copies it from the claim)."""
    def current() -> dict[str, Any] | None:
        dv: dict[str, Any] = k.get("dv", name)
        return dv if "source.sha256" in recorded(dv) else None
    found: dict[str, Any] = wait_for(current, 60, message=f"the received sha256 on DataVolume {name}")
    return found


def condition(dv: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in dv["status"]["conditions"] if c["type"] == type_)


def set_import_proxy(k: Kubectl, proxy: dict[str, str] | None) -> None:
    """CDI's `spec.config.importProxy` (None: none), waited for until CDIConfig's status carries it."""
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": {"config": {"importProxy": proxy}}}))
    wait_for(lambda: k.json("get", "cdiconfig", "config")["status"].get("importProxy") == proxy, 30,
             message=f"CDIConfig status.importProxy {proxy}")
