"""CDI's DataVolume mutating webhook (`cdi-api-datavolume-mutate`, path `/datavolume-mutate`, CREATE and
UPDATE of datavolumes): who may clone from another namespace, and the clone token.

For a DataVolume that clones (`source.pvc`, `source.snapshot`, or a `sourceRef` DataSource naming one)
from another namespace, SubjectAccessReviews ask whether the requesting user may `create`
`datavolumes/source` there, or (a PVC) `pods`, or (a snapshot) both `pods` and `pvcs`; if not, the
request is refused with CDI's "User NAME has insufficient permissions in clone source namespace NS".
At creation every clone DataVolume gets `cdi.kubevirt.io/storage.clone.token`: a token signed with
cdi-apiserver's key (`cdi.common.uploadtoken`, operation `Clone`, the source's name, namespace and
resource, params `targetNamespace`/`targetName`, valid 5 minutes), which the controller verifies before
it reads another namespace's volume, so a DataVolume written without passing through this webhook
clones nothing there.

Unlike CDI, a token that arrives on the object is never kept: whoever wrote it, the webhook removes the
clone token a CREATE carries (and the extended one, which only the controller issues) and refuses to let
an UPDATE add or change one, so the only clone token a DataVolume can hold is the one written here after
the checks above, for the user the API server names. (CDI passes a pre-populated or static-volume
DataVolume through with whatever token it carries: a token minted elsewhere then clones.)"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from typing import Any

import jsonpatch
import orjson
from aiohttp import web

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.validation import Cause
from cdi.api.views import DataSourceView, DataVolumeView, dig
from cdi.apiserver.admission import review_response
from cdi.common import uploadtoken
from cdi.kube import KubeClient, NotFound

log = logging.getLogger(__name__)
Obj = dict[str, Any]

PATH = "/datavolume-mutate"
CONFIGURATION = "cdi-api-datavolume-mutate"
WEBHOOK = "datavolume-mutate.cdi.kubevirt.io"


def insufficient(user: str, namespace: str) -> str:
    return f"User {user} has insufficient permissions in clone source namespace {namespace}"


class DataVolumeMutation:
    def __init__(self, client: KubeClient, private_key: Callable[[], bytes]) -> None:
        self.client = client
        self.private_key = private_key

    def routes(self) -> list[web.RouteDef]:
        return [web.post(PATH, self.mutate)]

    async def mutate(self, http: web.Request) -> web.Response:
        review = await http.json()
        request = review.get("request") or {}
        operation = request.get("operation")
        dv: Obj = request.get("object") or {}
        view = DataVolumeView(dv)
        if operation not in ("CREATE", "UPDATE") or view.deleting:
            return review_response(review)
        old_annotations = DataVolumeView(request.get("oldObject") or {}).annotations if operation == "UPDATE" else None
        annotations = untrusted_tokens_removed(view.annotations, old_annotations)
        target_ns = str(view.namespace or request.get("namespace") or "")
        target_name = str(view.name or request.get("name") or "")
        found = await clone_source(self.client, dv, target_ns)
        if found is not None:
            kind, source_ns, source_name = found
            no_token_okay = ann.PRE_POPULATED in annotations or ann.CHECK_STATIC_VOLUME in annotations
            user: Mapping[str, Any] = request.get("userInfo") or {}
            may_clone = source_ns == target_ns or await self._may_clone(kind, source_ns, source_name, user)
            if not may_clone and not no_token_okay:
                return review_response(review, [Cause("spec.source.PVC.namespace",
                                                      insufficient(str(user.get("username", "")), source_ns),
                                                      "FieldValueInvalid")])
            if may_clone and operation == "CREATE":
                annotations[ann.CLONE_TOKEN] = uploadtoken.issue(
                    self.private_key(), source_ns, source_name, operation=uploadtoken.OPERATION_CLONE,
                    resource=uploadtoken.PVC_RESOURCE if kind == "pvc" else uploadtoken.SNAPSHOT_RESOURCE,
                    params={"targetNamespace": target_ns, "targetName": target_name})
        if annotations == view.annotations:
            return review_response(review)
        metadata = {**(dv.get("metadata") or {}), "annotations": annotations}
        if not annotations:
            del metadata["annotations"]
        patch = jsonpatch.make_patch(dv, {**dv, "metadata": metadata}).patch
        uid = request.get("uid", "")
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": uid, "allowed": True, "patchType": "JSONPatch",
            "patch": base64.b64encode(orjson.dumps(patch)).decode()}})

    async def _may_clone(self, kind: str, namespace: str, name: str, user: Mapping[str, Any]) -> bool:
        """CDI's SubjectAccessReviews: `datavolumes/source`, else `pods` (a PVC) or `pods` and `pvcs` (a
        snapshot), in the source namespace."""
        spec = {"user": user.get("username", ""), "groups": list(user.get("groups") or []),
                "uid": user.get("uid", ""), "extra": dict(user.get("extra") or {})}

        async def allowed(resource: str, subresource: str = "", group: str = "") -> bool:
            attributes = {"namespace": namespace, "verb": "create", "group": group, "resource": resource,
                          "subresource": subresource, "name": name}
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": {**spec, "resourceAttributes": attributes}}
            answer = await self.client.create(groups.SUBJECTACCESSREVIEWS, review)
            return bool(dig(answer, "status", "allowed"))

        if await allowed("datavolumes", "source", groups.CDI_GROUP):
            return True
        if kind == "pvc":
            return await allowed("pods")
        return await allowed("pods") and await allowed("pvcs")


def untrusted_tokens_removed(annotations: Mapping[str, str], old: Mapping[str, str] | None) -> dict[str, str]:
    """The annotations without a clone token the requester wrote. At creation (`old` None) neither token
    stays. On an update the short token may stay as stored or go, never be added or changed; the extended
    one may change, as the controller writes it by an update once it has verified the short one (it is
    signed by the controller's issuer and bound to this DataVolume's uid, which no creation can know)."""
    kept = dict(annotations)
    checked = (ann.CLONE_TOKEN, ann.EXTENDED_CLONE_TOKEN) if old is None else (ann.CLONE_TOKEN,)
    for key in checked:
        stored = (old or {}).get(key)
        if key in kept and kept[key] != stored:
            if stored is None:
                del kept[key]
            else:
                kept[key] = stored
    return kept


async def clone_source(client: KubeClient, dv: Mapping[str, Any], namespace: str) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of what a clone DataVolume reads, its DataSource followed; None when it
    does not clone (or its DataSource does not exist yet)."""
    for kind in ("pvc", "snapshot"):
        source = DataVolumeView(dv).source.get(kind)
        if source is not None:
            return kind, str(source.get("namespace") or namespace), str(source.get("name") or "")
    ref = DataVolumeView(dv).source_ref
    if ref is None or ref.get("kind") != "DataSource":
        return None
    ds_namespace = str(ref.get("namespace") or namespace)
    try:
        data_source = await client.get(groups.DATASOURCES, str(ref.get("name")), ds_namespace)
    except NotFound:
        return None
    source_spec = DataSourceView(data_source).source
    if source_spec.get("dataSource") is not None:
        source_spec = dig(data_source, "status", "source") or {}
    for kind in ("pvc", "snapshot"):
        source = source_spec.get(kind)
        if source is not None:
            return kind, str(source.get("namespace") or ds_namespace), str(source.get("name") or "")
    return None


def mutating_configuration(namespace: str, service: str, ca_bundle: str) -> Obj:
    """CDI's `cdi-api-datavolume-mutate` as its operator installs it."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION, "labels": {"cdi.kubevirt.io": service}},
            "webhooks": [{
                "name": WEBHOOK, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "matchPolicy": "Exact", "timeoutSeconds": 10,
                "reinvocationPolicy": "Never", "namespaceSelector": {}, "objectSelector": {},
                "clientConfig": {"service": {"namespace": namespace, "name": service, "path": PATH, "port": 443},
                                 "caBundle": ca_bundle},
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [groups.CDI_GROUP],
                           "apiVersions": [groups.CDI_VERSION], "resources": ["datavolumes"], "scope": "*"}]}]}
