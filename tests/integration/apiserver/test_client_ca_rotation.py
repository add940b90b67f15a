"""cdi-apiserver follows the client CA the API server publishes (`kube-system/extension-apiserver-authentication`,
`client-ca-file`) while it runs: after a rotation the API server's new certificate is answered, and once the old
CA is no longer published a certificate it issued is refused, without a restart. Against the embedded API
server, in-process; the webhook caller is a plain TLS client posting to a webhook path."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from cdi.api import groups
from cdi.apiserver.frontproxy import AUTH_CONFIGMAP, AUTH_NAMESPACE
from cdi.apiserver.server import CdiApiServer
from cdi.common import pki
from cdi.embedded.kubeapi.server import ApiServer, ServerConfig
from cdi.kube import KubeClient

NAME = "kube-apiserver-kubelet-client"  # what the API server's certificate is called, as on the realk8s kit


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[CdiApiServer, KubeClient]]:
    api = ApiServer(ServerConfig(data_dir=tmp_path / "kube", bookmark_interval=0.2))
    await api.start()
    client = await KubeClient.connect(api.kubeconfig_path)
    await client.create(groups.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cdi"}})
    server = CdiApiServer(client, "cdi", tmp_path / "cdi-apiserver", webhook_client_names=(NAME,))
    try:
        yield server, client
    finally:
        await server.stop()
        await client.close()
        await api.stop()


async def publish(client: KubeClient, *cas: pki.KeyPair) -> None:
    """The API server publishes these client CAs (the rest of the ConfigMap as it was)."""
    configmap = await client.get(groups.CONFIGMAPS, AUTH_CONFIGMAP, AUTH_NAMESPACE)
    configmap["data"]["client-ca-file"] = "".join(ca.cert_pem.decode() for ca in cas)
    await client.replace(groups.CONFIGMAPS, configmap, AUTH_NAMESPACE)


async def call(server: CdiApiServer, identity: pki.KeyPair) -> str:
    """A webhook call presenting `identity`: "refused" when the handshake or cdi-apiserver refuses it (403),
    "answered" when the webhook looked at the review."""
    assert server.ca is not None
    context = pki.insecure_client_context(identity)
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "1"}}
    try:
        async with aiohttp.ClientSession() as session, session.post(
                f"https://127.0.0.1:{server.port}/datavolume-validate", data=json.dumps(review),
                headers={"Content-Type": "application/json"}, ssl=context) as response:
            return "refused" if response.status == 403 else "answered"
    except (aiohttp.ClientError, ssl.SSLError):
        return "refused"  # the handshake: a certificate of no CA the server trusts


async def until(server: CdiApiServer, identity: pki.KeyPair, outcome: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := await call(server, identity)) != outcome and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert seen == outcome, f"still {seen} after {timeout}s"


async def test_a_rotated_client_ca_is_followed_without_a_restart(served: tuple[CdiApiServer, KubeClient]) -> None:
    server, client = served
    # (named apart, as kubeadm's are not: its leaves name their CA's key, ours pick the CA by name)
    old, new = pki.make_ca("kubernetes"), pki.make_ca("kubernetes-rotated")
    old_cert = pki.issue(old, NAME, server=False, client=True)
    new_cert = pki.issue(new, NAME, server=False, client=True)
    await publish(client, old)
    await server.start()
    assert await call(server, old_cert) == "answered"
    assert await call(server, new_cert) == "refused"

    await publish(client, old, new)  # the rotation begins: both CAs published
    await until(server, new_cert, "answered")
    assert await call(server, old_cert) == "answered"

    await publish(client, new)  # and ends: the old CA no longer vouches for the API server
    await until(server, old_cert, "refused")
    assert await call(server, new_cert) == "answered"
    # another name from the new CA is still no API server
    assert await call(server, pki.issue(new, "system:node:worker", server=False, client=True)) == "refused"
