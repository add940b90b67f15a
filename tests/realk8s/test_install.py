"""The real-cluster tier: cdi installed on a genuine Kubernetes (the realk8s kit) the way CDI is, with
`cdi manifests | kubectl apply` and the `CDI` resource, then used and uninstalled.

One test, because every step needs the previous one (and `pytest -n 2` must not split them):
install -> `Deployed`/`Available=True` -> the Prometheus operator's CRDs appear and the operator adds
CDI's PrometheusRule and ServiceMonitor -> `certConfig` and `customizeComponents` change and the
components follow -> CDIConfig's TLS profile set to Modern: cdi-api and the proxy refuse TLS 1.2 (openssl
s_client from the kit's netns), and accept it again once it is removed -> **the end-to-end suite's
`anycluster` scenarios run against this cluster** (the same
tests that run against `cdi up`: HTTP imports of raw and qcow2 read back by a pod, blank disks, permanent
failures, WaitForFirstConsumer, `cdi image-upload` of four formats, DataVolumes refused at admission, smart
and host-assisted clones across namespaces, the three populators, DataImportCrons from HTTP; run from inside
the kit's network namespace, so their file servers listen on the bridge address pods reach) -> a DataVolume
in a namespace enforcing the `restricted` Pod Security profile -> uninstall refused while DataVolumes exist
under `BlockUninstallIfWorkloadsExist`, then everything the operator created gone. Skipped without the kit."""

from __future__ import annotations

import base64
import datetime
import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tests.realk8s.takeover import takeover_from_cdi
from tests.support.realk8s import IMAGES_DIR, NODE_IP, REPO, WEBHOOK_CLIENT_NAME, RealK8s, kit_dir
from tests.support.waiting import wait_for

KIT = kit_dir()
pytestmark = [pytest.mark.skipif(KIT is None, reason="the realk8s kit (../shared/realk8s or $REALK8S_DIR, as root) "
                                                     "is not here"),
              pytest.mark.slow, pytest.mark.timeout(2400)]
NS = "cdi-realk8s-e2e"
CLASS = "csi-hostpath-sc"  # the kit's default class: snapshots and CSI clones
COPY_CLASS = "csi-hostpath-nosnap"  # no VolumeSnapshotClass: host-assisted clones
KUBECONFIG = "/var/lib/realk8s/admin.kubeconfig"
MONITORING_CRDS = {"prometheusrules": "PrometheusRule", "servicemonitors": "ServiceMonitor"}
WFFC_CLASS = "cdi-realk8s-wffc"  # the kit's hostpath driver, WaitForFirstConsumer (the kit's own class is Immediate)
RESTRICTED = "pod-security.kubernetes.io/enforce"
MULTINODE_CLASSES = ("csi-hostpath-wffc", "csi-hostpath-nosnap-wffc")  # what the kit's `up.sh --nodes` adds


def monitoring_crd(plural: str, kind: str) -> dict[str, Any]:
    """A stand-in for the Prometheus operator's CRD (no Prometheus operator runs on the kit): the same
    group, names and scope, its schema left open."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def _handshake(k8s: RealK8s, service: str, version: str) -> bool:
    """Whether the real `openssl s_client`, from inside the kit's network namespace, completes a handshake
    with only `version` (-tls1_2, -tls1_3) with the Service's cluster IP."""
    spec = k8s.get("service", service, "cdi")["spec"]
    address = f"{spec['clusterIP']}:{spec['ports'][0]['port']}"
    done = k8s.run("openssl", "s_client", "-brief", version, "-connect", address, check=False, timeout=30, input="")
    return done.returncode == 0


def tls12_accepted(k8s: RealK8s, service: str) -> bool:
    return _handshake(k8s, service, "-tls1_2")


def tls13_accepted(k8s: RealK8s, service: str) -> bool:
    return _handshake(k8s, service, "-tls1_3")


def cdi(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "cdi.cli.main", *argv], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout


def blank(name: str) -> dict[str, Any]:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name, "namespace": NS},
            "spec": {"source": {"blank": {}}, "storage": {"storageClassName": CLASS,
                                                         "resources": {"requests": {"storage": "16Mi"}}}}}


def wait_phase(k8s: RealK8s, name: str, phase: str, timeout: float = 300) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        dv = k8s.get("datavolume", name, NS)
        current = ((dv or {}).get("status") or {}).get("phase")
        if current == "Failed":
            raise AssertionError(f"DataVolume {name} Failed: {json.dumps(dv['status'])}")
        return dv if current == phase else None
    dv: dict[str, Any] = wait_for(reached, timeout=timeout, interval=1.0, message=f"DataVolume {name} {phase}")
    return dv


def clear_default_namespace(k8s: RealK8s) -> None:
    """What the e2e suite left: its namespaces, and its objects in `default` (which it named there)."""
    k8s.kubectl("delete", "namespace", "-l", "cdi-e2e", "--wait=false")
    # the crons first: one still there makes its DataVolume again right after the DataVolumes went (seen: the
    # several-node run then refused the `default` it found)
    k8s.kubectl("delete", "dataimportcrons", "--all", "-n", "default", "--wait=true", timeout=300, check=False)
    k8s.kubectl("delete", "datavolumes,datasources,volumeimportsources,volumeuploadsources,"
                "volumeclonesources,pods,persistentvolumeclaims", "--all", "-n", "default", "--wait=true",
                timeout=300, check=False)  # without CDI's CRDs (an interrupted run) there is nothing of theirs
    k8s.kubectl("label", "namespace", "default", f"{RESTRICTED}-", check=False)


def prepare_for_e2e(k8s: RealK8s, classes: tuple[str, ...] = (CLASS, COPY_CLASS, WFFC_CLASS)) -> None:
    """The cluster as the e2e suite expects it: a WaitForFirstConsumer class, `default` enforcing the
    restricted profile (as the namespaces the suite creates do), and StorageProfiles of `classes` that state
    the access and volume modes of the hostpath driver, which CDI does not know, as a user of CDI states them."""
    clear_default_namespace(k8s)
    k8s.apply(json.dumps({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": WFFC_CLASS},
                          "provisioner": "hostpath.csi.k8s.io", "reclaimPolicy": "Delete",
                          "volumeBindingMode": "WaitForFirstConsumer"}))
    k8s.kubectl("label", "namespace", "default", f"{RESTRICTED}=restricted", "--overwrite")
    modes = [{"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"},
             {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"}]
    for name in classes:
        wait_for(lambda n=name: k8s.get("storageprofile", n), timeout=60, interval=1.0,
                 message=f"the StorageProfile of {name}")
        k8s.kubectl("patch", "storageprofile", name, "--type=merge",
                    "-p", json.dumps({"spec": {"claimPropertySets": modes}}))
        wait_for(lambda n=name: (k8s.get("storageprofile", n) or {}).get("status", {}).get("claimPropertySets")
                 == modes, timeout=60, interval=1.0, message=f"the StorageProfile of {name} states its modes")


def passed_and_skipped(junit: Path) -> dict[str, int]:
    counts = {"passed": 0, "skipped": 0}
    for case in ET.parse(junit).getroot().iter("testcase"):
        counts["skipped" if case.find("skipped") is not None else "passed"] += 1
    return counts


def clean_slate(k8s: RealK8s) -> None:
    """A previous run's test namespace and CDI resource go first (an interrupted run leaves them)."""
    k8s.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=300)
    # a cluster cdi was never installed on has no CDI kind to ask about
    if k8s.get("crd", "cdis.cdi.kubevirt.io") is not None and k8s.get("cdi", "cdi") is not None:
        k8s.kubectl("patch", "cdi", "cdi", "--type=merge", "-p", '{"spec":{"uninstallStrategy":"RemoveWorkloads"}}')
        k8s.kubectl("delete", "cdi", "cdi", "--wait=true", timeout=300)
    for plural in MONITORING_CRDS:
        k8s.kubectl("delete", "crd", f"{plural}.monitoring.coreos.com", "--ignore-not-found", "--wait=true")
    k8s.kubectl("delete", "storageclass", WFFC_CLASS, "--ignore-not-found")
    clear_default_namespace(k8s)
    wait_for(lambda: (k8s.get("namespace", "cdi") or {}).get("status", {}).get("phase") != "Terminating",
             timeout=300, interval=1.0, message="namespace cdi deleted")


@pytest.fixture(scope="module")
def k8s() -> RealK8s:
    assert KIT is not None
    cluster = RealK8s(KIT)
    cluster.prepare()
    # as with CDI, non-root worker pods write Block volumes only where the runtime hands the devices over
    cluster.hand_block_devices_to_pod_users()
    # as the README's install section asks of an admin: kube-apiserver presents its client certificate to
    # admission webhooks (and, for the isolation scenarios, runs with CrossNamespaceVolumeDataSource)
    cluster.ensure_drivers_registered()  # no registration in flight when the API server restarts
    cluster.configure_api_server()
    cluster.ensure_drivers_registered()
    cluster.check_volumes()
    clean_slate(cluster)
    return cluster


def test_install_use_and_uninstall_on_a_real_cluster(k8s: RealK8s, tmp_path: Path) -> None:
    started = time.monotonic()
    timings = k8s.timings

    # -- take over from CDI: what CDI's install leaves, then cdi's operator over it (tests/realk8s/takeover.py);
    # it leaves cdi Deployed with the resource `cdi manifests --cr` makes, which the install below then finds
    t0 = time.monotonic()
    takeover_from_cdi(k8s, tmp_path)
    timings["takeover from CDI"] = round(time.monotonic() - t0, 1)

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
    # cdi-apiserver's, and the upload proxy's (uploads through the API server): the aggregator reached each
    for name in ("v1beta1.upload.cdi.kubevirt.io", "v1beta1.upload.extensions.cdi.dev"):
        wait_for(lambda n=name: k8s.condition(k8s.get("apiservice", n) or {}, "Available") == "True", timeout=60,
                 interval=1.0, message=f"APIService {name} Available")
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
            "flags": {"api": {"v": "2", "webhook-client-names": WEBHOOK_CLIENT_NAME}}}}}))

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
    assert api_args[-4:] == ["--v", "2", "--webhook-client-names", WEBHOOK_CLIENT_NAME], api_args

    # -- CDIConfig's TLS profile, as HyperConverged sets it: cdi-api and the proxy follow it without a restart --
    t0 = time.monotonic()
    assert tls12_accepted(k8s, "cdi-api") and tls12_accepted(k8s, "cdi-uploadproxy")  # Intermediate
    k8s.kubectl("patch", "cdi", "cdi", "--type=merge", "-p", json.dumps({"spec": {"config": {
        "tlsSecurityProfile": {"type": "Modern", "modern": {}}}}}))
    for service in ("cdi-api", "cdi-uploadproxy"):
        wait_for(lambda s=service: not tls12_accepted(k8s, s), timeout=60, interval=1.0,
                 message=f"{service} to refuse TLS 1.2 under the Modern profile")
        assert tls13_accepted(k8s, service), service
    k8s.kubectl("patch", "cdi", "cdi", "--type=json",
                "-p", '[{"op":"remove","path":"/spec/config/tlsSecurityProfile"}]')
    for service in ("cdi-api", "cdi-uploadproxy"):
        wait_for(lambda s=service: tls12_accepted(k8s, s), timeout=60, interval=1.0,
                 message=f"{service} to accept TLS 1.2 again (Intermediate)")
    timings["TLS profile"] = round(time.monotonic() - t0, 1)

    # -- the end-to-end suite's `anycluster` and `realcluster` scenarios, against this cluster -----------------
    # (tests/e2e/target.py): the node is this machine, and the kit restarts its kubelet and runtime
    t0 = time.monotonic()
    prepare_for_e2e(k8s)
    env = {"CDI_E2E_KUBECONFIG": KUBECONFIG, "CDI_E2E_STORAGE_CLASS": CLASS, "CDI_E2E_COPY_CLASS": COPY_CLASS,
           "CDI_E2E_WFFC_CLASS": WFFC_CLASS, "CDI_E2E_SERVE_HOST": NODE_IP, "CDI_E2E_WEBHOOK_CLIENT_AUTH": "1",
           "CDI_E2E_CROSS_NAMESPACE_GATE": "1", "CDI_E2E_NODE_LOCAL": "1",
           "CDI_E2E_NODE_RESTART": f"{sys.executable} -m tests.support.realk8s restart-node"}
    # one line per scenario, written as it ends, so a run cut short still says where it stood
    log = tmp_path / "e2e.log"
    returncode = k8s.run_logged(log, "env", *(f"{name}={value}" for name, value in env.items()), sys.executable,
                                "-m", "pytest", "tests/e2e", "-m",
                                "(anycluster or realcluster) and not multinode and not upgrade", "-n", "0",
                                "-p", "no:cacheprovider", "-v", "-rfEs", "--maxfail=5", "--durations=15",
                                f"--basetemp={tmp_path / 'e2e'}", "--junitxml", str(tmp_path / "e2e.xml"),
                                timeout=1500, cwd=REPO)
    timings["e2e suite (anycluster, realcluster)"] = round(time.monotonic() - t0, 1)
    output = log.read_text(errors="replace")
    print(output[-8000:])
    assert returncode == 0, (f"the e2e suite failed on the real cluster ({returncode}):\n{output[-20000:]}\n"
                             f"{k8s.diagnosis()}")
    ran = passed_and_skipped(tmp_path / "e2e.xml")
    assert ran["passed"] >= 36 and ran["skipped"] == 0, ran  # every scenario ran here, Block ones too
    # what the scenarios measured (failover times, the workers' peak memory): in the timings file
    figures = {f"{case.get('name')}: {prop.get('name')}": prop.get("value")
               for case in ET.parse(tmp_path / "e2e.xml").getroot().iter("testcase") for prop in case.iter("property")}
    timings["measured"] = figures
    print("realk8s: measured by the scenarios:", json.dumps(figures, indent=1))
    # -- scale: 100 DataVolumes at once (half blank, half small HTTP imports), each Succeeded with one worker
    # pod, with the controller's CPU, memory and the API requests per DataVolume (bench/bench_controller.py's
    # mode for a real cluster; bench/RESULTS.md has its runs with 500)
    t0 = time.monotonic()
    figures_file = tmp_path / "scale.json"
    scaled = k8s.run(sys.executable, "bench/bench_controller.py", "--kubeconfig", KUBECONFIG, "--serve-host", NODE_IP,
                     "--storage-class", CLASS, "--count", "100", "--timeout", "600", "--json", str(figures_file),
                     check=False, timeout=900, cwd=REPO)
    assert scaled.returncode == 0, f"the scale scenario:\n{scaled.stdout[-4000:]}\n{scaled.stderr[-2000:]}"
    timings["scale (100 DataVolumes)"] = round(time.monotonic() - t0, 1)
    figures.update({f"scale, 100 DataVolumes: {key}": value
                    for key, value in json.loads(figures_file.read_text())["rows"].items()})
    print("realk8s: the scale scenario:\n" + scaled.stdout[-3000:])

    # -- several nodes: the kit grown to two (`up.sh --nodes 2`), the `multinode` scenarios
    # (tests/e2e/test_multinode.py: WaitForFirstConsumer on the consumer's node, a host-assisted clone across
    # nodes, workers beside their volumes, node 2's power cut mid-import), then back to one node
    t0 = time.monotonic()
    k8s.add_node()
    try:
        prepare_for_e2e(k8s, (CLASS, COPY_CLASS, WFFC_CLASS, *MULTINODE_CLASSES))  # the main run's objects go
        log = tmp_path / "multinode.log"
        several = {**env, "CDI_E2E_NODES": "2", "CDI_E2E_NODE_DOWN": f"{KIT}/down.sh --node 2",
                   "CDI_E2E_NODE_UP": f"{KIT}/up.sh --nodes 2"}
        returncode = k8s.run_logged(log, "env", *(f"{name}={value}" for name, value in several.items()),
                                    sys.executable, "-m", "pytest", "tests/e2e/test_multinode.py", "-m", "multinode",
                                    "-n", "0", "-p", "no:cacheprovider", "-v", "-rfEs", "-s",
                                    f"--basetemp={tmp_path / 'multinode'}", "--junitxml",
                                    str(tmp_path / "multinode.xml"), timeout=600, cwd=REPO)
        output = log.read_text(errors="replace")
        print(output[-6000:])
        assert returncode == 0, (f"the several-node scenarios failed ({returncode}):\n{output[-20000:]}\n"
                                 f"{k8s.diagnosis()}")
        ran = passed_and_skipped(tmp_path / "multinode.xml")
        assert ran["passed"] >= 6 and ran["skipped"] == 0, ran
        figures.update({f"several nodes, {case.get('name')}: {prop.get('name')}": prop.get("value")
                        for case in ET.parse(tmp_path / "multinode.xml").getroot().iter("testcase")
                        for prop in case.iter("property")})
    finally:
        # the scenarios' namespaces go while node 2 runs: its provisioners delete the volumes they made there
        left = k8s.kubectl("get", "namespaces", "-l", "cdi-e2e", "-o", "name").stdout.split()
        multinode = [name for name in left if name.startswith("namespace/mn-")]
        if multinode:
            k8s.kubectl("delete", *multinode, "--wait=true", timeout=300, check=False)
        k8s.remove_node()
    timings["several nodes"] = round(time.monotonic() - t0, 1)

    # the controller's ClusterRole covers everything it did meanwhile: no request of its was refused (a refused
    # cleanup once failed each reconcile after an import, on every real cluster and never on `cdi up`)
    controllers = k8s.kubectl("get", "pods", "-n", "cdi", "-l", "cdi.kubevirt.io=cdi-deployment", "-o", "name")
    for pod in controllers.stdout.split():
        log = k8s.kubectl("logs", "-n", "cdi", pod).stdout
        # (not a namespace being deleted, which refuses everyone's writes: the several-node phase clears the
        # suite's namespaces while the controller still records events in them)
        refused = [line for line in log.splitlines() if "403 Forbidden" in line and "is being terminated" not in line]
        assert not refused, f"{pod} was refused {len(refused)} requests, e.g. {refused[:3]}"

    # a DataVolume in a namespace that enforces the restricted profile: its worker pod is admitted and placed
    # as spec.workload says, with the pull policy of cdi-cr.yaml
    k8s.apply(json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    k8s.apply(json.dumps(blank("kept")))
    def importer_or_done() -> Any:
        pods = json.loads(k8s.kubectl("get", "pods", "-n", NS, "-l", "cdi.kubevirt.io=importer", "-o", "json")
                          .stdout)["items"]
        dv = k8s.get("datavolume", "kept", NS) or {}
        return pods[0] if pods else (dv.get("status") or {}).get("phase") == "Succeeded"
    importer = wait_for(importer_or_done, timeout=120, interval=0.5, message="the blank DataVolume's importer pod")
    if isinstance(importer, dict):
        assert importer["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
        assert importer["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    wait_phase(k8s, "kept", "Succeeded")

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
    assert k8s.get("datavolume", "kept", NS) is not None
    k8s.kubectl("delete", "namespace", NS, "--wait=true", timeout=300)
    clear_default_namespace(k8s)
    gone = [("deployment", "cdi-deployment", "cdi"), ("deployment", "cdi-apiserver", "cdi"),
            ("deployment", "cdi-uploadproxy", "cdi"), ("service", "cdi-api", "cdi"),
            ("service", "cdi-uploadproxy", "cdi"), ("serviceaccount", "cdi-sa", "cdi"),
            ("secret", "cdi-apiserver-signer", "cdi"), ("secret", "cdi-api-signing-key", "cdi"),
            ("poddisruptionbudget", "cdi-deployment", "cdi"), ("clusterrole", "cdi", None),
            ("clusterrole", "cdi-apiserver", None), ("clusterrole", "cdi.kubevirt.io:view", None),
            ("validatingwebhookconfiguration", "cdi-api-datavolume-validate", None),
            ("validatingwebhookconfiguration", "cdi-api-validate", None),
            ("validatingwebhookconfiguration", "cdi-api-populator-validate", None),
            ("mutatingwebhookconfiguration", "cdi-api-datavolume-mutate", None),
            ("apiservice", "v1beta1.upload.cdi.kubevirt.io", None), ("cdiconfig", "config", None),
            ("apiservice", "v1beta1.upload.extensions.cdi.dev", None),
            ("rolebinding", "cdi-uploadproxy-auth-reader", "kube-system"),
            ("prometheusrule", "prometheus-cdi-rules", "cdi"), ("servicemonitor", "service-monitor-cdi", "cdi"),
            ("rolebinding", "cdi-monitoring", "cdi"), ("secret", "cdi-apiserver-server-cert", "cdi"),
            ("secret", "cdi-uploadserver-client-cert", "cdi")]
    for kind, name, namespace in gone:
        wait_for(lambda k=kind, n=name, s=namespace: k8s.get(k, n, s) is None, timeout=60, interval=1.0,
                 message=f"{kind} {name} removed by the uninstall")
    assert k8s.get("deployment", "cdi-operator", "cdi") is not None  # the operator stays until its manifests go
    for plural in MONITORING_CRDS:
        k8s.kubectl("delete", "crd", f"{plural}.monitoring.coreos.com", "--wait=true")

    # -- upgrade in place (issue 29): the checkout's parent built and installed, work started under it, this
    # build's manifests applied over it, then a downgrade refused (tests/e2e/test_upgrade.py, its own run)
    t0 = time.monotonic()
    previous, old_manifests = k8s.previous_build(tmp_path)
    new_manifests, cr_file = tmp_path / "manifests.yaml", tmp_path / "cr.yaml"
    new_manifests.write_text(cdi("manifests"))
    cr_file.write_text(cdi("manifests", "--cr"))
    log = tmp_path / "upgrade.log"
    upgrade_env = {**env, "CDI_E2E_UPGRADE_FROM": str(old_manifests), "CDI_E2E_UPGRADE_TO": str(new_manifests),
                   "CDI_E2E_UPGRADE_CR": str(cr_file)}
    returncode = k8s.run_logged(log, "env", *(f"{name}={value}" for name, value in upgrade_env.items()),
                                sys.executable, "-m", "pytest", "tests/e2e/test_upgrade.py", "-m", "upgrade", "-n", "0",
                                "-p", "no:cacheprovider", "-v", "-rfEs", f"--basetemp={tmp_path / 'upgrade'}",
                                "--junitxml", str(tmp_path / "upgrade.xml"), timeout=1200, cwd=REPO)
    timings["upgrade in place (build, install, upgrade, downgrade)"] = round(time.monotonic() - t0, 1)
    output = log.read_text(errors="replace")
    print(output[-6000:])
    assert returncode == 0, f"the upgrade scenario failed ({returncode}):\n{output[-20000:]}\n{k8s.diagnosis()}"
    assert passed_and_skipped(tmp_path / "upgrade.xml") == {"passed": 1, "skipped": 0}
    figures.update({f"{case.get('name')}: {prop.get('name')}": prop.get("value")
                    for case in ET.parse(tmp_path / "upgrade.xml").getroot().iter("testcase")
                    for prop in case.iter("property")})
    k8s.kubectl("patch", "cdi", "cdi", "--type=merge", "-p", '{"spec":{"uninstallStrategy":"RemoveWorkloads"}}')
    k8s.kubectl("delete", "cdi", "cdi", "--wait=true", timeout=300)
    k8s.drop_images(previous)

    k8s.kubectl("delete", "storageclass", WFFC_CLASS)
    timings["total"] = round(time.monotonic() - started, 1)
    (IMAGES_DIR.parent / "realk8s-timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    print("realk8s tier timings (s):", json.dumps(timings))
