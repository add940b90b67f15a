"""The upload proxy's aggregation listener: only the front proxy's certificate (issued by the request-header
CA, with an allowed common name) and a user it names get a request routed; what they ask is read from the
path (namespace, claim, the proxy's own upload path), and discovery lists only `uploads/proxy`. And the
token-less routing itself (`UploadProxy.plan_for`): the PVC the path names, with the proxy's usual answers."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api import upload as names
from cdi.common import pki, tlsfront
from cdi.kube import tlswatch
from cdi.kube.requestheader import Caller, RequestHeaderConfig
from cdi.uploadproxy.aggregated import AggregatedFront, write_client_ca
from cdi.uploadproxy.front import Answer, Forward
from cdi.uploadproxy.routing import UpstreamTls
from cdi.uploadproxy.server import UploadProxy
from tests.support.fakekube import FakeKube

UPLOAD = names.extension_base("tenant", "disk") + "/v1beta1/upload-async"


@dataclass
class Listener:
    port: int
    server_ca: pki.KeyPair
    front_proxy: pki.KeyPair  # the API server's client certificate (CN front-proxy-client)
    other_name: pki.KeyPair  # the same CA, another name
    stranger: pki.KeyPair  # another CA, the allowed name
    asked: list[tuple[str, str, str, Caller, str | None]] = field(default_factory=list)

    def request(self, method: str, path: str, identity: pki.KeyPair | None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        context = pki.client_context(self.server_ca.cert_pem.decode(), identity=identity)
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=10)
        try:
            conn.request(method, path, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
        finally:
            conn.close()


@pytest.fixture
async def listener(tmp_path: Path) -> AsyncIterator[Listener]:
    server_ca, requestheader_ca, other_ca = (pki.make_ca(n) for n in ("proxy-ca", "front-proxy-ca", "other-ca"))
    pki.issue(server_ca, "cdi-uploadproxy.cdi.svc", ["127.0.0.1"]).write(tmp_path / "tls.crt", tmp_path / "tls.key")
    write_client_ca(tmp_path / "client-ca.crt", requestheader_ca.cert_pem.decode())
    config = RequestHeaderConfig.from_configmap({"requestheader-client-ca-file": requestheader_ca.cert_pem.decode(),
                                                 "requestheader-allowed-names": '["front-proxy-client"]'})
    found = Listener(0, server_ca, *(pki.issue(ca, cn, None, server=False, client=True) for ca, cn in (
        (requestheader_ca, "front-proxy-client"), (requestheader_ca, "someone"), (other_ca, "front-proxy-client"))))

    async def plan_for(namespace: str, pvc: str, path: str, caller: Caller, target: str | None) -> Forward | Answer:
        found.asked.append((namespace, pvc, path, caller, target))
        return Answer(503, f"the upload server for PVC {namespace}/{pvc} is not ready")

    tls = tlsfront.ServerTLS(tmp_path / "tls.crt", tmp_path / "tls.key", tlswatch.DEFAULT_POLICY,
                             client_ca_file=tmp_path / "client-ca.crt")
    front = AggregatedFront(asyncio.get_running_loop(), tls, plan_for, lambda: config)
    found.port = front.start("127.0.0.1", 0)
    yield found
    await front.closed()


async def test_an_upload_from_the_front_proxy_is_routed_by_its_path(listener: Listener) -> None:
    status, headers, body = await asyncio.to_thread(
        listener.request, "POST", UPLOAD + "?x=1", listener.front_proxy,
        {"X-Remote-User": "alice", "X-Remote-Group": "devs", "Content-Length": "0",
         names.TARGET_HEADER: "tenant/disk"})
    assert (status, body) == (503, "the upload server for PVC tenant/disk is not ready")
    [(namespace, pvc, path, caller, target)] = listener.asked
    assert (namespace, pvc, path, target) == ("tenant", "disk", "/v1beta1/upload-async", "tenant/disk")
    assert (caller.user, caller.groups) == ("alice", ("devs",))
    status, headers, _ = await asyncio.to_thread(listener.request, "HEAD", UPLOAD, listener.front_proxy,
                                                 {"X-Remote-User": "alice"})
    assert status == 503 and "upgrade" not in headers  # end-to-end TLS is not on offer through the API server


async def test_discovery_lists_only_the_subresource(listener: Listener) -> None:
    status, _, body = await asyncio.to_thread(listener.request, "GET", names.EXTENSION_BASE, listener.front_proxy,
                                              {"X-Remote-User": "system:kube-aggregator"})
    assert status == 200
    assert [(r["name"], r["verbs"]) for r in json.loads(body)["resources"]] == [("uploads/proxy", ["create", "get"])]
    for path in ("/apis", f"/apis/{names.EXTENSION_GROUP}"):
        status, _, body = await asyncio.to_thread(listener.request, "GET", path, listener.front_proxy,
                                                  {"X-Remote-User": "system:kube-aggregator"})
        assert status == 200 and names.EXTENSION_GROUP in body


@pytest.mark.parametrize(("who", "headers", "why"), [
    ("nobody", {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"},
     "no verified front-proxy client certificate"),
    ("other_name", {"X-Remote-User": "admin"}, "not an allowed requestheader name"),
    ("front_proxy", {"X-Remote-Group": "system:masters"}, "X-Remote-User"),
])
async def test_anyone_but_the_front_proxy_naming_a_user_gets_401(listener: Listener, who: str,
                                                                 headers: dict[str, str], why: str) -> None:
    identity = None if who == "nobody" else getattr(listener, who)
    status, _, body = await asyncio.to_thread(listener.request, "POST", UPLOAD, identity,
                                              {**headers, "Content-Length": "0"})
    assert status == 401 and why in json.loads(body)["message"]
    assert listener.asked == []


async def test_a_certificate_of_another_ca_fails_the_handshake(listener: Listener) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await asyncio.to_thread(listener.request, "POST", UPLOAD, listener.stranger, {"X-Remote-User": "admin"})
    assert listener.asked == []


@pytest.mark.parametrize("path", [
    names.extension_base("tenant", "disk") + "/healthz",
    names.extension_base("tenant", "..") + "/v1beta1/upload",
    names.extension_base("tenant", "disk") + "/../../uploads/other/proxy/v1beta1/upload",
    f"/apis/{names.EXTENSION_GROUP}/v1/namespaces/tenant/uploads/disk/proxy/v1beta1/upload",
    "/v1beta1/upload",
])
async def test_other_paths_are_not_found(listener: Listener, path: str) -> None:
    status, _, _ = await asyncio.to_thread(listener.request, "POST", path, listener.front_proxy,
                                           {"X-Remote-User": "alice", "Content-Length": "0"})
    assert status == 404 and listener.asked == []


async def test_no_protocol_switch_through_the_api_server(listener: Listener) -> None:
    status, _, body = await asyncio.to_thread(listener.request, "POST", UPLOAD, listener.front_proxy, {
        "X-Remote-User": "alice", "Content-Length": "0", "Connection": "Upgrade", "Upgrade": names.TLS_UPGRADE})
    assert status == 400 and "not offered through the Kubernetes API server" in body


def test_a_cluster_without_a_request_header_ca_trusts_nobody(tmp_path: Path) -> None:
    write_client_ca(tmp_path / "ca.crt", "")
    assert "BEGIN CERTIFICATE" in (tmp_path / "ca.crt").read_text()  # a CA whose key nobody has


# -- the routing: as for a token of the PVC the path names ----------------------------------------------------
def claim(annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "disk", "annotations": annotations}, "spec": {}}


@pytest.fixture
def proxy() -> UploadProxy:
    tls = UpstreamTls(None, "cdi", cert=b"c", key=b"k", ca_bundle=b"ca")
    tls._context = ssl.create_default_context()
    tls._checked = float("inf")  # the material is not read: this test never connects
    return UploadProxy(FakeKube(), public_key=b"unused", upstream_tls=tls, ready_timeout=0.0)


async def test_routing_needs_an_upload_target_that_is_ready(proxy: UploadProxy) -> None:
    alice = Caller("alice", ("devs",))
    kube = proxy.client
    answer = await proxy.plan_for("tenant", "disk", "/v1beta1/upload-async", alice, None)
    assert isinstance(answer, Answer) and (answer.status, answer.text) == (
        503, "rejecting Upload Request for PVC disk that doesn't exist")
    await kube.create(groups.PVCS, claim({}), "tenant")
    answer = await proxy.plan_for("tenant", "disk", "/v1beta1/upload-async", alice, None)
    assert isinstance(answer, Answer) and answer.text == "PVC disk is not an upload target"
    await kube.patch(groups.PVCS, "disk", {"metadata": {"annotations": {ann.UPLOAD_TARGET: "",
                                                                        ann.POD_PHASE: "Succeeded"}}}, "tenant")
    answer = await proxy.plan_for("tenant", "disk", "/v1beta1/upload-async", alice, None)
    assert isinstance(answer, Answer) and answer.status == 503 and answer.headers == ((names.STATE_HEADER, "done"),)
    await kube.patch(groups.PVCS, "disk", {"metadata": {"annotations": {ann.POD_PHASE: "Running",
                                                                        ann.POD_READY: "true"}}}, "tenant")
    await kube.create(groups.SERVICES, {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": names.upload_service_name("disk")}, "spec": {"clusterIP": "10.0.0.9", "ports": [{"port": 443}]}},
        "tenant")
    forward = await proxy.plan_for("tenant", "disk", "/v1beta1/upload-async", alice, "tenant/disk")
    assert isinstance(forward, Forward)
    assert (forward.url, forward.server_hostname) == ("https://10.0.0.9:443/v1beta1/upload-async",
                                                      "cdi-upload-disk.tenant.svc")
    answer = await proxy.plan_for("tenant", "disk", "/v1beta1/upload-async", alice, "tenant/other")
    assert isinstance(answer, Answer) and answer.status == 400  # the client meant another claim
