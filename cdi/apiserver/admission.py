"""AdmissionReview v1 handlers for CDI's kinds. The rules themselves are pure functions in
`cdi.api.validation`; what needs the cluster (does a PVC of that name already exist?) is looked up
here."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from cdi.api import annotations as ann
from cdi.api import featuregates, groups
from cdi.api.cronvalidation import already_managed, validate_dataimportcron
from cdi.api.validation import (
    Cause,
    rejection_message,
    validate_datavolume,
    validate_volume_import_source,
    validate_volume_upload_source,
)
from cdi.api.views import ClaimView, DataVolumeView, ObjectView, dig
from cdi.api.workeroverrides import worker_override_causes
from cdi.kube import KubeClient, NotFound

log = logging.getLogger(__name__)
Obj = dict[str, Any]
UNINSTALL_BLOCK = "BlockUninstallIfWorkloadsExist"
UNINSTALL_REFUSED = ("rejecting the uninstall request, since there are still {} DataVolumes present. Either delete "
                     "all DataVolumes or change the uninstall strategy before uninstalling CDI")


def review_response(review: Mapping[str, Any], causes: list[Cause] | None = None,
                    code: int = 422) -> web.Response:
    request = review.get("request") or {}
    response: Obj = {"uid": request.get("uid", ""), "allowed": not causes}
    if causes:
        response["status"] = {
            "status": "Failure", "code": code, "message": rejection_message(causes),
            "details": {"causes": [{"type": c.reason, "message": c.message, "field": c.field} for c in causes]},
        }
    return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})


class Admission:
    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/datavolume-validate", self.validate_datavolume),
                web.post("/cdi-validate", self.validate_cdi),
                web.post("/dataimportcron-validate", self.validate_dataimportcron),
                web.post("/populator-validate", self.validate_populator)]

    async def validate_cdi(self, http: web.Request) -> web.Response:
        """CDI's uninstall guard: deleting a deployed CDI resource whose `uninstallStrategy` is
        `BlockUninstallIfWorkloadsExist` is refused while DataVolumes (other than a DataImportCron's)
        exist anywhere, with CDI's message."""
        review = await http.json()
        request = review.get("request") or {}
        if request.get("operation") != "DELETE":
            return review_response(review)
        cdi: Mapping[str, Any] = request.get("oldObject") or {}
        if not cdi and request.get("name"):
            try:
                cdi = await self.client.get(groups.CDIS, str(request["name"]))
            except NotFound:
                return review_response(review)
        if dig(cdi, "status", "phase") in (None, "", "Error"):
            return review_response(review)
        if dig(cdi, "spec", "uninstallStrategy") != UNINSTALL_BLOCK:
            return review_response(review)
        listed = await self.client.list_all(groups.DATAVOLUMES, label_selector=f"!{ann.LABEL_DATAIMPORTCRON}")
        count = len(listed.items)
        if not count:
            return review_response(review)
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": request.get("uid", ""), "allowed": False,
            "status": {"status": "Failure", "code": 400, "message": UNINSTALL_REFUSED.format(count)}}})

    async def validate_datavolume(self, http: web.Request) -> web.Response:
        review = await http.json()
        request = review.get("request") or {}
        if request.get("operation") not in ("CREATE", "UPDATE"):
            return review_response(review)
        dv: Mapping[str, Any] = request.get("object") or {}
        old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
        causes = validate_datavolume(dv, old)
        if not causes:
            causes = worker_override_causes(dv, old, await self._worker_cap(dv))
        if not causes and request.get("operation") == "CREATE":
            causes = await self._claim_conflict(dv, request.get("namespace", ""))
        return review_response(review, causes)

    async def validate_dataimportcron(self, http: web.Request) -> web.Response:
        review = await http.json()
        request = review.get("request") or {}
        if request.get("operation") not in ("CREATE", "UPDATE"):
            return review_response(review)
        cron: Mapping[str, Any] = request.get("object") or {}
        old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
        causes = validate_dataimportcron(cron, old)
        if not causes and old is None:
            others = await self.client.list_all(groups.DATAIMPORTCRONS, request.get("namespace") or None)
            causes = already_managed(cron, list(others.items))
        return review_response(review, causes)

    async def validate_populator(self, http: web.Request) -> web.Response:
        """CDI's `/populator-validate`: VolumeImportSources and VolumeUploadSources, on creation and update;
        any other resource sent here is an error, as in CDI."""
        review = await http.json()
        request = review.get("request") or {}
        resource = request.get("resource") or {}
        validate = {"volumeimportsources": validate_volume_import_source,
                    "volumeuploadsources": validate_volume_upload_source}.get(str(resource.get("resource")))
        if resource.get("group") != groups.CDI_GROUP or validate is None:
            return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
                "uid": request.get("uid", ""), "allowed": False, "status": {
                    "status": "Failure", "message": f"unexpected resource: {resource.get('resource')}"}}})
        if request.get("operation") not in ("CREATE", "UPDATE"):
            return review_response(review)
        old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
        return review_response(review, validate(request.get("object") or {}, old))

    async def _worker_cap(self, dv: Mapping[str, Any]) -> str | None:
        """CDIConfig's `worker.maxResources`, read only for a DataVolume that asks for worker resources."""
        if ann.WORKER_RESOURCES not in DataVolumeView(dv).annotations:
            return None
        try:
            config = await self.client.get(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
        except NotFound:
            return None
        return ObjectView(config).annotations.get(ann.WORKER_MAX_RESOURCES)

    async def _claim_conflict(self, dv: Mapping[str, Any], namespace: str) -> list[Cause]:
        """A PVC of the DataVolume's name that is not a DataVolume's would be taken over silently."""
        name = DataVolumeView(dv).name
        try:
            pvc = await self.client.get(groups.PVCS, name, namespace)
        except NotFound:
            return []
        try:
            config = await self.client.get(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
        except NotFound:
            config = None
        if not featuregates.claim_requires_work(
                pvc, dv, featuregates.enabled(config, featuregates.DATA_VOLUME_CLAIM_ADOPTION)):
            return []  # populated for it, or adoptable (annotation, else the DataVolumeClaimAdoption gate)
        owner = ClaimView(pvc).controller_ref()
        if owner is not None and owner.get("kind") == "DataVolume":
            return []
        return [Cause("DataVolume.Name", f"Destination PVC {namespace}/{name} already exists", "FieldValueDuplicate")]
