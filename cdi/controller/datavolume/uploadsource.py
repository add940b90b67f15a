"""The upload DataVolume reconciler (CDI's datavolume/upload-controller.go): DataVolumes with
`source: upload`. Their claim is annotated as an upload target, which the upload reconciler (`uploads`)
serves with an upload-server pod; the DataVolume is UploadScheduled, UploadReady once the server takes
uploads, then Succeeded or Failed as the claim's annotations say."""

from __future__ import annotations

from cdi.api import annotations as ann
from cdi.api.views import ClaimView, DataVolumeView
from cdi.controller.datavolume.base import Body, DataVolumeReconciler, Event, Obj
from cdi.kube import NORMAL, WARNING


class UploadDataVolumeReconciler(DataVolumeReconciler):
    name = "datavolume-upload"
    succeeded_reason = "UploadSucceeded"
    succeeded_message = "Successfully uploaded into PVC {}"

    def handles(self, dv: Body) -> bool:
        return DataVolumeView(dv).source_kind == "upload"

    def claim_annotations(self, view: DataVolumeView) -> dict[str, str]:
        return {ann.UPLOAD_TARGET: "", ann.CONTENT_TYPE: view.content_type}

    def worker_phase(self, view: DataVolumeView, pvc: Body, status: Obj) -> tuple[Event | None, float | None]:
        annotations = ClaimView(pvc).annotations
        name = ClaimView(pvc).name
        if annotations.get(ann.POD_PHASE) == "Failed" and annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
            status["phase"] = "Failed"
            return (WARNING, "UploadFailed", f"Upload into {name} failed"), None
        if annotations.get(ann.POD_READY) == "true":
            status["phase"] = "UploadReady"
            return (NORMAL, "UploadReady", f"Upload into {name} ready"), None
        status["phase"] = "UploadScheduled"
        return (NORMAL, "UploadScheduled", f"Upload into {name} scheduled"), None
