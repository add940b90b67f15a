"""Nobody reads another namespace's data: two users, each with rights in one namespace only, attack as
issue 26 found they could. Each attack reads the bytes back (or finds no claim to read) to prove that
nothing crossed: the victim's volume holds a marker that must never show up in the attacker's namespace.

- a forged AdmissionReview sent straight to cdi-apiserver's webhook (from the host and from a pod) gets no
  clone token: the webhooks answer only the API server's client certificate;
- a clone token minted by any means (here: signed with the apiserver's key, as the open webhook once
  signed one for a `userInfo` of the caller's choosing) is dropped by admission on every clone path
  (static volume, pre-populated, `sourceRef`, snapshot, PVC), and added on an update it is dropped too;
- a claim's own annotations do not choose the clone populator's source;
- a PVC's `dataSourceRef.namespace` is dropped without the CrossNamespaceVolumeDataSource gate, and with it
  a PersistentVolumeClaim, VolumeSnapshot or VolumeCloneSource of another namespace fills a claim only
  where a ReferenceGrant there allows it."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi.api import referencegrant
from cdi.common import uploadtoken
from tests.e2e.target import TARGET, External, own_cluster
from tests.e2e.workloads import get, new_namespace, pod, pvc, run_to_completion, wait_bound
from tests.support.cluster import CdiUp, Kubectl, wait_for

MARKER = "victim-secret-0123456789"
USERS = {"alice": "alice-token-0123456789", "mallory": "mallory-token-0123456789"}
CLONE_TOKEN = "cdi.kubevirt.io/storage.clone.token"
EXTENDED_TOKEN = "cdi.kubevirt.io/storage.extended.clone.token"
PERSONAL_RULES = [{"apiGroups": ["cdi.kubevirt.io"], "verbs": ["*"],
                   "resources": ["datavolumes", "datasources", "volumeclonesources", "volumeimportsources"]},
                  {"apiGroups": [""], "verbs": ["*"], "resources": ["persistentvolumeclaims", "pods", "pods/log"]},
                  {"apiGroups": ["snapshot.storage.k8s.io"], "verbs": ["*"], "resources": ["volumesnapshots"]},
                  {"apiGroups": [""], "verbs": ["get", "list", "watch"], "resources": ["events"]}]

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp | External]:
    """`cdi up` with two users and the CrossNamespaceVolumeDataSource gate on; a real cluster as it is."""
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.csv"
    tokens.write_text("".join(f'{token},{name},{1000 + i},"people"\n' for i, (name, token) in enumerate(USERS.items())))
    yield from own_cluster(tmp_path_factory, "isolation", "--token-auth-file", str(tokens),
                           "--feature-gates", f"{referencegrant.FEATURE_GATE}=true")


@pytest.fixture(scope="module")
def k(cluster: CdiUp | External, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("kc"))


def gate_on() -> bool:
    return TARGET.cross_namespace_gate is not False  # this module's `cdi up` runs with it


class User:
    """Someone with every right in one namespace and none elsewhere: a token user of `cdi up`, or on a
    real cluster a ServiceAccount of that namespace with a token from the TokenRequest API."""

    def __init__(self, admin: Kubectl, name: str, namespace: str, workdir: Path) -> None:
        self.namespace = namespace
        if TARGET.embedded:
            self.name, token = name, USERS[name]
        else:
            admin("create", "serviceaccount", name, "-n", namespace)
            self.name = f"system:serviceaccount:{namespace}:{name}"
            token = admin("create", "token", name, "-n", namespace, "--duration", "1h").stdout.strip()
        admin.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                     "metadata": {"name": f"{name}-own"}, "rules": PERSONAL_RULES}, "-n", namespace)
        admin.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": f"{name}-own"},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-own"},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": self.name}]},
                    "-n", namespace)
        # a kubeconfig holding only the token: the admin's may hold a client certificate, which would win
        view = yaml.safe_load(admin("config", "view", "--raw", "--minify").stdout)
        cluster = view["clusters"][0]
        config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
                  "users": [{"name": name, "user": {"token": token}}],
                  "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name,
                                                          "namespace": namespace}}],
                  "current-context": name}
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / f"{name}.kubeconfig"
        path.write_text(json.dumps(config))
        self.k = Kubectl(path, workdir / f"{name}-cache")


def victim(k: Kubectl, prefix: str) -> str:
    """A namespace whose claim `secret` holds the marker."""
    ns = new_namespace(k, prefix)
    k.apply(pvc("secret", "64Mi", storage_class=TARGET.storage_class), "-n", ns)
    run_to_completion(k, ns, pod("fill", f"printf {MARKER} > /data/disk.img", "secret"))
    return ns


def snapshot_of(k: Kubectl, ns: str, claim: str, name: str) -> None:
    k.apply({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": name},
             "spec": {"volumeSnapshotClassName": TARGET.snapshot_class,
                      "source": {"persistentVolumeClaimName": claim}}}, "-n", ns)
    wait_for(lambda: ((get(k, "volumesnapshot", name, ns) or {}).get("status") or {}).get("readyToUse"), 120, 0.2,
             message=f"snapshot {ns}/{name} ready")


def holds_marker(k: Kubectl, ns: str, claim: str, reader: str) -> bool:
    """Whether the claim, if it is bound, holds the victim's bytes (read back by a pod)."""
    obj = get(k, "pvc", claim, ns)
    if obj is None or (obj.get("status") or {}).get("phase") != "Bound":
        return False
    out = run_to_completion(k, ns, pod(reader, "cat /data/disk.img 2>/dev/null; true", claim))
    return MARKER in out


def events_of(k: Kubectl, ns: str, name: str) -> list[tuple[str, str]]:
    items = k.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    return [(e["reason"], e["message"]) for e in items]


def cdi_namespace(k: Kubectl) -> str:
    found = k.json("get", "services", "-A", "--field-selector", "metadata.name=cdi-api")["items"]
    assert found, "no cdi-api Service"
    return str(found[0]["metadata"]["namespace"])


def forged_review(target_ns: str, source_ns: str) -> dict[str, Any]:
    """What an attacker sends the DataVolume webhook: a clone into their namespace, as a cluster admin."""
    dv = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
          "metadata": {"name": "stolen", "namespace": target_ns},
          "spec": {"source": {"pvc": {"namespace": source_ns, "name": "secret"}},
                   "storage": {"resources": {"requests": {"storage": "64Mi"}}}}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "0f0f0f0f-0000-4000-8000-000000000000", "operation": "CREATE", "namespace": target_ns,
        "name": "stolen", "object": dv, "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "kind": {"group": "cdi.kubevirt.io", "version": "v1beta1", "kind": "DataVolume"},
        "resource": {"group": "cdi.kubevirt.io", "version": "v1beta1", "resource": "datavolumes"}}}


FORGE_SCRIPT = """
import json, ssl, sys, urllib.request, urllib.error
context = ssl.create_default_context(); context.check_hostname = False; context.verify_mode = ssl.CERT_NONE
request = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, context=context, timeout=20) as answer:
        print(answer.status, answer.read().decode())
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode())
except (OSError, ssl.SSLError) as exc:
    print("refused", exc)
"""


def post_forged(url: str, review: dict[str, Any]) -> str:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(url, data=json.dumps(review).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=20) as answer:
            return f"{answer.status} {answer.read().decode()}"
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {exc.read().decode()}"


@pytest.mark.anycluster
def test_the_webhooks_answer_only_the_api_server(k: Kubectl) -> None:
    if not TARGET.webhook_client_auth:
        pytest.skip("the cluster's API server presents no client certificate to webhooks "
                    "(CDI_E2E_WEBHOOK_CLIENT_AUTH=0)")
    source_ns = victim(k, "iso-hookv")
    attacker_ns = new_namespace(k, "iso-hooka")
    service = k.json("get", "service", "cdi-api", "-n", cdi_namespace(k))
    url = f"https://{service['spec']['clusterIP']}:443/datavolume-mutate"
    review = forged_review(attacker_ns, source_ns)

    from_host = post_forged(url, review)
    assert from_host.startswith("403 "), from_host
    assert "admission webhooks answer only the API server" in from_host
    assert "patch" not in from_host

    from_pod = run_to_completion(k, attacker_ns, pod("forge", FORGE_SCRIPT, python=True,
                                                     extra={"args": [url, json.dumps(review)]}))
    assert from_pod.startswith("403 "), from_pod
    assert "patch" not in from_pod

    # the API server itself still gets its answers: a clone the admin may make gets its token
    manifest = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "allowed"},
                "spec": {"source": {"pvc": {"namespace": source_ns, "name": "secret"}},
                         "storage": {"storageClassName": TARGET.storage_class,
                                     "resources": {"requests": {"storage": "64Mi"}}}}}
    k("create", "-f", "-", "-n", attacker_ns, input=json.dumps(manifest))
    assert CLONE_TOKEN in get(k, "datavolume", "allowed", attacker_ns)["metadata"]["annotations"]


def minted_token(k: Kubectl, kind: str, source_ns: str, source_name: str, target_ns: str, target_name: str) -> str:
    """A clone token as the open webhook once signed one for anybody: with cdi-apiserver's own key."""
    secret = k.json("get", "secret", "cdi-api-signing-key", "-n", cdi_namespace(k))
    key = base64.b64decode(secret["data"]["id_rsa"])
    return uploadtoken.issue(key, source_ns, source_name, operation=uploadtoken.OPERATION_CLONE,
                             resource=uploadtoken.PVC_RESOURCE if kind == "pvc" else uploadtoken.SNAPSHOT_RESOURCE,
                             params={"targetNamespace": target_ns, "targetName": target_name})


@pytest.mark.anycluster
def test_a_clone_token_the_api_server_did_not_write_reads_nothing(k: Kubectl, tmp_path: Path) -> None:
    source_ns = victim(k, "iso-tokv")
    snapshot_of(k, source_ns, "secret", "secret-snap")
    ns = new_namespace(k, "iso-toka")
    mallory = User(k, "mallory", ns, tmp_path)
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource", "metadata": {"name": "golden"},
             "spec": {"source": {"pvc": {"namespace": source_ns, "name": "secret"}}}}, "-n", ns)
    pvc_source = {"pvc": {"namespace": source_ns, "name": "secret"}}
    snap_source = {"snapshot": {"namespace": source_ns, "name": "secret-snap"}}
    cases = {  # name: (spec, annotations besides the token, kind of source)
        "static": ({"source": pvc_source}, {"cdi.kubevirt.io/storage.checkStaticVolume": ""}, "pvc"),
        "prepop": ({"source": pvc_source}, {"cdi.kubevirt.io/storage.prePopulated": "prepop"}, "pvc"),
        "by-ref": ({"sourceRef": {"kind": "DataSource", "name": "golden"}},
                   {"cdi.kubevirt.io/storage.checkStaticVolume": ""}, "pvc"),
        # its DataSource does not exist yet, so admission sees no clone to check; mallory makes it later
        "late-ref": ({"sourceRef": {"kind": "DataSource", "name": "later"}}, {}, "pvc"),
        "by-snap": ({"source": snap_source}, {"cdi.kubevirt.io/storage.checkStaticVolume": ""}, "snapshot"),
    }
    for name, (spec, extra, kind) in cases.items():
        source_name = "secret-snap" if kind == "snapshot" else "secret"
        token = minted_token(k, kind, source_ns, source_name, ns, name)
        manifest = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                    "metadata": {"name": name, "annotations": {**extra, CLONE_TOKEN: token,
                                                               EXTENDED_TOKEN: token}},
                    "spec": {**spec, "storage": {"storageClassName": TARGET.storage_class,
                                                 "resources": {"requests": {"storage": "64Mi"}}}}}
        mallory.k("create", "-f", "-", "-n", ns, input=json.dumps(manifest))
        stored = get(k, "datavolume", name, ns)["metadata"].get("annotations") or {}
        assert CLONE_TOKEN not in stored and EXTENDED_TOKEN not in stored, (name, stored)
    mallory.k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource", "metadata": {"name": "later"},
                     "spec": {"source": {"pvc": {"namespace": source_ns, "name": "secret"}}}})

    # a plain PVC clone with the token: refused at admission, as without it
    token = minted_token(k, "pvc", source_ns, "secret", ns, "plain")
    refused = mallory.k("create", "-f", "-", "-n", ns, check=False, input=json.dumps({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "plain", "annotations": {CLONE_TOKEN: token}},
        "spec": {"source": pvc_source, "storage": {"resources": {"requests": {"storage": "64Mi"}}}}}))
    assert refused.returncode != 0
    assert f"has insufficient permissions in clone source namespace {source_ns}" in refused.stderr

    # a token added by an update is dropped as well
    mallory.k("annotate", "datavolume", "static", "-n", ns,
              f"{CLONE_TOKEN}={minted_token(k, 'pvc', source_ns, 'secret', ns, 'static')}")
    assert CLONE_TOKEN not in (get(k, "datavolume", "static", ns)["metadata"].get("annotations") or {})

    # the controller looked at each and refused to clone for want of a token
    for name in cases:
        wait_for(lambda n=name: ("CloneTokenInvalid", "token missing") in events_of(k, ns, n), 120, 0.5,
                 message=f"DataVolume {name} refused for want of a token: {events_of(k, ns, name)}")
    for name in cases:
        assert get(k, "datavolume", name, ns)["status"].get("phase") != "Succeeded"
        assert not holds_marker(k, ns, name, f"read-{name}")
    assert not [c for c in k.json("get", "pvc", "-n", source_ns)["items"]
                if c["metadata"]["name"].startswith("tmp-pvc-")], "a temporary claim in the victim's namespace"


@pytest.mark.anycluster
def test_a_claims_own_annotations_do_not_choose_its_clone_source(k: Kubectl, tmp_path: Path) -> None:
    source_ns = victim(k, "iso-annv")
    ns = new_namespace(k, "iso-anna")
    alice = User(k, "alice", ns, tmp_path)
    # her VolumeCloneSource names a claim of her own that does not exist yet; the claim's annotations
    # name the victim's, as the controller records a planned source
    alice.k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeCloneSource", "metadata": {"name": "mine"},
                   "spec": {"source": {"kind": "PersistentVolumeClaim", "name": "not-yet"}}})
    claim = pvc("target", "64Mi", storage_class=TARGET.copy_class)
    claim["spec"]["dataSourceRef"] = {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeCloneSource", "name": "mine"}
    claim["metadata"]["annotations"] = {
        "cdi.kubevirt.io/storage.clone.source": f"pvc/{source_ns}/secret", "cdi.kubevirt.io/cloneType": "copy",
        "cdi.kubevirt.io/clonePhase": "Pending", "cdi.kubevirt.io/dataSourceNamespace": source_ns}
    alice.k.apply(claim)
    wait_for(lambda: any(reason == "CloneSourceUnauthorized" for reason, _ in events_of(k, ns, "target")), 120, 0.5,
             message=f"the recorded source refused: {events_of(k, ns, 'target')}")
    assert not [c for c in k.json("get", "pvc", "-n", source_ns)["items"]
                if c["metadata"]["name"].startswith("tmp-pvc-")], "a temporary claim in the victim's namespace"
    assert not holds_marker(k, ns, "target", "read-target")


def cross_namespace_claim(name: str, kind: str, group: str, namespace: str, source: str) -> dict[str, Any]:
    claim = pvc(name, "64Mi", storage_class=TARGET.storage_class)
    claim["spec"]["dataSourceRef"] = {"apiGroup": group, "kind": kind, "name": source, "namespace": namespace}
    if not group:
        del claim["spec"]["dataSourceRef"]["apiGroup"]
    return claim


def test_without_the_gate_a_data_source_ref_stays_in_its_namespace(shared_kubectl: Kubectl) -> None:
    """`cdi up` without `--feature-gates` drops the field as kube-apiserver does (the realk8s tier runs the
    real one with the gate, for the scenarios above)."""
    k = shared_kubectl
    source_ns = victim(k, "iso-nogv")
    ns = new_namespace(k, "iso-noga")
    k.apply(cross_namespace_claim("stolen", "PersistentVolumeClaim", "", source_ns, "secret"), "-n", ns)
    stored = get(k, "pvc", "stolen", ns)["spec"]
    assert stored["dataSourceRef"] == {"kind": "PersistentVolumeClaim", "name": "secret"}  # the namespace dropped
    assert stored["dataSource"] == {"kind": "PersistentVolumeClaim", "name": "secret"}
    wait_for(lambda: any(reason == "ProvisioningFailed" for reason, _ in events_of(k, ns, "stolen")), 120, 0.5,
             message="the provisioner found no source claim of that name here")
    assert not holds_marker(k, ns, "stolen", "read-stolen")


@pytest.mark.anycluster
def test_with_the_gate_another_namespace_fills_a_claim_only_with_a_grant(k: Kubectl) -> None:
    if not gate_on():
        pytest.skip("the cluster runs without CrossNamespaceVolumeDataSource (CDI_E2E_CROSS_NAMESPACE_GATE=0)")
    if not TARGET.embedded:  # the kit's CRDs lack the Gateway API's; an admin installs them, as here
        k.apply(referencegrant.crd())
        k("wait", "--for=condition=Established", "crd/referencegrants.gateway.networking.k8s.io", "--timeout=60s")
    source_ns = victim(k, "iso-gatev")
    snapshot_of(k, source_ns, "secret", "secret-snap")
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeCloneSource", "metadata": {"name": "offer"},
             "spec": {"source": {"kind": "PersistentVolumeClaim", "name": "secret"}}}, "-n", source_ns)
    ns = new_namespace(k, "iso-gatea")
    # the provisioner's own kinds need a CSI driver that honours the gate: `cdi up`'s does; on a real cluster
    # that is the cluster's provisioner, and only the clone populator is cdi's
    kinds = [("VolumeCloneSource", "cdi.kubevirt.io", "offer")]
    if TARGET.embedded:
        kinds += [("PersistentVolumeClaim", "", "secret"), ("VolumeSnapshot", "snapshot.storage.k8s.io", "secret-snap")]
    for kind, group, source in kinds:
        name = f"from-{kind.lower()}"
        k.apply(cross_namespace_claim(name, kind, group, source_ns, source), "-n", ns)
        assert get(k, "pvc", name, ns)["spec"]["dataSourceRef"]["namespace"] == source_ns
    for kind, _, _ in kinds:
        name = f"from-{kind.lower()}"
        wait_for(lambda n=name: any("isn't allowed" in message for _, message in events_of(k, ns, n)), 120, 0.5,
                 message=f"{name} refused without a grant: {events_of(k, ns, name)}")
        assert (get(k, "pvc", name, ns).get("status") or {}).get("phase") == "Pending"
    assert not [c for c in k.json("get", "pvc", "-n", source_ns)["items"]
                if c["metadata"]["name"].startswith("tmp-pvc-")], "a temporary claim in the victim's namespace"

    # the source namespace's owner grants it: every kind fills the claim with the source's bytes
    k.apply({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
             "metadata": {"name": "share"},
             "spec": {"from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": ns}],
                      "to": [{"group": group, "kind": kind} for kind, group, _ in kinds]}}, "-n", source_ns)
    for kind, _, _ in kinds:
        name = f"from-{kind.lower()}"
        wait_bound(k, ns, name, timeout=180)
        assert holds_marker(k, ns, name, f"read-{name}")
