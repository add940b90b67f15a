"""Worker pods end to end (issue #15 points 4 and 5) on one `cdi up`: CDIConfig's
`importProxy.trustedCAProxy` behind a real HTTPS-intercepting proxy, and upload and importer pods that
get the same placement, resources, pull secrets, priority class, security context and pass-through
annotations from the CDI CR, CDIConfig and the DataVolume."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdi.common import pki
from tests.e2e.importing import condition, datavolume, read_back, set_import_proxy, wait_phase
from tests.e2e.uploading import upload_dv
from tests.e2e.workloads import new_namespace
from tests.support.cluster import Kubectl, wait_for
from tests.support.images import Image
from tests.support.interceptproxy import InterceptingProxy
from tests.support.servers import FileServer
from tests.support.sourceservers import PASSWORD, USER

CDI_NAMESPACE = "cdi"

# the legacy path: these tests look at the pods and objects named after the DataVolume's claim
LEGACY = {"cdi.kubevirt.io/storage.usePopulator": "false"}


def patch_cdi(k: Kubectl, spec: dict[str, Any]) -> None:
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": spec}))


def wait_config_status(k: Kubectl, field: str, value: Any) -> None:
    """Until CDIConfig's status shows `value` (the controller has then seen the CDI CR that set it)."""
    wait_for(lambda: k.json("get", "cdiconfig", "config")["status"].get(field) == value, 30,
             message=f"CDIConfig status.{field} {value}")


# -- point 4: importProxy.trustedCAProxy ----------------------------------------------------------------
@pytest.fixture
def intercepting_proxy(ca: pki.KeyPair, tmp_path: Path) -> Iterator[InterceptingProxy]:
    proxy = InterceptingProxy(pki.make_ca("intercepting proxy CA"), ca.cert_pem, tmp_path)
    yield proxy
    proxy.close()


def test_trusted_ca_proxy_is_copied_into_the_import_namespace_and_trusted(
        k: Kubectl, https_server: FileServer, images: dict[str, Image],
        intercepting_proxy: InterceptingProxy) -> None:
    """An HTTPS source reached through a proxy that intercepts TLS: the importer has no CA for the
    origin's certificate, only the proxy's bundle that CDIConfig names (`trustedCAProxy`, a ConfigMap in
    CDI's namespace). As in CDI, the controller copies it into the DataVolume's namespace as
    `import-proxy-cm-<pvc>`, the importer pod mounts it at /proxycerts, and the copy is removed when the
    import is done."""
    image, proxy = images["raw.img"], intercepting_proxy
    ns, name, bundle = new_namespace(k, "proxyca"), "through-proxy", "proxy-ca-bundle"
    copy = f"import-proxy-cm-{name}"
    k.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": ns},
             "stringData": {"accessKeyId": USER, "secretKey": PASSWORD}})
    k.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": bundle, "namespace": CDI_NAMESPACE},
             "data": {"ca.pem": proxy.ca.cert_pem.decode()}})
    proxy.hold()  # every tunnel waits after its CONNECT: the import is caught in the middle
    try:
        set_import_proxy(k, {"HTTPSProxy": proxy.url, "trustedCAProxy": bundle})
        source = {"http": {"url": f"{https_server.url}/{image.name}", "secretRef": "creds"}}
        k.apply({**datavolume(name, source, "64Mi"),
                 "metadata": {"name": name, "namespace": ns, "annotations": LEGACY}})
        wait_for(lambda: proxy.tunnels, 90, message="the importer's CONNECT at the proxy")
        assert proxy.tunnels[0] == https_server.url.removeprefix("https://")
        copied = k.get("configmap", copy, ns)
        assert copied["data"] == {"ca.pem": proxy.ca.cert_pem.decode()}
        assert [(r["kind"], r["name"]) for r in copied["metadata"]["ownerReferences"]] == [
            ("PersistentVolumeClaim", name)]
        pod = k.get("pod", f"importer-{name}", ns)
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "cdi-proxy-cert-vol")
        assert volume["configMap"]["name"] == copy
        container = pod["spec"]["containers"][0]
        assert {"name": "cdi-proxy-cert-vol", "mountPath": "/proxycerts"} in container["volumeMounts"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["IMPORTER_PROXY_CERT_DIR"] == "/proxycerts" and env["https_proxy"] == proxy.url
        assert "IMPORTER_CERT_DIR" not in env  # nothing but the proxy's bundle to trust
        proxy.release()
        wait_phase(k, name, "Succeeded", namespace=ns)
    finally:
        proxy.release()
        set_import_proxy(k, None)
        k("delete", "configmap", bundle, "-n", CDI_NAMESPACE, "--ignore-not-found")
    assert proxy.intercepted >= 1  # the importer accepted the proxy's certificate for the origin
    assert read_back(k, name, image.virtual_size, namespace=ns) == image.sha256
    wait_for(lambda: not k.exists("configmap", copy, ns), 30, message=f"{copy} removed after the import")


def test_a_missing_trusted_ca_proxy_bundle_is_reported_and_waited_for(
        k: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    """CDIConfig names a bundle CDI's namespace does not have: instead of an importer pod hanging in
    ContainerCreating, the DataVolume's Running condition and a Warning event say which ConfigMap is
    missing, and the import starts once it is there."""
    image = images["raw.img"]
    ns, name, bundle = new_namespace(k, "proxyca"), "waits-for-bundle", "late-proxy-ca"
    try:
        set_import_proxy(k, {"trustedCAProxy": bundle})
        k.apply({**datavolume(name, {"http": {"url": f"{range_server.url}/{image.name}"}}, "64Mi"),
                 "metadata": {"name": name, "namespace": ns, "annotations": LEGACY}})

        def reported() -> bool:
            conditions = (k.get("dv", name, ns).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Running" and c.get("reason") == "ErrResourceDoesntExist" for c in conditions)
        wait_for(reported, 60, message="the missing bundle in the Running condition")
        message = condition(k.get("dv", name, ns), "Running")["message"]
        assert f'ConfigMap "{bundle}"' in message and f'namespace "{CDI_NAMESPACE}"' in message
        warnings = k("get", "events", "-n", ns, "--field-selector", "type=Warning",
                     "-o", "jsonpath={.items[*].reason}").stdout.split()
        assert "ErrResourceDoesntExist" in warnings
        assert not k.exists("pod", f"importer-{name}", ns)
        k.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": bundle, "namespace": CDI_NAMESPACE},
                 "data": {"ca.pem": pki.make_ca("late proxy CA").cert_pem.decode()}})
        wait_phase(k, name, "Succeeded", namespace=ns)
    finally:
        set_import_proxy(k, None)
        k("delete", "configmap", bundle, "-n", CDI_NAMESPACE, "--ignore-not-found")
    assert read_back(k, name, image.virtual_size, namespace=ns) == image.sha256
    wait_for(lambda: not k.exists("configmap", f"import-proxy-cm-{name}", ns), 30, message="the copy removed")


# -- point 5: one way to build worker pods ----------------------------------------------------------------
PLACEMENT = {
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "cdi.example/dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
}
RESOURCES = {"limits": {"cpu": "1", "memory": "700M"}, "requests": {"cpu": "50m", "memory": "50M"}}
PULL_SECRETS = [{"name": "worker-pull-secret"}]
PASS_THROUGH = {
    "k8s.v1.cni.cncf.io/networks": '[{"name": "storage-net", "namespace": "default"}]',
    "v1.multus-cni.io/default-network": "default/ovn-primary",
    "linkerd.io/inject": "enabled",
}
SHARED_SPEC = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "serviceAccountName",
               "imagePullSecrets", "securityContext", "enableServiceLinks")
SHARED_CONTAINER = ("resources", "securityContext", "imagePullPolicy", "terminationMessagePolicy")
PRIORITY_CLASS = "cdi.kubevirt.io/storage.pod.priorityclassname"
SERVICE_ACCOUNT = "cdi.kubevirt.io/storage.pod.serviceAccountName"
PASSED_KEYS = (*PASS_THROUGH, "sidecar.istio.io/inject", PRIORITY_CLASS, SERVICE_ACCOUNT)


def shared_parts(pod: dict[str, Any]) -> dict[str, Any]:
    """What every worker pod gets from the cluster's configuration and the DataVolume, whatever it does."""
    annotations = pod["metadata"].get("annotations") or {}
    return {"annotations": {key: annotations.get(key) for key in PASSED_KEYS},
            **{key: pod["spec"].get(key) for key in SHARED_SPEC},
            "containers": [{key: c.get(key) for key in SHARED_CONTAINER} for c in pod["spec"]["containers"]]}


def test_upload_and_importer_pods_share_placement_resources_and_pass_through_annotations(k: Kubectl) -> None:
    """The CDI CR's `spec.workload`, CDIConfig's pod resources and pull secrets, the DataVolume's
    priority class, service account (as a spec field, or as CDI's annotation on the DataVolume) and
    Multus/Linkerd annotations: an upload pod and an importer pod get the same."""
    ns = new_namespace(k, "workerpods")
    k.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "worker-sa", "namespace": ns}})
    try:
        patch_cdi(k, {"workload": PLACEMENT,
                      "config": {"podResourceRequirements": RESOURCES, "imagePullSecrets": PULL_SECRETS}})
        wait_config_status(k, "defaultPodResourceRequirements", RESOURCES)
        wait_config_status(k, "imagePullSecrets", PULL_SECRETS)
        imported = datavolume("imported", {"blank": {}}, "16Mi",  # its finished pod kept for a look
                              annotations={"cdi.kubevirt.io/storage.pod.retainAfterCompletion": "true"})
        uploaded = upload_dv("uploaded", "16Mi")
        for dv in (imported, uploaded):
            dv["metadata"].update(namespace=ns, annotations={**dv["metadata"].get("annotations", {}), **PASS_THROUGH,
                                                             **LEGACY})
            dv["spec"]["priorityClassName"] = "system-cluster-critical"
        imported["spec"]["serviceAccountName"] = "worker-sa"
        uploaded["metadata"]["annotations"][SERVICE_ACCOUNT] = "worker-sa"
        for dv in (imported, uploaded):
            k.apply(dv)
        wait_phase(k, "imported", "Succeeded", namespace=ns)
        wait_phase(k, "uploaded", "UploadReady", namespace=ns)
        importer, upload = k.get("pod", "importer-imported", ns), k.get("pod", "cdi-upload-uploaded", ns)
    finally:
        patch_cdi(k, {"workload": None, "config": {"podResourceRequirements": None, "imagePullSecrets": None}})
    expected = {
        "annotations": {**PASS_THROUGH, "sidecar.istio.io/inject": "false",
                        PRIORITY_CLASS: "system-cluster-critical", SERVICE_ACCOUNT: "worker-sa"},
        **PLACEMENT, "priorityClassName": "system-cluster-critical", "serviceAccountName": "worker-sa",
        "imagePullSecrets": PULL_SECRETS,
        "securityContext": {"fsGroup": 107, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "enableServiceLinks": False,
        "containers": [{"resources": RESOURCES, "imagePullPolicy": "IfNotPresent",
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "runAsNonRoot": True, "runAsUser": 107,
                                            "seccompProfile": {"type": "RuntimeDefault"}}}],
    }
    assert shared_parts(upload) == shared_parts(importer) == expected
