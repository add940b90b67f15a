"""The upload proxy's own serving certificate, and where clients find the CA to check it.

CDI#2926 / KV#3584: CDI's proxy certificate comes from an internal CA that nobody can verify, so
everybody uploads with `--insecure`. Here:

* `cdi uploadproxy --tls-cert/--tls-key` serves a certificate you bring (cert-manager, your CA);
* otherwise (and in `cdi up`) the proxy keeps a CA of its own in its state directory (`ca.crt`,
  kept across restarts so trust survives them) and issues itself a certificate for every name it is
  reached by (loopback, `cdi-uploadproxy[.cdi[.svc]]`, and any extra host names given);
* the CA is published where `cdi image-upload` looks without flags: ConfigMap `cdi-uploadproxy-ca`
  (key `ca.crt`) in CDI's namespace, and, for `cdi up`, the file `uploadproxy-ca.crt` next to the
  kubeconfig."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from cdi.api import groups
from cdi.api.upload import PROXY_SERVICE
from cdi.common import pki, tlsfront
from cdi.kube import AlreadyExists, KubeClient, NotFound, tlswatch

CA_CONFIGMAP = "cdi-uploadproxy-ca"
CA_KEY = "ca.crt"
CA_FILE_NEXT_TO_KUBECONFIG = "uploadproxy-ca.crt"
SERVICE_NAME = PROXY_SERVICE


def default_hosts(namespace: str, extra: list[str] | None = None) -> list[str]:
    return ["127.0.0.1", "localhost", SERVICE_NAME, f"{SERVICE_NAME}.{namespace}", f"{SERVICE_NAME}.{namespace}.svc",
            *(extra or [])]


def self_managed(directory: Path, hosts: list[str]) -> tuple[tlsfront.ServerTLS, pki.KeyPair]:
    """Serving TLS from the CA kept in `directory` (created the first time); returns it and the CA."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # it holds the CA's private key
    ca_crt, ca_key = directory / "ca.crt", directory / "ca.key"
    if ca_crt.exists() and ca_key.exists():
        ca = pki.KeyPair.read(ca_crt, ca_key)
    else:
        # a name of its own: clients may trust several such CAs at once (ConfigMap, file, another proxy),
        # and OpenSSL picks an issuer by name before it checks the signature
        ca = pki.make_ca(f"cdi-uploadproxy-ca-{secrets.token_hex(4)}")
        ca.write(ca_crt, ca_key)
    leaf = pki.issue(ca, hosts[0], hosts)
    serving = directory / "serving"
    pki.server_context(leaf, serving)  # writes the pair there
    return brought(serving / "tls.crt", serving / "tls.key"), ca


def brought(cert_file: Path, key_file: Path) -> tlsfront.ServerTLS:
    """Serving TLS from these files (the proxy serves with CDIConfig's TLS profile once it has read it)."""
    return tlsfront.ServerTLS(cert_file, key_file, tlswatch.DEFAULT_POLICY)


async def publish_ca(client: KubeClient, namespace: str, ca_pem: bytes) -> None:
    """ConfigMap `cdi-uploadproxy-ca`: the CA `cdi image-upload` trusts for the proxy (not a secret)."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CA_CONFIGMAP, "namespace": namespace, "labels": {"cdi.kubevirt.io": ""}},
            "data": {CA_KEY: ca_pem.decode()}}
    try:
        current = await client.get(groups.CONFIGMAPS, CA_CONFIGMAP, namespace)
    except NotFound:
        try:
            await client.create(groups.CONFIGMAPS, body, namespace)
        except AlreadyExists:
            pass
        return
    if (current.get("data") or {}).get(CA_KEY) != body["data"][CA_KEY]:
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await client.replace(groups.CONFIGMAPS, body, namespace)
