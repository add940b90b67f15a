"""cdi's operator installed where CDI's ran (issue 29 item 1): one pass over what CDI's operator left
(its CDI resource, component Deployments, webhook configurations, RSA certificates, `cdi-config`), against
the in-memory fake client. The real-cluster scenario (tests/realk8s/takeover.py) does the same on the kit."""

from __future__ import annotations

import base64
from typing import Any

from cryptography import x509

from cdi.api import groups
from cdi.common import pki
from cdi.operator.reconciler import Operator
from cdi.operator.resources import DEPLOYMENTS, Images
from tests.support.cdistate import rsa_ca
from tests.support.fakekube import FakeKube

Obj = dict[str, Any]
NS = "cdi"
SPEC = {"imagePullPolicy": "IfNotPresent", "uninstallStrategy": "BlockUninstallIfWorkloadsExist",
        "config": {"featureGates": ["HonorWaitForFirstConsumer"]},
        "certConfig": {"ca": {"duration": "72h", "renewBefore": "24h"}},
        "infra": {"nodeSelector": {"kubernetes.io/os": "linux"}}}


def hook_config(name: str, service: str, namespace: str = NS) -> Obj:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{"name": f"{name}.example", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "clientConfig": {"service": {"namespace": namespace, "name": service, "path": "/x"}},
                          "rules": []}]}


def left_by_cdis_operator(kube: FakeKube) -> bytes:
    """CDI's CDI resource, `cdi-config`, controller Deployment, webhooks and apiserver CA; the CA's PEM."""
    cr = kube.add(groups.CDIS, {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
        "metadata": {"name": "cdi", "finalizers": ["operator.cdi.kubevirt.io"],
                     "annotations": {"cdi.kubevirt.io/configAuthority": ""}},
        "spec": SPEC,
        "status": {"phase": "Deployed", "operatorVersion": "v1.62.0", "targetVersion": "v1.62.0",
                   "observedVersion": "v1.62.0",
                   "conditions": [{"type": "Available", "status": "True", "reason": "Completed"}]}})
    kube.add(groups.CONFIGMAPS, {"metadata": {"name": "cdi-config", "namespace": NS,
                                              "labels": {"operator.cdi.kubevirt.io": ""},
                                              "ownerReferences": [{"apiVersion": "cdi.kubevirt.io/v1beta1",
                                                                   "kind": "CDI", "name": "cdi",
                                                                   "uid": cr["metadata"]["uid"],
                                                                   "controller": True}]}})
    kube.add(DEPLOYMENTS, {  # CDI's controller Deployment: same name and selector, CDI's probe and volumes
        "metadata": {"name": "cdi-deployment", "namespace": NS,
                     "labels": {"cdi.kubevirt.io": "", "app.kubernetes.io/managed-by": "cdi-operator"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"cdi.kubevirt.io": "cdi-deployment"}},
                 "template": {"metadata": {"labels": {"cdi.kubevirt.io": "cdi-deployment"}}, "spec": {
                     "serviceAccountName": "cdi-sa",
                     "containers": [{"name": "cdi-deployment", "image": "quay.io/kubevirt/cdi-controller:v1.62.0",
                                     "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}},
                                     "volumeMounts": [{"name": "cdi-api-signing-key",
                                                       "mountPath": "/var/run/cdi/token/keys"}]}],
                     "volumes": [{"name": "cdi-api-signing-key", "secret": {"secretName": "cdi-api-signing-key"}}]}}}})
    kube.add(groups.VALIDATING_WEBHOOKS, hook_config("objecttransfer-api-validate", "cdi-api"))
    kube.add(groups.VALIDATING_WEBHOOKS, hook_config("virt-api-validator", "virt-api", "kubevirt"))
    cert, key = rsa_ca("cdi-apiserver-signer")
    kube.add(groups.SECRETS, {"type": "kubernetes.io/tls",
                              "metadata": {"name": "cdi-apiserver-signer", "namespace": NS},
                              "data": {"tls.crt": base64.b64encode(cert).decode(),
                                       "tls.key": base64.b64encode(key).decode()}})
    kube.add(groups.CONFIGMAPS, {"metadata": {"name": "cdi-apiserver-signer-bundle", "namespace": NS},
                                 "data": {"ca-bundle.crt": cert.decode()}})
    return cert


async def test_a_pass_over_what_cdis_operator_left_takes_it_over() -> None:
    kube = FakeKube(NS)
    cdis_ca = left_by_cdis_operator(kube)
    config = kube.object(groups.CONFIGMAPS, "cdi-config", NS)
    assert config is not None
    await Operator(kube, NS, Images()).reconcile()

    # cdi's controller Deployment in place of CDI's (nothing of CDI's merged into it)
    deployment = kube.object(DEPLOYMENTS, "cdi-deployment", NS)
    assert deployment is not None
    assert deployment["metadata"]["labels"]["cdi.kubevirt.io/component"] == "cdi-deployment"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert set(container["readinessProbe"]) - {"periodSeconds", "failureThreshold"} == {"httpGet"}
    assert "volumes" not in deployment["spec"]["template"]["spec"]
    # CDI's webhook for what cdi-api does not serve is gone; what is not CDI's stays
    assert kube.object(groups.VALIDATING_WEBHOOKS, "objecttransfer-api-validate") is None
    assert kube.object(groups.VALIDATING_WEBHOOKS, "virt-api-validator") is not None
    assert kube.object(groups.VALIDATING_WEBHOOKS, "cdi-api-datavolume-validate") is not None
    # CDI's RSA CA replaced by one cdi signs with; the bundle trusts both while CDI's is valid
    secret = kube.object(groups.SECRETS, "cdi-apiserver-signer", NS)
    assert secret is not None
    ours = pki.KeyPair(base64.b64decode(secret["data"]["tls.crt"]), base64.b64decode(secret["data"]["tls.key"]))
    assert pki.can_sign(ours)
    bundle = kube.object(groups.CONFIGMAPS, "cdi-apiserver-signer-bundle", NS)
    assert bundle is not None
    trusted = x509.load_pem_x509_certificates(bundle["data"]["ca-bundle.crt"].encode())
    assert x509.load_pem_x509_certificate(cdis_ca) in trusted and ours.certificate() in trusted
    # the CDI resource: the admin's spec, CDI's finalizer, not refused: upgrading from CDI's version to cdi's
    # (lower, but CDI's components are not cdi's: no downgrade), as CDI's operator upgrades
    now = kube.object(groups.CDIS, "cdi")
    assert now is not None
    assert now["spec"] == SPEC and now["metadata"]["finalizers"] == ["operator.cdi.kubevirt.io"]
    assert now["status"]["phase"] == "Upgrading" and now["status"]["operatorVersion"] == Images().tag
    assert now["status"]["targetVersion"] == Images().tag
    assert now["status"]["observedVersion"] == "v1.62.0"  # until cdi's components are ready
    # CDI's cdi-config as it was: the way back to CDI's operator
    after = kube.object(groups.CONFIGMAPS, "cdi-config", NS)
    assert after is not None and after["metadata"]["resourceVersion"] == config["metadata"]["resourceVersion"]

    # a second pass deletes nothing of cdi's own
    await Operator(kube, NS, Images()).reconcile()
    again = kube.object(DEPLOYMENTS, "cdi-deployment", NS)
    assert again is not None and again["metadata"]["uid"] == deployment["metadata"]["uid"]


async def test_cdi_config_is_made_as_cdi_makes_it_for_the_way_back() -> None:
    kube = FakeKube(NS)
    cr = kube.add(groups.CDIS, {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
                                "metadata": {"name": "cdi"}, "spec": {}})
    await Operator(kube, NS, Images()).reconcile()
    config = kube.object(groups.CONFIGMAPS, "cdi-config", NS)
    assert config is not None
    assert config["metadata"]["labels"]["operator.cdi.kubevirt.io"] == ""
    [owner] = config["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("CDI", "cdi", cr["metadata"]["uid"],
                                                                                  True)


async def test_once_its_components_are_ready_the_resource_says_they_are_cdis() -> None:
    """A resource saying Deployed and Available with CDI's versions (CDI's operator, not yet removed, wrote its
    status again) over cdi's ready components: cdi's pass writes its own observedVersion (what CDI's operator
    upgrades from, going back), where Deployed and Available alone looked like nothing to do."""
    kube = FakeKube(NS)
    left_by_cdis_operator(kube)
    operator = Operator(kube, NS, Images())
    operator.deployments = kube.informer(DEPLOYMENTS)  # what the running operator's informer would hold
    await operator.reconcile()
    for deployment in kube.objects(DEPLOYMENTS, NS):
        want = deployment["spec"]["replicas"]
        deployment["status"] = {"observedGeneration": deployment["metadata"].get("generation", 1),
                                "replicas": want, "readyReplicas": want, "updatedReplicas": want}
        kube.add(DEPLOYMENTS, deployment)
    cdis = kube.object(groups.CDIS, "cdi")
    assert cdis is not None
    cdis["status"] = {"phase": "Deployed", "operatorVersion": "v1.62.0", "targetVersion": "v1.62.0",
                      "observedVersion": "v1.62.0", "conditions": [{"type": "Available", "status": "True"}]}
    kube.add(groups.CDIS, cdis)
    await operator.reconcile()
    cr = kube.object(groups.CDIS, "cdi")
    assert cr is not None
    assert cr["status"]["phase"] == "Deployed" and cr["status"]["observedVersion"] == Images().tag
    assert next(c for c in cr["status"]["conditions"] if c["type"] == "Available")["status"] == "True"
