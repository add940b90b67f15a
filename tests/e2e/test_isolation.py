"""Nobody reads another namespace's data: two users, each with rights in one namespace only, attack as
issue 26 found they could. Alice owns namespace A and writes a marker disk there as herself; Mallory owns
namespace B and does every attack as herself (her own credentials, her own pods in B). Each scenario then
reads back, with Mallory's pods, what is in Mallory's volumes: Alice's marker is never there unless Alice
granted it (a claim that stays unbound cannot even be mounted: Mallory's reader pod is left unscheduled).

- a forged AdmissionReview sent straight to cdi-apiserver's webhook (from the host and from Mallory's pod)
  gets no clone token: the webhooks answer only the API server's client certificate;
- a clone token Mallory did not get from admission (forged: signed with the apiserver's key, as the open
  webhook once signed one for a `userInfo` of the caller's choosing; copied: the one admission wrote on
  Alice's own clone) is dropped on every clone path (static volume, pre-populated, `sourceRef`, snapshot,
  PVC), and added on an update it is dropped too;
- a claim's own annotations do not choose the clone populator's source;
- a PVC's `dataSourceRef.namespace` is dropped without the CrossNamespaceVolumeDataSource gate, and with it
  a PersistentVolumeClaim, VolumeSnapshot (where the cluster's provisioner honours the gate),
  VolumeCloneSource, VolumeImportSource or VolumeUploadSource of another namespace fills a claim only
  where a ReferenceGrant there, written by that namespace's owner, allows it.

The users: on `cdi up` two users of `--token-auth-file`; on a cluster the suite did not start, whose API
server has no token file of ours, a ServiceAccount per user with a token from the TokenRequest API
(`kubectl create token`). Either way each is bound to `admin` in their own namespace (plus the
VolumeSnapshots and ReferenceGrants an owner of a namespace is given where `admin` does not aggregate
them) and to nothing elsewhere, and acts through a kubeconfig holding only their token."""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi.api import referencegrant
from cdi.common import uploadtoken
from tests.e2e.target import TARGET, External, own_cluster
from tests.e2e.uploading import curl, token
from tests.e2e.workloads import get, new_namespace, pod, pvc, run_to_completion
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.servers import FileServer

MARKER = "victim-secret-0123456789"
MALLORYS = "mallory-own-bytes-9876543210"  # what Mallory writes or uploads herself
USERS = {"alice": "alice-token-0123456789", "mallory": "mallory-token-0123456789"}
CLONE_TOKEN = "cdi.kubevirt.io/storage.clone.token"
EXTENDED_TOKEN = "cdi.kubevirt.io/storage.extended.clone.token"
# what a namespace's owner has beyond `admin` (which aggregates CDI's kinds but neither of these)
OWNER_EXTRAS = [{"apiGroups": ["snapshot.storage.k8s.io"], "verbs": ["*"], "resources": ["volumesnapshots"]},
                {"apiGroups": ["gateway.networking.k8s.io"], "verbs": ["*"], "resources": ["referencegrants"]}]
GATEWAY_GROUP = "gateway.networking.k8s.io"
REFERENCEGRANTS_CRD = f"referencegrants.{GATEWAY_GROUP}"


def token_file(directory: Path) -> Path:
    path = directory / "tokens.csv"
    path.write_text("".join(f'{token},{name},{1000 + i},"people"\n' for i, (name, token) in enumerate(USERS.items())))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp | External]:
    """`cdi up` with the two users and the CrossNamespaceVolumeDataSource gate on; a real cluster as it is."""
    tokens = token_file(tmp_path_factory.mktemp("tokens"))
    yield from own_cluster(tmp_path_factory, "isolation", "--token-auth-file", str(tokens),
                           "--feature-gates", f"{referencegrant.FEATURE_GATE}=true")


@pytest.fixture(scope="module")
def k(cluster: CdiUp | External, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("kc"))


@dataclass
class User:
    """Someone with every right an owner has in one namespace and none elsewhere, acting through a
    kubeconfig that holds only their token."""

    name: str  # as RBAC knows them
    namespace: str
    k: Kubectl


class People:
    """Makes the users of a cluster: users of the token file its API server was started with, or (where
    the suite did not start it) ServiceAccounts with TokenRequest tokens."""

    def __init__(self, admin: Kubectl, workdir: Path, *, token_users: bool) -> None:
        self.admin, self.workdir, self.token_users = admin, workdir, token_users

    def owner(self, name: str, namespace: str) -> User:
        admin = self.admin
        if self.token_users:
            user, token = name, USERS[name]
            subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
        else:
            admin("create", "serviceaccount", name, "-n", namespace)
            user = f"system:serviceaccount:{namespace}:{name}"
            token = admin("create", "token", name, "-n", namespace, "--duration", "1h").stdout.strip()
            subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
        admin.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                     "metadata": {"name": f"{name}-owner-extras"}, "rules": OWNER_EXTRAS}, "-n", namespace)
        for kind, role in (("ClusterRole", "admin"), ("Role", f"{name}-owner-extras")):
            admin.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                         "metadata": {"name": f"{name}-{role}"}, "subjects": [subject],
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}},
                        "-n", namespace)
        # a kubeconfig holding only the token: the admin's may hold a client certificate, which would win
        view = yaml.safe_load(admin("config", "view", "--raw", "--minify").stdout)
        cluster = view["clusters"][0]
        config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
                  "users": [{"name": name, "user": {"token": token}}],
                  "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name,
                                                          "namespace": namespace}}],
                  "current-context": name}
        directory = self.workdir / namespace
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.kubeconfig"
        path.write_text(json.dumps(config))
        person = User(user, namespace, Kubectl(path, directory / f"{name}-cache"))
        # the authorizer has seen the bindings (a real API server's RBAC cache follows them a moment later)
        for resource in ("pods", "volumesnapshots.snapshot.storage.k8s.io"):  # each binding
            wait_for(partial(may, person, "create", resource, namespace), 30, 0.2,
                     message=f"{user} may create {resource} in {namespace}")
        assert not may(person, "get", "pods", "default")
        return person

    def pair(self, prefix: str) -> tuple[User, User]:
        """Alice, owning a fresh namespace A, and Mallory, owning a fresh namespace B."""
        alice = self.owner("alice", new_namespace(self.admin, f"{prefix}-a"))
        mallory = self.owner("mallory", new_namespace(self.admin, f"{prefix}-b"))
        assert not may(mallory, "get", "persistentvolumeclaims", alice.namespace)
        return alice, mallory


def may(user: User, verb: str, resource: str, namespace: str) -> bool:
    """What `kubectl auth can-i` tells the user."""
    return bool(user.k("auth", "can-i", verb, resource, "-n", namespace, check=False).stdout.strip() == "yes")


@pytest.fixture(scope="module")
def people(cluster: CdiUp | External, k: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> People:
    return People(k, tmp_path_factory.mktemp("people"), token_users=isinstance(cluster, CdiUp))


def gate_on() -> bool:
    return TARGET.cross_namespace_gate is not False  # this module's `cdi up` runs with it


# -- what Alice keeps, and what Mallory can read ---------------------------------------------------------

def write_marker(alice: User) -> None:
    """Alice's claim `secret` holds the marker, written by her own pod."""
    alice.k.apply(pvc("secret", "64Mi", storage_class=TARGET.storage_class), "-n", alice.namespace)
    run_to_completion(alice.k, alice.namespace, pod("fill", f"printf {MARKER} > /data/disk.img", "secret"))


def write_own(mallory: User, claim: str) -> None:
    """Mallory's own claim, holding her own bytes."""
    mallory.k.apply(pvc(claim, "64Mi", storage_class=TARGET.storage_class), "-n", mallory.namespace)
    run_to_completion(mallory.k, mallory.namespace, pod(f"fill-{claim}", f"printf {MALLORYS} > /data/disk.img", claim))


# what a pod finds at /data/disk.img: whether it is there, its size, and whether either marker is in it
# (read in chunks: an imported disk fills its 64 MiB claim)
READ = """
import json, os, sys
path, markers = "/data/disk.img", sys.argv[1:]
found = {"exists": os.path.exists(path), "size": 0, "holds": []}
if found["exists"]:
    found["size"] = os.path.getsize(path)
    keep, tail = max(len(m) for m in markers), b""
    with open(path, "rb") as disk:
        while chunk := disk.read(1 << 20):
            window = tail + chunk
            found["holds"] += [m for m in markers if m.encode() in window and m not in found["holds"]]
            tail = window[-keep:]
print(json.dumps(found))
"""

_readers = iter(range(1_000_000))


def read(user: User, claim: str) -> dict[str, Any]:
    """What the user's own pod finds in the claim (which must be bound)."""
    name = f"read-{next(_readers)}-{claim}"[:63].rstrip("-")
    manifest = pod(name, READ, claim, python=True, extra={"args": [MARKER, MALLORYS]})
    found: dict[str, Any] = json.loads(run_to_completion(user.k, user.namespace, manifest, timeout=120))
    user.k("delete", "pod", name, "-n", user.namespace, "--wait=false")
    return found


def cannot_mount(mallory: User, claim: str) -> None:
    """Mallory's pod reading an unbound claim is never scheduled: there is no volume to read."""
    name = f"read-{next(_readers)}-{claim}"[:63].rstrip("-")
    mallory.k.apply(pod(name, READ, claim, python=True, extra={"args": [MARKER, MALLORYS]}), "-n", mallory.namespace)

    def unschedulable() -> bool:
        status = (get(mallory.k, "pod", name, mallory.namespace) or {}).get("status") or {}
        assert status.get("phase") == "Pending", f"{name} ran on {claim}: {status}"
        return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and "unbound" in c.get("message", "")
                   for c in status.get("conditions") or [])
    wait_for(unschedulable, 60, 0.2, message=f"{name} unschedulable for its unbound claim {claim}")
    mallory.k("delete", "pod", name, "-n", mallory.namespace, "--wait=false")


def workers_claims(user: User) -> list[str]:
    """The claims cdi's workers make for a while in the user's namespace (clones' and populators')."""
    return [c["metadata"]["name"] for c in user.k.json("get", "pvc", "-n", user.namespace)["items"]
            if c["metadata"]["name"].startswith(("tmp-pvc-", "prime-"))]


def nothing_crossed(mallory: User) -> dict[str, dict[str, Any]]:
    """Every claim in Mallory's namespace read back by her pods: no bound one holds the marker, and no
    unbound one has a volume. What was read, by claim."""
    # a finished clone's temporary claims are going: read what stays
    wait_for(lambda: not [c for c in mallory.k.json("get", "pvc", "-n", mallory.namespace)["items"]
                          if c["metadata"].get("deletionTimestamp")], 60, 0.2, message="no claim being deleted")
    readings = {}
    for claim in mallory.k.json("get", "pvc", "-n", mallory.namespace)["items"]:
        name = claim["metadata"]["name"]
        if (claim.get("status") or {}).get("phase") == "Bound":
            readings[name] = read(mallory, name)
            assert MARKER not in readings[name]["holds"], f"Alice's marker in {mallory.namespace}/{name}"
        else:
            assert not claim["spec"].get("volumeName"), f"{name} is not bound, yet has a volume"
    return readings


def temporary_claims(alice: User) -> list[str]:
    """Clone claims in Alice's namespace, as she sees them (a clone out of it would make one)."""
    return [name for name in workers_claims(alice) if name.startswith("tmp-pvc-")]


def primes(user: User) -> list[str]:
    return [name for name in workers_claims(user) if name.startswith("prime-")]


def snapshot_of(user: User, claim: str, name: str) -> None:
    user.k.apply({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": name},
                  "spec": {"volumeSnapshotClassName": TARGET.snapshot_class,
                           "source": {"persistentVolumeClaimName": claim}}}, "-n", user.namespace)
    wait_for(lambda: ((get(user.k, "volumesnapshot", name, user.namespace) or {}).get("status") or {})
             .get("readyToUse"), 120, 0.2, message=f"snapshot {user.namespace}/{name} ready")


def events_of(user: User, name: str) -> list[tuple[str, str]]:
    items = user.k.json("get", "events", "-n", user.namespace, "--field-selector", f"involvedObject.name={name}")
    return [(e["reason"], e["message"]) for e in items["items"]]


def has_event(user: User, name: str, reason: str | None, words: str) -> bool:
    """Whether an event about `name` (of `reason`, if given) says `words`."""
    return any(reason in (None, r) and words in message for r, message in events_of(user, name))


def bound(user: User, claim: str) -> bool:
    return bool(((get(user.k, "pvc", claim, user.namespace) or {}).get("status") or {}).get("phase") == "Bound")


def wait_dv(user: User, name: str, phase: str, timeout: float = 120) -> None:
    def reached() -> bool:
        current = ((get(user.k, "datavolume", name, user.namespace) or {}).get("status") or {}).get("phase")
        assert current != "Failed" or phase == "Failed", f"DataVolume {name} failed"
        return current == phase
    wait_for(reached, timeout, 0.2, message=f"DataVolume {user.namespace}/{name} {phase}")


def clone_dv(name: str, source: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"source": source, "storage": {"storageClassName": TARGET.storage_class,
                                                   "resources": {"requests": {"storage": "64Mi"}}}}}


# -- the webhook endpoint ------------------------------------------------------------------------------

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
def test_the_webhooks_answer_only_the_api_server(k: Kubectl, people: People) -> None:
    if not TARGET.webhook_client_auth:
        pytest.skip("the cluster's API server presents no client certificate to webhooks "
                    "(CDI_E2E_WEBHOOK_CLIENT_AUTH=0)")
    alice, mallory = people.pair("iso-hook")
    write_marker(alice)
    # the Service's address: anyone in the cluster's network finds it (cdi-api.cdi.svc); Mallory needs no right
    service = k.json("get", "service", "cdi-api", "-n", TARGET.cdi_namespace)
    url = f"https://{service['spec']['clusterIP']}:443/datavolume-mutate"
    review = forged_review(mallory.namespace, alice.namespace)

    from_host = post_forged(url, review)
    assert from_host.startswith("403 "), from_host
    assert "admission webhooks answer only the API server" in from_host
    assert "patch" not in from_host

    from_pod = run_to_completion(mallory.k, mallory.namespace, pod("forge", FORGE_SCRIPT, python=True,
                                                                   extra={"args": [url, json.dumps(review)]}))
    assert from_pod.startswith("403 "), from_pod
    assert "patch" not in from_pod

    # through the API server she is answered for what she may do: her clone of her own disk gets its token,
    # her clone of Alice's is refused
    write_own(mallory, "mine")
    mallory.k("create", "-f", "-", input=json.dumps(clone_dv("own-copy", {"pvc": {"namespace": mallory.namespace,
                                                                                   "name": "mine"}})))
    assert CLONE_TOKEN in get(mallory.k, "datavolume", "own-copy", mallory.namespace)["metadata"]["annotations"]
    refused = mallory.k("create", "-f", "-", check=False, input=json.dumps(
        clone_dv("stolen", {"pvc": {"namespace": alice.namespace, "name": "secret"}})))
    assert refused.returncode != 0
    assert f"has insufficient permissions in clone source namespace {alice.namespace}" in refused.stderr
    wait_dv(mallory, "own-copy", "Succeeded")
    wait_for(lambda: not workers_claims(mallory), 60, 0.2, message="the clone's temporary claims gone")

    readings = nothing_crossed(mallory)
    assert readings["own-copy"]["holds"] == [MALLORYS], readings  # the reader reads: her clone of her bytes
    assert set(readings) == {"mine", "own-copy"}, readings  # and no other claim came from the forged reviews


# -- clone tokens ---------------------------------------------------------------------------------------

def minted_token(k: Kubectl, kind: str, source_ns: str, source_name: str, target_ns: str, target_name: str) -> str:
    """A clone token as the open webhook once signed one for anybody: with cdi-apiserver's own key."""
    secret = k.json("get", "secret", "cdi-api-signing-key", "-n", TARGET.cdi_namespace)
    key = base64.b64decode(secret["data"]["id_rsa"])
    return uploadtoken.issue(key, source_ns, source_name, operation=uploadtoken.OPERATION_CLONE,
                             resource=uploadtoken.PVC_RESOURCE if kind == "pvc" else uploadtoken.SNAPSHOT_RESOURCE,
                             params={"targetNamespace": target_ns, "targetName": target_name})


def copied_tokens(k: Kubectl, alice: User) -> dict[str, str]:
    """The tokens admission wrote on Alice's own clone of her disk, as a leak would hand them to Mallory
    (read by the admin here: Mallory cannot read Alice's namespace)."""
    alice.k("create", "-f", "-", input=json.dumps(clone_dv("own-copy", {"pvc": {"namespace": alice.namespace,
                                                                                 "name": "secret"}})))

    def written() -> dict[str, str]:
        annotations = get(k, "datavolume", "own-copy", alice.namespace)["metadata"].get("annotations") or {}
        return {key: annotations[key] for key in (CLONE_TOKEN, EXTENDED_TOKEN) if key in annotations}
    tokens: dict[str, str] = wait_for(written, 30, 0.2, message="the tokens of Alice's own clone")
    wait_dv(alice, "own-copy", "Succeeded")  # and its temporary claims gone: any found later are an attack's
    wait_for(lambda: not temporary_claims(alice), 60, 0.2, message="Alice's clone's temporary claims gone")
    return tokens


@pytest.mark.anycluster
def test_a_clone_token_the_api_server_did_not_write_reads_nothing(k: Kubectl, people: People) -> None:
    alice, mallory = people.pair("iso-tok")
    write_marker(alice)
    snapshot_of(alice, "secret", "secret-snap")
    copied = copied_tokens(k, alice)
    ns = mallory.namespace
    mallory.k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource", "metadata": {"name": "golden"},
                     "spec": {"source": {"pvc": {"namespace": alice.namespace, "name": "secret"}}}})
    pvc_source = {"pvc": {"namespace": alice.namespace, "name": "secret"}}
    snap_source = {"snapshot": {"namespace": alice.namespace, "name": "secret-snap"}}
    static = {"cdi.kubevirt.io/storage.checkStaticVolume": ""}
    cases: dict[str, tuple[dict[str, Any], dict[str, str], str]] = {  # name: (spec, other annotations, kind)
        "static": ({"source": pvc_source}, static, "pvc"),
        "prepop": ({"source": pvc_source}, {"cdi.kubevirt.io/storage.prePopulated": "prepop"}, "pvc"),
        "by-ref": ({"sourceRef": {"kind": "DataSource", "name": "golden"}}, static, "pvc"),
        # its DataSource does not exist yet, so admission sees no clone to check; Mallory makes it later
        "late-ref": ({"sourceRef": {"kind": "DataSource", "name": "later"}}, {}, "pvc"),
        "by-snap": ({"source": snap_source}, static, "snapshot"),
        "copied": ({"source": pvc_source}, static, "copied"),
    }
    for name, (spec, extra, kind) in cases.items():
        if kind == "copied":
            tokens = {CLONE_TOKEN: copied.get(CLONE_TOKEN) or copied[EXTENDED_TOKEN],
                      EXTENDED_TOKEN: copied.get(EXTENDED_TOKEN) or copied[CLONE_TOKEN]}
        else:
            forged = minted_token(k, kind, alice.namespace, "secret-snap" if kind == "snapshot" else "secret", ns, name)
            tokens = {CLONE_TOKEN: forged, EXTENDED_TOKEN: forged}
        manifest = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                    "metadata": {"name": name, "annotations": {**extra, **tokens}},
                    "spec": {**spec, "storage": {"storageClassName": TARGET.storage_class,
                                                 "resources": {"requests": {"storage": "64Mi"}}}}}
        mallory.k("create", "-f", "-", input=json.dumps(manifest))
        stored = get(mallory.k, "datavolume", name, ns)["metadata"].get("annotations") or {}
        assert CLONE_TOKEN not in stored and EXTENDED_TOKEN not in stored, (name, stored)
    mallory.k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource", "metadata": {"name": "later"},
                     "spec": {"source": {"pvc": {"namespace": alice.namespace, "name": "secret"}}}})

    # a plain PVC clone with the token: refused at admission, as without it
    refused = mallory.k("create", "-f", "-", check=False, input=json.dumps(clone_dv(
        "plain", pvc_source, {CLONE_TOKEN: minted_token(k, "pvc", alice.namespace, "secret", ns, "plain")})))
    assert refused.returncode != 0
    assert f"has insufficient permissions in clone source namespace {alice.namespace}" in refused.stderr

    # a token added by an update is dropped as well
    forged = minted_token(k, "pvc", alice.namespace, "secret", ns, "static")
    mallory.k("annotate", "datavolume", "static", f"{CLONE_TOKEN}={forged}")
    assert CLONE_TOKEN not in (get(mallory.k, "datavolume", "static", ns)["metadata"].get("annotations") or {})

    # the controller looked at each and refused to clone for want of a token
    for name in cases:
        wait_for(partial(has_event, mallory, name, "CloneTokenInvalid", "token missing"), 120, 0.5,
                 message=f"DataVolume {name} refused for want of a token: {events_of(mallory, name)}")
    for name in cases:
        assert (get(mallory.k, "datavolume", name, ns).get("status") or {}).get("phase") != "Succeeded"
    nothing_crossed(mallory)
    assert not temporary_claims(alice), "a temporary claim in Alice's namespace"


@pytest.mark.anycluster
def test_a_claims_own_annotations_do_not_choose_its_clone_source(people: People) -> None:
    alice, mallory = people.pair("iso-ann")
    write_marker(alice)
    # her VolumeCloneSource names a claim of her own that does not exist yet; the claim's annotations
    # name Alice's, as the controller records a planned source
    mallory.k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeCloneSource",
                     "metadata": {"name": "mine"},
                     "spec": {"source": {"kind": "PersistentVolumeClaim", "name": "not-yet"}}})
    claim = pvc("target", "64Mi", storage_class=TARGET.copy_class)
    claim["spec"]["dataSourceRef"] = {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeCloneSource", "name": "mine"}
    claim["metadata"]["annotations"] = {
        "cdi.kubevirt.io/storage.clone.source": f"pvc/{alice.namespace}/secret", "cdi.kubevirt.io/cloneType": "copy",
        "cdi.kubevirt.io/clonePhase": "Pending", "cdi.kubevirt.io/dataSourceNamespace": alice.namespace}
    mallory.k.apply(claim)
    wait_for(lambda: any(reason == "CloneSourceUnauthorized" for reason, _ in events_of(mallory, "target")), 120, 0.5,
             message=f"the recorded source refused: {events_of(mallory, 'target')}")
    assert not temporary_claims(alice), "a temporary claim in Alice's namespace"
    nothing_crossed(mallory)
    cannot_mount(mallory, "target")


# -- cross-namespace dataSourceRefs --------------------------------------------------------------------

def cross_namespace_claim(name: str, kind: str, group: str, namespace: str, source: str) -> dict[str, Any]:
    claim = pvc(name, "64Mi", storage_class=TARGET.storage_class)
    claim["spec"]["dataSourceRef"] = {"apiGroup": group, "kind": kind, "name": source, "namespace": namespace}
    if not group:
        del claim["spec"]["dataSourceRef"]["apiGroup"]
    return claim


@pytest.fixture(scope="module")
def gateless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[People]:
    """`cdi up` without the gate, with the two users (only `cdi up`: a real cluster has the gate or not)."""
    tokens = token_file(tmp_path_factory.mktemp("gateless-tokens"))
    up = CdiUp(tmp_path_factory.mktemp("gateless") / "cdi", "--token-auth-file", str(tokens))
    up.start()
    try:
        yield People(Kubectl(up.kubeconfig, tmp_path_factory.mktemp("gateless-kc")),
                     tmp_path_factory.mktemp("gateless-people"), token_users=True)
    finally:
        up.stop()


def test_without_the_gate_a_data_source_ref_stays_in_its_namespace(gateless: People) -> None:
    """`cdi up` without `--feature-gates` drops the field as kube-apiserver does (the realk8s tier runs the
    real one with the gate, for the scenarios above)."""
    alice, mallory = gateless.pair("iso-nog")
    write_marker(alice)
    mallory.k.apply(cross_namespace_claim("stolen", "PersistentVolumeClaim", "", alice.namespace, "secret"))
    stored = get(mallory.k, "pvc", "stolen", mallory.namespace)["spec"]
    assert stored["dataSourceRef"] == {"kind": "PersistentVolumeClaim", "name": "secret"}  # the namespace dropped
    assert stored["dataSource"] == {"kind": "PersistentVolumeClaim", "name": "secret"}
    wait_for(lambda: any(reason == "ProvisioningFailed" for reason, _ in events_of(mallory, "stolen")), 120, 0.5,
             message="the provisioner found no source claim of that name here")
    nothing_crossed(mallory)
    cannot_mount(mallory, "stolen")


def served_marker(served_dir: Path) -> str:
    """A raw disk holding Alice's marker, on the tests' file server: what her VolumeImportSource imports."""
    name = f"alice-{os.getpid()}.img"
    (served_dir / name).write_bytes(MARKER.encode().ljust(1 << 20, b"\0"))
    return name


@pytest.mark.anycluster
def test_with_the_gate_another_namespace_fills_a_claim_only_with_a_grant(
        cluster: CdiUp | External, k: Kubectl, people: People, range_server: FileServer, served_dir: Path,
        tmp_path: Path) -> None:
    if not gate_on():
        pytest.skip("the cluster runs without CrossNamespaceVolumeDataSource (CDI_E2E_CROSS_NAMESPACE_GATE=0)")
    if k("get", "crd", REFERENCEGRANTS_CRD, check=False).returncode != 0:
        # a cluster without the Gateway API's CRDs: its admin installs them, as `cdi up` with the gate does
        k.apply(referencegrant.crd())
        k("wait", "--for=condition=Established", f"crd/{REFERENCEGRANTS_CRD}", "--timeout=60s")
    alice, mallory = people.pair("iso-gate")
    write_marker(alice)
    a, b = alice.namespace, mallory.namespace
    # what Alice offers in her namespace, each of cdi's populator kinds
    alice.k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeCloneSource", "metadata": {"name": "offer"},
                   "spec": {"source": {"kind": "PersistentVolumeClaim", "name": "secret"}}})
    alice.k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeImportSource", "metadata": {"name": "feed"},
                   "spec": {"source": {"http": {"url": f"{range_server.url}/{served_marker(served_dir)}"}}}})
    alice.k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeUploadSource", "metadata": {"name": "inbox"},
                   "spec": {"contentType": "kubevirt"}})
    kinds = [("VolumeCloneSource", "cdi.kubevirt.io", "offer"), ("VolumeImportSource", "cdi.kubevirt.io", "feed"),
             ("VolumeUploadSource", "cdi.kubevirt.io", "inbox")]
    # a claim or snapshot is the cluster's CSI provisioner's to restore from (`cdi up`'s honours the gate)
    if TARGET.provisioner_cross_namespace:
        snapshot_of(alice, "secret", "secret-snap")
        kinds += [("PersistentVolumeClaim", "", "secret"), ("VolumeSnapshot", "snapshot.storage.k8s.io", "secret-snap")]
    claims = {kind: f"from-{kind.lower()}" for kind, _, _ in kinds}
    for kind, group, source in kinds:
        mallory.k.apply(cross_namespace_claim(claims[kind], kind, group, a, source))
        assert get(mallory.k, "pvc", claims[kind], b)["spec"]["dataSourceRef"]["namespace"] == a
    for name in claims.values():
        wait_for(partial(has_event, mallory, name, None, "isn't allowed"), 120, 0.5,
                 message=f"{name} refused without a grant: {events_of(mallory, name)}")
    # nothing to read: no claim of hers bound, none she could mount, no worker started for any
    for name in claims.values():
        assert (get(mallory.k, "pvc", name, b).get("status") or {}).get("phase") == "Pending"
        cannot_mount(mallory, name)
    assert not primes(mallory), "a prime claim for a reference no grant allows"
    assert not mallory.k.json("get", "pods", "-n", b, "-l", "app=containerized-data-importer")["items"]
    assert nothing_crossed(mallory) == {}
    assert not temporary_claims(alice), "a temporary claim in Alice's namespace"
    # and her upload into the claim naming Alice's VolumeUploadSource finds no upload server
    upload = tmp_path / "upload.img"
    upload.write_bytes(MALLORYS.encode().ljust(1 << 20, b"\0"))
    bearer = token(mallory.k, claims["VolumeUploadSource"], b)
    status, body, _ = curl(cluster, mallory.k, "/v1beta1/upload", "--data-binary", f"@{upload}", bearer=bearer)
    assert status == 503 and "not ready" in body, (status, body)

    # Alice grants it: every kind fills Mallory's claim, with Alice's bytes (her upload with her own)
    alice.k.apply({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
                   "metadata": {"name": "share"},
                   "spec": {"from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": b}],
                            "to": [{"group": group, "kind": kind} for kind, group, _ in kinds]}})
    uploads = claims["VolumeUploadSource"]
    wait_for(lambda: (get(mallory.k, "pvc", uploads, b)["metadata"].get("annotations") or {})
             .get("cdi.kubevirt.io/storage.pod.ready") == "true", 120, 0.2, message="the upload server ready")
    status, body, _ = curl(cluster, mallory.k, "/v1beta1/upload", "--data-binary", f"@{upload}",
                           bearer=token(mallory.k, uploads, b))
    assert status == 200, body
    for kind, name in claims.items():
        wait_for(partial(bound, mallory, name), 180, 0.2, message=f"{name} bound once granted")
        expected = [MALLORYS] if kind == "VolumeUploadSource" else [MARKER]
        assert read(mallory, name)["holds"] == expected, kind
