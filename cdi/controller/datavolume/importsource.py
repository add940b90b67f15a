"""The import DataVolume reconciler (CDI's datavolume/import-controller.go): DataVolumes importing from
`http`, `s3`, `gcs`, `registry` or `blank` (and `imageio` and `vddk`, which this CDI refuses with the
field and the reason). Their claim is annotated with the `ImportRequest` that the import reconciler
(`imports`) turns into an importer pod; the DataVolume is ImportScheduled, ImportInProgress with the
importer's progress read from its metrics, Succeeded or Failed as the claim's annotations say."""

from __future__ import annotations

from cdi.api import annotations as ann
from cdi.api.importrequest import ImportRequest
from cdi.api.phases import PROGRESS_UNKNOWN
from cdi.api.validation import IMPORT_SOURCES
from cdi.api.views import ClaimView, DataVolumeView
from cdi.controller import conditions
from cdi.controller.datavolume.base import Body, DataVolumeReconciler, Event, Obj
from cdi.controller.populators.datavolumes import claim_uses_populator
from cdi.controller.progress import format_progress
from cdi.kube import NORMAL, WARNING


class ImportDataVolumeReconciler(DataVolumeReconciler):
    name = "datavolume-import"

    def handles(self, dv: Body) -> bool:
        return DataVolumeView(dv).source_kind in IMPORT_SOURCES

    def claim_annotations(self, view: DataVolumeView) -> dict[str, str]:
        return ImportRequest.from_source(view.source, view.content_type).to_annotations()

    def worker_phase(self, view: DataVolumeView, pvc: Body, status: Obj) -> tuple[Event | None, float | None]:
        annotations = ClaimView(pvc).annotations
        name = ClaimView(pvc).name
        pod_phase = annotations.get(ann.POD_PHASE, "")
        if pod_phase == "Failed" and annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
            status["phase"] = "Failed"
            return (WARNING, "ImportFailed", f"Failed to import into PVC {name}"), None
        if pod_phase == "Running":
            status["phase"] = "ImportInProgress"
            return (NORMAL, "ImportInProgress", f"Import into {name} in progress"), self.ctx.settings.progress_interval
        status["phase"] = "ImportScheduled"
        return (NORMAL, "ImportScheduled", f"Import into {name} scheduled"), None

    async def running_message(self, view: DataVolumeView, pvc: Body, status: Obj) -> str | None:
        """While the import runs: the importer's progress read into `status`, and what it is retrying
        ("retrying: ... (attempt 3)"), else the step it is in ("Convert: 1.2 GiB of 4.0 GiB, 310 MiB/s,
        about 7 s left"), else the claim's message; None when the pod could not be asked, to keep what the
        condition says."""
        if status.get("phase") != "ImportInProgress":
            return None
        annotations = ClaimView(pvc).annotations
        populated = claim_uses_populator(pvc)
        if populated:  # the import populator keeps the progress on the claim (CDI)
            status["progress"] = annotations.get(ann.POPULATOR_PROGRESS, PROGRESS_UNKNOWN)
        pod_ip, owner_uid = self.worker_pod_ip(view, pvc,
                                               lambda claim: ClaimView(claim).annotations.get(ann.IMPORT_POD_NAME, ""))
        if not pod_ip:
            return None
        report = await self.ctx.progress.read(pod_ip, owner_uid)
        if report is None:
            return conditions.running_message(status)
        if report.progress is not None:
            # 100 is held back until the importer's result is in: conversion may still be running. The
            # populator's annotation is written on its own round: the reading just made, of the same
            # importer, is as true and maybe further on (the message below comes from it too)
            recorded = _percent(str(status.get("progress", "")))
            if not populated or recorded is None or report.progress > recorded:
                status["progress"] = format_progress(min(report.progress, 99.99))
            self.ctx.metrics.set_import_progress(view.key, view.uid, report.progress)
        self.ctx.metrics.worker_step(view.key, report.step)
        message = report.running_message()
        return message if message is not None else annotations.get(ann.CONDITION_RUNNING_MESSAGE, "")


def _percent(progress: str) -> float | None:
    """"45.67%" as 45.67; None for "N/A" or anything else."""
    try:
        return float(progress.removesuffix("%"))
    except ValueError:
        return None
