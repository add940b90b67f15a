"""Upgrading in place with work in flight (issue 29, "Upgrade in place"), as the README's "Upgrading in place"
says to: the earlier build's `cdi manifests` installed and Deployed, then an import stalled part way, a
host-assisted clone frozen part way, an upload DataVolume waiting in UploadReady and a DataImportCron with its
first import done; then this build's manifests applied over them. The `CDI` resource goes through `Upgrading`
(observedVersion the old, targetVersion the new, Progressing=True `UpgradeStarted`) to `Deployed` at the new
version; the transfers finish in the worker pods the old controller started (none starts over: one pod each,
no restart), with the right bytes, the waiting upload is sent through the new proxy to the old upload server,
and the cron goes on under the new controller. Nothing of the old version is left (every object the operator
owns carries the new `updateVersion`; every cdi pod runs the new images). Then a downgrade, the old manifests
applied again: the old operator refuses it (`UpgradeRefused`) and leaves the new components running; the new
manifests applied once more put things back.

Run by the real-cluster tier after its uninstall (`tests/realk8s/test_install.py`), which builds the earlier
images (the checkout's parent commit) and passes both builds' manifests: `CDI_E2E_UPGRADE_FROM`,
`CDI_E2E_UPGRADE_TO` (files of `cdi manifests --tag ...`) and `CDI_E2E_UPGRADE_CR` (`cdi manifests --cr`). It
starts with no `CDI` resource and leaves this build's Deployed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.importing import datavolume, read_back, wait_phase
from tests.e2e.target import TARGET, External
from tests.e2e.test_clone import LARGE_WRITE, clone_dv, describe, stop_mid_copy, wait_dv_phase
from tests.e2e.test_dataimportcron import DISK_SIZE, cron, disk
from tests.e2e.test_failover import PodWatch
from tests.e2e.uploading import image_upload, upload_dv
from tests.e2e.workloads import get, new_namespace, pod, pvc, run_to_completion
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer

pytestmark = [pytest.mark.realcluster, pytest.mark.upgrade]

FROM, TO, CR = (os.environ.get(f"CDI_E2E_UPGRADE_{name}") for name in ("FROM", "TO", "CR"))
MIB = 1 << 20
VERSION_LABEL = "operator.cdi.kubevirt.io/updateVersion"  # what cdi's operator (as CDI's) stamps on its objects
NAMESPACED = ("deployments", "services", "serviceaccounts", "configmaps", "secrets", "roles", "rolebindings",
              "poddisruptionbudgets")
CLUSTER_WIDE = ("clusterroles", "clusterrolebindings", "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations", "apiservices")


@pytest.fixture(autouse=True)
def _given() -> None:
    if not (FROM and TO and CR):
        pytest.skip("needs the two builds' manifests (CDI_E2E_UPGRADE_FROM, _TO, _CR: the real-cluster tier)")
    if not TARGET.node_local:
        pytest.skip("needs the node's processes on this machine (CDI_E2E_NODE_LOCAL=1)")



def operator_version(manifests: Path) -> str:
    """The version a build's manifests give its operator (`OPERATOR_VERSION` of `cdi-operator`)."""
    for doc in yaml.safe_load_all(manifests.read_text()):
        if doc and doc.get("kind") == "Deployment" and doc["metadata"]["name"] == "cdi-operator":
            env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
            return str(next(e["value"] for e in env if e["name"] == "OPERATOR_VERSION"))
    raise AssertionError(f"no cdi-operator Deployment in {manifests}")


def apply_manifests(k: Kubectl, path: Path) -> None:
    k("apply", "--server-side", "--force-conflicts", "-f", str(path))


def resource(k: Kubectl) -> dict[str, Any]:
    """The `CDI` resource, or {} while there is none."""
    found = k("get", "cdi", "cdi", "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else {}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def deployed_at(k: Kubectl, version: str) -> dict[str, Any] | None:
    cr = resource(k)
    status = cr.get("status") or {}
    done = (status.get("phase") == "Deployed" and status.get("observedVersion") == version
            and condition(cr, "Available").get("status") == "True")
    return cr if done else None


def state_volume_modes(k: Kubectl) -> None:
    """A fresh install's StorageProfiles state the modes of the classes used here, as the tier's `prepare_for_e2e`
    does (CDI knows nothing of the kit's hostpath driver; its users state them so)."""
    modes = [{"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"},
             {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"}]

    def profile(name: str) -> dict[str, Any]:
        found = k("get", "storageprofile", name, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else {}
    for name in sorted({TARGET.storage_class, TARGET.copy_class}):
        wait_for(lambda n=name: profile(n), 60, 1.0, message=f"the StorageProfile of {name}")
        if (profile(name).get("status") or {}).get("claimPropertySets"):
            continue
        k("patch", "storageprofile", name, "--type=merge", "-p", json.dumps({"spec": {"claimPropertySets": modes}}))
        wait_for(lambda n=name: (profile(n).get("status") or {}).get("claimPropertySets"), 60, 1.0,
                 message=f"the StorageProfile of {name} states its modes")


def cdi_pod_tags(k: Kubectl) -> set[str]:
    """The image tags the pods of cdi's namespace run (the operator's and the components'), terminating ones too."""
    pods = k.json("get", "pods", "-n", TARGET.cdi_namespace)["items"]
    return {c["image"].rsplit(":", 1)[1] for p in pods for c in p["spec"]["containers"]}


def component_tags(k: Kubectl) -> set[str]:
    deployments = k.json("get", "deployments", "-n", TARGET.cdi_namespace)["items"]
    return {c["image"].rsplit(":", 1)[1] for d in deployments if d["metadata"]["name"] != "cdi-operator"
            for c in d["spec"]["template"]["spec"]["containers"]}


def operator_tag(k: Kubectl) -> str:
    operator = get(k, "deployment", "cdi-operator", TARGET.cdi_namespace)
    return str(operator["spec"]["template"]["spec"]["containers"][0]["image"].rsplit(":", 1)[1])


def events_on_cdi(k: Kubectl) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the events on the `CDI` resource, oldest first."""
    items = k.json("get", "events", "-A", "--field-selector", "involvedObject.kind=CDI")["items"]
    items.sort(key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "", e["metadata"]["name"]))
    return [(e["type"], e["reason"], e.get("message") or "") for e in items]


def stale_objects(k: Kubectl, version: str) -> list[str]:
    """What the operator made (its version label) that does not carry `version`."""
    stale = []
    for kinds, scope in ((NAMESPACED, ["-n", TARGET.cdi_namespace]), (CLUSTER_WIDE, [])):
        for kind in kinds:
            items = k.json("get", kind, *scope, "-l", VERSION_LABEL)["items"]
            stale += [f"{kind}/{o['metadata']['name']} ({o['metadata']['labels'][VERSION_LABEL]})"
                      for o in items if o["metadata"]["labels"][VERSION_LABEL] != version]
    return stale


def test_an_upgrade_in_place_finishes_the_work_in_flight_and_a_downgrade_is_refused(
        cluster: CdiUp | External, k: Kubectl, gated_server: FileServer, range_server: FileServer,
        served_dir: Path, images: dict[str, Image], tmp_path: Path, record_property: Any) -> None:
    assert FROM and TO and CR
    old_manifests, new_manifests = Path(FROM), Path(TO)
    old, new = operator_version(old_manifests), operator_version(new_manifests)
    assert old != new, old
    assert not resource(k), "the tier leaves no CDI resource before this scenario"

    # -- the earlier build, installed as its release would be -----------------------------------------------
    apply_manifests(k, old_manifests)
    k("apply", "-f", CR)
    wait_for(lambda: deployed_at(k, old), 300, 2.0, message=f"the earlier build Deployed at {old}")
    assert component_tags(k) == {old}
    state_volume_modes(k)

    # -- work in flight under it ------------------------------------------------------------------------
    ns = new_namespace(k, "upgrade")
    image = images["raw.img"]
    importers = PodWatch(k, ns, "cdi.kubevirt.io=importer")
    sources = PodWatch(k, ns, "cdi.kubevirt.io=cdi-clone-source")
    uploads = PodWatch(k, ns, "cdi.kubevirt.io=cdi-upload-server")
    gated_server.close_gate(4 * MIB)  # the import stalls part way until the upgrade is done
    k.apply(datavolume("imported", {"http": {"url": f"{gated_server.url}/{image.name}"}}, "64Mi"), "-n", ns)
    wait_phase(k, "imported", "ImportInProgress", namespace=ns)
    wait_for(lambda: gated_server.served(image.name) >= 4 * MIB - 256 * 1024, 120, 0.2, message="import under way")

    k.apply(pvc("golden", "320Mi", storage_class=TARGET.copy_class), "-n", ns)
    run_to_completion(k, ns, pod("fill", LARGE_WRITE, "golden", python=True), timeout=180)
    original = describe(k, ns, "golden", "describe-golden")
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class=TARGET.copy_class),
            "-n", ns)
    uid = wait_for(lambda: (get(k, "datavolume", "copy", ns) or {}).get("metadata", {}).get("uid"), 30, 0.05,
                   message="the clone's DataVolume")
    frozen = stop_mid_copy(uid, 32 * MIB)  # the copy stands part way until the upgrade is done

    k.apply(upload_dv("uploaded"), "-n", ns)
    wait_phase(k, "uploaded", "UploadReady", timeout=180, namespace=ns)

    cron_ns = new_namespace(k, "upgrade-cron")  # its imports apart from the importer counted above
    golden_file = served_dir / "upgrade-golden.img"
    first, _ = disk(tmp_path, 21)
    shutil.copy(first, golden_file)
    k.apply(cron("golden", {"http": {"url": f"{range_server.url}/{golden_file.name}"}}, "golden-ds"), "-n", cron_ns)
    wait_for(lambda: ((get(k, "dataimportcron", "golden", cron_ns) or {}).get("status") or {}).get("lastImportedPVC"),
             180, 0.5, message="the cron's first import")
    first_claim = get(k, "dataimportcron", "golden", cron_ns)["status"]["lastImportedPVC"]["name"]
    schedule = get(k, "dataimportcron", "golden", cron_ns)["metadata"]["annotations"][
        "cdi.kubevirt.io/storage.import.nextCronTime"]
    assert get(k, "datavolume", "imported", ns)["status"]["phase"] == "ImportInProgress"
    assert get(k, "datavolume", "copy", ns)["status"]["phase"] == "CloneInProgress"

    # -- this build's manifests over them ---------------------------------------------------------------
    started = time.monotonic()
    apply_manifests(k, new_manifests)
    seen: list[tuple[str, str, str, str]] = []

    def upgraded() -> dict[str, Any] | None:
        cr = resource(k)
        status = cr.get("status") or {}
        state = (str(status.get("phase")), str(status.get("observedVersion")), str(status.get("targetVersion")),
                 str(condition(cr, "Progressing").get("reason")))
        if not seen or seen[-1] != state:
            seen.append(state)
        return deployed_at(k, new)
    wait_for(upgraded, 600, 0.5, message=f"Deployed at {new}")
    took = time.monotonic() - started
    record_property("upgrade: manifests applied -> Deployed (s)", round(took, 1))
    assert ("Upgrading", old, new, "UpgradeStarted") in seen, seen
    reasons = [reason for _, reason, _ in events_on_cdi(k)]
    assert "UpgradeStarted" in reasons and "DeployCompleted" in reasons[reasons.index("UpgradeStarted"):], reasons
    assert operator_tag(k) == new and component_tags(k) == {new}
    wait_for(lambda: cdi_pod_tags(k) == {new}, 180, 1.0, message="only pods of the new build in cdi's namespace")
    assert stale_objects(k, new) == []

    # -- the work finishes where it stood ---------------------------------------------------------------
    gated_server.open_gate()
    os.killpg(os.getpgid(frozen), signal.SIGCONT)
    dv = wait_phase(k, "imported", "Succeeded", timeout=300, namespace=ns)
    assert dv["status"]["progress"] == "100.0%" and dv["status"].get("restartCount", 0) == 0, dv["status"]
    assert read_back(k, "imported", image.virtual_size, namespace=ns) == image.sha256
    dv = wait_dv_phase(k, ns, "copy", "Succeeded", timeout=300)
    assert dv["status"].get("restartCount", 0) == 0, dv["status"]
    copied = describe(k, ns, "copy", "describe-copy")
    assert (copied["sha256"], copied["size"]) == (original["sha256"], original["size"])

    uploaded = image_upload(cluster, "dv", "uploaded", "--namespace", ns, "--no-create", "--image-path",
                            str(image.path), timeout=300)
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    wait_phase(k, "uploaded", "Succeeded", timeout=180, namespace=ns)
    assert read_back(k, "uploaded", image.virtual_size, namespace=ns) == image.sha256
    # one worker pod each, started by the old controller and finished under the new one
    assert (len(importers.stop()), len(sources.stop())) == (1, 1), (importers.uids, sources.uids)
    assert len(uploads.stop()) == 2, uploads.uids  # the clone's target and the waiting upload's

    cron_now = get(k, "dataimportcron", "golden", cron_ns)
    assert cron_now["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.nextCronTime"] == schedule
    assert cron_now["status"]["lastImportedPVC"]["name"] == first_claim
    second, second_sha = disk(tmp_path, 22)
    shutil.copy(second, golden_file)
    stat = os.stat(golden_file)
    os.utime(golden_file, (stat.st_atime, stat.st_mtime + 10))  # a new Last-Modified within the same second
    k("annotate", "dataimportcron", "golden", "-n", cron_ns, "cdi.kubevirt.io/refreshNow=", "--overwrite")
    wait_for(lambda: get(k, "dataimportcron", "golden", cron_ns)["status"]["lastImportedPVC"]["name"] != first_claim,
             180, 0.5, message="the new controller imports the changed object")
    second_claim = get(k, "dataimportcron", "golden", cron_ns)["status"]["lastImportedPVC"]["name"]
    wait_for(lambda: ((get(k, "datasource", "golden-ds", cron_ns) or {}).get("spec") or {}).get("source", {})
             .get("pvc", {}).get("name") == second_claim, 120, 0.5, message="the DataSource follows")
    assert read_back(k, second_claim, DISK_SIZE, namespace=cron_ns) == second_sha
    assert get(k, "persistentvolumeclaim", first_claim, cron_ns) is not None  # kept: importsToKeep

    # -- a downgrade: the old operator refuses, the new components stay ----------------------------------
    apply_manifests(k, old_manifests)
    wait_for(lambda: any(t == "Warning" and r == "UpgradeRefused" and old in m for t, r, m in events_on_cdi(k)),
             300, 1.0, message="the earlier operator refuses the downgrade")
    cr = resource(k)
    assert cr["status"]["observedVersion"] == new and cr["status"]["targetVersion"] == old, cr["status"]
    assert operator_tag(k) == old and component_tags(k) == {new}
    assert get(k, "datavolume", "imported", ns)["status"]["phase"] == "Succeeded"
    apply_manifests(k, new_manifests)
    wait_for(lambda: deployed_at(k, new) and (resource(k)["status"].get("targetVersion") == new), 300, 1.0,
             message=f"back to {new}")
    assert component_tags(k) == {new}
    print("upgrade: states seen:", json.dumps(seen))
    for namespace in (ns, cron_ns):
        k("delete", "namespace", namespace, "--wait=false", check=False)
