"""The upload DataVolume reconciler (CDI's datavolume/upload-controller.go): DataVolumes with
`source: upload`. Their claim is annotated as an upload target, which the upload reconciler (`uploads`)
serves with an upload-server pod; the DataVolume is UploadScheduled, UploadReady once the server takes
uploads, then Succeeded or Failed as the claim's annotations say.

While UploadReady, the upload server's progress (its `/metrics`, the importer's series: an upload goes through
the importer's pipeline) goes into `status.progress` once an upload began (CDI leaves "N/A" there until the
end) and its step, bytes, rate and time left into the Running condition's message. The server is asked every
`progress_interval` while an upload runs, every `IDLE_POLL` seconds while none has begun."""

from __future__ import annotations

from cdi.api import annotations as ann
from cdi.api.phases import PROGRESS_UNKNOWN
from cdi.api.views import ClaimView, DataVolumeView
from cdi.controller import conditions
from cdi.controller.datavolume.base import Body, DataVolumeReconciler, Event, Obj
from cdi.controller.datavolume.uploads import upload_name
from cdi.controller.progress import format_progress
from cdi.kube import NORMAL, WARNING

IDLE_POLL = 10.0  # seconds between looks at a ready upload server that has not been sent anything yet


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
            uploading = view.status.get("progress", PROGRESS_UNKNOWN) != PROGRESS_UNKNOWN
            return (NORMAL, "UploadReady", f"Upload into {name} ready"), \
                self.ctx.settings.progress_interval if uploading else IDLE_POLL
        status["phase"] = "UploadScheduled"
        return (NORMAL, "UploadScheduled", f"Upload into {name} scheduled"), None

    async def running_message(self, view: DataVolumeView, pvc: Body, status: Obj) -> str | None:
        """While the upload server is ready: once an upload began, its progress read into `status` and its step
        ("Transfer: 12 MiB of 48 MiB, 5.0 MiB/s, about 7 s left") for the Running condition; the claim's message
        before; None when the server could not be asked, to keep what the condition says."""
        if status.get("phase") != "UploadReady":
            return None
        annotations = ClaimView(pvc).annotations
        pod_ip, owner_uid = self.worker_pod_ip(view, pvc, lambda claim: upload_name(ClaimView(claim).name))
        if not pod_ip:
            return None
        report = await self.ctx.progress.read(pod_ip, owner_uid)
        if report is None:
            return conditions.running_message(status)
        if report.progress is not None:  # an upload began (the server says nothing before)
            status["progress"] = format_progress(min(report.progress, 99.99))
        self.ctx.metrics.worker_step(view.key, report.step)
        message = report.running_message()
        return message if message is not None else annotations.get(ann.CONDITION_RUNNING_MESSAGE, "")
