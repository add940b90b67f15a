"""API groups registered with an APIService are proxied to their server, with the caller's
identity passed in X-Remote-* headers over the front-proxy client certificate."""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from cdi.common import pki
from tests.integration.kubeapi.conftest import Api, make_api
from tests.support.cluster import async_wait_for

GROUP = "/apis/upload.cdi.kubevirt.io/v1beta1"


@pytest.fixture
async def aggregated(tmp_path: Path) -> AsyncIterator[tuple[Api, list[dict[str, Any]]]]:
    tokens = tmp_path / "tokens.csv"
    tokens.write_text("bob-token,bob,1001,devs\n")
    api = await make_api(tmp_path / "srv", token_auth_file=tokens)
    auth = await api.ok("GET", "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication")
    seen: list[dict[str, Any]] = []

    async def discovery(request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion":
                                  "upload.cdi.kubevirt.io/v1beta1", "resources": [
                                      {"name": "uploadtokenrequests", "namespaced": True,
                                       "kind": "UploadTokenRequest", "verbs": ["create"]}]})

    async def create(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        seen.append({"user": request.headers.get("X-Remote-User"),
                     "groups": request.headers.getall("X-Remote-Group", []),
                     "identity": sorted((k.lower(), v) for k, v in request.headers.items()
                                        if k.lower().startswith(("x-remote-extra-", "impersonate-"))),
                     "client_cn": dict(x[0] for x in peer["subject"])["commonName"] if peer else None})
        body = await request.json()
        return web.json_response({**body, "status": {"token": "signed"}}, status=201)

    async def stream(request: web.Request) -> web.Response:
        """A long-running subresource: the body read as it arrives, when it arrives."""
        record: dict[str, Any] = {"content_length": request.headers.get("Content-Length"),
                                  "transfer_encoding": request.headers.get("Transfer-Encoding"),
                                  "user": request.headers.get("X-Remote-User"), "chunks": 0, "received": 0}
        seen.append(record)
        async for chunk in request.content.iter_any():
            record["chunks"] += 1
            record["received"] += len(chunk)
        return web.Response(text=str(record["received"]))

    app = web.Application()
    app.add_routes([web.get(GROUP, discovery),
                    web.post(GROUP + "/namespaces/{ns}/uploadtokenrequests", create),
                    web.post(GROUP + "/namespaces/{ns}/things/{name}/proxy/{rest:.*}", stream)])
    ca = pki.make_ca("cdi-apiserver-ca")
    context = pki.server_context(pki.issue(ca, "cdi-api", ["127.0.0.1", "cdi-api.cdi.svc"]), tmp_path / "tls",
                                 client_ca=auth["data"]["requestheader-client-ca-file"].encode())
    context.verify_mode = ssl.CERT_REQUIRED
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await api.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cdi"}})
    await api.ok("POST", "/api/v1/namespaces/cdi/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "cdi-api"},
        "spec": {"ports": [{"port": 443, "targetPort": 8443}]}})
    await api.ok("POST", "/api/v1/namespaces/cdi/endpoints", {
        "apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "cdi-api"},
        "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": port}]}]})
    await api.ok("POST", "/apis/apiregistration.k8s.io/v1/apiservices", {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.upload.cdi.kubevirt.io"},
        "spec": {"group": "upload.cdi.kubevirt.io", "version": "v1beta1", "groupPriorityMinimum": 1000,
                 "versionPriority": 15, "caBundle": base64.b64encode(ca.cert_pem).decode(),
                 "service": {"namespace": "cdi", "name": "cdi-api", "port": 443}}})
    yield api, seen
    await runner.cleanup()
    await api.session.close()
    await api.server.stop()


async def test_requests_for_an_aggregated_group_reach_its_server(aggregated: tuple[Api, list[dict[str, Any]]]) -> None:
    api, seen = aggregated
    groups = await api.ok("GET", "/apis")
    assert "upload.cdi.kubevirt.io" in [g["name"] for g in groups["groups"]]
    resources = await api.ok("GET", GROUP)
    assert resources["resources"][0]["name"] == "uploadtokenrequests"
    request = {"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
               "metadata": {"name": "t"}, "spec": {"pvcName": "disk"}}
    created = await api.ok("POST", GROUP + "/namespaces/default/uploadtokenrequests", request)
    assert created["status"]["token"] == "signed"
    assert seen[-1]["user"] == "admin" and "system:masters" in seen[-1]["groups"]
    assert seen[-1]["client_cn"] == "front-proxy-client"


async def test_aggregated_requests_are_authorized_first(aggregated: tuple[Api, list[dict[str, Any]]]) -> None:
    api, seen = aggregated
    request = {"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
               "metadata": {"name": "t"}, "spec": {"pvcName": "disk"}}
    async with api.session.post(api.url + GROUP + "/namespaces/default/uploadtokenrequests", json=request,
                                headers={"Authorization": "Bearer bob-token"}) as resp:
        assert resp.status == 403
        assert 'cannot create resource "uploadtokenrequests"' in (await resp.json())["message"]
    assert seen == []


async def test_the_backend_hears_the_impersonated_users_extras_and_nothing_the_caller_forged(
        aggregated: tuple[Api, list[dict[str, Any]]]) -> None:
    """An aggregated server trusts X-Remote-* from the front proxy: extras it receives are those this server
    granted (escaped as client-go escapes header keys), never headers the caller sent itself."""
    api, seen = aggregated
    request = {"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
               "metadata": {"name": "t"}, "spec": {"pvcName": "disk"}}
    headers = {"Impersonate-User": "carol", "Impersonate-Group": "system:masters",
               "Impersonate-Extra-Example.com%2fScope": "view", "X-Remote-Extra-Forged": "yes"}
    await api.ok("POST", GROUP + "/namespaces/default/uploadtokenrequests", request, headers=headers)
    assert seen[-1]["user"] == "carol" and seen[-1]["groups"] == ["system:masters", "system:authenticated"]
    assert seen[-1]["identity"] == [("x-remote-extra-example.com%2fscope", "view")]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_reaches_the_aggregated_server_while_it_is_sent(aggregated: tuple[Api, list[dict[str, Any]]],
                                                                     framing: str) -> None:
    """As kube-apiserver proxies a `proxy` subresource: streamed, with the client's framing, no time limit. The
    client sends the rest of its body only once the server has its first bytes (held, it would never get them)."""
    api, seen = aggregated
    first = b"x" * (1 << 20)

    async def body() -> AsyncIterator[bytes]:
        yield first
        await async_wait_for(lambda: seen and seen[-1]["received"] > 0, 10, message="the first bytes, passed on")
        for _ in range(3):
            yield first

    headers = {"Content-Length": str(4 * len(first))} if framing == "content-length" else {}
    async with api.session.post(api.url + GROUP + "/namespaces/default/things/disk/proxy/v1beta1/upload",
                                data=body(), headers=headers) as resp:
        assert (resp.status, await resp.text()) == (200, str(4 * len(first)))
    record = seen[-1]
    assert record["user"] == "admin" and record["chunks"] > 1
    if framing == "content-length":
        assert (record["content_length"], record["transfer_encoding"]) == (str(4 * len(first)), None)
    else:
        assert (record["content_length"], record["transfer_encoding"]) == (None, "chunked")
