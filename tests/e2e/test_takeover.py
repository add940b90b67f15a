"""Taking over from CDI without touching a byte (issue 29 item 1), on `cdi up`.

The state CDI leaves (`tests/support/cdistate.py`: finished, failed and waiting DataVolumes and their claims
with CDI's annotations, populated claims whose primes are gone, a DataImportCron between runs with its
DataSource, an admin's StorageProfile edit, CDIConfig and the CDI resource as CDI's operator left them, an
upload waiting in `UploadReady` with CDI's upload server pod) is built while nothing of cdi runs
(`cdi up --no-cdi`); then `cdi up` starts again on the same data directory, its components now running over
that state. Once every controller has settled: no claim was written or deleted, no worker pod started for
what CDI finished, every DataVolume is in the phase CDI left it with the status CDI wrote, each claim holds
the bytes written into it, the cron keeps its schedule, history and imports, the DataSource stays Ready,
the profile edit and the CDI resource's spec are kept. Then the waiting upload is completed with
`cdi image-upload --no-create`: cdi replaces CDI's upload server, as CDI's controller replaces its own when
it ends, and the bytes arrive."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from cdi.api.crds import cdi_crds
from tests.e2e.uploading import image_upload
from tests.support.cdistate import CdiState, Classes, Kube, Left, cdi_shipped_crds
from tests.support.cluster import ROOT, CdiUp, Kubectl, wait_for
from tests.support.takeover import check_untouched, snapshot

NS = "takeover"
CONFIG = {"featureGates": ["HonorWaitForFirstConsumer"], "filesystemOverhead": {"global": "0.06"}}
CDI_SPEC = {"imagePullPolicy": "IfNotPresent", "uninstallStrategy": "BlockUninstallIfWorkloadsExist",
            "config": CONFIG, "certConfig": {"ca": {"duration": "72h", "renewBefore": "24h"},
                                             "server": {"duration": "36h", "renewBefore": "12h"}},
            "workload": {"nodeSelector": {"kubernetes.io/os": "linux"}}}


_S = "cdi.kubevirt.io/storage."
UPLOAD_DONE_ANNOTATIONS = {
    # CDI's: its upload populator copies them from the prime; the PV controller's binding
    _S + "pod.phase", _S + "pod.ready", _S + "pod.restarts", _S + "condition.running",
    _S + "condition.running.message", _S + "condition.running.reason", _S + "preallocation",
    "pv.kubernetes.io/bind-completed", "pv.kubernetes.io/bound-by-controller",
    # cdi's: whether its upload server had scratch (CDI writes the key for imports only), and our extension's
    # record of what the upload received (README "Extensions")
    _S + "import.requiresScratch", "extensions.cdi.dev/source.sha256", "extensions.cdi.dev/source.format"}


def kube_of(k: Kubectl) -> Kube:
    def kube(*args: str, input: str | None = None) -> str:
        return k(*args, input=input).stdout
    return kube


def controllers_settled(up: CdiUp) -> None:
    """Every controller of `cdi up` idle: its reconcile counts still for three looks a second apart."""
    found = wait_for(lambda: re.findall(r"controller metrics (\S+)", up.log_path.read_text()), 30, 0.1,
                     message="cdi up's metrics URL")
    url = found[-1]
    seen: list[float] = []

    def still() -> bool:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        total = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("cdi_controller_reconciles_total{"))
        seen.append(total)
        return len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]

    wait_for(still, 120, 1.0, message="cdi's controllers idle")


def test_cdi_takes_over_what_cdi_left_without_touching_a_byte(tmp_path: Path) -> None:
    up = CdiUp(tmp_path / "cdi", "--no-cdi")
    up.start()
    k = Kubectl(up.kubeconfig, tmp_path / "kc")
    kube = kube_of(k)
    state = CdiState(kube, NS, Classes("local", "local-wffc"), with_cdi_resource=True)
    try:
        left: Left = state.build(profile_class="local-nosnap", config=CONFIG, cdi_spec=CDI_SPEC,
                                 profile_provisioner="nosnap.local.storage.cdi.kubevirt.io")
        before = snapshot(kube, left)
    finally:
        up.stop()

    up.extra = []  # the same cluster, now with cdi's components
    up.start()
    try:
        # CDI's upload server replaced by cdi's, ready for the upload CDI's user was about to send
        wait_for(lambda: k("get", "pod", left.upload_pod, "-n", NS, "-o", "jsonpath={.metadata.annotations}",
                           check=False).stdout.find("createdByUploadController") < 0 and
                 k("get", "pod", left.upload_pod, "-n", NS, "-o",
                   "jsonpath={.status.containerStatuses[0].ready}", check=False).stdout == "true",
                 120, 0.5, message="cdi's upload server in place of CDI's")
        controllers_settled(up)
        after = snapshot(kube, left)
        check_untouched(before, after, left)
        assert after.cdi is not None and after.cdi["status"]["phase"] == "Deployed", after.cdi
        for claim, digest in left.digests.items():
            assert state.read_digest(claim) == digest, f"claim {claim} does not hold what was written into it"

        # the upload CDI left waiting completes through cdi's proxy
        image = tmp_path / "disk.raw"
        image.write_bytes(b"uploaded after the takeover\n" * 40_000)
        result = image_upload(up, "dv", left.upload_waiting, "--no-create", "--image-path", str(image),
                              "-n", NS)
        assert result.returncode == 0, result.stdout + result.stderr
        wait_for(lambda: k("get", "dv", left.upload_waiting, "-n", NS, "-o", "jsonpath={.status.phase}").stdout
                 == "Succeeded", 120, 0.5, message="the waiting upload Succeeded")
        got = state.run_pod("read-uploaded", left.upload_waiting,
                            f"head -c {image.stat().st_size} /data/disk.img | sha256sum").split()[0]
        assert got == hashlib.sha256(image.read_bytes()).hexdigest()
        # what the completed upload's claim says: what CDI's upload populator would write, and one key of cdi's
        claim = k.get("pvc", left.upload_waiting, NS)["metadata"]["annotations"]
        was = before.claims[left.upload_waiting]["metadata"]["annotations"]
        changed = {key for key, value in claim.items() if was.get(key) != value}
        assert changed <= UPLOAD_DONE_ANNOTATIONS, changed - UPLOAD_DONE_ANNOTATIONS
        assert set(was) - set(claim) == {"cdi.kubevirt.io/storage.populator.pvcPrime"}  # CDI drops it too
    except BaseException:
        print(up.recent_logs())
        raise
    finally:
        up.stop()


def test_cdi_manifests_apply_over_the_crds_cdi_left(tmp_path: Path) -> None:
    """CDI's CRDs as CDI ships them (no status subresource for the CDI kind; its `v1alpha1`, here also in the
    CRD's storedVersions as on a cluster CDI upgraded from it): `cdi manifests`' CRDs apply over them, the CDI
    resource and its status stay. Without the old version declared, the API server refuses it, as
    kube-apiserver does. (`cdi up`'s API server has no server-side apply: kubectl's client-side apply and
    replace here, the README's server-side apply on a cluster.)"""
    up = CdiUp(tmp_path / "cdi", "--no-cdi")
    up.start()
    k = Kubectl(up.kubeconfig, tmp_path / "kc")
    try:
        for crd in cdi_shipped_crds(cdi_crds()):  # cdi up made its own: CDI's in their place
            current = k.json("get", "crd", crd["metadata"]["name"])
            crd["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            k("replace", "-f", "-", input=json.dumps(crd))
        k("patch", "crd", "cdis.cdi.kubevirt.io", "--subresource=status", "--type=merge",
          "-p", '{"status":{"storedVersions":["v1alpha1","v1beta1"]}}')
        k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI", "metadata": {"name": "cdi"},
                 "spec": CDI_SPEC, "status": {"phase": "Deployed", "observedVersion": "v1.62.0"}})
        assert k.json("get", "cdi", "cdi")["status"]["observedVersion"] == "v1.62.0"

        without_alpha = next(c for c in cdi_crds() if c["metadata"]["name"] == "cdis.cdi.kubevirt.io")
        without_alpha["spec"]["versions"] = [v for v in without_alpha["spec"]["versions"] if v["name"] == "v1beta1"]
        refused = k("replace", "-f", "-", input=json.dumps(without_alpha), check=False)
        assert refused.returncode != 0 and "must appear in spec.versions" in refused.stderr, refused.stderr

        manifests = subprocess.run([sys.executable, "-m", "cdi.cli.main", "manifests"], capture_output=True,
                                   text=True, check=True, cwd=ROOT).stdout
        crds = "\n---\n".join(doc for doc in manifests.split("\n---\n") if "kind: CustomResourceDefinition" in doc)
        k.apply(crds)
        crd = k.json("get", "crd", "cdis.cdi.kubevirt.io")
        assert crd["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]
        assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha1", "v1beta1"]
        cr = k.json("get", "cdi", "cdi")
        assert cr["spec"] == CDI_SPEC and cr["status"]["observedVersion"] == "v1.62.0"
    finally:
        up.stop()
