"""The shared base of the DataVolume reconcilers, one per source kind as CDI has them (its
controller-base.go): renders and creates the claim, takes a claim that needs no work (populated for
the DataVolume, adopted, a static volume), and derives the DataVolume's phase, conditions, restart
count and events from the claim and the annotations its worker's reconciler keeps on it, exactly as
CDI names them. What differs by source kind is asked of the subclass: which DataVolumes are its own
(`handles`), what a claim it fills is annotated with (`claim_annotations`) and the phase its worker
gives a bound claim (`worker_phase`).

`datavolume_watches` is what every DataVolume reconciler watches, the clone one included."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import featuregates, groups, workeroverrides
from cdi.api.envvalues import format_bool
from cdi.api.owners import owner_keys, owner_reference
from cdi.api.phases import PROGRESS_COMPLETE, PROGRESS_UNKNOWN
from cdi.api.rendering import (
    NoStorageClass,
    RenderError,
    render_claim_spec,
    unrendered_claim_spec,
    webhook_rendering_enabled,
)
from cdi.api.validation import Cause, unsupported_source
from cdi.api.views import ClaimView, DataVolumeView, ObjectView, PersistentVolumeView, PodView
from cdi.api.workeroverrides import WORKER_OVERRIDES
from cdi.controller import conditions, quota
from cdi.controller.claims import claim_keys_of_pod, cluster_storage, waits_for_first_consumer
from cdi.controller.datavolume import staticvolumes
from cdi.controller.populators.datavolumes import (
    claim_uses_populator,
    delete_volume_source,
    ensure_volume_source,
    pending_population,
    uses_populator,
)
from cdi.controller.runtime import Context, Reconciler, RetryLater, write_status
from cdi.controller.watches import Watch
from cdi.controller.workerpod import worker_cap
from cdi.kube import NORMAL, WARNING, AlreadyExists, Forbidden, object_key, split_key
from cdi.kube.events import EventType

Obj = dict[str, Any]
Body = Mapping[str, Any]
Event = tuple[EventType, str, str]

# annotations users put on a DataVolume that CDI passes to its PVC and worker pods (a clone's target too)
PASSED_TO_CLAIM = (ann.BIND_IMMEDIATE, ann.RETAIN_AFTER_COMPLETION, ann.MULTUS_NETWORKS,
                       ann.MULTUS_DEFAULT_NETWORK, ann.ISTIO_INJECT, ann.LINKERD_INJECT, ann.PREALLOCATION_REQUESTED,
                       ann.POD_PRIORITY_CLASS, ann.POD_SERVICE_ACCOUNT, ann.UPLOAD_FORMAT, ann.UPLOAD_CHECKSUM,
                       # ours: the DataVolume's worker overrides (cdi.api.workeroverrides), a clone's opt-in
                       *WORKER_OVERRIDES, ann.CLONE_ALLOW_SOURCE_IN_USE)
# what a finished worker recorded on the claim that its DataVolume shows too (our extension: an audit of what
# a golden image holds reads the DataVolume)
_RECORDED_ANNOTATIONS = (ann.SOURCE_SHA256, ann.SOURCE_FORMAT)


def _passes_label(key: str) -> bool:
    """CDI propagates only kubevirt.io labels (e.g. instancetype.kubevirt.io/default-preference)."""
    prefix = key.split("/", 1)[0] if "/" in key else ""
    return prefix == "kubevirt.io" or prefix.endswith(".kubevirt.io")


def datavolume_watches(ctx: Context, handles: Callable[[Body], bool]) -> list[Watch]:
    """What every DataVolume reconciler watches (CDI's addDataVolumeControllerCommonWatches), for the
    DataVolumes `handles` says are its own: the DataVolume; a claim of its name (owned or not) or owned
    by it; and StorageClasses and StorageProfiles, for every DataVolume still without a claim. Those
    wait for a class to exist, or for a profile to give the access and volume modes the `storage` API
    leaves out, so creating the class or completing its profile is all an admin has to do; any class
    counts, as a new default class changes the one a DataVolume naming none gets. And ResourceQuotas, for
    the DataVolumes whose claim a quota refused."""

    def datavolume(dv: Obj) -> list[str]:
        return [object_key(dv)] if handles(dv) else []

    def claim(pvc: Obj) -> list[str]:
        return own_datavolumes(ctx, handles, [object_key(pvc), *owner_keys(pvc, "DataVolume")])

    def waiting_on_storage(_: Obj) -> list[str]:
        return [ObjectView(dv).key for dv in ctx.cached_list(groups.DATAVOLUMES) if handles(dv) and
                ctx.cached(groups.PVCS, ObjectView(dv).name, ObjectView(dv).namespace) is None]

    return [Watch(groups.DATAVOLUMES, datavolume), Watch(groups.PVCS, claim),
            Watch(groups.STORAGECLASSES, waiting_on_storage), Watch(groups.STORAGEPROFILES, waiting_on_storage),
            quota.quota_watch(ctx, groups.DATAVOLUMES, handles)]


def own_datavolumes(ctx: Context, handles: Callable[[Body], bool], keys: list[str]) -> list[str]:
    """The keys of `keys` naming a DataVolume that exists and that `handles` says is ours."""
    found = []
    for key in keys:
        namespace, name = split_key(key)
        dv = ctx.cached(groups.DATAVOLUMES, name, namespace)
        if dv is not None and handles(dv):
            found.append(key)
    return found


def _finished(view: DataVolumeView, pvc: Body | None) -> bool:
    """A DataVolume whose claim is there and filled, as its status or the claim says: its source, whatever it
    is, is read no more (CDI filled it before cdi took over, from a source cdi refuses to start from). Its
    claim gone, it would have to be filled again, which such a source cannot."""
    if pvc is None:
        return False
    return view.phase == "Succeeded" or ClaimView(pvc).annotations.get(ann.POD_PHASE) == "Succeeded"


class DataVolumeReconciler(Reconciler):
    """The flow every source kind shares; a subclass per kind fills in what differs."""

    # the event of a claim whose worker succeeded: reason, and message about the claim's name
    succeeded_reason = "ImportSucceeded"
    succeeded_message = "Successfully imported into PVC {}"

    # -- what each source kind provides ---------------------------------------------------------------

    def handles(self, dv: Body) -> bool:
        """Whether the DataVolume is of this reconciler's source kind."""
        raise NotImplementedError  # pragma: no cover - every source kind overrides it

    def claim_annotations(self, view: DataVolumeView) -> dict[str, str]:
        """What a claim this kind's worker fills is annotated with, for the reconciler that runs the worker."""
        raise NotImplementedError  # pragma: no cover - every source kind overrides it

    def worker_phase(self, view: DataVolumeView, pvc: Body, status: Obj) -> tuple[Event | None, float | None]:
        """The phase (set in `status`) of a DataVolume whose claim is bound, or waits for its worker as
        the first consumer; with the event of a phase change and when to look again."""
        raise NotImplementedError  # pragma: no cover - every source kind overrides it

    async def running_message(self, view: DataVolumeView, pvc: Body, status: Obj) -> str | None:
        """The Running condition's message from the worker itself, None to keep what the claim says."""
        return None

    def worker_pod_ip(self, view: DataVolumeView, pvc: Body, pod_name: Callable[[Body], str]) -> tuple[str, str]:
        """(IP, owner UID) of the worker pod that fills the DataVolume's claim, named by `pod_name` of the claim
        it fills: under a populator that is the prime claim, and the worker reports for the user's claim. The
        IP is "" while there is no such pod or it has none yet."""
        worker_claim, owner_uid = pvc, view.uid
        if claim_uses_populator(pvc):
            prime = ClaimView(pvc).annotations.get(ann.PVC_PRIME_NAME, "")
            worker_claim, owner_uid = self.ctx.cached(groups.PVCS, prime, view.namespace) or {}, ClaimView(pvc).uid
        name = pod_name(worker_claim) if worker_claim else ""
        pod = self.ctx.cached(groups.PODS, name, view.namespace) if name else None
        return (PodView(pod).pod_ip if pod else ""), owner_uid

    # -- what brings a DataVolume back ----------------------------------------------------------------

    def watches(self) -> list[Watch]:
        """The common DataVolume watches, and: pods owned by or mounting a DataVolume's claim (its
        worker's progress), and volumes pre-bound to a DataVolume's claim (`storage.checkStaticVolume`)."""
        return [*datavolume_watches(self.ctx, self.handles), Watch(groups.PODS, self._keys_of_pod),
                Watch(groups.PVS, self._keys_of_volume)]

    def _keys_of_pod(self, pod: Obj) -> list[str]:
        return own_datavolumes(self.ctx, self.handles, claim_keys_of_pod(pod))

    def _keys_of_volume(self, volume: Obj) -> list[str]:
        ref = PersistentVolumeView(volume).claim_ref
        if not (ref.get("name") and ref.get("namespace")):
            return []
        return own_datavolumes(self.ctx, self.handles, [f"{ref['namespace']}/{ref['name']}"])

    # -- the shared flow ------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        dv = self.ctx.cached(groups.DATAVOLUMES, name, namespace)
        if dv is None or DataVolumeView(dv).deleting:
            self.ctx.metrics.clear_import_progress(key)
            self.ctx.metrics.worker_step(key, None)
            return None
        if not self.handles(dv):
            return None  # another source kind's
        view = DataVolumeView(dv)
        pvc = self.ctx.cached(groups.PVCS, name, namespace)
        unsupported = unsupported_source(view.spec)
        if unsupported is not None and not _finished(view, pvc):
            return await self._refuse(dv, unsupported)
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
        await self._recorded_annotations(view, pvc)
        if not _finished(view, pvc):
            self._warn_if_clamped(dv, pvc)
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
        owners.append(owner_reference(groups.DATAVOLUMES, dv))
        patch = {"metadata": {"ownerReferences": owners, "resourceVersion": ClaimView(pvc).resource_version}}
        adopted: Obj = await self.ctx.client.patch(groups.PVCS, view.name, patch, view.namespace)
        return adopted

    async def _recorded_annotations(self, view: DataVolumeView, pvc: Body) -> None:
        """What the worker recorded on the claim (the sha256 and format it received), onto the DataVolume."""
        claimed = ClaimView(pvc).annotations
        changes = {key: claimed[key] for key in _RECORDED_ANNOTATIONS
                   if claimed.get(key) and view.annotations.get(key) != claimed[key]}
        if changes:
            await self.ctx.client.patch(groups.DATAVOLUMES, view.name, {"metadata": {"annotations": changes}},
                                        view.namespace)

    async def _delayed_annotations(self, view: DataVolumeView, pvc: Body) -> None:
        """CDI's delayed annotations: a DataVolume's `storage.populatedFor` reaches its claim only once the
        DataVolume succeeded (a backup taken then restores as populated, never half-filled)."""
        wanted = view.annotations.get(ann.POPULATED_FOR)
        if view.phase == "Succeeded" and wanted is not None and \
                ann.POPULATED_FOR not in ClaimView(pvc).annotations:
            await self.ctx.client.patch(groups.PVCS, view.name, {"metadata": {"annotations": {
                ann.POPULATED_FOR: wanted}}}, view.namespace)

    def _warn_if_clamped(self, dv: Body, pvc: Body) -> None:
        """Ours: a DataVolume whose `worker.resources` asks above CDIConfig's cap (lowered after it was
        admitted; admission refuses such a DataVolume) gets its worker pods clamped to the cap, and one
        Warning that says so; under a malformed cap its override is ignored, and the Warning says that."""
        text = ClaimView(pvc).annotations.get(ann.WORKER_RESOURCES)
        if text is None:
            return
        cap, allowed = worker_cap(self.ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME))
        try:
            above = workeroverrides.above_cap(workeroverrides.parse_resources(text), cap or {})
        except workeroverrides.OverrideError:
            return
        if not allowed:
            message = (f"{ann.WORKER_RESOURCES} ignored: the cap {ann.WORKER_MAX_RESOURCES} on CDIConfig is "
                       "malformed; worker pods get the default resources")
        elif above and cap:
            message = (f"{ann.WORKER_RESOURCES}: {', '.join(above)} above the cap {ann.WORKER_MAX_RESOURCES} on "
                       f"CDIConfig ({workeroverrides.describe_cap(cap)}): worker pods are clamped to it")
        else:
            return
        if not self.ctx.recorder.recorded(dv, WARNING, workeroverrides.CLAMPED_REASON, message):
            self.ctx.recorder.record(dv, WARNING, workeroverrides.CLAMPED_REASON, message)

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
            # `datavolume_watches` bring the DataVolume back when a StorageClass or StorageProfile changes
            return await self._update_status(dv, None, message=str(exc), reason="Pending", phase="Pending")
        except RenderError as exc:
            return await self._update_status(dv, None, message=str(exc), reason=exc.reason, phase="Pending",
                                             event=(WARNING, exc.reason, str(exc)))
        annotations = {k: v for k, v in view.annotations.items() if k in PASSED_TO_CLAIM}
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
        else:
            annotations.update(self.claim_annotations(view))
        # as CDI, every claim of a DataVolume says what it holds, whichever path fills it: a clone reads it
        # to measure a disk image's virtual size (the target's size, and whether a smaller Block target fits)
        annotations.setdefault(ann.CONTENT_TYPE, view.content_type)
        preallocation = view.spec.get("preallocation")
        if preallocation is not None:
            annotations[ann.PREALLOCATION_REQUESTED] = format_bool(bool(preallocation))
        if view.spec.get("priorityClassName"):
            annotations[ann.POD_PRIORITY_CLASS] = str(view.spec["priorityClassName"])
        if view.spec.get("serviceAccountName"):
            annotations[ann.POD_SERVICE_ACCOUNT] = str(view.spec["serviceAccountName"])
        annotations[ann.CREATED_FOR_DATAVOLUME] = view.uid
        if not self._gate(featuregates.HONOR_WAIT_FOR_FIRST_CONSUMER) and not static:
            annotations[ann.BIND_IMMEDIATE] = ""  # as CDI: worker pods need not wait for a first consumer
        labels = {k: v for k, v in view.labels.items() if _passes_label(k)}
        labels[ann.LABEL_APP] = ann.LABEL_APP_VALUE
        labels[ann.LABEL_FILLING_UP_ALERT] = "disabled"
        claim = {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": view.name, "namespace": view.namespace, "labels": labels,
                         "annotations": annotations, "ownerReferences": [owner_reference(groups.DATAVOLUMES, dv)]},
            "spec": spec,
        }
        try:
            created = await self.ctx.client.create(groups.PVCS, claim, view.namespace)
        except AlreadyExists:
            return 0.5  # our cache is behind; look again
        except Forbidden as exc:
            message = quota.refusal(exc)
            if message is None:
                raise
            # as CDI: Pending, the refusal on Bound and Ready and as a Warning; tried again until it fits
            await self._update_status(dv, None, message=message, reason=quota.ERR_EXCEEDED_QUOTA, phase="Pending",
                                      event=(WARNING, quota.ERR_EXCEEDED_QUOTA, message))
            raise RetryLater(message) from exc
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
            running_message = await self.running_message(view, pvc, status)
            restarts = ClaimView(pvc).annotations.get(ann.POD_RESTARTS, "")
            if restarts.isdigit():
                status["restartCount"] = int(restarts)
        conditions.update_all(status, pvc, message, reason, running_message=running_message)
        if status.get("phase") != "ImportInProgress":
            self.ctx.metrics.clear_import_progress(view.key)
        if status.get("phase") not in ("ImportInProgress", "UploadReady"):  # the phases a worker reports in
            self.ctx.metrics.worker_step(view.key, None)
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
        populating = claim_uses_populator(pvc)
        if pod_phase == "Succeeded" and populating and claim_phase != "Bound":
            # filled, and the volume on its way to the claim: Succeeded once the claim can be used
            # (CDI says Succeeded a moment earlier, while its claim is still Pending)
            return None, 0.5
        if pod_phase == "Succeeded":
            if status.get("phase") != "Succeeded":  # a finished DataVolume's progress is what it ended with
                status["phase"], status["progress"] = "Succeeded", PROGRESS_COMPLETE
            return (NORMAL, self.succeeded_reason, self.succeeded_message.format(name)), None
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
        return self.worker_phase(view, pvc, status)
