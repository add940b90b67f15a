"""The aggregation layer: API groups registered by APIService objects are served by another server
(CDI's cdi-apiserver serves upload.cdi.kubevirt.io), and requests for them are proxied to it with
the caller's identity in X-Remote-* headers over a front-proxy client certificate, as
kube-aggregator does. The identity headers are trusted by the backend through the
`kube-system/extension-apiserver-authentication` ConfigMap this server publishes.

Bodies are streamed both ways, never held (an upload through `upload.extensions.cdi.dev` is gigabytes), with
the client's framing: its `Content-Length` when it gave one, else chunked. No request timeout applies to a
proxied request, as kube-apiserver applies none to a `proxy` subresource (it cuts other aggregated requests at
60 s; the aggregated servers of this project answer those in milliseconds)."""

from __future__ import annotations

import base64
import logging
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from cdi.common import pki
from cdi.embedded.kubeapi import services
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.kubeapi.objects import UserInfo
from cdi.embedded.kubeapi.store import Store

log = logging.getLogger(__name__)

APISERVICES = "apiregistration.k8s.io/apiservices"
FRONT_PROXY_CLIENT = "front-proxy-client"
_HOP_HEADERS = {"host", "authorization", "connection", "keep-alive", "transfer-encoding", "content-length",
                "x-remote-user", "x-remote-group", "upgrade"}
# what the caller says about its identity is never passed on: only what this server decided it is
_IDENTITY_PREFIXES = ("x-remote-extra-", "impersonate-")
_HEADER_TOKEN = frozenset(b"!#$&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _header_key_escape(key: str) -> str:
    """An extra's key as client-go puts it in a header name: each byte a header token may not hold (and
    `%`) percent-encoded, so `example.com/scope` travels as `example.com%2Fscope`."""
    return "".join(chr(b) if b in _HEADER_TOKEN else f"%{b:02X}" for b in key.encode())


def _identity(user: UserInfo) -> list[tuple[str, str]]:
    """The front-proxy headers naming `user`, as kube-aggregator sets them."""
    headers = [("X-Remote-User", user.name)]
    headers += [("X-Remote-Group", group) for group in user.groups]
    headers += [(f"X-Remote-Extra-{_header_key_escape(key)}", value)
                for key, values in user.extra.items() for value in values]
    return headers


class Aggregator:
    def __init__(self, store: Store, data_dir: Path) -> None:
        self.store = store
        self.dir = data_dir
        self.ca: pki.KeyPair | None = None
        self.client: pki.KeyPair | None = None
        self._session: aiohttp.ClientSession | None = None

    def setup_identity(self) -> None:
        """The front-proxy CA and client certificate the backends verify."""
        ca_crt, ca_key = self.dir / "front-proxy-ca.crt", self.dir / "front-proxy-ca.key"
        if ca_crt.exists():
            self.ca = pki.KeyPair.read(ca_crt, ca_key)
        else:
            self.ca = pki.make_ca("front-proxy-ca")
            self.ca.write(ca_crt, ca_key)
        self.client = pki.issue(self.ca, FRONT_PROXY_CLIENT, None, server=False, client=True)
        self.client.write(self.dir / "front-proxy-client.crt", self.dir / "front-proxy-client.key")

    def authentication_configmap(self, client_ca: bytes) -> dict[str, Any]:
        assert self.ca is not None
        return {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {
                "client-ca-file": client_ca.decode(),
                "requestheader-client-ca-file": self.ca.cert_pem.decode(),
                "requestheader-allowed-names": f'["{FRONT_PROXY_CLIENT}"]',
                "requestheader-username-headers": '["X-Remote-User"]',
                "requestheader-group-headers": '["X-Remote-Group"]',
                "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
            },
        }

    def apiservices(self) -> list[dict[str, Any]]:
        return [entry.obj() for _, _, entry in self.store.items(APISERVICES)]

    def claimed(self, group: str, version: str) -> Mapping[str, Any] | None:
        """The APIService that delegates group/version to another server, if any."""
        for apiservice in self.apiservices():
            spec = apiservice.get("spec") or {}
            if spec.get("group") == group and spec.get("version") == version and spec.get("service"):
                return apiservice
        return None

    def groups(self) -> list[tuple[str, list[str]]]:
        found: dict[str, list[str]] = {}
        for apiservice in self.apiservices():
            spec = apiservice.get("spec") or {}
            if spec.get("service") and spec.get("group"):
                found.setdefault(spec["group"], []).append(spec.get("version", "v1"))
        return sorted(found.items())

    def _ssl(self, spec: Mapping[str, Any]) -> ssl.SSLContext:
        assert self.client is not None
        identity = (self.dir / "front-proxy-client.crt", self.dir / "front-proxy-client.key")
        if spec.get("insecureSkipTLSVerify"):
            return pki.insecure_client_context(identity)
        ca = base64.b64decode(spec["caBundle"]).decode() if spec.get("caBundle") else None
        return pki.client_context(ca, identity=identity)

    async def proxy(self, request: web.Request, apiservice: Mapping[str, Any], user: UserInfo) -> web.StreamResponse:
        spec = apiservice.get("spec") or {}
        service = spec["service"]
        try:
            host, port = services.resolve(self.store, service.get("namespace", ""), service.get("name", ""),
                                          int(service.get("port", 443)))
        except ConnectionError as exc:
            raise StatusError(503, f"service unavailable: {exc}", "ServiceUnavailable") from exc
        forwarded = [(k, v) for k, v in request.headers.items()
                     if k.lower() not in _HOP_HEADERS and not k.lower().startswith(_IDENTITY_PREFIXES)]
        forwarded += _identity(user)
        if request.content_length is not None and "Transfer-Encoding" not in request.headers:
            forwarded.append(("Content-Length", str(request.content_length)))  # as sent: not re-framed as chunks
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        url = f"https://{host}:{port}{request.path_qs}"
        try:
            async with self._session.request(
                    request.method, url, headers=forwarded, ssl=self._ssl(spec),
                    server_hostname=f"{service['name']}.{service['namespace']}.svc",
                    data=request.content if request.can_read_body else None) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise StatusError(503, f"error trying to reach service: {exc}", "ServiceUnavailable") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

