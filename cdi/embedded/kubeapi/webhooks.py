"""Admission webhooks: the server calls the endpoints registered by Mutating- and
ValidatingWebhookConfiguration objects with AdmissionReview v1, as kube-apiserver does (rules,
namespace and object selectors, caBundle, failurePolicy, timeouts, JSONPatch responses), presenting a
client certificate of this server's CA (CN `WEBHOOK_CLIENT`) to every webhook, as kube-apiserver does when
its admission configuration names a `kubeConfigFile`: a webhook can tell the API server from anyone else
who reaches its Service."""

from __future__ import annotations

import asyncio
import base64
import errno
import logging
import ssl
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import orjson

from cdi.common import pki
from cdi.embedded.kubeapi import services
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.kubeapi.objects import AdmissionRequest, Obj
from cdi.embedded.kubeapi.selectors import label_selector_from_object
from cdi.embedded.kubeapi.store import Store

log = logging.getLogger(__name__)

MUTATING = "admissionregistration.k8s.io/mutatingwebhookconfigurations"
VALIDATING = "admissionregistration.k8s.io/validatingwebhookconfigurations"
_EXEMPT = {MUTATING, VALIDATING}
WEBHOOK_CLIENT = "kube-apiserver-webhook-client"  # the common name cdi-apiserver expects under `cdi up`


def _dropped(exc: aiohttp.ClientError) -> bool:
    """The connection went away under the request, as a reused keep-alive connection closed by the
    peer does (a refused or unreachable endpoint is a ClientConnectorError: not this)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionResetError)):
        return True
    return isinstance(exc, aiohttp.ClientOSError) and bool(exc.errno in {errno.ECONNRESET, errno.EPIPE})


def _matches_rule(rule: Mapping[str, Any], request: AdmissionRequest) -> bool:
    rtype = request.rtype
    ops = rule.get("operations") or []
    if "*" not in ops and request.operation not in ops:
        return False
    groups = rule.get("apiGroups") or []
    if "*" not in groups and rtype.group not in groups:
        return False
    versions = rule.get("apiVersions") or []
    if "*" not in versions and rtype.version not in versions:
        return False
    resource = rtype.plural + (f"/{request.subresource}" if request.subresource else "")
    wanted = rule.get("resources") or []
    if not any(r in ("*/*", resource) or (r == "*" and not request.subresource)
               or (r.endswith("/*") and r[:-2] == rtype.plural and request.subresource)
               or (r.startswith("*/") and request.subresource == r[2:]) for r in wanted):
        return False
    scope = rule.get("scope", "*")
    return scope == "*" or (scope == "Namespaced") == rtype.namespaced


class WebhookAdmission:
    """An AdmissionHook that consults the stored webhook configurations on every request."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._session: aiohttp.ClientSession | None = None
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._identity: tuple[Path, Path] | None = None

    def setup_identity(self, ca: pki.KeyPair, directory: Path) -> None:
        """The client certificate every webhook call presents, issued anew at each start."""
        cert, key = directory / "webhook-client.crt", directory / "webhook-client.key"
        pki.issue(ca, WEBHOOK_CLIENT, None, server=False, client=True).write(cert, key)
        self._identity = (cert, key)
        self._contexts.clear()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _webhooks(self, key: str, request: AdmissionRequest) -> list[Obj]:
        if request.rtype.key in _EXEMPT:
            return []
        matched = []
        for _, _, entry in self.store.items(key):
            for hook in entry.obj().get("webhooks") or []:
                if any(_matches_rule(rule, request) for rule in hook.get("rules") or []) and \
                        self._selected(hook, request):
                    matched.append(hook)
        return matched

    def _selected(self, hook: Mapping[str, Any], request: AdmissionRequest) -> bool:
        obj = request.obj if request.obj is not None else request.old or {}
        object_selector = label_selector_from_object(hook.get("objectSelector"))
        if not object_selector.matches((obj.get("metadata") or {}).get("labels")):
            return False
        namespace_selector = label_selector_from_object(hook.get("namespaceSelector"))
        if namespace_selector.empty:
            return True
        name = request.namespace or (request.name if request.rtype.kind == "Namespace" else "")
        if not name:
            return True
        ns = self.store.get("/namespaces", "", name)
        labels = ns.labels if ns is not None else {}
        return namespace_selector.matches(labels)

    async def mutate(self, request: AdmissionRequest) -> Obj | None:
        obj = request.obj
        for hook in self._webhooks(MUTATING, request):
            response = await self._call(hook, request)
            if response is None:
                continue
            patch = response.get("patch")
            if patch and request.obj is not None:
                operations = orjson.loads(base64.b64decode(patch))
                obj = jsonpatch.JsonPatch(operations).apply(request.obj)
                request.obj = obj
        return obj

    async def validate(self, request: AdmissionRequest) -> None:
        hooks = self._webhooks(VALIDATING, request)
        await asyncio.gather(*(self._call(hook, request) for hook in hooks))

    def _review(self, request: AdmissionRequest) -> dict[str, Any]:
        rtype = request.rtype
        kind = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
        resource = {"group": rtype.group, "version": rtype.version, "resource": rtype.plural}
        body: dict[str, Any] = {
            "uid": str(uuid.uuid4()), "kind": kind, "resource": resource, "requestKind": kind,
            "requestResource": resource, "name": request.name, "operation": request.operation,
            "userInfo": request.ctx.user.as_dict(), "object": request.obj, "oldObject": request.old,
            "dryRun": request.ctx.dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1",
                        "kind": {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions",
                                 "DELETE": "DeleteOptions"}.get(request.operation, "")},
        }
        if request.subresource:
            body["subResource"] = request.subresource
        if rtype.namespaced:
            body["namespace"] = request.namespace
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}

    def _context(self, ca_bundle: str) -> ssl.SSLContext:
        """One TLS context per CA bundle: aiohttp pools connections by context, so a context made per
        call would open (and leave idle) a new connection for every call."""
        context = self._contexts.get(ca_bundle)
        if context is None:
            if len(self._contexts) >= 64:
                self._contexts.pop(next(iter(self._contexts)))
            context = pki.client_context(base64.b64decode(ca_bundle).decode() if ca_bundle else None,
                                         identity=self._identity)
            self._contexts[ca_bundle] = context
        return context

    def _pooled(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    @staticmethod
    async def _post(session: aiohttp.ClientSession, url: str, body: bytes, context: ssl.SSLContext,
                    server_name: str | None) -> Any:
        async with session.post(url, data=body, ssl=context, server_hostname=server_name,
                                headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                raise ConnectionError(f"the server responded with {resp.status}")
            return orjson.loads(await resp.read())

    def _endpoint(self, client: Mapping[str, Any]) -> tuple[str, str | None]:
        if client.get("url"):
            return str(client["url"]), None
        service = client.get("service") or {}
        host, port = services.resolve(self.store, service.get("namespace", ""), service.get("name", ""),
                                      int(service.get("port", 443)))
        path = service.get("path") or "/"
        return f"https://{host}:{port}{path}", f"{service['name']}.{service['namespace']}.svc"

    async def _call(self, hook: Mapping[str, Any], request: AdmissionRequest) -> Mapping[str, Any] | None:
        name = hook.get("name", "")
        client = hook.get("clientConfig") or {}
        timeout = float(hook.get("timeoutSeconds") or 10)
        try:
            url, server_name = self._endpoint(client)
            context = self._context(str(client.get("caBundle") or ""))
            body = orjson.dumps(self._review(request))
            async with asyncio.timeout(timeout):
                try:
                    review = await self._post(self._pooled(), url, body, context, server_name)
                except aiohttp.ClientError as exc:
                    if not _dropped(exc):
                        raise
                    # The webhook server closed the connection under the request: most often a kept-alive
                    # one whose idle timeout raced our reuse of it (Go's transport, kube-apiserver's
                    # client, retries that case on a new connection). A call can be repeated safely, as
                    # admissionregistration/v1 webhooks declare no side effects: once, on a new one.
                    log.info("webhook %s: connection dropped (%s), retrying on a new one", name, exc)
                    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                        review = await self._post(fresh, url, body, context, server_name)
        except (aiohttp.ClientError, ConnectionError, TimeoutError, OSError, ValueError) as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("webhook %s failed, ignored: %s", name, exc)
                return None
            why = str(exc) or ("context deadline exceeded" if isinstance(exc, TimeoutError) else type(exc).__name__)
            raise StatusError(500, f'Internal error occurred: failed calling webhook "{name}": {why}',
                              "InternalError") from exc
        response = review.get("response") or {}
        request.ctx.warnings.extend(response.get("warnings") or [])
        if not response.get("allowed"):
            # as kube-apiserver's ToStatusErr: the webhook's code (at least 400), reason and details
            status = response.get("status") or {}
            code = max(int(status.get("code") or 400), 400)
            message = status.get("message") or status.get("reason") or ""
            denied = f'admission webhook "{name}" denied the request'
            raise StatusError(code, f"{denied}: {message}" if message else f"{denied} without explanation",
                              str(status.get("reason") or ""), dict(status.get("details") or {}))
        return response
