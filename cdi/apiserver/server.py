"""The cdi-apiserver process: an HTTPS server for admission webhooks and the upload token API
(an aggregated API), plus what registers both with the cluster it serves.

TLS: its own serving certificate (CA kept in the state directory, published as the webhooks' and the
APIService's caBundle); client certificates are *optional* and, when given, must chain to the
aggregation layer's request-header CA or (with `webhook_client_names`) to the cluster's client CA, so
that one listener serves webhook calls (the API server's certificate, required when names are given)
and front-proxied token requests (the front proxy's certificate). Both CAs come from
`kube-system/extension-apiserver-authentication`, followed as the API server republishes it (a rotated
CA), in place in the serving context as the TLS profile is. Versions and cipher suites are CDIConfig's
`tlsSecurityProfile`, followed as it changes (`cdi.kube.tlswatch`), as CDI's."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.rendering import webhook_rendering_enabled
from cdi.apiserver import dvmutate, pvcmutate
from cdi.apiserver.admission import Admission
from cdi.apiserver.frontproxy import (
    AUTH_CONFIGMAP,
    AUTH_NAMESPACE,
    RequestHeaderConfig,
    Unauthenticated,
    WebhookCallers,
)
from cdi.apiserver.signingkey import ensure_signing_key
from cdi.apiserver.uploadtokens import UploadTokenApi
from cdi.common import pki
from cdi.kube import AlreadyExists, ApiError, Backoff, Informer, KubeClient, NotFound
from cdi.kube.requestheader import AuthenticationWatch
from cdi.kube.tlswatch import TLSProfileWatch

log = logging.getLogger(__name__)
SERVICE_NAME = "cdi-api"
UPLOAD_APISERVICE = f"{groups.UPLOAD_VERSION}.{groups.UPLOAD_GROUP}"
PVC_MUTATE_CONFIGURATION = "cdi-api-pvc-mutate"
POPULATOR_VALIDATE_CONFIGURATION = "cdi-api-populator-validate"
POPULATOR_VALIDATE_RESOURCES = ["volumeimportsources", "volumeuploadsources"]
Obj = dict[str, Any]


class CdiApiServer:
    def __init__(self, client: KubeClient, namespace: str, state_dir: Path,
                 webhook_client_names: tuple[str, ...] = ()) -> None:
        self.client = client
        self.webhook_client_names = webhook_client_names
        self.webhook_callers = WebhookCallers()
        self.namespace = namespace
        self.dir = state_dir
        self.admission = Admission(client)
        self.pvc_mutation = pvcmutate.PvcMutation(client)
        self.pvc_webhook: PvcWebhookRegistration | None = None
        self.ca: pki.KeyPair | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._signing_key: bytes | None = None
        self.request_headers = RequestHeaderConfig()
        self.tokens = UploadTokenApi(client, self.signing_key, self._request_header_config)
        self.dv_mutation = dvmutate.DataVolumeMutation(client, self.signing_key)
        self.tls_profile = TLSProfileWatch(client)
        self._context: ssl.SSLContext | None = None
        self._trusted: set[str] = set()  # the client CA bundles the serving context was given
        self.authentication = AuthenticationWatch(client)
        self._names: list[str] = []
        self._endpoint_ip: str | None = None

    def signing_key(self) -> bytes:
        assert self._signing_key is not None, "start() loads the signing key"
        return self._signing_key

    async def _request_header_config(self) -> RequestHeaderConfig:
        return self.request_headers

    def app(self) -> web.Application:
        app = web.Application()
        for route in (*self.admission.routes(), *self.pvc_mutation.routes(), *self.dv_mutation.routes()):
            assert isinstance(route, web.RouteDef)
            app.router.add_route(route.method, route.path, self._from_api_server(route.handler))
        app.add_routes(self.tokens.routes())
        app.router.add_get("/healthz", _healthz)
        return app

    def _from_api_server(self, handler: Handler) -> Handler:
        """An admission webhook's handler, answering only the callers `webhook_callers` admits."""
        async def checked(request: web.Request) -> web.StreamResponse:
            try:
                self.webhook_callers.check(request)
            except Unauthenticated as exc:
                log.warning("refused an admission webhook call from %s: %s", request.remote, exc)
                return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                          "message": str(exc), "reason": "Forbidden", "code": 403}, status=403)
            return await handler(request)
        return checked

    def _certificates(self, hosts: list[str]) -> pki.KeyPair:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # it holds the CA's private key
        ca_crt, ca_key = self.dir / "ca.crt", self.dir / "ca.key"
        if ca_crt.exists():
            self.ca = pki.KeyPair.read(ca_crt, ca_key)
        else:
            self.ca = pki.make_ca("cdi-apiserver-ca")
            self.ca.write(ca_crt, ca_key)
        leaf_crt, leaf_key = self.dir / "tls.crt", self.dir / "tls.key"
        if leaf_crt.exists() and leaf_key.exists():  # cdi-operator's `cdi-apiserver-server-cert` (certConfig)
            return pki.KeyPair.read(leaf_crt, leaf_key)
        return pki.issue(self.ca, f"{SERVICE_NAME}.{self.namespace}.svc", hosts)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        names = self._names = [host, SERVICE_NAME, f"{SERVICE_NAME}.{self.namespace}",
                                f"{SERVICE_NAME}.{self.namespace}.svc"]
        self._signing_key = await ensure_signing_key(self.client, self.namespace)
        # not waited for beyond its first read: what that says serves until the watch says otherwise (it
        # keeps trying where it may not watch, as an informer does)
        await self.authentication.start()
        data = self.authentication.data
        self.request_headers = RequestHeaderConfig.from_configmap(data)
        self.webhook_callers = WebhookCallers.from_configmap(data, self.webhook_client_names)
        if self.webhook_callers.required and not self.webhook_callers.client_ca:
            log.warning("%s/%s names no client CA: every admission webhook call will be refused",
                        AUTH_NAMESPACE, AUTH_CONFIGMAP)
        await self.tls_profile.start()
        context = pki.server_context(self._certificates(names), self.dir / "serving", policy=self.tls_profile.policy)
        self._context = context
        self._trust(self.request_headers.client_ca, self.webhook_callers.client_ca)
        self.tls_profile.subscribe(self._follow)
        self.authentication.subscribe(self._authentication_changed)
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def _trust(self, *bundles: str) -> None:
        """Client certificates of these CAs pass the TLS handshake from now on (optional ones: the handlers
        decide whom they answer). The context only ever gains CAs; one the API server stops publishing
        is refused by `WebhookCallers.check`, which verifies the issuer against the published bundle."""
        assert self._context is not None
        for bundle in bundles:
            if bundle and bundle not in self._trusted:
                self._context.verify_mode = ssl.CERT_OPTIONAL
                self._context.load_verify_locations(cadata=bundle)
                self._trusted.add(bundle)

    def _authentication_changed(self, data: Mapping[str, str]) -> None:
        """The API server republished its CAs (or the names and headers of its front proxy): connections made
        from now on are checked against them, as Kubernetes' aggregated API servers follow this ConfigMap."""
        request_headers = RequestHeaderConfig.from_configmap(data)
        callers = WebhookCallers.from_configmap(data, self.webhook_client_names)
        if request_headers == self.request_headers and callers == self.webhook_callers:
            return
        if self._context is not None:
            try:
                self._trust(request_headers.client_ca, callers.client_ca)
            except (ssl.SSLError, ValueError) as exc:  # no PEM certificates: keep what was trusted, say so
                log.warning("%s/%s holds a client CA that cannot be loaded, keeping the previous ones: %s",
                            AUTH_NAMESPACE, AUTH_CONFIGMAP, exc)
                return
        log.info("%s/%s changed: following its client CAs", AUTH_NAMESPACE, AUTH_CONFIGMAP)
        self.request_headers, self.webhook_callers = request_headers, callers

    def _follow(self, policy: pki.TLSPolicy) -> None:
        """A change of CDIConfig's profile: the serving context changes in place, on the event loop, where
        aiohttp makes every connection from it; connections made afterwards get the new versions and suites."""
        if self._context is not None:
            policy.apply(self._context)

    async def certificates_renewed(self, ca_bundle: bytes) -> None:
        """Its CA and serving certificate were replaced in the state directory, and `ca_bundle` is what
        callers must trust now (the new CA and the previous ones still valid): the webhooks and the
        APIService get the bundle first, then new connections present the new certificate, in place in
        the serving context as `_follow` changes it. What runs the server in-process and renews its
        certificates calls this (`cdi up`); on a cluster cdi-operator rolls the Deployment instead."""
        await self.register(self._endpoint_ip, ca_bundle)
        pair = self._certificates(self._names)
        serving = self.dir / "serving"
        pair.write(serving / "tls.crt", serving / "tls.key")
        if self._context is not None:
            self._context.load_cert_chain(serving / "tls.crt", serving / "tls.key")

    async def stop(self) -> None:
        await self.authentication.stop()
        await self.tls_profile.stop()
        if self.pvc_webhook is not None:
            await self.pvc_webhook.stop()
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

    async def register(self, endpoint_ip: str | None = "127.0.0.1", ca_bundle: bytes | None = None) -> None:
        """The `cdi-api` Service, and the webhook configuration and APIService that address it (with the
        CA bundle: `ca_bundle`, else its CA), as CDI's operator installs them. With `endpoint_ip` (one
        process, as in `cdi up`) the Service has no selector and its Endpoints point at this process;
        without it (a Deployment on a real cluster) the Service selects the pods labelled
        `cdi.kubevirt.io: cdi-apiserver`."""
        assert self.ca is not None
        self._endpoint_ip = endpoint_ip
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
        bundle = base64.b64encode(ca_bundle or self.ca.cert_pem).decode()
        await self._apply(groups.VALIDATING_WEBHOOKS, validating_configuration(self.namespace, bundle))
        await self._apply(groups.MUTATING_WEBHOOKS, dvmutate.mutating_configuration(self.namespace, SERVICE_NAME,
                                                                                  bundle))
        await self._apply(groups.VALIDATING_WEBHOOKS, cdi_validating_configuration(self.namespace, bundle))
        await self._apply(groups.VALIDATING_WEBHOOKS, dataimportcron_validating_configuration(self.namespace, bundle))
        await self._apply(groups.VALIDATING_WEBHOOKS, populator_validating_configuration(self.namespace, bundle))
        await self._apply(groups.APISERVICES, upload_apiservice(self.namespace, bundle))
        if self.pvc_webhook is None:
            self.pvc_webhook = PvcWebhookRegistration(self.client, pvc_mutating_configuration(self.namespace, bundle))
            self.pvc_webhook.start()
        else:
            self.pvc_webhook.want(pvc_mutating_configuration(self.namespace, bundle))


class PvcWebhookRegistration:
    """Keeps the PVC mutating webhook's configuration in line with CDIConfig `spec.webhookPvcRendering`:
    present while enabled, removed when `Disabled` (CDI's operator does this; here the server that
    answers the webhook does, since it holds the CA bundle). No CDIConfig yet: nothing is done, as CDI."""

    def __init__(self, client: KubeClient, desired: Obj) -> None:
        self.client = client
        self.desired = desired
        self.configs = Informer(client, groups.CDICONFIGS)
        self.configs.add_handler(self._changed, self._updated, None)
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _changed(self, _: Obj) -> None:
        self._dirty.set()

    def _updated(self, _: Obj, new: Obj) -> None:
        self._dirty.set()

    def want(self, desired: Obj) -> None:
        """A new configuration to keep (a renewed CA bundle), written at once where it is enabled."""
        self.desired = desired
        self._dirty.set()

    def start(self) -> None:
        self.configs.start()
        self._task = asyncio.create_task(self._run(), name="pvc-webhook-registration")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.configs.stop()

    async def _run(self) -> None:
        backoff = Backoff(initial=0.2, maximum=10.0)
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.sync()
                backoff.reset()
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("could not update %s, retrying: %s", PVC_MUTATE_CONFIGURATION, exc)
                self._dirty.set()
                await backoff.sleep()

    async def sync(self) -> None:
        config = self.configs.get_by_name(groups.CDI_CONFIG_NAME)
        if config is None:
            return
        try:
            current = await self.client.get(groups.MUTATING_WEBHOOKS, PVC_MUTATE_CONFIGURATION)
        except NotFound:
            current = None
        if not webhook_rendering_enabled(config.get("spec") or {}):
            if current is not None:
                with contextlib.suppress(NotFound):
                    await self.client.delete(groups.MUTATING_WEBHOOKS, PVC_MUTATE_CONFIGURATION)
            return
        if current is None:
            with contextlib.suppress(AlreadyExists):
                await self.client.create(groups.MUTATING_WEBHOOKS, self.desired)
            return
        if current.get("webhooks") != self.desired["webhooks"] or \
                current["metadata"].get("labels") != self.desired["metadata"]["labels"]:
            body = {**self.desired, "metadata": {**self.desired["metadata"],
                                                 "resourceVersion": current["metadata"]["resourceVersion"]}}
            await self.client.replace(groups.MUTATING_WEBHOOKS, body)


def validating_configuration(namespace: str, ca_bundle: str) -> Obj:
    def hook(name: str, path: str, resource: str, operations: list[str]) -> Obj:
        return _hook(namespace, ca_bundle, name, path, resource, operations, "Fail")

    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "cdi-api-datavolume-validate", "labels": {"cdi.kubevirt.io": ""}},
            "webhooks": [hook("datavolume-validate.cdi.kubevirt.io", "/datavolume-validate", "datavolumes",
                              ["CREATE", "UPDATE"])]}


def dataimportcron_validating_configuration(namespace: str, ca_bundle: str) -> Obj:
    """CDI's `cdi-api-dataimportcron-validate` (a configuration of its own, as the operator installs it)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "cdi-api-dataimportcron-validate", "labels": {"cdi.kubevirt.io": ""}},
            "webhooks": [_hook(namespace, ca_bundle, "dataimportcron-validate.cdi.kubevirt.io",
                               "/dataimportcron-validate", "dataimportcrons", ["CREATE", "UPDATE"], "Fail")]}


def populator_validating_configuration(namespace: str, ca_bundle: str) -> Obj:
    """CDI's `cdi-api-populator-validate`: VolumeImportSources and VolumeUploadSources (CDI validates no
    VolumeCloneSource), on creation and update."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": POPULATOR_VALIDATE_CONFIGURATION, "labels": {"cdi.kubevirt.io": ""}},
            "webhooks": [_hook(namespace, ca_bundle, "populator-validate.cdi.kubevirt.io", "/populator-validate",
                               POPULATOR_VALIDATE_RESOURCES, ["CREATE", "UPDATE"], "Fail")]}


def cdi_validating_configuration(namespace: str, ca_bundle: str) -> Obj:
    """CDI's uninstall guard on the CDI resource (`Ignore` as CDI's: a CDI whose apiserver is gone can go)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "cdi-api-validate", "labels": {"cdi.kubevirt.io": ""}},
            "webhooks": [_hook(namespace, ca_bundle, "cdi-validate.cdi.kubevirt.io", "/cdi-validate", "cdis",
                               ["DELETE"], "Ignore")]}


def _hook(namespace: str, ca_bundle: str, name: str, path: str, resource: str | list[str], operations: list[str],
          failure_policy: str) -> Obj:
    return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": failure_policy,
            "clientConfig": {"service": {"namespace": namespace, "name": SERVICE_NAME, "path": path, "port": 443},
                             "caBundle": ca_bundle},
            "rules": [{"operations": operations, "apiGroups": [groups.CDI_GROUP],
                       "apiVersions": [groups.CDI_VERSION],
                       "resources": [resource] if isinstance(resource, str) else list(resource), "scope": "*"}]}


def pvc_mutating_configuration(namespace: str, ca_bundle: str) -> Obj:
    """CDI's `cdi-api-pvc-mutate`: PVC creations whose labels opt in (objectSelector), nothing else, so a
    cdi-apiserver that is down never blocks an ordinary claim."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": PVC_MUTATE_CONFIGURATION, "labels": {"cdi.kubevirt.io": SERVICE_NAME}},
            "webhooks": [{
                "name": "pvc-mutate.cdi.kubevirt.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "matchPolicy": "Exact", "timeoutSeconds": 10,
                "reinvocationPolicy": "Never", "namespaceSelector": {},
                "objectSelector": {"matchLabels": {ann.LABEL_APPLY_STORAGE_PROFILE: "true"}},
                "clientConfig": {"service": {"namespace": namespace, "name": SERVICE_NAME, "path": pvcmutate.PATH,
                                             "port": 443}, "caBundle": ca_bundle},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["persistentvolumeclaims"], "scope": "*"}]}]}


def upload_apiservice(namespace: str, ca_bundle: str) -> Obj:
    """The APIService that makes the aggregation layer send upload.cdi.kubevirt.io here (as CDI's)."""
    return {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": UPLOAD_APISERVICE, "labels": {"cdi.kubevirt.io": ""}},
            "spec": {"group": groups.UPLOAD_GROUP, "version": groups.UPLOAD_VERSION, "groupPriorityMinimum": 1000,
                     "versionPriority": 15, "caBundle": ca_bundle,
                     "service": {"namespace": namespace, "name": SERVICE_NAME, "port": 443}}}


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")
