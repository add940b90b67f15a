"""The cdi-apiserver process: an HTTPS server for admission webhooks and the upload token API
(an aggregated API), plus what registers both with the cluster it serves.

TLS: its own serving certificate (CA kept in the state directory, published as the webhooks' and the
APIService's caBundle); client certificates are *optional* and, when given, must chain to the
aggregation layer's request-header CA, so that one listener serves webhook calls (no client
certificate) and front-proxied token requests (the front proxy's certificate)."""

from __future__ import annotations

import base64
import logging
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web

from cdi.api import groups
from cdi.apiserver.admission import Admission
from cdi.apiserver.frontproxy import RequestHeaderConfig
from cdi.apiserver.signingkey import ensure_signing_key
from cdi.apiserver.uploadtokens import UploadTokenApi
from cdi.common import pki
from cdi.kube import AlreadyExists, KubeClient, NotFound

log = logging.getLogger(__name__)
SERVICE_NAME = "cdi-api"
UPLOAD_APISERVICE = f"{groups.UPLOAD_VERSION}.{groups.UPLOAD_GROUP}"
Obj = dict[str, Any]


class CdiApiServer:
    def __init__(self, client: KubeClient, namespace: str, state_dir: Path) -> None:
        self.client = client
        self.namespace = namespace
        self.dir = state_dir
        self.admission = Admission(client)
        self.ca: pki.KeyPair | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._signing_key: bytes | None = None
        self.request_headers = RequestHeaderConfig()
        self.tokens = UploadTokenApi(client, self.signing_key, self._request_header_config)

    def signing_key(self) -> bytes:
        assert self._signing_key is not None, "start() loads the signing key"
        return self._signing_key

    async def _request_header_config(self) -> RequestHeaderConfig:
        return self.request_headers

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(self.admission.routes())
        app.add_routes(self.tokens.routes())
        app.router.add_get("/healthz", _healthz)
        return app

    def _certificates(self, hosts: list[str]) -> pki.KeyPair:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # it holds the CA's private key
        ca_crt, ca_key = self.dir / "ca.crt", self.dir / "ca.key"
        if ca_crt.exists():
            self.ca = pki.KeyPair.read(ca_crt, ca_key)
        else:
            self.ca = pki.make_ca("cdi-apiserver-ca")
            self.ca.write(ca_crt, ca_key)
        return pki.issue(self.ca, f"{SERVICE_NAME}.{self.namespace}.svc", hosts)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        names = [host, SERVICE_NAME, f"{SERVICE_NAME}.{self.namespace}", f"{SERVICE_NAME}.{self.namespace}.svc"]
        self._signing_key = await ensure_signing_key(self.client, self.namespace)
        self.request_headers = await RequestHeaderConfig.load(self.client)
        context = pki.server_context(self._certificates(names), self.dir / "serving")
        if self.request_headers.client_ca:
            context.verify_mode = ssl.CERT_OPTIONAL
            context.load_verify_locations(cadata=self.request_headers.client_ca)
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _apply(self, gvr: groups.GVR, body: Obj, namespace: str | None = None) -> None:
        name = body["metadata"]["name"]
        try:
            current = await self.client.get(gvr, name, namespace)
        except NotFound:
            try:
                await self.client.create(gvr, body, namespace)
            except AlreadyExists:
                pass
            return
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await self.client.replace(gvr, body, namespace)

    async def register(self, endpoint_ip: str | None = "127.0.0.1") -> None:
        """The `cdi-api` Service, and the webhook configuration and APIService that address it (with the
        CA bundle), as CDI's operator installs them. With `endpoint_ip` (one process, as in `cdi up`) the
        Service has no selector and its Endpoints point at this process; without it (a Deployment on a real
        cluster) the Service selects the pods labelled `cdi.kubevirt.io: cdi-apiserver`."""
        assert self.ca is not None
        service: Obj = {"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": SERVICE_NAME, "namespace": self.namespace},
                        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.port}]}}
        if endpoint_ip is None:
            service["spec"]["selector"] = {"cdi.kubevirt.io": "cdi-apiserver"}
        await self._apply(groups.SERVICES, service, self.namespace)
        if endpoint_ip is not None:
            await self._apply(groups.ENDPOINTS, {
                "apiVersion": "v1", "kind": "Endpoints",
                "metadata": {"name": SERVICE_NAME, "namespace": self.namespace},
                "subsets": [{"addresses": [{"ip": endpoint_ip}], "ports": [{"name": "https", "port": self.port}]}]},
                self.namespace)
        bundle = base64.b64encode(self.ca.cert_pem).decode()
        await self._apply(groups.VALIDATING_WEBHOOKS, validating_configuration(self.namespace, bundle))
        await self._apply(groups.VALIDATING_WEBHOOKS, cdi_validating_configuration(self.namespace, bundle))
        await self._apply(groups.APISERVICES, upload_apiservice(self.namespace, bundle))


def validating_configuration(namespace: str, ca_bundle: str) -> Obj:
    def hook(name: str, path: str, resource: str, operations: list[str]) -> Obj:
        return _hook(namespace, ca_bundle, name, path, resource, operations, "Fail")

    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "cdi-api-datavolume-validate", "labels": {"cdi.kubevirt.io": ""}},
            "webhooks": [hook("datavolume-validate.cdi.kubevirt.io", "/datavolume-validate", "datavolumes",
                              ["CREATE", "UPDATE"])]}


def cdi_validating_configuration(namespace: str, ca_bundle: str) -> Obj:
    """CDI's uninstall guard on the CDI resource (`Ignore` as CDI's: a CDI whose apiserver is gone can go)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "cdi-api-validate", "labels": {"cdi.kubevirt.io": ""}},
            "webhooks": [_hook(namespace, ca_bundle, "cdi-validate.cdi.kubevirt.io", "/cdi-validate", "cdis",
                               ["DELETE"], "Ignore")]}


def _hook(namespace: str, ca_bundle: str, name: str, path: str, resource: str, operations: list[str],
          failure_policy: str) -> Obj:
    return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": failure_policy,
            "clientConfig": {"service": {"namespace": namespace, "name": SERVICE_NAME, "path": path, "port": 443},
                             "caBundle": ca_bundle},
            "rules": [{"operations": operations, "apiGroups": [groups.CDI_GROUP],
                       "apiVersions": [groups.CDI_VERSION], "resources": [resource], "scope": "*"}]}


def upload_apiservice(namespace: str, ca_bundle: str) -> Obj:
    """The APIService that makes the aggregation layer send upload.cdi.kubevirt.io here (as CDI's)."""
    return {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": UPLOAD_APISERVICE, "labels": {"cdi.kubevirt.io": ""}},
            "spec": {"group": groups.UPLOAD_GROUP, "version": groups.UPLOAD_VERSION, "groupPriorityMinimum": 1000,
                     "versionPriority": 15, "caBundle": ca_bundle,
                     "service": {"namespace": namespace, "name": SERVICE_NAME, "port": 443}}}


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")
