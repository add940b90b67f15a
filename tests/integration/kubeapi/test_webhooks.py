"""The server calls admission webhooks registered through the API with AdmissionReview v1."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from cdi.common import pki
from tests.integration.kubeapi.conftest import DV, Api, datavolume


@pytest.fixture
async def webhook_server(tmp_path: Path) -> AsyncIterator[tuple[str, bytes, list[dict[str, Any]]]]:
    ca = pki.make_ca("webhook-ca")
    reviews: list[dict[str, Any]] = []

    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        reviews.append(review)
        patch = [{"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}]
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode()}})

    async def complete_claim(request: web.Request) -> web.Response:
        review = await request.json()
        reviews.append(review)
        patch = [{"op": "add", "path": "/spec/accessModes", "value": ["ReadWriteMany"]},
                 {"op": "replace", "path": "/spec/volumeMode", "value": "Block"}]
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode()}})

    async def validate(request: web.Request) -> web.Response:
        review = await request.json()
        reviews.append(review)
        obj = review["request"]["object"] or {}
        allowed = (obj.get("spec") or {}).get("contentType") != "archive"
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 400, "message": "archive is not allowed here", "reason": "BadRequest"}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": response})

    app = web.Application()
    app.add_routes([web.post("/mutate", mutate), web.post("/validate", validate),
                    web.post("/complete-claim", complete_claim)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=pki.server_context(
        pki.issue(ca, "webhook", ["127.0.0.1"]), tmp_path / "webhook-tls"))
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"https://127.0.0.1:{port}", ca.cert_pem, reviews
    await runner.cleanup()


def configuration(kind: str, url: str, ca: bytes, failure: str = "Fail") -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": kind.lower()},
            "webhooks": [{"name": f"{kind.lower()}.cdi.kubevirt.io", "admissionReviewVersions": ["v1"],
                          "sideEffects": "None", "failurePolicy": failure,
                          "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
                          "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["cdi.kubevirt.io"],
                                     "apiVersions": ["v1beta1"], "resources": ["datavolumes"]}]}]}


async def test_mutating_and_validating_webhooks_are_called(
        api: Api, webhook_server: tuple[str, bytes, list[dict[str, Any]]]) -> None:
    url, ca, reviews = webhook_server
    base = "/apis/admissionregistration.k8s.io/v1"
    await api.ok("POST", f"{base}/mutatingwebhookconfigurations",
                 configuration("MutatingWebhookConfiguration", url + "/mutate", ca))
    await api.ok("POST", f"{base}/validatingwebhookconfigurations",
                 configuration("ValidatingWebhookConfiguration", url + "/validate", ca))
    created = await api.ok("POST", DV, datavolume("hooked"))
    assert created["metadata"]["labels"] == {"mutated": "yes"}
    request = reviews[0]["request"]
    assert request["operation"] == "CREATE" and request["namespace"] == "default"
    assert request["resource"] == {"group": "cdi.kubevirt.io", "version": "v1beta1", "resource": "datavolumes"}
    assert request["userInfo"]["username"] == "admin"
    status, body = await api.call("POST", DV, datavolume("refused", contentType="archive"))
    assert status == 400
    assert body["message"] == ('admission webhook "validatingwebhookconfiguration.cdi.kubevirt.io" denied the '
                               "request: archive is not allowed here")
    # an impersonated user's extras reach the webhook with the rest of who asked
    await api.ok("POST", DV, datavolume("as-carol"), headers={
        "Impersonate-User": "carol", "Impersonate-Group": "system:masters", "Impersonate-Extra-Scopes": "view"})
    user = reviews[-1]["request"]["userInfo"]
    assert (user["username"], user["extra"]) == ("carol", {"scopes": ["view"]})


async def test_unreachable_webhook_fails_closed_or_open_by_policy(api: Api, tmp_path: Path) -> None:
    ca = pki.make_ca("nobody")
    base = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    await api.ok("POST", base, configuration("ValidatingWebhookConfiguration", "https://127.0.0.1:1/x", ca.cert_pem))
    status, body = await api.call("POST", DV, datavolume("blocked"))
    assert status == 500 and "failed calling webhook" in body["message"]
    hook = configuration("ValidatingWebhookConfiguration", "https://127.0.0.1:1/x", ca.cert_pem, failure="Ignore")
    current = await api.ok("GET", f"{base}/validatingwebhookconfiguration")
    hook["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await api.ok("PUT", f"{base}/validatingwebhookconfiguration", hook)
    await api.ok("POST", DV, datavolume("let-through"))


async def test_a_claim_is_validated_after_mutating_webhooks_completed_it(
        api: Api, webhook_server: tuple[str, bytes, list[dict[str, Any]]]) -> None:
    """As kube-apiserver: defaults first (volumeMode Filesystem), then mutating webhooks, then validation,
    so that a webhook may supply what validation requires (CDI's PVC webhook fills accessModes)."""
    url, ca, reviews = webhook_server
    hook = configuration("MutatingWebhookConfiguration", url + "/complete-claim", ca)
    hook["webhooks"][0]["rules"] = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                     "resources": ["persistentvolumeclaims"]}]
    hook["webhooks"][0]["objectSelector"] = {"matchLabels": {"complete": "true"}}
    await api.ok("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", hook)
    claims = "/api/v1/namespaces/default/persistentvolumeclaims"

    def claim(name: str, **labels: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "labels": labels},
                "spec": {"resources": {"requests": {"storage": "1Gi"}}}}

    created = await api.ok("POST", claims, claim("completed", complete="true"))
    assert (created["spec"]["accessModes"], created["spec"]["volumeMode"]) == (["ReadWriteMany"], "Block")
    assert reviews[-1]["request"]["object"]["spec"]["volumeMode"] == "Filesystem"
    status, body = await api.call("POST", claims, claim("incomplete"))
    assert status == 422 and "at least 1 access mode is required" in body["message"]


@asynccontextmanager
async def closing_webhook(tmp_path: Path, drop_first: bool = False) -> AsyncIterator[tuple[str, bytes, list[int]]]:
    """A validating webhook that answers one request per connection, keeping it alive as HTTP/1.1 does,
    and closes it unanswered when a second request arrives on it: what a server whose keep-alive
    timeout fires as a client reuses the connection does. With `drop_first`, the very first request
    it gets is closed unanswered too (a server restarting under its clients). Yields its URL, CA and
    the connections it closed with a request unanswered."""
    ca = pki.make_ca("webhook-ca")
    numbers = itertools.count()
    dropped: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = next(numbers)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            assert length is not None, head
            review = json.loads(await reader.readexactly(int(length.group(1))))
            if drop_first and connection == 0:
                dropped.append(connection)
                return
            answer = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                 "response": {"uid": review["request"]["uid"], "allowed": True}}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer))
            await writer.drain()
            if await reader.read(1):
                dropped.append(connection)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    context = pki.server_context(pki.issue(ca, "webhook", ["127.0.0.1"]), tmp_path / "closing-tls")
    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"https://127.0.0.1:{port}/validate", ca.cert_pem, dropped
    finally:
        server.close()


async def test_a_webhook_connection_the_server_closes_unanswered_is_retried_once(api: Api, tmp_path: Path) -> None:
    async with closing_webhook(tmp_path, drop_first=True) as (url, ca, dropped):
        await api.ok("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                     configuration("ValidatingWebhookConfiguration", url, ca))
        status, body = await api.call("POST", DV, datavolume("after-a-drop"))
        assert status == 201, body  # not 500 "Server disconnected"
        assert dropped == [0]


async def test_a_kept_alive_webhook_connection_the_server_closed_is_retried_on_a_new_one(
        api: Api, tmp_path: Path) -> None:
    async with closing_webhook(tmp_path) as (url, ca, dropped):
        await api.ok("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                     configuration("ValidatingWebhookConfiguration", url, ca))
        for i in range(3):
            status, body = await api.call("POST", DV, datavolume(f"kept-alive-{i}"))
            assert status == 201, body
        assert dropped, "no call reused the kept-alive connection of the call before it"
