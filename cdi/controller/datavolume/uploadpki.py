"""The certificates between the upload proxy and upload servers, as CDI's operator keeps them: a
signer for upload-server certificates (the proxy trusts its bundle), a signer for the proxy's client
certificate (every upload server trusts it), and the proxy's client certificate. cdi-operator (and
`cdi up` in its place) creates and rotates them in CDI's namespace per certConfig; they are read again for
each upload or clone-source pod, which gets a certificate of its own. Where nothing made them (a
controller run alone) they are created here, once."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api import groups
from cdi.api.upload import CLIENT_NAME
from cdi.api.views import CDIView
from cdi.common import certconfig, pki
from cdi.kube import AlreadyExists, KubeClient, NotFound

SERVER_SIGNER = "cdi-uploadserver-signer"
CLIENT_SIGNER = "cdi-uploadserver-client-signer"
CLIENT_CERT = "cdi-uploadserver-client-cert"
SERVER_SIGNER_BUNDLE = "cdi-uploadserver-signer-bundle"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _pair(secret: dict[str, object]) -> pki.KeyPair:
    data = secret.get("data") or {}
    assert isinstance(data, dict)
    return pki.KeyPair(base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"]))


@dataclass
class UploadPki:
    server_signer: pki.KeyPair
    client_signer: pki.KeyPair
    client: pki.KeyPair

    def server_certificate(self, service: str, namespace: str, days: float = 1.0) -> pki.KeyPair:
        """An upload server's leaf; `days` from the CDI resource's `certConfig.server` (`server_days`)."""
        hosts = [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
                 f"{service}.{namespace}.svc.cluster.local"]
        common_name = f"{service}.{namespace}.svc"  # a certificate's CN holds 64 characters at most
        return pki.issue(self.server_signer, common_name if len(common_name) <= 64 else service, hosts,
                         days=days)


def cert_days(cdi: Mapping[str, Any] | None, which: str) -> float:
    """The lifetime in days of the `server` or `client` certificates this controller issues per pod, from
    the CDI resource's `certConfig` (CDI's 24h by default)."""
    return certconfig.days(CDIView(cdi or {}).cert_config, which)


async def _ensure_secret(client: KubeClient, namespace: str, name: str, make: pki.KeyPair) -> pki.KeyPair:
    try:
        return _pair(await client.get(groups.SECRETS, name, namespace))
    except NotFound:
        pass
    body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace, "labels": {"cdi.kubevirt.io": ""}},
            "data": {"tls.crt": _b64(make.cert_pem), "tls.key": _b64(make.key_pem)}}
    try:
        await client.create(groups.SECRETS, body, namespace)
        return make
    except AlreadyExists:
        return _pair(await client.get(groups.SECRETS, name, namespace))


async def ensure_upload_pki(client: KubeClient, namespace: str) -> UploadPki:
    server_signer = await _ensure_secret(client, namespace, SERVER_SIGNER, pki.make_ca("cdi-uploadserver-signer"))
    client_signer = await _ensure_secret(client, namespace, CLIENT_SIGNER,
                                         pki.make_ca("cdi-uploadserver-client-signer"))
    client_pair = await _ensure_secret(client, namespace, CLIENT_CERT,
                                       pki.issue(client_signer, CLIENT_NAME, None, server=False, client=True))
    bundle = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": SERVER_SIGNER_BUNDLE, "namespace": namespace, "labels": {"cdi.kubevirt.io": ""}},
              "data": {"ca-bundle.crt": server_signer.cert_pem.decode()}}
    try:
        await client.create(groups.CONFIGMAPS, bundle, namespace)
    except AlreadyExists:
        pass
    return UploadPki(server_signer, client_signer, client_pair)
