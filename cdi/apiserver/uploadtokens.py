"""The aggregated API `upload.cdi.kubevirt.io/v1beta1`: UploadTokenRequest, `create` only.

`POST /apis/upload.cdi.kubevirt.io/v1beta1/namespaces/{ns}/uploadtokenrequests` with
`{kind: UploadTokenRequest, spec: {pvcName}}` answers 201 with the request echoed and `status.token`
set: a token (`cdi.common.uploadtoken`) that lets its holder start uploads into that one PVC for
5 minutes. As in CDI the PVC is not looked at here: the upload proxy checks it when an upload starts.

Who may ask: whoever may `create` `uploadtokenrequests` in the namespace (CDI's `doc/RBAC.md`). The
aggregation layer checks that before proxying; this server checks it again with a
SubjectAccessReview for the user the front proxy names (defense in depth, as CDI's authorizer does),
after authenticating the front proxy itself (`frontproxy.py`). Discovery (`/apis/...` without a
namespace) is open to everyone, as in CDI."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from cdi.api import groups
from cdi.apiserver.frontproxy import Caller, RequestHeaderConfig, Unauthenticated, caller_of
from cdi.common import uploadtoken
from cdi.kube import ApiError, KubeClient

log = logging.getLogger(__name__)

GROUP = groups.UPLOAD_GROUP
VERSION = groups.UPLOAD_VERSION
GROUP_VERSION = groups.UPLOAD_API_VERSION
RESOURCE = "uploadtokenrequests"
KIND = "UploadTokenRequest"
BASE = f"/apis/{GROUP}/{VERSION}"


def status(code: int, reason: str, message: str) -> web.Response:
    """A Kubernetes Status object, so that kubectl and client libraries show the message."""
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


def api_group() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [version],
            "preferredVersion": version}


def resource_list() -> dict[str, Any]:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION, "resources": [
        {"name": RESOURCE, "singularName": "uploadtokenrequest", "namespaced": True, "kind": KIND,
         "verbs": ["create"]}]}


class UploadTokenApi:
    """The routes, the signer and the authorizer of the token API."""

    def __init__(self, client: KubeClient, private_key: Callable[[], bytes],
                 auth_config: Callable[[], Awaitable[RequestHeaderConfig]]) -> None:
        self.client = client
        self.private_key = private_key
        self.auth_config = auth_config

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/apis", self.group_list),
            web.get(f"/apis/{GROUP}", self.group),
            web.get(BASE, self.resources),
            web.post(BASE + "/namespaces/{namespace}/" + RESOURCE, self.create),
        ]

    async def group_list(self, _: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]})

    async def group(self, _: web.Request) -> web.Response:
        return web.json_response(api_group())

    async def resources(self, _: web.Request) -> web.Response:
        return web.json_response(resource_list())

    async def create(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        try:
            caller = caller_of(request, await self.auth_config())
        except Unauthenticated as exc:
            log.info("refused an upload token request: %s", exc)
            return status(401, "Unauthorized", str(exc))
        denied = await self._authorize(caller, namespace)
        if denied is not None:
            return denied
        try:
            body = await request.json()
        except ValueError as exc:
            return status(400, "BadRequest", f"the request body is not JSON: {exc}")
        if not isinstance(body, dict) or body.get("kind", KIND) != KIND:
            return status(400, "BadRequest", f"expected a {KIND}")
        pvc = str((body.get("spec") or {}).get("pvcName") or "")
        if not pvc:
            return status(422, "Invalid", f"{KIND}.spec.pvcName: Required value: the PVC to upload into")
        token = uploadtoken.issue(self.private_key(), namespace, pvc)
        metadata = dict(body.get("metadata") or {})
        metadata["namespace"] = namespace
        log.info("issued an upload token for PVC %s/%s to %s", namespace, pvc, caller.user)
        response = {"apiVersion": GROUP_VERSION, "kind": KIND, "metadata": metadata,
                    "spec": {"pvcName": pvc}, "status": {"token": token}}
        return web.json_response(response, status=201, headers={"X-Content-Type-Options": "nosniff"})

    async def _authorize(self, caller: Caller, namespace: str) -> web.Response | None:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
            "user": caller.user, "groups": list(caller.groups), "extra": caller.extra,
            "resourceAttributes": {"namespace": namespace, "verb": "create", "group": GROUP, "version": VERSION,
                                   "resource": RESOURCE}}}
        try:
            result = await self.client.create(groups.SUBJECTACCESSREVIEWS, review)
        except ApiError as exc:
            log.error("SubjectAccessReview failed: %s", exc)
            return status(500, "InternalError", f"cannot authorize the request: {exc}")
        if (result.get("status") or {}).get("allowed"):
            return None
        return status(403, "Forbidden", f'{RESOURCE}.{GROUP} is forbidden: User "{caller.user}" cannot create '
                                        f'resource "{RESOURCE}" in API group "{GROUP}" in the namespace '
                                        f'"{namespace}"')
