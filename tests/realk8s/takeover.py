"""Taking over from CDI on a real cluster (issue 29 item 1), as the README's "Taking over from CDI" says to:
the scenario the real-cluster tier runs before it installs cdi (`takeover_from_cdi`), on the realk8s kit.

What CDI's installation leaves is built first, with nothing of cdi installed: CDI's CRDs as CDI ships them
(`cdistate.cdi_shipped_crds`: cdi's schemas with CDI's versions and status subresources; the CDI kind's
`v1alpha1` also in the CRD's status.storedVersions, as on a cluster CDI upgraded from it), CDI's operator
(stand-ins of its Deployment and RBAC, which the procedure deletes) and components (stand-ins of its three
Deployments, no replicas: the same names and selectors, CDI's probes and volumes), a webhook configuration
of CDI's that cdi-api does not serve, CDI's RSA signer, and the state of `tests/support/cdistate.py` with the
`CDI` resource as CDI's operator leaves it. Then the procedure: CDI's operator Deployment and RBAC deleted,
`cdi manifests` applied server-side (no `--cr`: the resource is there), and the checks of the e2e test
(`tests/e2e/test_takeover.py`) once cdi is `Deployed`: nothing re-imported, rewritten or deleted, the bytes
in place, the cron between runs, the DataSource Ready, the profile edit and the CDI resource's spec kept,
the waiting upload completed with `cdi image-upload`. Before CDI's operator could take it back: `cdi-config`
still names the resource, and the resource's observedVersion is cdi's (a lower version than CDI's, which CDI's
operator upgrades from).

Not run by the author (the kit was another engineer's while this was written): read it with that in mind.
It leaves cdi installed and Deployed, its CDI resource's spec as `cdi manifests --cr` has it, the profile
edit undone and its namespace gone, so that the tier's install steps that follow find what they expect."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cdi.api.crds import cdi_crds
from cdi.operator.resources import Images, example_cr
from tests.support.cdistate import CdiState, Classes, Kube, Left, Pods, cdi_shipped_crds, rsa_ca
from tests.support.realk8s import DEBIAN_IMAGE, REPO, RealK8s
from tests.support.takeover import check_untouched, snapshot
from tests.support.waiting import wait_for

NS = "cdi-takeover"
CDI_NS = "cdi"
CLASS = "csi-hostpath-sc"
WFFC_CLASS = "cdi-realk8s-wffc"  # the tier's WaitForFirstConsumer class (made here if it is not there yet)
PROFILE_CLASS, PROFILE_PROVISIONER = "csi-hostpath-nosnap", "hostpath-nosnap.csi.k8s.io"
CONFIG = {"featureGates": ["HonorWaitForFirstConsumer"]}
CDI_SPEC = {"imagePullPolicy": "IfNotPresent", "uninstallStrategy": "BlockUninstallIfWorkloadsExist",
            "config": CONFIG, "certConfig": {"ca": {"duration": "72h", "renewBefore": "24h"}},
            "infra": {"nodeSelector": {"kubernetes.io/os": "linux"}},
            "workload": {"nodeSelector": {"kubernetes.io/os": "linux"}}}
CDI_IMAGE = "quay.io/kubevirt/{}:v1.62.0"  # named, never pulled: CDI's stand-ins run no replicas


def kube_of(k8s: RealK8s) -> Kube:
    def kube(*args: str, input: str | None = None) -> str:
        return k8s.kubectl(*args, input=input).stdout
    return kube


def cdi_cli(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "cdi.cli.main", *argv], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout


# -- CDI's installation, as its operator left it ----------------------------------------------------------

def rsa_ca_secret(name: str) -> dict[str, Any]:
    """A signer as CDI's operator keeps it (kubernetes.io/tls)."""
    pem, key_pem = rsa_ca(name, CDI_NS)
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": CDI_NS},
            "data": {"tls.crt": base64.b64encode(pem).decode(), "tls.key": base64.b64encode(key_pem).decode()}}


def cdi_deployment(name: str, selector: dict[str, str], probe: dict[str, Any], account: str) -> dict[str, Any]:
    """One of CDI's Deployments, without replicas (CDI's images are not on the kit)."""
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": CDI_NS,
                         "labels": {"cdi.kubevirt.io": "", "app.kubernetes.io/managed-by": "cdi-operator"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": selector}, "spec": {
                         "serviceAccountName": account,
                         "containers": [{"name": name, "image": CDI_IMAGE.format(name), "readinessProbe": probe,
                                         "volumeMounts": [{"name": "keys", "mountPath": "/var/run/cdi/token/keys"}]}],
                         "volumes": [{"name": "keys", "secret": {"secretName": "cdi-api-signing-key"}}]}}}}


def install_cdis_leftovers(k8s: RealK8s) -> None:
    """CDI's CRDs, its operator's and its components' objects (stand-ins that run nothing)."""
    for crd in cdi_shipped_crds(cdi_crds()):
        k8s.kubectl("create", "-f", "-", input=json.dumps(crd))
    for crd in cdi_shipped_crds(cdi_crds()):
        name = crd["metadata"]["name"]
        wait_for(lambda n=name: k8s.condition(k8s.get("crd", n), "Established") == "True", timeout=60,
                 interval=0.5, message=f"CRD {name} established")
    # a cluster CDI upgraded from v1alpha1: its CDI kind may still list it as stored
    k8s.kubectl("patch", "crd", "cdis.cdi.kubevirt.io", "--subresource=status", "--type=merge",
                "-p", '{"status":{"storedVersions":["v1alpha1","v1beta1"]}}')
    k8s.kubectl("create", "namespace", CDI_NS)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "cdi-operator", "namespace": CDI_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "cdi-operator-cluster"},
         "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["cdis"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "cdi-operator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cdi-operator-cluster"},
         "subjects": [{"kind": "ServiceAccount", "name": "cdi-operator", "namespace": CDI_NS}]},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "cdi-operator", "namespace": CDI_NS, "labels": {"operator.cdi.kubevirt.io": ""}},
         "spec": {"replicas": 0, "selector": {"matchLabels": {"name": "cdi-operator"}},
                  "template": {"metadata": {"labels": {"name": "cdi-operator"}}, "spec": {
                      "serviceAccountName": "cdi-operator",
                      "containers": [{"name": "cdi-operator", "image": CDI_IMAGE.format("cdi-operator")}]}}}},
        cdi_deployment("cdi-deployment", {"cdi.kubevirt.io": "cdi-deployment"},
                       {"exec": {"command": ["cat", "/tmp/ready"]}}, "cdi-sa"),
        cdi_deployment("cdi-apiserver", {"cdi.kubevirt.io": "cdi-apiserver"},
                       {"httpGet": {"path": "/healthz", "port": 8443, "scheme": "HTTPS"}}, "cdi-apiserver"),
        cdi_deployment("cdi-uploadproxy", {"cdi.kubevirt.io": "cdi-uploadproxy"},
                       {"httpGet": {"path": "/healthz", "port": 8443, "scheme": "HTTPS"}}, "cdi-uploadproxy"),
        rsa_ca_secret("cdi-uploadproxy-signer"),
    ]
    for obj in objects:
        k8s.kubectl("create", "-f", "-", input=json.dumps(obj))


def cdis_objecttransfer_webhook() -> dict[str, Any]:
    """CDI's `objecttransfer-api-validate` (created after the state: with no cdi-api behind it, it refuses)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "objecttransfer-api-validate", "labels": {"cdi.kubevirt.io": ""}},
            "webhooks": [{"name": "objecttransfer-validate.cdi.kubevirt.io", "admissionReviewVersions": ["v1"],
                          "sideEffects": "None", "failurePolicy": "Fail",
                          "clientConfig": {"service": {"namespace": CDI_NS, "name": "cdi-api",
                                                       "path": "/objecttransfer-validate", "port": 443}},
                          "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["cdi.kubevirt.io"],
                                     "apiVersions": ["v1beta1"], "resources": ["objecttransfers"]}]}]}


# -- the procedure and the checks ---------------------------------------------------------------------

def deployed(k8s: RealK8s, version: str) -> dict[str, Any] | None:
    cr = k8s.get("cdi", "cdi")
    status = (cr or {}).get("status") or {}
    ok = status.get("phase") == "Deployed" and k8s.condition(cr, "Available") == "True" and \
        status.get("observedVersion") == version
    return cr if ok else None


def settled(kube: Kube, left: Left) -> None:
    """What cdi's controllers write settled: the DataVolumes, claims and cron unchanged for three looks five
    seconds apart (on `cdi up` the controllers' own metrics say so; here they are in pods)."""
    seen: list[str] = []

    def still() -> bool:
        listed = json.loads(kube("get", "datavolumes,pvc,dataimportcrons,datasources", "-n", left.namespace,
                                 "-o", "json"))["items"]
        seen.append(json.dumps(sorted((o["kind"], o["metadata"]["name"], o["metadata"]["resourceVersion"])
                                      for o in listed)))
        return len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]

    wait_for(still, timeout=180, interval=5.0, message="cdi's controllers done with what CDI left")


def remove_earlier_installs(k8s: RealK8s) -> None:
    """The scenario starts where neither cdi nor CDI is installed. What an earlier run of the tier (or of this
    scenario) left goes first: the CDI resource (its finalizer dropped, no operator may be left to remove
    it), then everything `cdi manifests` installs, CRDs included, with the CDI objects they hold; CDI's
    stand-ins that `cdi manifests` does not name; this scenario's namespace."""
    if k8s.get("crd", "cdis.cdi.kubevirt.io") is not None and k8s.get("cdi", "cdi") is not None:
        k8s.kubectl("patch", "cdi", "cdi", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        k8s.kubectl("delete", "cdi", "cdi", "--ignore-not-found", "--wait=true", timeout=120)
    k8s.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=300)
    k8s.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", input=cdi_cli("manifests"), timeout=600)
    k8s.kubectl("delete", "clusterrole/cdi-operator-cluster", "--ignore-not-found")
    k8s.kubectl("delete", "validatingwebhookconfiguration/objecttransfer-api-validate", "--ignore-not-found")
    for crd in cdi_shipped_crds(cdi_crds()):
        k8s.kubectl("delete", "crd", crd["metadata"]["name"], "--ignore-not-found", "--wait=true", timeout=300)
    wait_for(lambda: k8s.get("namespace", CDI_NS) is None, timeout=300, interval=1.0,
             message=f"namespace {CDI_NS} gone")


def takeover_from_cdi(k8s: RealK8s, tmp_path: Path) -> None:
    """The scenario; the tier calls it before it installs cdi (after its clean slate)."""
    kube = kube_of(k8s)
    version = Images().tag
    remove_earlier_installs(k8s)
    k8s.apply(json.dumps({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": WFFC_CLASS},
                          "provisioner": "hostpath.csi.k8s.io", "reclaimPolicy": "Delete",
                          "volumeBindingMode": "WaitForFirstConsumer"}))

    install_cdis_leftovers(k8s)
    state = CdiState(kube, NS, Classes(CLASS, WFFC_CLASS), Pods(DEBIAN_IMAGE, restricted=True, pull_policy="Never"),
                     cdi_namespace=CDI_NS, with_cdi_resource=True)
    left = state.build(profile_class=PROFILE_CLASS, profile_provisioner=PROFILE_PROVISIONER, config=CONFIG,
                       cdi_spec=CDI_SPEC, namespace_labels={"pod-security.kubernetes.io/enforce": "restricted"})
    k8s.kubectl("create", "-f", "-", input=json.dumps(cdis_objecttransfer_webhook()))
    before = snapshot(kube, left)
    config_map = k8s.get("configmap", "cdi-config", CDI_NS)
    assert config_map is not None

    # the README's procedure: CDI's operator goes (never its CDI resource nor cdi-operator.yaml), cdi's comes
    k8s.kubectl("delete", "-n", CDI_NS, "deployment/cdi-operator", "--wait=true")
    k8s.kubectl("delete", "clusterrolebinding/cdi-operator", "clusterrole/cdi-operator-cluster")
    applied = k8s.apply(cdi_cli("manifests"))
    assert "customresourcedefinition.apiextensions.k8s.io/cdis.cdi.kubevirt.io serverside-applied" in applied, applied
    crd = k8s.get("crd", "cdis.cdi.kubevirt.io")
    assert crd is not None and "v1alpha1" in crd["status"]["storedVersions"]
    cr = wait_for(lambda: deployed(k8s, version), timeout=420, interval=2.0,
                  message=f"CDI Deployed, Available, observedVersion {version}")

    # the waiting upload is served by cdi's upload server now
    def cdis_server_ready() -> bool:
        pod = k8s.get("pod", left.upload_pod, NS)
        annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        return bool(pod) and "cdi.kubevirt.io/storage.createdByUploadController" not in annotations and \
            bool(statuses) and all(s.get("ready") for s in statuses)
    wait_for(cdis_server_ready, timeout=180, interval=1.0, message="cdi's upload server in place of CDI's")
    settled(kube, left)
    after = snapshot(kube, left)
    check_untouched(before, after, left)
    for claim, digest in left.digests.items():
        assert state.read_digest(claim) == digest, f"claim {claim} does not hold what was written into it"

    # what the operator took over, and what it left for the way back
    controller = k8s.get("deployment", "cdi-deployment", CDI_NS)
    assert controller is not None
    assert "exec" not in controller["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert k8s.get("validatingwebhookconfiguration", "objecttransfer-api-validate") is None
    assert before.cdi is not None and cr["spec"] == before.cdi["spec"]
    assert cr["metadata"]["finalizers"] == ["operator.cdi.kubevirt.io"]
    config_now = k8s.get("configmap", "cdi-config", CDI_NS)
    assert config_now is not None and config_now["metadata"]["uid"] == config_map["metadata"]["uid"]
    assert config_now["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]

    # the upload CDI's user was about to send
    image = tmp_path / "takeover-upload.raw"
    image.write_bytes(b"uploaded after the takeover\n" * 40_000)
    proxy = k8s.get("service", "cdi-uploadproxy", CDI_NS)
    assert proxy is not None
    done = k8s.run(sys.executable, "-m", "cdi.cli.main", "image-upload", "dv", left.upload_waiting, "--no-create",
                   "--image-path", str(image), "-n", NS, "--uploadproxy-url", f"https://{proxy['spec']['clusterIP']}:443",
                   check=False, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: ((k8s.get("datavolume", left.upload_waiting, NS) or {}).get("status") or {}).get("phase")
             == "Succeeded", timeout=180, interval=1.0, message="the waiting upload Succeeded")
    got = state.run_pod("read-uploaded", left.upload_waiting,
                        f"head -c {image.stat().st_size} /data/disk.img | sha256sum").split()[0]
    assert got == hashlib.sha256(image.read_bytes()).hexdigest()

    # leave cdi as the tier's install leaves it: its namespace gone, the profile edit undone, cdi-cr.yaml's spec
    k8s.kubectl("delete", "namespace", NS, "--wait=true", timeout=300)
    k8s.kubectl("patch", "storageprofile", PROFILE_CLASS, "--type=json", "-p", json.dumps([
        {"op": "remove", "path": "/spec/cloneStrategy"}, {"op": "remove", "path": "/spec/claimPropertySets"},
        {"op": "remove", "path": "/metadata/annotations/cdi.kubevirt.io~1minimumSupportedPvcSize"}]))
    k8s.kubectl("patch", "cdi", "cdi", "--type=json",
                "-p", json.dumps([{"op": "replace", "path": "/spec", "value": example_cr()["spec"]}]))
    wait_for(lambda: deployed(k8s, version), timeout=300, interval=2.0, message="CDI Deployed again")
