"""The upload proxy's aggregation listener follows the request-header CA the API server publishes
(`kube-system/extension-apiserver-authentication`, `requestheader-client-ca-file`) while it runs: after a
rotation the front proxy's new certificate is answered, and once the old CA is no longer published a
certificate it issued is refused at the handshake, without a restart. Against the embedded API server."""

from __future__ import annotations

import asyncio
import http.client
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdi.api import groups
from cdi.common import pki, tlsfront
from cdi.embedded.kubeapi.server import ApiServer, ServerConfig
from cdi.kube import KubeClient, tlswatch
from cdi.kube.requestheader import AUTH_CONFIGMAP, AUTH_NAMESPACE
from cdi.uploadproxy.server import UploadProxy

NAME = "front-proxy-client"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[UploadProxy, KubeClient, pki.KeyPair]]:
    api = ApiServer(ServerConfig(data_dir=tmp_path / "kube", bookmark_interval=0.2))
    await api.start()
    client = await KubeClient.connect(api.kubeconfig_path)
    server_ca = pki.make_ca("proxy-ca")
    pki.issue(server_ca, "cdi-uploadproxy.cdi.svc", ["127.0.0.1"]).write(tmp_path / "tls.crt", tmp_path / "tls.key")
    tls = tlsfront.ServerTLS(tmp_path / "tls.crt", tmp_path / "tls.key", tlswatch.DEFAULT_POLICY)
    proxy = UploadProxy(client, public_key=b"unused")
    try:
        await proxy.start("127.0.0.1", 0, tls)
        yield proxy, client, server_ca
    finally:
        await proxy.stop()
        await client.close()
        await api.stop()


async def publish(client: KubeClient, *cas: pki.KeyPair) -> None:
    """The API server publishes these request-header CAs (the rest of the ConfigMap as it was)."""
    configmap = await client.get(groups.CONFIGMAPS, AUTH_CONFIGMAP, AUTH_NAMESPACE)
    configmap["data"]["requestheader-client-ca-file"] = "".join(ca.cert_pem.decode() for ca in cas)
    await client.replace(groups.CONFIGMAPS, configmap, AUTH_NAMESPACE)


def discovery(port: int, server_ca: pki.KeyPair, identity: pki.KeyPair) -> str:
    """What the aggregation layer's discovery request gets with `identity`: "answered" or "refused"."""
    context = pki.client_context(server_ca.cert_pem.decode(), identity=identity)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("GET", "/apis", headers={"X-Remote-User": "system:kube-aggregator"})
        response = conn.getresponse()
        response.read()
        return "answered" if response.status == 200 else f"refused {response.status}"
    except (ssl.SSLError, ConnectionError):
        return "refused"
    finally:
        conn.close()


async def until(proxy: UploadProxy, server_ca: pki.KeyPair, identity: pki.KeyPair, outcome: str,
                timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := await asyncio.to_thread(discovery, proxy.aggregation_port, server_ca, identity)) != outcome \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert seen == outcome, f"still {seen} after {timeout}s"


async def test_a_rotated_request_header_ca_is_followed_without_a_restart(
        served: tuple[UploadProxy, KubeClient, pki.KeyPair], tmp_path: Path) -> None:
    proxy, client, server_ca = served
    old, new = pki.make_ca("front-proxy-ca"), pki.make_ca("front-proxy-ca-rotated")
    old_cert, new_cert = (pki.issue(ca, NAME, server=False, client=True) for ca in (old, new))
    await publish(client, old)
    tls = tlsfront.ServerTLS(tmp_path / "tls.crt", tmp_path / "tls.key", tlswatch.DEFAULT_POLICY)
    await proxy.start_aggregation("127.0.0.1", 0, tls, tmp_path / "state")
    assert await asyncio.to_thread(discovery, proxy.aggregation_port, server_ca, old_cert) == "answered"
    assert await asyncio.to_thread(discovery, proxy.aggregation_port, server_ca, new_cert) == "refused"

    await publish(client, old, new)  # the rotation begins: both CAs published
    await until(proxy, server_ca, new_cert, "answered")
    assert await asyncio.to_thread(discovery, proxy.aggregation_port, server_ca, old_cert) == "answered"

    await publish(client, new)  # and ends: the old CA no longer vouches for the front proxy
    await until(proxy, server_ca, old_cert, "refused")
    assert await asyncio.to_thread(discovery, proxy.aggregation_port, server_ca, new_cert) == "answered"
    # another name from the new CA is no front proxy
    other = pki.issue(new, "system:node:worker", server=False, client=True)
    assert await asyncio.to_thread(discovery, proxy.aggregation_port, server_ca, other) == "refused 401"
