"""What `cdi manifests` prints and what the operator installs, checked without a cluster (the
real-cluster tier applies them to a real kube-apiserver with strict validation)."""

from __future__ import annotations

import datetime
import subprocess
import sys

import pytest
import yaml

from cdi.common import certconfig, pki
from cdi.operator import certs, monitoring, resources
from cdi.operator.resources import Images


def cdi(*argv: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "cdi.cli.main", *argv], capture_output=True, text=True, check=True)
    return list(yaml.safe_load_all(out.stdout))


def test_manifests_install_the_operator_with_the_images_and_namespace_asked_for() -> None:
    documents = cdi("manifests", "--image-registry", "quay.example/cdi", "--tag", "v9", "--namespace", "storage")
    kinds = [d["kind"] for d in documents]
    assert kinds[0] == "Namespace" and documents[0]["metadata"]["name"] == "storage"
    crds = {d["metadata"]["name"] for d in documents if d["kind"] == "CustomResourceDefinition"}
    assert {"datavolumes.cdi.kubevirt.io", "cdis.cdi.kubevirt.io", "cdiconfigs.cdi.kubevirt.io"} <= crds
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "quay.example/cdi/cdi-operator:v9"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["IMPORTER_IMAGE"] == "quay.example/cdi/cdi-importer:v9"
    assert env["CONTROLLER_IMAGE"] == "quay.example/cdi/cdi-controller:v9"
    assert all(d["metadata"].get("namespace") in (None, "storage", "kube-system") for d in documents)
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_operators_version_is_the_tag_unless_said_otherwise() -> None:
    """CDI's release sets OPERATOR_VERSION to its image tag; its manifest generator also takes another."""
    def version(*argv: str) -> str:
        deployment = next(d for d in cdi("manifests", *argv) if d["kind"] == "Deployment")
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        return str(env["OPERATOR_VERSION"])

    assert version() == Images().tag
    assert version("--tag", "0.1.0-dev.541.g3fcd25e") == "0.1.0-dev.541.g3fcd25e"
    assert version("--tag", "latest", "--operator-version", "0.0.9") == "0.0.9"
    refused = subprocess.run([sys.executable, "-m", "cdi.cli.main", "manifests", "--operator-version", "1.0.0+build"],
                             capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "not a label value" in refused.stderr


def test_manifests_cr_is_an_example_cdi_resource() -> None:
    (cr,) = cdi("manifests", "--cr")
    assert (cr["apiVersion"], cr["kind"], cr["metadata"]["name"]) == ("cdi.kubevirt.io/v1beta1", "CDI", "cdi")


def _covers(held: list[dict], rule: dict) -> bool:
    for verb in rule["verbs"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                if not any((verb in h["verbs"] or "*" in h["verbs"]) and group in h["apiGroups"]
                           and (resource in h["resources"] or "*" in h["resources"])
                           and (not h.get("resourceNames") or set(rule.get("resourceNames", ())) <= set(
                               h["resourceNames"])) for h in held):
                    return False
    return True


def test_the_operator_holds_every_permission_it_grants_and_no_escalate_or_bind() -> None:
    """RBAC refuses a Role that grants more than its creator holds; the operator gets no shortcut."""
    cluster, namespaced = resources.operator_cluster_rules(), resources.operator_namespace_rules()
    cr = {"metadata": {"name": "cdi"}, "spec": {}}
    for obj in [*resources.components(cr, "cdi", Images(), {}), *monitoring.objects("cdi")]:
        if obj["kind"] == "ClusterRole":
            assert all(_covers(cluster, r) for r in obj["rules"]), obj["metadata"]["name"]
        if obj["kind"] == "Role" and obj["metadata"]["namespace"] == "cdi":
            assert all(_covers(cluster + namespaced, r) for r in obj["rules"]), obj["metadata"]["name"]
    verbs = {v for rule in cluster + namespaced for v in rule["verbs"]}
    assert not verbs & {"escalate", "bind", "impersonate"}


def test_components_follow_the_cdi_resource() -> None:
    cr = {"metadata": {"name": "cdi"}, "spec": {
        "imagePullPolicy": "Always", "priorityClass": "system-cluster-critical",
        "infra": {"nodeSelector": {"infra": "yes"}, "apiServerReplicas": 2}}}
    objects = {(o["kind"], o["metadata"]["name"]): o for o in resources.components(cr, "cdi", Images(), {})}
    controller = objects[("Deployment", "cdi-deployment")]
    assert controller["spec"]["replicas"] == 2
    assert "--no-cdi-status" in controller["spec"]["template"]["spec"]["containers"][0]["args"]
    args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    # worker pods pull as the resource says, and clone source pods run the cloner image
    assert args[args.index("--pull-policy") + 1] == "Always"
    assert args[args.index("--cloner-image") + 1] == Images().of("cdi-cloner")
    apiserver = objects[("Deployment", "cdi-apiserver")]["spec"]
    assert apiserver["replicas"] == 2
    pod = apiserver["template"]["spec"]
    assert pod["nodeSelector"] == {"infra": "yes"} and pod["priorityClassName"] == "system-cluster-critical"
    assert pod["containers"][0]["imagePullPolicy"] == "Always"
    for name in ("cdi.kubevirt.io:admin", "cdi.kubevirt.io:edit", "cdi.kubevirt.io:view"):
        assert objects[("ClusterRole", name)]["metadata"]["labels"][
            f"rbac.authorization.k8s.io/aggregate-to-{name.rsplit(':', 1)[1]}"] == "true"
    assert ("PodDisruptionBudget", "cdi-deployment") in objects


@pytest.mark.parametrize(("text", "seconds"), [("48h", 172800), ("1h30m", 5400), ("90s", 90), ("48h0m0s", 172800)])
def test_cert_durations_are_go_durations(text: str, seconds: int) -> None:
    assert certconfig.parse_duration(text).total_seconds() == seconds


def test_a_certificate_is_renewed_within_renew_before_or_when_its_ca_changed() -> None:
    lifetime = certs.Lifetime(datetime.timedelta(hours=2), datetime.timedelta(hours=1))
    ca = pki.make_ca("ca", days=2 / 24)
    assert not certs.due(ca, lifetime)
    assert certs.due(ca, certs.Lifetime(datetime.timedelta(hours=2), datetime.timedelta(hours=3)))
    assert certs.due(ca, certs.Lifetime(datetime.timedelta(hours=1), datetime.timedelta(minutes=1)))  # shortened
    leaf = pki.issue(ca, "x", ["x"], days=1 / 24)
    assert not certs.due(leaf, certs.Lifetime(datetime.timedelta(hours=1), datetime.timedelta(minutes=10)), ca)
    assert certs.due(leaf, certs.Lifetime(datetime.timedelta(hours=1), datetime.timedelta(minutes=10)),
                     pki.make_ca("another"))


def test_uploads_through_the_api_server_are_installed() -> None:
    """The APIService of `upload.extensions.cdi.dev` at the proxy's aggregation port (with the proxy's CA),
    that port on the Service and the Deployment, the proxy's read of the request-header CA, and the right to
    upload in CDI's edit and admin roles (`create` for POST, `get` for the HEAD probe), not in view."""
    objects = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
               for o in [*resources.components({"spec": {}}, "cdi", Images(), {}),
                         *resources.webhooks_and_apiservice("cdi", "QVBJ", "UFJPWFk=")]}
    apiservice = objects[("APIService", "", "v1beta1.upload.extensions.cdi.dev")]["spec"]
    assert apiservice["service"] == {"namespace": "cdi", "name": "cdi-uploadproxy", "port": 8444}
    assert (apiservice["group"], apiservice["version"], apiservice["caBundle"]) == (
        "upload.extensions.cdi.dev", "v1beta1", "UFJPWFk=")
    assert {"name": "aggregation", "port": 8444, "targetPort": 8444, "protocol": "TCP"} in \
        objects[("Service", "cdi", "cdi-uploadproxy")]["spec"]["ports"]
    pod = objects[("Deployment", "cdi", "cdi-uploadproxy")]["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--aggregation-listen") + 1] == "0.0.0.0:8444"
    state = args[args.index("--state-dir") + 1]
    assert {"name": "state", "mountPath": state} in pod["containers"][0]["volumeMounts"]
    assert {"name": "state", "emptyDir": {}} in pod["volumes"]
    binding = objects[("RoleBinding", "kube-system", "cdi-uploadproxy-auth-reader")]
    assert binding["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "cdi-uploadproxy", "namespace": "cdi"}]
    upload = {"apiGroups": ["upload.extensions.cdi.dev"], "resources": ["uploads/proxy"], "verbs": ["create", "get"]}
    for role in ("admin", "edit"):
        assert upload in objects[("ClusterRole", "", f"cdi.kubevirt.io:{role}")]["rules"]
    assert not any("upload.extensions.cdi.dev" in rule["apiGroups"]
                   for rule in objects[("ClusterRole", "", "cdi.kubevirt.io:view")]["rules"])
