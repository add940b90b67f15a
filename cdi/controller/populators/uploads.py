"""The upload populator (CDI's upload-populator): a claim naming a `VolumeUploadSource` gets a prime
claim marked as an upload target, so the upload reconciler runs the usual upload server for it; the
upload proxy follows the claim's `storage.populator.pvcPrime` to that server, and the claim gets the
volume once the upload succeeded."""

from __future__ import annotations

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.envvalues import format_bool
from cdi.api.targetvolume import preallocation_wanted
from cdi.api.views import ClaimView
from cdi.controller.claims import config_status
from cdi.controller.populators.base import Body, PopulatorReconciler, is_bound, is_complete
from cdi.kube import NORMAL, WARNING

VOLUME_UPLOAD_SOURCE = "VolumeUploadSource"
UPLOAD_FAILED = "UploadFailed"
UPLOAD_SUCCEEDED = "UploadSucceeded"


class UploadPopulator(PopulatorReconciler):
    name = "upload-populator"
    source_kind = VOLUME_UPLOAD_SOURCE
    source_gvr = groups.VOLUMEUPLOADSOURCES

    def prime_annotations(self, pvc: Body, source: Body) -> dict[str, str]:
        spec: Body = source.get("spec") or {}
        preallocation = preallocation_wanted(spec.get("preallocation"), config_status(self.ctx))
        return {ann.UPLOAD_TARGET: "", ann.CONTENT_TYPE: str(spec.get("contentType") or "kubevirt"),
                ann.POPULATOR_KIND: VOLUME_UPLOAD_SOURCE, ann.PREALLOCATION_REQUESTED: format_bool(preallocation)}

    async def reconcile_target(self, pvc: Body, prime: Body) -> float | None:
        theirs = ClaimView(prime).annotations
        phase = theirs.get(ann.POD_PHASE, "")
        name = ClaimView(pvc).name
        if phase == "Failed":
            self.ctx.recorder.record(pvc, WARNING, UPLOAD_FAILED, f"Upload into {name} failed")
        # once uploaded, the claim no longer sends uploads to the prime (CDI's updateUploadAnnotations);
        # the annotations are final before the volume moves, so a bound claim shows the finished upload
        await self.mirror(pvc, prime, {ann.PVC_PRIME_NAME: None} if is_complete(prime) else None)
        if is_complete(prime) and not is_bound(pvc):
            await self.hand_over(pvc, prime)
        if is_complete(prime):
            self.ctx.recorder.record(pvc, NORMAL, UPLOAD_SUCCEEDED, f"Successfully uploaded into {name}")
        return None
