"""The PVC mutating webhook (CDI's `/pvc-mutate`): a bare PVC labelled
`cdi.kubevirt.io/applyStorageProfile: "true"` is completed from its StorageProfile exactly as a
DataVolume's claim is (`cdi.api.rendering`): storage class, access modes, volume mode
(`FromStorageProfile` asks for the profile's), and the size with the filesystem overhead.

The API server calls it only for labelled claims (the configuration's objectSelector), and only
while CDIConfig `spec.webhookPvcRendering` is not `Disabled` (the configuration is removed then, see
`server.PvcWebhookRegistration`). Cluster state is read at each call: a labelled claim is rare, and a
stale cache would render a claim with yesterday's profile."""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from typing import Any

import jsonpatch
import orjson
from aiohttp import web

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.rendering import ClusterStorage, RenderError, render_pvc_spec
from cdi.api.views import ClaimView, StorageProfileView
from cdi.kube import KubeClient, NotFound

log = logging.getLogger(__name__)
Obj = dict[str, Any]
PATH = "/pvc-mutate"
_PVC_RESOURCE = {"group": "", "version": "v1", "resource": "persistentvolumeclaims"}


def _response(review: Mapping[str, Any], **fields: Any) -> web.Response:
    uid = (review.get("request") or {}).get("uid", "")
    return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                              "response": {"uid": uid, **fields}})


def _refused(review: Mapping[str, Any], message: str) -> web.Response:
    """As CDI's toAdmissionResponseError: not allowed, 400, the error's text."""
    return _response(review, allowed=False, status={"status": "Failure", "message": message, "code": 400})


class PvcMutation:
    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def routes(self) -> list[web.RouteDef]:
        return [web.post(PATH, self.mutate)]

    async def cluster_storage(self) -> ClusterStorage:
        classes = (await self.client.list_all(groups.STORAGECLASSES)).items
        profiles = (await self.client.list_all(groups.STORAGEPROFILES)).items
        by_class = {StorageProfileView(p).name: p for p in profiles}
        try:
            config = await self.client.get(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
        except NotFound:
            config = {}
        return ClusterStorage(classes, by_class, config.get("status") or {})

    async def mutate(self, http: web.Request) -> web.Response:
        review = await http.json()
        request = review.get("request") or {}
        if request.get("operation") != "CREATE":
            return _response(review, allowed=True)
        resource = request.get("resource") or {}
        if {k: resource.get(k, "") for k in _PVC_RESOURCE} != _PVC_RESOURCE:
            return _refused(review, f"resource is {resource}, but request is: {_PVC_RESOURCE}")
        pvc: Obj = request.get("object") or {}
        if ClaimView(pvc).labels.get(ann.LABEL_APPLY_STORAGE_PROFILE) != "true":
            log.warning("got PVC %s/%s which was not labeled for rendering", request.get("namespace"),
                        ClaimView(pvc).name)
            return _response(review, allowed=True)
        try:
            spec = render_pvc_spec(pvc, await self.cluster_storage())
        except RenderError as exc:
            return _refused(review, str(exc))
        patch = jsonpatch.make_patch(pvc, {**pvc, "spec": spec}).patch
        if not patch:
            return _response(review, allowed=True)
        return _response(review, allowed=True, patchType="JSONPatch",
                         patch=base64.b64encode(orjson.dumps(patch)).decode())
