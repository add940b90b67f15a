"""`cdi image-upload` through the API server: the kubeconfig's own connection settings and credentials reach
the upload's requests (`cdi.kube.direct`), the same requests go to the proxy's paths under the claim's
`uploads/<pvc>/proxy`, and an RBAC refusal ends the upload before a byte of the image is sent, with the API
server's words."""

from __future__ import annotations

import io
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi.api import upload as names
from cdi.cli.imageupload import transfer
from cdi.cli.imageupload.progress import Progress
from cdi.common import pki
from cdi.kube.config import ConfigError, load_kubeconfig
from cdi.kube.direct import DirectAccess

FORBIDDEN = ('uploads.upload.extensions.cdi.dev "disk" is forbidden: User "bob" cannot get resource '
             '"uploads/proxy" in API group "upload.extensions.cdi.dev" in the namespace "tenant"')


def kubeconfig(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "tenant"}}],
        "current-context": "x"}))
    return path


async def test_a_token_kubeconfig_gives_its_server_ca_and_bearer(tmp_path: Path) -> None:
    ca = pki.make_ca("cluster-ca")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    config = await load_kubeconfig(kubeconfig(tmp_path, {"server": "https://10.0.0.1:6443/",
                                                         "certificate-authority": str(tmp_path / "ca.crt"),
                                                         "tls-server-name": "kubernetes.default.svc"},
                                              {"token": "sa-token"}))
    direct = DirectAccess.of(config)
    assert (direct.server, direct.server_hostname) == ("https://10.0.0.1:6443", "kubernetes.default.svc")
    assert direct.context.verify_mode == ssl.CERT_REQUIRED and direct.context.check_hostname
    assert await direct.authorization() == "Bearer sa-token"


async def test_a_certificate_kubeconfig_sends_no_authorization(tmp_path: Path) -> None:
    ca = pki.make_ca("cluster-ca")
    user = pki.issue(ca, "alice", None, server=False, client=True)
    user.write(tmp_path / "alice.crt", tmp_path / "alice.key")
    config = await load_kubeconfig(kubeconfig(tmp_path, {"server": "https://api.example:6443",
                                                         "insecure-skip-tls-verify": True},
                                              {"client-certificate": str(tmp_path / "alice.crt"),
                                               "client-key": str(tmp_path / "alice.key")}))
    direct = DirectAccess.of(config)
    assert direct.server_hostname == "api.example" and direct.context.verify_mode == ssl.CERT_NONE
    assert await direct.authorization() is None


async def test_what_cannot_carry_an_upload_is_said(tmp_path: Path) -> None:
    config = await load_kubeconfig(kubeconfig(tmp_path, {"server": "https://api.example:6443",
                                                         "proxy-url": "http://proxy.corp:3128"}, {"token": "t"}))
    with pytest.raises(ConfigError, match="through a proxy"):
        DirectAccess.of(config)


class Recorder(BaseHTTPRequestHandler):
    """An API server that forbids `get` on uploads/proxy (the HEAD probe) with kube-apiserver's Status."""

    seen: list[tuple[str, str, str | None, int]] = []

    def _forbid(self, body: bool) -> None:
        Recorder.seen.append((self.command, self.path, self.headers.get("Authorization"),
                              int(self.headers.get("Content-Length") or 0)))
        status = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": FORBIDDEN,
                             "reason": "Forbidden", "code": 403}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(status)))
        self.end_headers()
        if body:
            self.wfile.write(status)

    def do_HEAD(self) -> None:
        self._forbid(False)

    def do_GET(self) -> None:
        self._forbid(True)

    def do_POST(self) -> None:
        self._forbid(True)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[tuple[int, pki.KeyPair]]:
    ca = pki.make_ca("cluster-ca")
    context = pki.server_context(pki.issue(ca, "kube-apiserver", ["127.0.0.1"]), tmp_path / "tls")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Recorder.seen = []
    yield server.server_address[1], ca
    server.shutdown()
    server.server_close()


def test_a_forbidden_upload_ends_before_the_image_is_sent(tmp_path: Path, apiserver: tuple[int, pki.KeyPair]) -> None:
    port, ca = apiserver
    image = tmp_path / "disk.raw"
    image.write_bytes(b"\1" * (1 << 20))
    url = f"https://127.0.0.1:{port}" + names.extension_base("tenant", "disk")
    upload = transfer.Transfer(url, pki.client_context(ca.cert_pem.decode()),
                               transfer.ApiServerCredentials(lambda: "Bearer bob-token"), "tenant/disk", str(image),
                               Progress(image.stat().st_size, out=io.StringIO()))
    with pytest.raises(transfer.UploadFailed) as refused:
        upload.run()
    assert str(refused.value) == f"the Kubernetes API server refused the upload: 403 {FORBIDDEN}"
    probe = "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/tenant/uploads/disk/proxy/v1beta1/upload-async"
    assert Recorder.seen == [("HEAD", probe, "Bearer bob-token", 0), ("GET", probe, "Bearer bob-token", 0)]
