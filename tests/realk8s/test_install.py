"""The real-cluster tier: cdi installed on a genuine Kubernetes (the realk8s kit) the way CDI is, with
`cdi manifests | kubectl apply` and the `CDI` resource, then used and uninstalled.

One test, because every step needs the previous one (and `pytest -n 2` must not split them):
install -> `Deployed`/`Available=True` -> the Prometheus operator's CRDs appear and the operator adds
CDI's PrometheusRule and ServiceMonitor -> `certConfig` and `customizeComponents` change and the
components follow -> HTTP imports (raw and qcow2, Filesystem and Block) whose bytes a pod reads back ->
a smart clone (csi-clone or snapshot, as the planner picks) and a host-assisted clone of an imported
volume -> the populators (a DataVolume on CSI storage and its opt-out, plain PVCs naming a VolumeImportSource,
VolumeCloneSource or VolumeUploadSource, PendingPopulation under WaitForFirstConsumer, no prime claim left
after a failure) -> a DataImportCron importing from the test's HTTP server, its DataSource Ready -> an upload
through the proxy with `cdi image-upload` -> a bad DataVolume refused at admission -> uninstall refused
while DataVolumes exist under `BlockUninstallIfWorkloadsExist`, then everything the operator created
gone. Skipped without the kit."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import re
import subprocess
import sys
import time
from typing import Any

import pytest
from cryptography import x509

from tests.support.realk8s import IMAGES_DIR, NODE_IP, REPO, RealK8s, kit_dir, restricted_pod
from tests.support.waiting import wait_for

KIT = kit_dir()
pytestmark = [pytest.mark.skipif(KIT is None, reason="the realk8s kit (../shared/realk8s or $REALK8S_DIR, as root) "
                                                     "is not here"),
              pytest.mark.slow, pytest.mark.timeout(1800)]
NS = "cdi-realk8s-e2e"
CLASS = "csi-hostpath-sc"
SIZE = "64Mi"
PORT = 18080
MONITORING_CRDS = {"prometheusrules": "PrometheusRule", "servicemonitors": "ServiceMonitor"}
USE_POPULATOR = "cdi.kubevirt.io/storage.usePopulator"
WFFC_CLASS = "cdi-realk8s-wffc"  # the kit's hostpath driver, WaitForFirstConsumer (the kit's own class is Immediate)
NEVER = "0 0 1 1 *"  # a DataImportCron schedule that does not come during the test: only its first import runs


def monitoring_crd(plural: str, kind: str) -> dict[str, Any]:
    """A stand-in for the Prometheus operator's CRD (no Prometheus operator runs on the kit): the same
    group, names and scope, its schema left open."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def cdi(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "cdi.cli.main", *argv], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout


def storage(block: bool = False) -> dict[str, Any]:
    # CDI knows no capabilities of hostpath.csi.k8s.io: the modes are given, as a user of CDI gives them
    return {"storageClassName": CLASS, "volumeMode": "Block" if block else "Filesystem",
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": SIZE}}}


def datavolume(name: str, url: str, block: bool) -> dict[str, Any]:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name, "namespace": NS},
            "spec": {"source": {"http": {"url": url}}, "storage": storage(block)}}


def clone(name: str, source: str) -> dict[str, Any]:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name, "namespace": NS},
            "spec": {"source": {"pvc": {"namespace": NS, "name": source}}, "storage": storage()}}


def populated_claim(name: str, kind: str, source: str) -> dict[str, Any]:
    """A plain PVC filled by one of CDI's populators."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"storageClassName": CLASS, "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                     "resources": {"requests": {"storage": SIZE}},
                     "dataSourceRef": {"apiGroup": "cdi.kubevirt.io", "kind": kind, "name": source}}}


def primes(k8s: RealK8s) -> list[str]:
    claims = json.loads(k8s.kubectl("get", "pvc", "-n", NS, "-o", "json").stdout)["items"]
    return [c["metadata"]["name"] for c in claims if c["metadata"]["name"].startswith("prime-")]


def read_back(k8s: RealK8s, claim: str, block: bool, length: int) -> str:
    """sha256 of the image's bytes on the volume, as a pod on the node reads them."""
    source = "/dev/cdi-block-volume" if block else "/data/disk.img"
    command = f"head -c {length} {source} | sha256sum | cut -d' ' -f1; stat -c %s {source} 2>/dev/null || true"
    name = f"read-{claim}"
    k8s.apply(json.dumps(restricted_pod(name, NS, command, claim, block)))
    pod = k8s.wait_pod_done(name, NS)
    logs = k8s.kubectl("logs", "-n", NS, name).stdout.split()
    assert pod["status"]["phase"] == "Succeeded", f"reader pod {name}: {pod['status']} {logs}"
    k8s.kubectl("delete", "pod", "-n", NS, name, "--wait=false")
    return logs[0]


def wait_phase(k8s: RealK8s, name: str, phase: str, timeout: float = 300) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        dv = k8s.get("datavolume", name, NS)
        current = ((dv or {}).get("status") or {}).get("phase")
        if current == "Failed":
            raise AssertionError(f"DataVolume {name} Failed: {json.dumps(dv['status'])}")
        return dv if current == phase else None
    dv: dict[str, Any] = wait_for(reached, timeout=timeout, interval=1.0, message=f"DataVolume {name} {phase}")
    return dv


def clean_slate(k8s: RealK8s) -> None:
    """A previous run's test namespace and CDI resource go first (an interrupted run leaves them)."""
    k8s.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=300)
    if k8s.get("cdi", "cdi") is not None:
        k8s.kubectl("patch", "cdi", "cdi", "--type=merge", "-p", '{"spec":{"uninstallStrategy":"RemoveWorkloads"}}')
        k8s.kubectl("delete", "cdi", "cdi", "--wait=true", timeout=300)
    for plural in MONITORING_CRDS:
        k8s.kubectl("delete", "crd", f"{plural}.monitoring.coreos.com", "--ignore-not-found", "--wait=true")
    k8s.kubectl("delete", "storageclass", WFFC_CLASS, "--ignore-not-found")
    wait_for(lambda: (k8s.get("namespace", "cdi") or {}).get("status", {}).get("phase") != "Terminating",
             timeout=300, interval=1.0, message="namespace cdi deleted")


@pytest.fixture(scope="module")
def k8s() -> RealK8s:
    assert KIT is not None
    cluster = RealK8s(KIT)
    cluster.prepare()
    clean_slate(cluster)
    return cluster


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A raw image with recognisable content and its qcow2 conversion, served from inside the netns."""
    directory = tmp_path_factory.mktemp("realk8s-images")
    raw = directory / "disk.raw"
    block = hashlib.sha256(b"cdi on a real cluster").digest() * 2048  # 64 KiB
    with raw.open("wb") as f:
        for index in range(128):  # 8 MiB, every 64 KiB different, with a hole in the middle
            f.write(block if 40 <= index < 80 else bytes([index]) * 65536)
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(directory / "disk.qcow2")],
                   check=True)
    return {"dir": directory, "raw": raw, "size": raw.stat().st_size,
            "sha256": hashlib.sha256(raw.read_bytes()).hexdigest()}


def test_install_use_and_uninstall_on_a_real_cluster(k8s: RealK8s, images: dict[str, Any]) -> None:
    started = time.monotonic()
    timings = k8s.timings

    # -- install as CDI's release assets are installed ----------------------------------------------------
    applied = k8s.apply(cdi("manifests"))
    assert "deployment.apps/cdi-operator serverside-applied" in applied
    k8s.apply(cdi("manifests", "--cr"))

    def deployed() -> dict[str, Any] | None:
        cr = k8s.get("cdi", "cdi")
        ok = (cr or {}).get("status", {}).get("phase") == "Deployed" and k8s.condition(cr, "Available") == "True"
        return cr if ok else None
    t0 = time.monotonic()
    cr = wait_for(deployed, timeout=300, interval=2.0, message="CDI Deployed with Available=True")
    timings["install to Deployed"] = round(time.monotonic() - t0, 1)
    assert k8s.condition(cr, "Progressing") == "False" and k8s.condition(cr, "Degraded") == "False"
    assert "operator.cdi.kubevirt.io" in cr["metadata"]["finalizers"]
    controller = k8s.get("deployment", "cdi-deployment", "cdi")
    assert controller is not None and controller["status"].get("readyReplicas") == 2
    apiservice = k8s.get("apiservice", "v1beta1.upload.cdi.kubevirt.io")
    assert k8s.condition(apiservice, "Available") == "True", apiservice
    for role in ("cdi.kubevirt.io:admin", "cdi.kubevirt.io:edit", "cdi.kubevirt.io:view",
                 "cdi.kubevirt.io:config-reader"):
        assert k8s.get("clusterrole", role) is not None, role
    controller_args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    assert controller_args[controller_args.index("--pull-policy") + 1] == "IfNotPresent"  # cdi-cr.yaml's policy
    assert controller["spec"]["template"]["spec"]["tolerations"] == [{"key": "CriticalAddonsOnly",
                                                                     "operator": "Exists"}]  # spec.infra

    # spec.config reaches the CDIConfig, and from there what clients read
    k8s.kubectl("patch", "cdi", "cdi", "--type=merge",
                "-p", '{"spec":{"config":{"uploadProxyURLOverride":"uploads.example.org"}}}')
    wait_for(lambda: (k8s.get("cdiconfig", "config") or {}).get("status", {}).get("uploadProxyURL")
             == "uploads.example.org", timeout=60, interval=1.0, message="CDIConfig follows spec.config")
    assert k8s.get("cdiconfig", "config")["spec"]["featureGates"] == ["HonorWaitForFirstConsumer"]
    k8s.kubectl("patch", "cdi", "cdi", "--type=json",
                "-p", '[{"op":"remove","path":"/spec/config/uploadProxyURLOverride"}]')

    # -- observability: the Prometheus operator's kinds appear, the operator adds CDI's rule and monitor ------
    assert k8s.kubectl("get", "crd", "prometheusrules.monitoring.coreos.com", check=False).returncode != 0
    t0 = time.monotonic()
    k8s.apply("\n---\n".join(json.dumps(monitoring_crd(p, k)) for p, k in MONITORING_CRDS.items()))
    for plural in MONITORING_CRDS:
        k8s.kubectl("wait", "--for=condition=Established", f"crd/{plural}.monitoring.coreos.com", "--timeout=60s")
    rule = wait_for(lambda: k8s.get("prometheusrule", "prometheus-cdi-rules", "cdi"), timeout=120, interval=1.0,
                    message="the operator creates CDI's PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert alerts["CDIOperatorDown"]["annotations"]["runbook_url"].endswith("/CDIOperatorDown")
    records = {r["record"] for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r}
    assert "cluster:kubevirt_cdi_operator_up:sum" in records
    monitor = wait_for(lambda: k8s.get("servicemonitor", "service-monitor-cdi", "cdi"), timeout=60, interval=1.0,
                       message="the operator creates CDI's ServiceMonitor")
    metrics_service = k8s.get("service", "cdi-prometheus-metrics", "cdi")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service["metadata"]["labels"].items()
    assert k8s.get("rolebinding", "cdi-monitoring", "cdi") is not None
    timings["monitoring"] = round(time.monotonic() - t0, 1)

    # -- certificates follow certConfig: shorter lifetimes renew them now, and the components roll ---------
    def certificate(secret: str) -> x509.Certificate:
        data = k8s.get("secret", secret, "cdi")["data"]["tls.crt"]
        return x509.load_pem_x509_certificate(base64.b64decode(data))

    # every certificate follows certConfig: CAs, servers (the apiserver's too) and the proxy's client cert
    leaves = {"cdi-uploadproxy-server-cert": 70, "cdi-apiserver-server-cert": 70, "cdi-uploadserver-client-cert": 100}
    cas = ("cdi-apiserver-signer", "cdi-uploadproxy-signer", "cdi-uploadserver-signer",
           "cdi-uploadserver-client-signer")
    before = {name: certificate(name).serial_number for name in (*leaves, *cas)}
    t0 = time.monotonic()
    # customizeComponents at the same time (one roll): a strategic patch and a flag, as HCO sets them
    k8s.kubectl("patch", "cdi", "cdi", "--type=merge", "-p", json.dumps({"spec": {"certConfig": {
        "ca": {"duration": "3h", "renewBefore": "1h"}, "server": {"duration": "1h", "renewBefore": "30m"},
        "client": {"duration": "90m", "renewBefore": "30m"}}, "customizeComponents": {
            "patches": [{"resourceName": "cdi-uploadproxy", "resourceType": "Deployment", "type": "strategic",
                         "patch": json.dumps({"spec": {"template": {"spec": {"containers": [
                             {"name": "cdi-uploadproxy", "env": [{"name": "CUSTOMIZED", "value": "yes"}]}]}}}})}],
            "flags": {"api": {"v": "2"}}}}}))

    def lifetime(cert: x509.Certificate) -> datetime.timedelta:
        return cert.not_valid_after_utc - cert.not_valid_before_utc

    def renewed() -> bool:
        now = {name: certificate(name) for name in (*leaves, *cas)}
        return (all(now[n].serial_number != before[n] for n in now)
                and all(lifetime(now[n]) <= datetime.timedelta(minutes=m) for n, m in leaves.items())
                and all(lifetime(now[n]) <= datetime.timedelta(minutes=190) for n in cas))
    wait_for(renewed, timeout=120, interval=1.0, message="every certificate renewed per certConfig")

    def rolled(name: str) -> dict[str, Any] | None:
        deployment = k8s.get("deployment", name, "cdi") or {}
        status = deployment.get("status") or {}
        generation = deployment["metadata"]["generation"]
        done = (generation > 1 and status.get("observedGeneration") == generation
                and status.get("updatedReplicas") == status.get("replicas") == status.get("readyReplicas")
                and not status.get("unavailableReplicas"))
        return deployment if done else None
    for name in ("cdi-uploadproxy", "cdi-apiserver", "cdi-deployment"):
        wait_for(lambda n=name: rolled(n), timeout=180, interval=2.0,
                 message=f"{name} rolled onto the renewed certificates")
    wait_for(lambda: k8s.condition(k8s.get("cdi", "cdi"), "Available") == "True", timeout=120, interval=1.0,
             message="CDI Available after the roll")
    timings["certificate rotation + customization"] = round(time.monotonic() - t0, 1)
    proxy = k8s.get("deployment", "cdi-uploadproxy", "cdi")
    assert proxy["metadata"]["annotations"]["cdi.kubevirt.io/customizer-identifier"]
    assert {"name": "CUSTOMIZED", "value": "yes"} in proxy["spec"]["template"]["spec"]["containers"][0]["env"]
    api_args = k8s.get("deployment", "cdi-apiserver", "cdi")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert api_args[-2:] == ["--v", "2"]

    # -- HTTP imports into a namespace that enforces the restricted Pod Security profile --------------------
    k8s.apply(json.dumps({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": WFFC_CLASS},
                          "provisioner": "hostpath.csi.k8s.io", "reclaimPolicy": "Delete",
                          "volumeBindingMode": "WaitForFirstConsumer"}))
    k8s.apply(json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    server = subprocess.Popen([str(k8s.kit / "exec.sh"), sys.executable, "-m", "http.server", "--bind", NODE_IP,
                               "--directory", str(images["dir"]), str(PORT)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cases = {"raw-fs": ("disk.raw", False), "qcow2-fs": ("disk.qcow2", False)}
        if k8s.block_devices_owned_by_pod_user():
            cases.update({"raw-block": ("disk.raw", True), "qcow2-block": ("disk.qcow2", True)})
        else:  # as CDI: non-root worker pods write block devices only where the runtime hands them over
            print("realk8s: Block imports not run: the kit's containerd lacks device_ownership_from_security_context"
                  " (CDI's doc/block_cri_ownership_config.md)")
        for name, (file, block) in cases.items():
            k8s.apply(json.dumps(datavolume(name, f"http://{NODE_IP}:{PORT}/{file}", block)))
        t0 = time.monotonic()
        for name, (_file, block) in cases.items():
            dv = wait_phase(k8s, name, "Succeeded")
            assert dv["status"]["progress"] == "100.0%"
            assert read_back(k8s, name, block, images["size"]) == images["sha256"], f"{name}: wrong bytes"
        timings[f"{len(cases)} imports + read back"] = round(time.monotonic() - t0, 1)
        importer = k8s.get("pod", "importer-raw-fs", NS)
        if importer is not None:  # spec.workload and imagePullPolicy reach worker pods
            assert importer["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
            assert importer["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"

        # -- populators: CSI storage (hostpath has a CSIDriver) takes CDI's populator path; the opt-out the legacy
        # one; a plain PVC naming a VolumeImportSource; WaitForFirstConsumer shows PendingPopulation ----------
        t0 = time.monotonic()
        assert k8s.get("datavolume", "raw-fs", NS)["metadata"]["annotations"][USE_POPULATOR] == "true"
        legacy = datavolume("raw-legacy", f"http://{NODE_IP}:{PORT}/disk.qcow2", False)
        legacy["metadata"]["annotations"] = {USE_POPULATOR: "false"}
        k8s.apply(json.dumps(legacy))
        k8s.apply(json.dumps({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeImportSource",
                              "metadata": {"name": "pop-src", "namespace": NS},
                              "spec": {"source": {"http": {"url": f"http://{NODE_IP}:{PORT}/disk.qcow2"}}}}))
        k8s.apply(json.dumps(populated_claim("pop-import", "VolumeImportSource", "pop-src")))
        k8s.apply(json.dumps({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeImportSource",
                              "metadata": {"name": "pop-missing", "namespace": NS},
                              "spec": {"source": {"http": {"url": f"http://{NODE_IP}:{PORT}/missing.img"}}}}))
        k8s.apply(json.dumps(populated_claim("pop-fails", "VolumeImportSource", "pop-missing")))
        wffc = datavolume("wffc", f"http://{NODE_IP}:{PORT}/disk.qcow2", False)
        wffc["spec"]["storage"]["storageClassName"] = WFFC_CLASS
        k8s.apply(json.dumps(wffc))
        wait_phase(k8s, "raw-legacy", "Succeeded")
        assert k8s.get("pvc", "raw-legacy", NS)["spec"].get("dataSourceRef") is None  # the legacy flow
        assert read_back(k8s, "raw-legacy", False, images["size"]) == images["sha256"], "legacy path: wrong bytes"
        wait_for(lambda: (k8s.get("pvc", "pop-import", NS) or {}).get("status", {}).get("phase") == "Bound",
                 timeout=300, interval=1.0, message="pop-import Bound")
        assert read_back(k8s, "pop-import", False, images["size"]) == images["sha256"], "import populator: wrong bytes"
        wait_phase(k8s, "wffc", "PendingPopulation")
        assert read_back(k8s, "wffc", False, images["size"]) == images["sha256"], "WaitForFirstConsumer: wrong bytes"
        wait_phase(k8s, "wffc", "Succeeded")

        def failed_import() -> bool:
            events = json.loads(k8s.kubectl("get", "events", "-n", NS, "--field-selector",
                                            "involvedObject.name=pop-fails", "-o", "json").stdout)["items"]
            return any(e["reason"] == "importFailed" for e in events)
        wait_for(failed_import, timeout=300, interval=1.0, message="pop-fails reports importFailed")
        assert k8s.get("pvc", "pop-fails", NS)["status"]["phase"] == "Pending"
        k8s.kubectl("delete", "pvc", "-n", NS, "pop-fails", "--wait=true", timeout=120)
        wait_for(lambda: primes(k8s) == [], timeout=120, interval=1.0, message="no prime claim left")
        timings["populators + read back"] = round(time.monotonic() - t0, 1)

        # -- golden images: a DataImportCron imports from the HTTP server, its DataSource becomes Ready ------
        t0 = time.monotonic()
        k8s.apply(json.dumps({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
                              "metadata": {"name": "golden", "namespace": NS},
                              "spec": {"schedule": NEVER, "managedDataSource": "golden-ds", "template": {"spec": {
                                  "source": {"http": {"url": f"http://{NODE_IP}:{PORT}/disk.qcow2"}},
                                  "storage": storage()}}}}))

        def data_source_ready() -> dict[str, Any] | None:
            ds = k8s.get("datasource", "golden-ds", NS)
            return ds if k8s.condition(ds, "Ready") == "True" else None
        ds = wait_for(data_source_ready, timeout=300, interval=1.0, message="DataSource golden-ds Ready")
        cron = k8s.get("dataimportcron", "golden", NS)
        golden = cron["status"]["lastImportedPVC"]["name"]
        assert golden.startswith("golden-ds-") and ds["spec"]["source"]["pvc"] == {"namespace": NS, "name": golden}
        assert k8s.condition(cron, "UpToDate") == "True"
        assert read_back(k8s, golden, False, images["size"]) == images["sha256"], "golden image: wrong bytes"
        timings["DataImportCron + read back"] = round(time.monotonic() - t0, 1)
    finally:
        server.terminate()
        server.wait(10)

    # -- clones of an imported volume: the planner's smart clone, then host-assisted (forced) -------------
    t0 = time.monotonic()
    k8s.apply(json.dumps(clone("clone-smart", "raw-fs")))
    wait_phase(k8s, "clone-smart", "Succeeded")
    clone_type = k8s.get("pvc", "clone-smart", NS)["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"]
    assert clone_type in ("csi-clone", "snapshot"), clone_type  # csi-hostpath-sc has both
    assert read_back(k8s, "clone-smart", False, images["size"]) == images["sha256"], "smart clone: wrong bytes"
    timings[f"{clone_type} clone + read back"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    k8s.kubectl("patch", "cdi", "cdi", "--type=merge", "-p", '{"spec":{"cloneStrategyOverride":"copy"}}')
    try:
        k8s.apply(json.dumps(clone("clone-copy", "raw-fs")))
        wait_phase(k8s, "clone-copy", "Succeeded")
    finally:
        k8s.kubectl("patch", "cdi", "cdi", "--type=json",
                    "-p", '[{"op":"remove","path":"/spec/cloneStrategyOverride"}]')
    assert k8s.get("pvc", "clone-copy", NS)["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"
    assert read_back(k8s, "clone-copy", False, images["size"]) == images["sha256"], "host-assisted clone: wrong bytes"
    timings["host-assisted clone + read back"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    k8s.apply(json.dumps({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeCloneSource",
                          "metadata": {"name": "pop-clone-src", "namespace": NS},
                          "spec": {"source": {"kind": "PersistentVolumeClaim", "name": "raw-fs"}}}))
    k8s.apply(json.dumps(populated_claim("pop-clone", "VolumeCloneSource", "pop-clone-src")))
    wait_for(lambda: (k8s.get("pvc", "pop-clone", NS) or {}).get("status", {}).get("phase") == "Bound",
             timeout=300, interval=1.0, message="pop-clone Bound")
    assert read_back(k8s, "pop-clone", False, images["size"]) == images["sha256"], "clone populator: wrong bytes"
    timings["clone populator + read back"] = round(time.monotonic() - t0, 1)

    # -- upload through the proxy ------------------------------------------------------------------------
    proxy_ip = k8s.get("service", "cdi-uploadproxy", "cdi")["spec"]["clusterIP"]
    t0 = time.monotonic()
    upload = k8s.run(sys.executable, "-m", "cdi.cli.main", "image-upload", "dv", "uploaded", "-n", NS,
                     # CDI knows no capabilities of hostpath.csi.k8s.io either: the modes are given, as to virtctl
                     "--size", SIZE, "--storage-class", CLASS, "--access-mode", "ReadWriteOnce",
                     "--volume-mode", "filesystem", "--image-path", str(images["raw"]),
                     "--uploadproxy-url", f"https://{proxy_ip}:443", timeout=300)
    timings["upload"] = round(time.monotonic() - t0, 1)
    assert upload.returncode == 0
    wait_phase(k8s, "uploaded", "Succeeded")
    assert read_back(k8s, "uploaded", False, images["size"]) == images["sha256"]

    k8s.apply(json.dumps({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeUploadSource",
                          "metadata": {"name": "pop-upload-src", "namespace": NS},
                          "spec": {"contentType": "kubevirt"}}))
    k8s.apply(json.dumps(populated_claim("pop-upload", "VolumeUploadSource", "pop-upload-src")))
    upload = k8s.run(sys.executable, "-m", "cdi.cli.main", "image-upload", "pvc", "pop-upload", "-n", NS,
                     "--no-create", "--image-path", str(images["raw"]),
                     "--uploadproxy-url", f"https://{proxy_ip}:443", timeout=300)
    assert upload.returncode == 0
    wait_for(lambda: (k8s.get("pvc", "pop-upload", NS) or {}).get("status", {}).get("phase") == "Bound",
             timeout=300, interval=1.0, message="pop-upload Bound")
    assert read_back(k8s, "pop-upload", False, images["size"]) == images["sha256"], "upload populator: wrong bytes"
    assert primes(k8s) == []

    # -- a bad DataVolume is refused at admission ------------------------------------------------------------
    bad = datavolume("bad", "ftp://example.org/disk.img", False)
    refused = k8s.kubectl("create", "-f", "-", input=json.dumps(bad), check=False)
    assert refused.returncode != 0
    assert 'admission webhook "datavolume-validate.cdi.kubevirt.io" denied the request' in refused.stderr
    assert "Invalid source URL scheme" in refused.stderr
    assert k8s.get("datavolume", "bad", NS) is None

    # -- uninstall: refused while DataVolumes exist under BlockUninstallIfWorkloadsExist, then complete ------
    k8s.kubectl("patch", "cdi", "cdi", "--type=merge",
                "-p", '{"spec":{"uninstallStrategy":"BlockUninstallIfWorkloadsExist"}}')
    blocked = k8s.kubectl("delete", "cdi", "cdi", "--wait=false", check=False)
    assert blocked.returncode != 0, blocked.stdout
    assert re.search(r"rejecting the uninstall request, since there are still \d+ DataVolumes present", blocked.stderr)
    assert k8s.get("cdi", "cdi")["status"]["phase"] == "Deployed"
    # RemoveWorkloads (CDI's default): the uninstall goes ahead and takes the worker pods with the controller;
    # the DataVolumes stay until CDI's CRDs are deleted
    k8s.kubectl("patch", "cdi", "cdi", "--type=merge", "-p", '{"spec":{"uninstallStrategy":"RemoveWorkloads"}}')
    workers = "cdi.kubevirt.io in (importer, cdi-upload-server, cdi-clone-source)"
    print("realk8s: worker pods before the uninstall:", len(json.loads(k8s.kubectl(
        "get", "pods", "-n", NS, "-l", workers, "-o", "json").stdout)["items"]))
    t0 = time.monotonic()
    k8s.kubectl("delete", "cdi", "cdi", "--wait=true", timeout=300)
    timings["uninstall"] = round(time.monotonic() - t0, 1)
    assert json.loads(k8s.kubectl("get", "pods", "-n", NS, "-l", workers, "-o", "json").stdout)["items"] == []
    assert k8s.get("datavolume", "raw-fs", NS) is not None
    k8s.kubectl("delete", "namespace", NS, "--wait=true", timeout=300)
    gone = [("deployment", "cdi-deployment", "cdi"), ("deployment", "cdi-apiserver", "cdi"),
            ("deployment", "cdi-uploadproxy", "cdi"), ("service", "cdi-api", "cdi"),
            ("service", "cdi-uploadproxy", "cdi"), ("serviceaccount", "cdi-sa", "cdi"),
            ("secret", "cdi-apiserver-signer", "cdi"), ("secret", "cdi-api-signing-key", "cdi"),
            ("poddisruptionbudget", "cdi-deployment", "cdi"), ("clusterrole", "cdi", None),
            ("clusterrole", "cdi-apiserver", None), ("clusterrole", "cdi.kubevirt.io:view", None),
            ("validatingwebhookconfiguration", "cdi-api-datavolume-validate", None),
            ("validatingwebhookconfiguration", "cdi-api-validate", None),
            ("mutatingwebhookconfiguration", "cdi-api-datavolume-mutate", None),
            ("apiservice", "v1beta1.upload.cdi.kubevirt.io", None), ("cdiconfig", "config", None),
            ("prometheusrule", "prometheus-cdi-rules", "cdi"), ("servicemonitor", "service-monitor-cdi", "cdi"),
            ("rolebinding", "cdi-monitoring", "cdi"), ("secret", "cdi-apiserver-server-cert", "cdi"),
            ("secret", "cdi-uploadserver-client-cert", "cdi")]
    for kind, name, namespace in gone:
        wait_for(lambda k=kind, n=name, s=namespace: k8s.get(k, n, s) is None, timeout=60, interval=1.0,
                 message=f"{kind} {name} removed by the uninstall")
    assert k8s.get("deployment", "cdi-operator", "cdi") is not None  # the operator stays until its manifests go
    for plural in MONITORING_CRDS:
        k8s.kubectl("delete", "crd", f"{plural}.monitoring.coreos.com", "--wait=true")
    k8s.kubectl("delete", "storageclass", WFFC_CLASS)
    timings["total"] = round(time.monotonic() - started, 1)
    (IMAGES_DIR.parent / "realk8s-timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    print("realk8s tier timings (s):", json.dumps(timings))
