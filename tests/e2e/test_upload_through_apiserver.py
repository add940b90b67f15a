"""Uploads that need only a kubeconfig (issue 30 point 3, an extension): `cdi image-upload` sends through the
Kubernetes API server's aggregation layer (`upload.extensions.cdi.dev`, served by the upload proxy), as the
user of the kubeconfig, authorized by RBAC, when no upload proxy URL is configured.

- a user bound to `cdi.kubevirt.io:edit` in one namespace uploads a qcow2 with nothing but a kubeconfig
  holding a token: the DataVolume Succeeded, the bytes read back by a pod;
- a user without the right (`view`) is refused with the API server's 403 naming `uploads/proxy`, before a
  byte is sent, and the claim stays waiting for its upload;
- the proxy's aggregation listener answers only the API server: straight to it, from the host and from a pod,
  without the front-proxy certificate, a request naming an admin in `X-Remote-User` gets 401 (one with a
  certificate of another CA fails the handshake), and the same headers on the public listener change nothing;
- an upload through the API server whose connection drops half way resumes where the upload server stopped.

On a real cluster the users are ServiceAccounts with tokens from the TokenRequest API and the API server is
the kubeconfig's (through the real kube-apiserver's aggregator); on `cdi up`, token users of its API server,
and `--through-apiserver` since `cdi up` publishes its proxy's URL."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from cdi.api import upload as names
from cdi.common import pki
from tests.e2e.importing import read_back
from tests.e2e.target import TARGET, External, own_cluster
from tests.e2e.test_upload_resume import CuttingRelay
from tests.e2e.uploading import curl
from tests.e2e.workloads import new_namespace, pod, run_to_completion
from tests.support.cluster import ROOT, CdiUp, Kubectl, wait_for

pytestmark = pytest.mark.anycluster

TOKENS = {"uploader": "uploader-token-0123456789", "outsider": "outsider-token-0123456789"}
IMAGE_MIB = 24
RAW_MIB = 64


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp | External]:
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.csv"
    tokens.write_text("".join(f'{token},{name},{3000 + i},"people"\n'
                              for i, (name, token) in enumerate(TOKENS.items())))
    yield from own_cluster(tmp_path_factory, "apiserver-upload", "--token-auth-file", str(tokens))


@pytest.fixture(scope="module")
def k(cluster: CdiUp | External, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("kc"))


@pytest.fixture(scope="module")
def ns(k: Kubectl) -> str:
    return new_namespace(k, "apiserver-upload")


@pytest.fixture(scope="module")
def qcow2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A qcow2 of random data (nothing sparse), and the sha256 of its raw content."""
    directory = tmp_path_factory.mktemp("image")
    raw = directory / "disk.raw"
    raw.write_bytes(os.urandom(IMAGE_MIB << 20))
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(directory / "disk.qcow2")],
                   check=True)
    return directory / "disk.qcow2", hashlib.sha256(raw.read_bytes()).hexdigest()


class User:
    """Someone the API server knows who has only what a namespace's RoleBindings give: a token user of
    `cdi up`, or on a real cluster a ServiceAccount with a token from the TokenRequest API. Their kubeconfig
    holds the admin's server and CA and their token, nothing else."""

    def __init__(self, admin: Kubectl, name: str, namespace: str, workdir: Path) -> None:
        if TARGET.embedded:
            self.name, self.token = name, TOKENS[name]
        else:
            admin("create", "serviceaccount", name, "-n", namespace)
            self.name = f"system:serviceaccount:{namespace}:{name}"
            self.token = admin("create", "token", name, "-n", namespace, "--duration", "1h").stdout.strip()
        view = yaml.safe_load(admin("config", "view", "--raw", "--minify").stdout)
        self.cluster = view["clusters"][0]["cluster"]
        config = {"apiVersion": "v1", "kind": "Config", "clusters": [{"name": "c", "cluster": self.cluster}],
                  "users": [{"name": name, "user": {"token": self.token}}],
                  "contexts": [{"name": name, "context": {"cluster": "c", "user": name, "namespace": namespace}}],
                  "current-context": name}
        workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = workdir / f"{name}.kubeconfig"
        self.kubeconfig.write_text(json.dumps(config))

    def bind(self, admin: Kubectl, namespace: str, kind: str, role: str) -> None:
        admin.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": f"{self.name.rsplit(':', 1)[-1]}-{role.replace(':', '-')}"},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": self.name}]},
                    "-n", namespace)

    def server_context(self) -> ssl.SSLContext:
        """What verifies the API server, from the kubeconfig."""
        if self.cluster.get("certificate-authority-data"):
            return pki.client_context(base64.b64decode(self.cluster["certificate-authority-data"]).decode())
        return pki.client_context(Path(self.cluster["certificate-authority"]).read_text())


def run_image_upload(kubeconfig: Path, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """`cdi image-upload` as a user runs it, with only a kubeconfig: no `--uploadproxy-url`, no CA of the proxy."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("KUBECONFIG", None)
    return subprocess.run([sys.executable, "-m", "cdi.cli.main", "image-upload", *args, "--kubeconfig",
                           str(kubeconfig)], capture_output=True, text=True, env=env, timeout=timeout, check=False)


def through_apiserver(k: Kubectl) -> tuple[str, ...]:
    """No flag where the cluster publishes no proxy URL (the default path, as on a cluster nobody exposed the
    proxy on); `--through-apiserver` where it does (`cdi up` publishes its loopback URL)."""
    published = k("get", "cdiconfig", "config", "-o", "jsonpath={.status.uploadProxyURL}").stdout.strip()
    return ("--through-apiserver",) if published else ()


def dv_phase(k: Kubectl, ns: str, name: str) -> str:
    return str(k("get", "dv", name, "-n", ns, "-o", "jsonpath={.status.phase}", check=False).stdout)


def aggregation_address(k: Kubectl) -> tuple[str, int]:
    """The proxy's aggregation listener, as the API server reaches it (its Service's cluster IP and port)."""
    service = k.get("service", names.PROXY_SERVICE, TARGET.cdi_namespace)
    port = next(p for p in service["spec"]["ports"] if p.get("name") == names.AGGREGATION_PORT_NAME)
    return service["spec"]["clusterIP"], int(port["port"])


def test_a_user_with_cdis_edit_role_uploads_with_only_a_kubeconfig(k: Kubectl, ns: str, tmp_path: Path,
                                                                   qcow2: tuple[Path, str]) -> None:
    wait_for(lambda: "uploads/proxy" in json.dumps(k.get("clusterrole", "edit", "")["rules"]), 60,
             message="cdi.kubevirt.io:edit's uploads/proxy aggregated into edit")
    uploader = User(k, "uploader", ns, tmp_path)
    uploader.bind(k, ns, "ClusterRole", "cdi.kubevirt.io:edit")
    # what `cdi image-upload` reads besides CDI's objects (the claim's readiness): edit would give it too
    k.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "claim-reader"},
             "rules": [{"apiGroups": [""], "resources": ["persistentvolumeclaims"],
                        "verbs": ["get", "list", "watch"]}]}, "-n", ns)
    uploader.bind(k, ns, "Role", "claim-reader")
    image, sha256 = qcow2
    result = run_image_upload(uploader.kubeconfig, "dv", "disk", "--size", "64Mi", "--storage-class",
                              TARGET.storage_class, "--access-mode", "ReadWriteOnce", "--image-path", str(image),
                              *through_apiserver(k))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"Uploading data through the Kubernetes API server {uploader.cluster['server'].rstrip('/')}" in output
    assert "endpoint /v1beta1/upload-async through the Kubernetes API server" in output
    assert f"result     DataVolume {ns}/disk Succeeded" in output
    assert dv_phase(k, ns, "disk") == "Succeeded"
    assert read_back(k, "disk", IMAGE_MIB << 20, namespace=ns) == sha256


def test_a_user_without_the_right_gets_403_naming_uploads_proxy(k: Kubectl, ns: str, tmp_path: Path,
                                                                  qcow2: tuple[Path, str]) -> None:
    outsider = User(k, "outsider", ns, tmp_path)
    outsider.bind(k, ns, "ClusterRole", "view")  # may look at everything in the namespace, upload nothing
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "guarded"},
             "spec": {"source": {"upload": {}}, "storage": {"resources": {"requests": {"storage": "64Mi"}},
                                                            "storageClassName": TARGET.storage_class}}}, "-n", ns)
    wait_for(lambda: dv_phase(k, ns, "guarded") == "UploadReady", 120, message="guarded UploadReady")
    image, _ = qcow2
    result = run_image_upload(outsider.kubeconfig, "dv", "guarded", "--no-create", "--image-path", str(image),
                              *through_apiserver(k))
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r'error: the Kubernetes API server refused the upload: 403 .*cannot get resource "uploads/proxy" '
                     r'in API group "upload.extensions.cdi.dev" in the namespace "' + ns + '"', result.stderr), \
        result.stderr
    assert "uploaded" not in result.stdout  # not a byte of the image went out
    # the POST itself, as any HTTP client sends it with the user's token
    server = urlsplit(outsider.cluster["server"])
    conn = http.client.HTTPSConnection(str(server.hostname), server.port or 443, timeout=30,
                                       context=outsider.server_context())
    conn.request("POST", names.extension_base(ns, "guarded") + "/v1beta1/upload", body=b"\0" * 4096,
                 headers={"Authorization": f"Bearer {outsider.token}", "Content-Type": "application/octet-stream"})
    response = conn.getresponse()
    status = json.loads(response.read())
    conn.close()
    assert response.status == 403 and status["reason"] == "Forbidden", status
    assert f'User "{outsider.name}" cannot create resource "uploads/proxy" in API group ' \
           f'"upload.extensions.cdi.dev" in the namespace "{ns}"' in status["message"]
    assert dv_phase(k, ns, "guarded") == "UploadReady"  # still waiting for its upload


FORGED = {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters", "Content-Length": "0"}
# what a pod sends straight to the aggregation listener (argv: host, port, path); prints the status or the refusal
STRAIGHT = """
import http.client, json, ssl, sys
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
conn = http.client.HTTPSConnection(sys.argv[1], int(sys.argv[2]), context=context, timeout=20)
try:
    conn.request("POST", sys.argv[3], headers=json.loads(sys.argv[4]))
    response = conn.getresponse()
    print(response.status, response.read().decode())
except (OSError, ssl.SSLError) as exc:
    print("refused", exc)
"""


def straight(host: str, port: int, path: str, identity: pki.KeyPair | None = None) -> str:
    """The same from this host, optionally with a client certificate."""
    context = pki.insecure_client_context(identity)
    conn = http.client.HTTPSConnection(host, port, context=context, timeout=20)
    try:
        conn.request("POST", path, headers=FORGED)
        response = conn.getresponse()
        return f"{response.status} {response.read().decode()}"
    except (OSError, ssl.SSLError) as exc:
        return f"refused {exc}"
    finally:
        conn.close()


def test_only_the_api_server_reaches_the_aggregation_listener(cluster: CdiUp | External, k: Kubectl, ns: str,
                                                              tmp_path: Path) -> None:
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "target"},
             "spec": {"source": {"upload": {}}, "storage": {"resources": {"requests": {"storage": "64Mi"}},
                                                            "storageClassName": TARGET.storage_class}}}, "-n", ns)
    wait_for(lambda: dv_phase(k, ns, "target") == "UploadReady", 120, message="target UploadReady")
    host, port = aggregation_address(k)
    path = names.extension_base(ns, "target") + "/v1beta1/upload"
    answer = straight(host, port, path)
    assert answer.startswith("401 ") and "no verified front-proxy client certificate" in answer, answer
    # a client certificate with the front proxy's name, from a CA of the attacker's own: not even a handshake
    forged = pki.issue(pki.make_ca("front-proxy-ca"), "front-proxy-client", None, server=False, client=True)
    assert straight(host, port, path, forged).startswith("refused"), "a certificate of another CA was accepted"
    logs = run_to_completion(k, ns, pod("straight", STRAIGHT, python=True,
                                        extra={"args": [host, str(port), path, json.dumps(FORGED)]}))
    assert logs.startswith("401 ") and "no verified front-proxy client certificate" in logs, logs
    # the public listener does not read them at all: an upload without a token is refused as any other
    status, body, _ = curl(cluster, k, "/v1beta1/upload", "-X", "POST", "--data-binary", "x",
                           *(arg for name, value in FORGED.items() if name != "Content-Length"
                             for arg in ("-H", f"{name}: {value}")))
    assert status == 400 and "Authorization: Bearer <token>" in body, (status, body)
    status, _, _ = curl(cluster, k, path, "-X", "POST", "--data-binary", "x",
                        *(arg for name, value in FORGED.items() if name != "Content-Length"
                          for arg in ("-H", f"{name}: {value}")))
    assert status == 404
    assert dv_phase(k, ns, "target") == "UploadReady"  # nothing got through


def test_a_dropped_upload_through_the_api_server_resumes(k: Kubectl, ns: str, tmp_path: Path) -> None:
    """A relay in front of the API server cuts the upload's connection half way: the CLI asks, through the API
    server, where the upload server stopped, and sends only the rest."""
    disk = tmp_path / "disk.raw"
    disk.write_bytes(os.urandom(RAW_MIB << 20))
    view = yaml.safe_load(k("config", "view", "--raw", "--minify").stdout)
    server = urlsplit(view["clusters"][0]["cluster"]["server"])
    relay = CuttingRelay((str(server.hostname), server.port or 443), cut_after=(RAW_MIB << 20) // 2)
    view["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    view["clusters"][0]["cluster"].setdefault("tls-server-name", server.hostname)  # the API server's own name
    view["contexts"][0]["context"]["namespace"] = ns
    relayed = tmp_path / "relayed.kubeconfig"
    relayed.write_text(json.dumps(view))
    try:
        result = run_image_upload(relayed, "dv", "resumed", "--size", "96Mi", "--storage-class",
                                  TARGET.storage_class, "--image-path", str(disk), "--through-apiserver")
    finally:
        relay.close()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert relay.cuts == 1
    assert "asking the upload server where to resume" in output and "2 attempts" in output
    resumed = re.search(r"resumed    at .*?\((\d+) bytes\); the last attempt sent .*?\((\d+) bytes\)", output)
    assert resumed, output
    offset, last = int(resumed.group(1)), int(resumed.group(2))
    assert offset > 0 and offset + last == RAW_MIB << 20
    assert f"result     DataVolume {ns}/resumed Succeeded" in output
    assert read_back(k, "resumed", RAW_MIB << 20, namespace=ns) == hashlib.sha256(disk.read_bytes()).hexdigest()
