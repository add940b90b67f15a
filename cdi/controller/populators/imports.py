"""The import populator (CDI's import-populator): a claim naming a `VolumeImportSource` gets a prime
claim annotated with the source as the PVC import API says, so the import reconciler runs the usual
importer pod on it; the user's claim shows the pod's annotations and the import's progress in
`cdi.kubevirt.io/storage.populator.progress`, and gets the volume once the import succeeded."""

from __future__ import annotations

from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.envvalues import format_bool
from cdi.api.importrequest import ImportRequest
from cdi.api.phases import PROGRESS_COMPLETE, PROGRESS_UNKNOWN
from cdi.api.targetvolume import preallocation_wanted
from cdi.api.views import ClaimView, ObjectView, PodView
from cdi.controller.claims import config_status
from cdi.controller.populators.base import Body, PopulatorReconciler, is_bound, is_complete
from cdi.controller.progress import format_progress
from cdi.kube import NORMAL, WARNING

Obj = dict[str, Any]

VOLUME_IMPORT_SOURCE = "VolumeImportSource"
IMPORT_FAILED = "importFailed"
IMPORT_SUCCEEDED = "importSucceeded"
RUNNING_POLL = 2.0  # seconds between progress looks while the importer runs (CDI's requeue)


class ImportPopulator(PopulatorReconciler):
    name = "import-populator"
    source_kind = VOLUME_IMPORT_SOURCE
    source_gvr = groups.VOLUMEIMPORTSOURCES

    def population_source(self, pvc: Body) -> Body | None:
        source = super().population_source(pvc)
        target = ObjectView(source).spec.get("targetClaim") if source else None
        if target and target != ClaimView(pvc).name:
            return None  # meant for another claim
        return source

    def prime_annotations(self, pvc: Body, source: Body) -> dict[str, str]:
        spec: Body = source.get("spec") or {}
        sources: Body = {k: v for k, v in (spec.get("source") or {}).items() if v is not None}
        out: dict[str, str] = {ann.POPULATOR_KIND: VOLUME_IMPORT_SOURCE}
        if sources:
            out.update(ImportRequest.from_source(sources, str(spec.get("contentType") or "kubevirt")).to_annotations())
        else:
            out.update({ann.IMPORT_SOURCE: "none", ann.CONTENT_TYPE: str(spec.get("contentType") or "kubevirt")})
        out[ann.PREALLOCATION_REQUESTED] = format_bool(preallocation_wanted(spec.get("preallocation"),
                                                                            config_status(self.ctx)))
        return out

    async def reconcile_target(self, pvc: Body, prime: Body) -> float | None:
        theirs = ClaimView(prime).annotations
        phase = theirs.get(ann.POD_PHASE, "")
        name = ClaimView(pvc).name
        progress = await self._progress(pvc, prime, phase)
        extra = {ann.POPULATOR_PROGRESS: progress} if progress else {}
        await self.mirror(pvc, prime, extra)
        # a permanent failure is final as soon as the importer's termination message says so; on a real
        # node the pod's phase may still read Running at that moment (its container has ended, the phase
        # follows), and the import reconciler does not look at a failed import's pod again
        if phase == "Failed" or theirs.get(ann.IMPORT_FATAL_ERROR) == "true":
            self.ctx.recorder.record(pvc, WARNING, IMPORT_FAILED, f"import into {name} failed")
            return None
        if phase == "Running":
            return RUNNING_POLL
        if is_complete(prime):
            if not is_bound(pvc):
                await self.hand_over(pvc, prime)
            self.ctx.recorder.record(pvc, NORMAL, IMPORT_SUCCEEDED, f"Successfully imported into {name}")
        return None

    async def _progress(self, pvc: Body, prime: Body, phase: str) -> str | None:
        """CDI's updateImportProgress: 100% once the pod succeeded; while it runs, the importer's counter
        for the user's claim (values from 100 held back: conversion may still be running); N/A when the
        prime is bound and no pod reports."""
        if phase == "Succeeded":
            return PROGRESS_COMPLETE
        mine = ClaimView(pvc).annotations
        pod_name = ClaimView(prime).annotations.get(ann.IMPORT_POD_NAME)
        if not pod_name:
            return None
        pod = self.ctx.cached(groups.PODS, pod_name, ClaimView(prime).namespace)
        if pod is None:
            if ann.POPULATOR_PROGRESS not in mine and is_bound(prime):
                return PROGRESS_UNKNOWN
            return None
        pod_ip = PodView(pod).pod_ip
        if PodView(pod).phase != "Running" or not pod_ip:
            return None
        report = await self.ctx.progress.read(pod_ip, ClaimView(pvc).uid)
        if report is None or report.progress is None or report.progress >= 100:
            return None
        return format_progress(report.progress)
