"""The DataVolume reconciler: renders and creates the PVC (annotated with what to import), and
derives the DataVolume's phase, conditions, progress, restart count and events from the PVC and
the annotations the import reconciler keeps on it, exactly as CDI names them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from cdi.api import annotations as ann
from cdi.api import featuregates, groups
from cdi.api.envvalues import format_bool
from cdi.api.importrequest import ImportRequest
from cdi.api.phases import PROGRESS_COMPLETE, PROGRESS_UNKNOWN
from cdi.api.rendering import (
    NoStorageClass,
    RenderError,
    render_claim_spec,
    unrendered_claim_spec,
    webhook_rendering_enabled,
)
from cdi.api.validation import Cause, external_population, unsupported_source
from cdi.api.views import ClaimView, DataVolumeView, PodView
from cdi.controller import conditions
from cdi.controller.claims import cluster_storage, waits_for_first_consumer
from cdi.controller.datavolume import staticvolumes
from cdi.controller.datavolume.progress import format_progress, scrape
from cdi.controller.populators.datavolumes import (
    claim_uses_populator,
    csi_driver_exists,
    delete_volume_source,
    ensure_volume_source,
    pending_population,
    uses_populator,
)
from cdi.controller.runtime import Context, Reconciler, write_status
from cdi.kube import NORMAL, WARNING, AlreadyExists, split_key
from cdi.kube.events import EventType

Obj = dict[str, Any]
Body = Mapping[str, Any]
Event = tuple[EventType, str, str]

IMPORT_SOURCES = {"http", "s3", "gcs", "registry", "blank"}
# annotations users put on a DataVolume that CDI passes to its PVC and worker pods
_PASSED_ANNOTATIONS = (ann.BIND_IMMEDIATE, ann.RETAIN_AFTER_COMPLETION, ann.MULTUS_NETWORKS,
                       ann.MULTUS_DEFAULT_NETWORK, ann.ISTIO_INJECT, ann.LINKERD_INJECT, ann.PREALLOCATION_REQUESTED,
                       ann.POD_PRIORITY_CLASS, ann.POD_SERVICE_ACCOUNT, ann.UPLOAD_FORMAT)
NO_CSI_DRIVER, NO_ANY_VOLUME_DATA_SOURCE = "NoCSIDriverForExternalPopulation", "NoAnyVolumeDataSource"
PRIORITY_CLASS = ann.POD_PRIORITY_CLASS
SERVICE_ACCOUNT = ann.POD_SERVICE_ACCOUNT


def _passes_label(key: str) -> bool:
    """CDI propagates only kubevirt.io labels (e.g. instancetype.kubevirt.io/default-preference)."""
    prefix = key.split("/", 1)[0] if "/" in key else ""
    return prefix == "kubevirt.io" or prefix.endswith(".kubevirt.io")


class DataVolumeReconciler(Reconciler):
    name = "datavolume"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        dv = self.ctx.cached(groups.DATAVOLUMES, name, namespace)
        if dv is None or DataVolumeView(dv).deleting:
            self.ctx.metrics.clear_import_progress(key)
            return None
        view = DataVolumeView(dv)
        kind = view.source_kind
        unsupported = unsupported_source(view.spec)
        if unsupported is not None:
            return await self._refuse(dv, unsupported)
        external = kind is None and view.source_ref is None and external_population(view.spec) is not None
        if kind not in IMPORT_SOURCES and kind != "upload" and not external:
            return None  # clones are reconciled elsewhere
        pvc = self.ctx.cached(groups.PVCS, name, namespace)
        if pvc is None:
            if ann.PRE_POPULATED in view.annotations:
                # as CDI: the claim is on its way (a restore); the DataVolume waits for it, never fills it
                return await self._update_status(dv, None, phase="Pending")
            # a claim deleted after success is created and filled again, as CDI does
            return await self._create_claim(dv)
        if ann.CHECK_STATIC_VOLUME in view.annotations and \
                ann.PERSISTENT_VOLUME_LIST in ClaimView(pvc).annotations:
            return await self._static_claim(dv, pvc)
        requires_work = featuregates.claim_requires_work(pvc, dv, self._gate(featuregates.DATA_VOLUME_CLAIM_ADOPTION))
        controller = ClaimView(pvc).controller_ref()
        if controller is None or controller.get("uid") != view.uid:
            if requires_work or controller is not None:
                message = f'Resource "{name}" already exists and is not managed by DataVolume'
                return await self._update_status(dv, None, message=message, reason="ErrResourceExists",
                                                 event=(WARNING, "ErrResourceExists", message))
            pvc = await self._adopt(dv, pvc)
        if ClaimView(pvc).phase == "Bound" and featuregates.populated_for(pvc, dv) and \
                ann.PRE_POPULATED not in view.annotations:
            # CDI's handlePrePopulation: the DataVolume remembers that its claim came filled
            await self.ctx.client.patch(groups.DATAVOLUMES, name, {"metadata": {"annotations": {
                ann.PRE_POPULATED: ClaimView(pvc).name}}}, namespace)
        await self._delayed_annotations(view, pvc)
        requeue = await self._update_status(dv, pvc, requires_work=requires_work)
        if claim_uses_populator(pvc) and ClaimView(pvc).phase == "Bound" and \
                ClaimView(pvc).annotations.get(ann.POD_PHASE) == "Succeeded":
            await delete_volume_source(self.ctx, dv)
        return requeue

    async def _static_claim(self, dv: Body, pvc: Body) -> float | None:
        """CDI's handleStaticVolume once the claim exists: Pending until bound; bound to one of the volumes
        it was made for, it is populated for the DataVolume from then on; bound to another, it is deleted
        and made again."""
        view = DataVolumeView(dv)
        if ClaimView(pvc).phase != "Bound":
            return await self._update_status(dv, pvc, phase="Pending")
        annotations = ClaimView(pvc).annotations
        volume = ClaimView(pvc).volume_name
        try:
            expected = json.loads(annotations[ann.PERSISTENT_VOLUME_LIST])
        except ValueError:
            expected = []
        if volume in expected:
            await self.ctx.client.patch(groups.PVCS, view.name, {"metadata": {"annotations": {
                ann.POPULATED_FOR: view.name, ann.PERSISTENT_VOLUME_LIST: None}}}, view.namespace)
            return None
        self.log.warning("DataVolume %s bound to unexpected PV %s; deleting its claim", view.key, volume)
        await self.ctx.client.delete(groups.PVCS, view.name, view.namespace)
        return None

    def _gate(self, gate: str) -> bool:
        return featuregates.enabled(self.ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME), gate)

    async def _adopt(self, dv: Body, pvc: Body) -> Obj:
        """Take a claim the DataVolume may use as it is: make the DataVolume its controller (CDI's
        addOwnerRef), keeping the claim's other owners."""
        view = DataVolumeView(dv)
        owners = [dict(r) for r in ClaimView(pvc).owner_references]
        owners.append({"apiVersion": groups.CDI_API_VERSION, "kind": "DataVolume", "name": view.name,
                       "uid": view.uid, "controller": True, "blockOwnerDeletion": True})
        patch = {"metadata": {"ownerReferences": owners, "resourceVersion": ClaimView(pvc).resource_version}}
        adopted: Obj = await self.ctx.client.patch(groups.PVCS, view.name, patch, view.namespace)
        return adopted

    async def _delayed_annotations(self, view: DataVolumeView, pvc: Body) -> None:
        """CDI's delayed annotations: a DataVolume's `storage.populatedFor` reaches its claim only once the
        DataVolume succeeded (a backup taken then restores as populated, never half-filled)."""
        wanted = view.annotations.get(ann.POPULATED_FOR)
        if view.phase == "Succeeded" and wanted is not None and \
                ann.POPULATED_FOR not in ClaimView(pvc).annotations:
            await self.ctx.client.patch(groups.PVCS, view.name, {"metadata": {"annotations": {
                ann.POPULATED_FOR: wanted}}}, view.namespace)

    async def _refuse(self, dv: Body, cause: Cause) -> float | None:
        """A source CDI admits that cannot work here: Failed at once, with the field and the reason."""
        event: Event = (WARNING, cause.reason, cause.message)
        return await self._update_status(dv, None, message=cause.message, reason=cause.reason, phase="Failed",
                                         event=event)

    async def _create_claim(self, dv: Body) -> float | None:
        view = DataVolumeView(dv)
        try:
            spec = unrendered_claim_spec(dv) if self._left_to_pvc_webhook(view) else \
                render_claim_spec(dv, cluster_storage(self.ctx))
        except NoStorageClass as exc:
            # the manager brings the DataVolume back when a StorageClass or StorageProfile changes
            return await self._update_status(dv, None, message=str(exc), reason="Pending", phase="Pending")
        except RenderError as exc:
            return await self._update_status(dv, None, message=str(exc), reason=exc.reason, phase="Pending",
                                             event=(WARNING, exc.reason, str(exc)))
        annotations = {k: v for k, v in view.annotations.items() if k in _PASSED_ANNOTATIONS}
        static = staticvolumes.available_for(self.ctx.cached_list(groups.PVS), view.namespace, view.name, spec) \
            if ann.CHECK_STATIC_VOLUME in view.annotations else []
        populate = False
        if not static and view.source_kind is not None:
            # as CDI: CSI storage is filled through a populator, unless the DataVolume says otherwise;
            # the DataVolume remembers the choice
            populate = uses_populator(self.ctx, dv, spec)
            if view.annotations.get(ann.USE_POPULATOR) is None:  # the status below is written on this version
                dv = await self.ctx.client.patch(groups.DATAVOLUMES, view.name, {"metadata": {"annotations": {
                    ann.USE_POPULATOR: "true" if populate else "false"}}}, view.namespace)
        if populate:
            spec["dataSourceRef"] = await ensure_volume_source(self.ctx, dv)
            annotations[ann.USE_POPULATOR] = "true"
        elif static:
            # as CDI: a claim for the pre-bound volume(s) that holds the data already, with nothing to fill
            annotations[ann.PERSISTENT_VOLUME_LIST] = json.dumps(static)
        elif view.source_kind == "upload":
            annotations[ann.UPLOAD_TARGET] = ""
            annotations[ann.CONTENT_TYPE] = view.content_type
        elif view.source_kind is None:  # filled by the claim's data source or a volume populator, as CDI
            annotations[ann.EXTERNAL_POPULATION] = "true"
        else:
            annotations.update(ImportRequest.from_source(view.source, view.content_type).to_annotations())
        # as CDI, every claim of a DataVolume says what it holds, whichever path fills it: a clone reads it
        # to measure a disk image's virtual size (the target's size, and whether a smaller Block target fits)
        annotations.setdefault(ann.CONTENT_TYPE, view.content_type)
        preallocation = view.spec.get("preallocation")
        if preallocation is not None:
            annotations[ann.PREALLOCATION_REQUESTED] = format_bool(bool(preallocation))
        if view.spec.get("priorityClassName"):
            annotations[PRIORITY_CLASS] = str(view.spec["priorityClassName"])
        if view.spec.get("serviceAccountName"):
            annotations[SERVICE_ACCOUNT] = str(view.spec["serviceAccountName"])
        annotations[ann.CREATED_FOR_DATAVOLUME] = view.uid
        if not self._gate(featuregates.HONOR_WAIT_FOR_FIRST_CONSUMER) and not static:
            annotations[ann.BIND_IMMEDIATE] = ""  # as CDI: worker pods need not wait for a first consumer
        labels = {k: v for k, v in view.labels.items() if _passes_label(k)}
        labels[ann.LABEL_APP] = ann.LABEL_APP_VALUE
        labels[ann.LABEL_FILLING_UP_ALERT] = "disabled"
        claim = {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": view.name, "namespace": view.namespace, "labels": labels,
                         "annotations": annotations, "ownerReferences": [{
                             "apiVersion": groups.CDI_API_VERSION, "kind": "DataVolume", "name": view.name,
                             "uid": view.uid, "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec,
        }
        try:
            created = await self.ctx.client.create(groups.PVCS, claim, view.namespace)
        except AlreadyExists:
            return 0.5  # our cache is behind; look again
        return await self._update_status(dv, created)

    def _left_to_pvc_webhook(self, view: DataVolumeView) -> bool:
        """As CDI: a `storage` DataVolume labelled applyStorageProfile, while the PVC mutating webhook is
        enabled, gets its claim rendered by the webhook alone (rendering twice would inflate it twice)."""
        config = self.ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME) or {}
        return view.spec.get("storage") is not None and \
            view.labels.get(ann.LABEL_APPLY_STORAGE_PROFILE) == "true" and \
            webhook_rendering_enabled(config.get("spec") or {})

    async def _update_status(self, dv: Body, pvc: Body | None, *, message: str = "", reason: str = "",
                             phase: str | None = None, event: Event | None = None,
                             requires_work: bool = True) -> float | None:
        """Write the status derived from `pvc`. `event` (with `reason` and `message`) is an error the
        Bound condition reports: recorded once, when the status changes, and not again as the condition's
        Normal event."""
        view = DataVolumeView(dv)
        status: Obj = json.loads(json.dumps(view.status))
        old_phase = status.get("phase", "")
        old_conditions = json.loads(json.dumps(status.get("conditions") or []))
        error_event = event
        event = None
        requeue: float | None = None
        running_message: str | None = None
        status.setdefault("progress", PROGRESS_UNKNOWN)
        if phase is not None:
            status["phase"] = phase
        elif pvc is None:
            if not old_phase:
                status["phase"] = "Pending"
        elif not ClaimView(pvc).deleting:
            status["claimName"] = ClaimView(pvc).name
            event, requeue = self._phase_from_claim(view, pvc, status) if requires_work else \
                self._phase_without_work(pvc, status)
            if status.get("phase") == "ImportInProgress":
                running_message = await self._refresh_progress(view, pvc, status)
            restarts = ClaimView(pvc).annotations.get(ann.POD_RESTARTS, "")
            if restarts.isdigit():
                status["restartCount"] = int(restarts)
        conditions.update_all(status, pvc, message, reason, running_message=running_message)
        if status.get("phase") != "ImportInProgress":
            self.ctx.metrics.clear_import_progress(view.key)
        if status == view.status:
            return requeue
        # conditional on the version we computed from: a reconcile working from a stale cache runs again
        # instead of repeating a transition (and its event) another one already made
        await write_status(self.ctx.client, groups.DATAVOLUMES, dv, status)
        if event is not None and status.get("phase") != old_phase:
            self.ctx.recorder.record(dv, *event)
        if error_event is not None:
            self.ctx.recorder.record(dv, *error_event)
        self._condition_events(dv, old_conditions, status["conditions"], error_event, str(status.get("phase", "")))
        return requeue

    def _condition_events(self, dv: Body, before: list[Obj], after: list[Obj], error_event: Event | None,
                          phase: str = "") -> None:
        bound, was_bound = conditions.find(after, "Bound"), conditions.find(before, "Bound")
        told = error_event is not None and bound is not None and \
            (bound.get("reason"), bound.get("message")) == error_event[1:]
        if bound and bound.get("reason") and not told and (was_bound is None or any(
                bound.get(k) != was_bound.get(k) for k in ("status", "reason", "message"))):
            self.ctx.recorder.record(dv, NORMAL, str(bound["reason"]), str(bound.get("message", "")))
        ready, running = conditions.find(after, "Ready"), conditions.find(after, "Running")
        was_running = conditions.find(before, "Running")
        # CDI's dvBoundOrPopulationInProgress: a populated claim binds only at the end
        populating = DataVolumeView(dv).annotations.get(ann.USE_POPULATOR) == "true" and \
            phase not in ("Pending", "PendingPopulation")
        if ready and running and bound and ready.get("status") == "False" and running.get("status") == "False" \
                and (bound.get("status") == "True" or populating) and running.get("message") and \
                running.get("message") != conditions.SCRATCH_REQUIRED_MESSAGE and \
                (was_running is None or was_running.get("message") != running.get("message")):
            self.ctx.recorder.record(dv, WARNING, str(running.get("reason", "")), str(running["message"]))

    @staticmethod
    def _phase_without_work(pvc: Body, status: Obj) -> tuple[Event | None, float | None]:
        """A claim taken as it is (populated for the DataVolume, or adopted): Succeeded as soon as it exists,
        with no import and no phase event, as CDI."""
        claim_phase = ClaimView(pvc).phase
        if claim_phase in ("Pending", "Bound"):
            status["phase"] = "Succeeded"
        elif claim_phase == "Lost":
            status["phase"] = "Failed"
            return (WARNING, "ErrClaimLost", f"PVC {ClaimView(pvc).name} lost"), None
        elif claim_phase:
            status["phase"] = "Unknown"
        return None, None

    def _phase_from_claim(self, view: DataVolumeView, pvc: Body,
                          status: Obj) -> tuple[Event | None, float | None]:
        annotations = ClaimView(pvc).annotations
        name = ClaimView(pvc).name
        claim_phase = ClaimView(pvc).phase
        pod_phase = annotations.get(ann.POD_PHASE, "")
        upload = ann.UPLOAD_TARGET in annotations or view.source_kind == "upload"
        populating = claim_uses_populator(pvc)
        if pod_phase == "Succeeded" and populating and claim_phase != "Bound":
            # filled, and the volume on its way to the claim: Succeeded once the claim can be used
            # (CDI says Succeeded a moment earlier, while its claim is still Pending)
            return None, 0.5
        if pod_phase == "Succeeded":
            status["phase"], status["progress"] = "Succeeded", PROGRESS_COMPLETE
            what = "Upload" if upload else "Import"
            message = f"Successfully {'uploaded' if upload else 'imported'} into PVC {name}"
            return (NORMAL, f"{what}Succeeded", message), None
        if claim_phase == "Pending" and populating:
            # the claim binds only once the prime's volume is handed over: the phase follows the pod
            if pending_population(self.ctx, pvc):
                status["phase"] = "PendingPopulation"
                return None, None
        elif claim_phase == "Pending":
            storage_class = self.ctx.cached(groups.STORAGECLASSES, ClaimView(pvc).storage_class)
            wffc = (storage_class or {}).get("volumeBindingMode") == "WaitForFirstConsumer"
            if wffc and waits_for_first_consumer(self.ctx, pvc):
                status["phase"] = "WaitForFirstConsumer"
                return None, None
            if not (wffc and pod_phase):
                status["phase"] = "Pending"
                return None, None
        elif claim_phase == "Lost":
            status["phase"] = "Failed"
            return (WARNING, "ErrClaimLost", f"PVC {name} lost"), None
        elif claim_phase != "Bound":
            status["phase"] = "Unknown" if claim_phase else status.get("phase", "Pending")
            return None, None
        if upload:
            return self._upload_phase(annotations, name, status), None
        if annotations.get(ann.EXTERNAL_POPULATION) == "true":
            return self._external_population(pvc, name, status), None
        if pod_phase == "Failed" and annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
            status["phase"] = "Failed"
            return (WARNING, "ImportFailed", f"Failed to import into PVC {name}"), None
        if pod_phase == "Running":
            status["phase"] = "ImportInProgress"
            return (NORMAL, "ImportInProgress", f"Import into {name} in progress"), self.ctx.settings.progress_interval
        status["phase"] = "ImportScheduled"
        return (NORMAL, "ImportScheduled", f"Import into {name} scheduled"), None

    def _external_population(self, pvc: Body, name: str, status: Obj) -> Event:
        """CDI's checkPopulationRequirements once an external populator bound the claim: population by
        anything but a VolumeSnapshot needs the class's CSI driver, and by a populator kind a cluster that
        kept `dataSourceRef` (the AnyVolumeDataSource gate; a cluster without it drops the field). Unmet,
        the DataVolume is not Succeeded and both objects get CDI's Warning."""
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
            return WARNING, *problem
        status["phase"] = "Succeeded"
        return NORMAL, "ExternalPopulationSucceeded", f"PVC {name} successfully populated by {ref.get('name', '')}"

    def _upload_phase(self, annotations: Mapping[str, str], name: str, status: Obj) -> Event | None:
        if annotations.get(ann.POD_PHASE) == "Failed" and annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
            status["phase"] = "Failed"
            return WARNING, "UploadFailed", f"Upload into {name} failed"
        if annotations.get(ann.POD_READY) == "true":
            status["phase"] = "UploadReady"
            return NORMAL, "UploadReady", f"Upload into {name} ready"
        status["phase"] = "UploadScheduled"
        return NORMAL, "UploadScheduled", f"Upload into {name} scheduled"

    async def _refresh_progress(self, view: DataVolumeView, pvc: Body, status: Obj) -> str | None:
        """Read the importer's progress into `status`; returns the Running condition's message: what the
        importer is retrying ("retrying: ... (attempt 3)"), "" when it is not retrying, or None when the
        pod could not be asked, to keep what the condition says."""
        annotations = ClaimView(pvc).annotations
        populated = claim_uses_populator(pvc)
        worker_claim, owner_uid = pvc, view.uid
        if populated:
            # the import populator keeps the progress on the claim (CDI); what the importer retries is
            # read from the prime claim's pod, which reports for the user's claim
            status["progress"] = annotations.get(ann.POPULATOR_PROGRESS, PROGRESS_UNKNOWN)
            worker_claim = self.ctx.cached(groups.PVCS, annotations.get(ann.PVC_PRIME_NAME, ""), view.namespace) \
                or {}
            owner_uid = ClaimView(pvc).uid
        pod_name = ClaimView(worker_claim).annotations.get(ann.IMPORT_POD_NAME)
        pod = self.ctx.cached(groups.PODS, pod_name, view.namespace) if pod_name else None
        pod_ip = PodView(pod).pod_ip if pod else ""
        if not pod_ip:
            return None
        if self._session is None:
            self._session = aiohttp.ClientSession()
        report = await scrape(self._session, pod_ip, owner_uid)
        if report is None:
            running = conditions.find(status.get("conditions") or [], "Running")
            return str(running.get("message", "")) if running and running.get("status") == "True" else None
        if report.progress is not None:
            if not populated:
                # 100 is held back until the importer's result is in: conversion may still be running
                status["progress"] = format_progress(min(report.progress, 99.99))
            self.ctx.metrics.set_import_progress(view.key, view.uid, report.progress)
        return report.retry.describe() if report.retry else annotations.get(ann.CONDITION_RUNNING_MESSAGE, "")
