"""The external-population DataVolume reconciler (CDI's datavolume/external-population-controller.go):
DataVolumes without a source whose claim names a `dataSource` or `dataSourceRef` (a volume snapshot, a
claim, or another populator's object). The claim is created as rendered and filled by its provisioner or
populator, nothing of ours; the DataVolume is Succeeded once the claim is bound, if the cluster meets
what such population needs."""

from __future__ import annotations

from cdi.api import annotations as ann
from cdi.api.validation import external_population
from cdi.api.views import ClaimView, DataVolumeView
from cdi.controller.datavolume.base import Body, DataVolumeReconciler, Event, Obj
from cdi.controller.populators.datavolumes import csi_driver_exists
from cdi.kube import NORMAL, WARNING

NO_CSI_DRIVER, NO_ANY_VOLUME_DATA_SOURCE = "NoCSIDriverForExternalPopulation", "NoAnyVolumeDataSource"


class ExternalPopulationReconciler(DataVolumeReconciler):
    name = "datavolume-external-population"

    def handles(self, dv: Body) -> bool:
        view = DataVolumeView(dv)
        return view.source_kind is None and view.source_ref is None and external_population(view.spec) is not None

    def claim_annotations(self, view: DataVolumeView) -> dict[str, str]:
        return {ann.EXTERNAL_POPULATION: "true"}

    def worker_phase(self, view: DataVolumeView, pvc: Body, status: Obj) -> tuple[Event | None, float | None]:
        """CDI's checkPopulationRequirements once the populator bound the claim: population by anything but
        a VolumeSnapshot needs the class's CSI driver, and by a populator kind a cluster that kept
        `dataSourceRef` (the AnyVolumeDataSource gate; a cluster without it drops the field). Unmet, the
        DataVolume is not Succeeded and both objects get CDI's Warning."""
        claim = ClaimView(pvc)
        ref = claim.data_source_ref
        kind = ref.get("kind", "")
        problem: tuple[str, str] | None = None
        if kind != "VolumeSnapshot" and not csi_driver_exists(self.ctx, claim.storage_class):
            problem = (NO_CSI_DRIVER, "No CSI drivers were found: External population not supported")
        elif kind not in ("PersistentVolumeClaim", "VolumeSnapshot") and not claim.spec.get("dataSourceRef"):
            problem = (NO_ANY_VOLUME_DATA_SOURCE,
                       "AnyVolumeDataSource feature gate is not enabled: External population not supported")
        if problem is not None:
            self.ctx.recorder.record(pvc, WARNING, *problem)
            return (WARNING, *problem), None
        status["phase"] = "Succeeded"
        message = f"PVC {claim.name} successfully populated by {ref.get('name', '')}"
        return (NORMAL, "ExternalPopulationSucceeded", message), None
