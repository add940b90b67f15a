"""The clone DataVolume reconciler (`source.pvc`, `source.snapshot`, or a `sourceRef` DataSource that
names one), beside the import and upload ones as CDI has one controller per source kind.

What is the DataVolume's own lives here: it renders the target claim (size taken from the source when the
`storage` API omits it, measured by a size-detection pod for a disk image), checks the clone token of a
clone from another namespace, asks the planner for a strategy, and creates the target with a
`dataSourceRef` to its VolumeCloneSource so that no provisioner fills it. The clone itself is
`cdi.controller.clone`'s: the planner's phases for that strategy (csi-clone, snapshot, host-assisted copy,
then prep-claim and rebind), driven one look at a time by `execute.advance`, as CDI's clone populator
drives them, each recorded in the target's `cdi.kubevirt.io/clonePhase`.

The DataVolume's phase follows the clonePhase (CDI's populator phase map), with CDI's events; a step is
taken only once the DataVolume shows the current phase, so that every phase shows however short."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.owners import owner_reference
from cdi.api.phases import PROGRESS_COMPLETE, PROGRESS_UNKNOWN
from cdi.api.rendering import ClusterStorage, ProfileNotReady, RenderError, render_claim_spec
from cdi.api.views import ClaimView, DataVolumeView, SnapshotView
from cdi.controller import conditions, quota
from cdi.controller.claims import cluster_storage, delete_if_present, get_if_present
from cdi.controller.clone import execute, hostclone, planner, sizedetection
from cdi.controller.clone import size as clonesize
from cdi.controller.clone import token as clonetoken
from cdi.controller.clone.csiclone import CSI_CLONE
from cdi.controller.clone.execute import POLL
from cdi.controller.clone.hostclone import HOST_CLONE
from cdi.controller.clone.phase import ERROR, PENDING, SUCCEEDED
from cdi.controller.clone.prepclaim import PREP_CLAIM
from cdi.controller.clone.rebind import REBIND
from cdi.controller.clone.snapclone import SNAPSHOT_CLONE
from cdi.controller.clone.snapshot import SNAPSHOT
from cdi.controller.clone.sourceclaim import CLONE_WITHOUT_SOURCE
from cdi.controller.clone.target import recorded_source, refuse
from cdi.controller.datasource import ChainError, CloneSource, Lookup, resolve_source_ref
from cdi.controller.datavolume.base import PASSED_TO_CLAIM, datavolume_watches
from cdi.controller.populators.clones import unnamed_source
from cdi.controller.populators.datavolumes import pending_population
from cdi.controller.progress import format_progress
from cdi.controller.runtime import Context, Reconciler, RetryLater, write_status
from cdi.controller.watches import Watch
from cdi.controller.workerpod import pod_settings
from cdi.kube import NORMAL, WARNING, AlreadyExists, Forbidden, split_key
from cdi.kube.events import EventType

Obj = dict[str, Any]
Body = Mapping[str, Any]

# the DataVolume phase each clonePhase (CDI's populator phase names) shows as
PHASE_MAP = {"": "CloneScheduled", PENDING: "CloneScheduled", SUCCEEDED: "Succeeded", CSI_CLONE: "CSICloneInProgress",
             HOST_CLONE: "CloneInProgress", PREP_CLAIM: "PrepClaimInProgress", REBIND: "RebindInProgress",
             SNAPSHOT_CLONE: "CloneFromSnapshotSourceInProgress", SNAPSHOT: "SnapshotForSmartCloneInProgress",
             ERROR: "Failed"}
CLONE_SOURCE_KIND = "VolumeCloneSource"
SIGNING_KEY_SECRET = "cdi-api-signing-key"  # cdi-apiserver's, which signs and checks clone tokens


def is_clone(dv: Body) -> bool:
    view = DataVolumeView(dv)
    return view.source_ref is not None or view.source_kind in ("pvc", "snapshot")


def clone_phase_of(target: Body) -> str:
    """The target claim's clonePhase. A claim an older CDI cloned without its clone populator (host-assisted,
    in place: `k8s.io/CloneRequest`) has none; once its copy succeeded (`k8s.io/CloneOf`, the upload
    server's phase), it is Succeeded, and nothing is cloned or looked at again."""
    annotations = ClaimView(target).annotations
    phase = annotations.get(ann.CLONE_PHASE)
    if phase is None and ann.CLONE_REQUEST in annotations and \
            (annotations.get(ann.CLONE_OF) == "true" or annotations.get(ann.POD_PHASE) == "Succeeded"):
        return SUCCEEDED
    return phase or ""


def clone_source_name(dv: Body) -> str:
    return f"volume-clone-source-{DataVolumeView(dv).uid}"


class SourceMissing(Exception):
    """The source a clone names does not exist (yet): CDI's CloneWithoutSource."""


@dataclass(frozen=True)
class ClonePlan:
    source: CloneSource
    source_obj: Body
    spec: Obj  # the target claim's spec
    plan: planner.Plan
    permissive: bool = False  # CDI's size rules made the clone permissive (cdi.kubevirt.io/permissiveClone)


def plan_datavolume(dv: Body, lookup: Lookup, storage: ClusterStorage, cluster: planner.Cluster) -> ClonePlan:
    """Everything decided before anything moves: the source, the target claim's spec (its size taken
    from the source when the `storage` API omits it) and the strategy with its reason. Shared by the
    reconciler and `cdi clone-plan`. Raises ChainError, SourceMissing, RenderError,
    planner.CloneValidationError or size.NeedsVirtualSize (a size-detection pod must measure the source)."""
    source = resolve_source_ref(dv, lookup)
    gvr = groups.PVCS if source.kind == "pvc" else groups.VOLUMESNAPSHOTS
    source_obj = lookup(gvr, source.name, source.namespace)
    if source_obj is None:
        raise SourceMissing(f"The source {source.kind} {source.name} doesn't exist")
    spec = render_claim_spec(dv, storage)
    requests = spec.setdefault("resources", {}).setdefault("requests", {})
    if source.kind == "pvc":
        sized = clonesize.pvc_clone_size(source_obj, spec, storage)
        content = None
    else:
        content_name = SnapshotView(source_obj).content_name
        content = lookup(groups.VOLUMESNAPSHOTCONTENTS, content_name, "") if content_name else None
        sized = clonesize.snapshot_clone_size(source_obj, content, spec, storage)
    if sized.request is not None:
        requests["storage"] = sized.request
    annotations: dict[str, str] = dict(DataVolumeView(dv).annotations)
    if sized.permissive:
        annotations[ann.PERMISSIVE_CLONE] = "true"
    if source.kind == "pvc":
        plan = planner.plan_from_pvc(source_obj, spec, annotations, cluster)
    else:
        plan = planner.plan_from_snapshot(source_obj, content, spec, cluster)
    return ClonePlan(source, source_obj, spec, plan, sized.permissive)


class CloneReconciler(Reconciler):
    name = "clone"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._signing_key: bytes | None = None

    def watches(self) -> list[Watch]:
        return datavolume_watches(self.ctx, is_clone)

    def lookup(self, gvr: groups.GVR, name: str, namespace: str) -> Obj | None:
        return self.ctx.cached(gvr, name, namespace)

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        dv = self.ctx.cached(groups.DATAVOLUMES, name, namespace)
        if dv is None or DataVolumeView(dv).deleting:
            self.ctx.metrics.worker_step(key, None)
            return None
        if not is_clone(dv):
            return None
        view = DataVolumeView(dv)
        target = self.ctx.cached(groups.PVCS, name, namespace)
        if target is not None and not ClaimView(target).owned_by(view.uid):
            message = f'Resource "{name}" already exists and is not managed by DataVolume'
            self.ctx.recorder.record(dv, WARNING, "ErrResourceExists", message)
            return await self._status(dv, None, reason="ErrResourceExists", message=message)
        if target is None:
            if view.phase == "Succeeded":
                return await self._status(dv, None, reason="ClaimLost", message="PVC was deleted")
            return await self._check_token(dv) or await self._create_target(dv)
        if ClaimView(target).deleting:
            return None
        phase = clone_phase_of(target)
        if phase in ("", PENDING) and pending_population(self.ctx, target):
            # as CDI's clone populator (claimReadyForPopulation): a WaitForFirstConsumer target waits for the
            # node the scheduler picks for its consumer, and the clone is then made there
            return await self._status(dv, target, phase="PendingPopulation")
        # a step is taken only once the DataVolume shows the current phase, so that every phase shows
        # (with its event) however short it is
        if phase in (SUCCEEDED, ERROR) or view.phase != PHASE_MAP.get(phase):
            requeue = await self._status(dv, target)
            return requeue if phase in (SUCCEEDED, ERROR) else POLL
        try:
            advanced = await self._advance(target)
        except RetryLater:
            # a quota holds a temporary: the DataVolume shows the phase that waits and why (the target says
            # both), then the key waits with its backoff, or for the quota to change
            await self._status(dv, await get_if_present(self.ctx, groups.PVCS, name, namespace) or target)
            raise
        await self._status(dv, advanced or target)
        return POLL

    # -- the target claim -------------------------------------------------------------------------

    async def _create_target(self, dv: Body) -> float | None:
        view = DataVolumeView(dv)
        try:
            decided = plan_datavolume(dv, self.lookup, cluster_storage(self.ctx), planner.cluster_from(self.ctx))
        except ChainError as exc:
            return await self._status(dv, None, reason=exc.reason, message=str(exc), phase="Pending", requeue=POLL)
        except SourceMissing as exc:
            message = str(exc)
            if (conditions.find(list(view.status.get("conditions") or []), "Bound") or {}).get("message") != message:
                self.ctx.recorder.record(dv, WARNING, CLONE_WITHOUT_SOURCE, message)
            return await self._status(dv, None, reason=CLONE_WITHOUT_SOURCE, message=message, phase="Pending",
                                      requeue=POLL)
        except planner.CloneValidationError as exc:
            message = f"{planner.MESSAGE_CLONE_VALIDATION_FAILED}: {exc}"
            if (conditions.find(list(view.status.get("conditions") or []), "Bound") or {}).get("message") != message:
                self.ctx.recorder.record(dv, WARNING, planner.ERR_INCOMPATIBLE_PVC, str(exc))
                self.ctx.recorder.record(dv, WARNING, planner.CLONE_VALIDATION_FAILED, message)
            return await self._status(dv, None, reason=planner.CLONE_VALIDATION_FAILED, message=message,
                                      phase="Pending")
        except ProfileNotReady as exc:  # the watches bring it back once the profile is written
            return await self._status(dv, None, reason=exc.reason, message=str(exc), phase="Pending")
        except RenderError as exc:
            self.ctx.recorder.record(dv, WARNING, exc.reason, str(exc))
            return await self._status(dv, None, reason=exc.reason, message=str(exc), phase="Pending")
        except clonesize.NeedsVirtualSize:
            return await self._detect_size(dv)
        source, spec, plan = decided.source, decided.spec, decided.plan
        if decided.permissive and view.annotations.get(ann.PERMISSIVE_CLONE) != "true":
            # CDI marks the DataVolume itself; the target claim takes the annotation below
            await self.ctx.client.patch(groups.DATAVOLUMES, view.name, {"metadata": {"annotations": {
                ann.PERMISSIVE_CLONE: "true"}}}, view.namespace)
            return 0
        if not spec.get("resources", {}).get("requests", {}).get("storage"):
            return await self._status(dv, None, reason="Pending", message="waiting for the source's size",
                                      phase="Pending", requeue=POLL)
        annotations: dict[str, str] = {
            ann.CREATED_FOR_DATAVOLUME: view.uid, ann.CLONE_TYPE: plan.strategy, ann.CLONE_PHASE: PENDING,
            ann.CONTENT_TYPE: view.content_type, ann.POD_RESTARTS: "0",
            ann.CLONE_SOURCE: f"{source.kind}/{source.namespace}/{source.name}",
            ann.CLONE_REQUEST: f"{source.namespace}/{source.name}"}
        if plan.fallback_message:
            annotations[ann.CLONE_FALLBACK_REASON] = plan.fallback_message
        if source.namespace != view.namespace:
            annotations[ann.DATA_SOURCE_NAMESPACE] = source.namespace
        for key in (ann.PERMISSIVE_CLONE, *PASSED_TO_CLAIM):
            if key in view.annotations:
                annotations[key] = view.annotations[key]
        spec["dataSourceRef"] = {"apiGroup": groups.CDI_GROUP, "kind": CLONE_SOURCE_KIND,
                                 "name": clone_source_name(dv)}
        labels = {k: v for k, v in view.labels.items() if "kubevirt.io/" in k}
        labels.update({ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_FILLING_UP_ALERT: "disabled"})
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": view.name, "namespace": view.namespace, "labels": labels,
                              "annotations": annotations, "ownerReferences": [owner_reference(groups.DATAVOLUMES, dv)]},
                 "spec": spec}
        try:
            created = await self.ctx.client.create(groups.PVCS, claim, view.namespace)
        except AlreadyExists:
            return 0.5
        except Forbidden as exc:
            refused = quota.refusal(exc)
            if refused is None:
                raise
            bound = conditions.find(list(view.status.get("conditions") or []), "Bound") or {}
            if (bound.get("reason"), bound.get("message")) != (quota.ERR_EXCEEDED_QUOTA, refused):
                self.ctx.recorder.record(dv, WARNING, quota.ERR_EXCEEDED_QUOTA, refused)
            await self._status(dv, None, reason=quota.ERR_EXCEEDED_QUOTA, message=refused, phase="Pending")
            raise RetryLater(refused) from exc
        if plan.fallback_reason and plan.fallback_message:
            self.ctx.recorder.record(created, WARNING, plan.fallback_reason, plan.fallback_message)
        await self._status(dv, created, scheduled_why=plan.why)
        return POLL

    async def _check_token(self, dv: Body) -> float | None:
        """A clone from another namespace needs its clone token (`clone.token`): None when it holds one
        for this source and target, else when to look again."""
        view = DataVolumeView(dv)
        try:
            source = resolve_source_ref(dv, self.lookup)
        except ChainError:
            return None  # _create_target says why
        if source.namespace == view.namespace:
            return None
        signing_key = await self._signing_key_or_none()
        if signing_key is None:
            return await self._status(dv, None, reason="Pending", message="waiting for cdi-apiserver's signing key",
                                      phase="Pending", requeue=POLL)
        try:
            extended = clonetoken.verified(view.annotations, signing_key, source.kind, source.namespace,
                                           source.name, view.namespace, view.name, view.uid)
        except clonetoken.TokenInvalid as exc:
            message = str(exc)
            if (conditions.find(list(view.status.get("conditions") or []), "Bound") or {}).get("message") != message:
                self.ctx.recorder.record(dv, WARNING, clonetoken.INVALID, message)
            return await self._status(dv, None, reason=clonetoken.INVALID, message=message, phase="Pending",
                                      requeue=30.0)
        if extended is None:
            return None
        await self.ctx.client.patch(groups.DATAVOLUMES, view.name, {"metadata": {"annotations": {
            ann.EXTENDED_CLONE_TOKEN: extended}}}, view.namespace)
        return 0.2

    async def _signing_key_or_none(self) -> bytes | None:
        """cdi-apiserver's key, which signs and checks clone tokens (None until it exists)."""
        if self._signing_key is None:
            secret = await self._get(groups.SECRETS, SIGNING_KEY_SECRET, self.ctx.settings.namespace)
            data = (secret or {}).get("data") or {}
            if "id_rsa" in data:
                self._signing_key = base64.b64decode(data["id_rsa"])
        return self._signing_key

    async def _unauthorized(self, target: Body, kind: str, source_ns: str, source_name: str) -> str | None:
        """Why the source the target records (an annotation on a claim its user may edit) is not one this
        clone may read, or None. A DataVolume's target reads its own namespace, or the source its clone
        token names; a claim that is not its DataVolume's (controller) is held to what a claim of the
        clone populator may read."""
        claim = ClaimView(target)
        recorded = f"{kind}/{source_ns}/{source_name}"
        owner = next((r for r in claim.owner_references if r.get("kind") == "DataVolume" and r.get("controller")),
                     None)
        if owner is not None:
            if source_ns == claim.namespace:
                return None
            dv = self.ctx.cached(groups.DATAVOLUMES, str(owner.get("name")), claim.namespace)
            signing_key = await self._signing_key_or_none()
            if dv is None or signing_key is None:
                return f"no clone token allows reading {recorded}"
            view = DataVolumeView(dv)
            try:
                clonetoken.verified(view.annotations, signing_key, kind, source_ns, source_name, view.namespace,
                                    view.name, view.uid)
            except clonetoken.TokenInvalid as exc:
                return f"no clone token allows reading {recorded}: {exc}"
            return None
        return unnamed_source(self.ctx, target)

    async def _detect_size(self, dv: Body) -> float | None:
        """The source's disk image is measured by a size-detection pod (CDI's getSizeFromPod); its
        answer is kept on the source claim, from where the next look takes the size."""
        source_ref = resolve_source_ref(dv, self.lookup)
        source = await self._get(groups.PVCS, source_ref.name, source_ref.namespace)
        if source is None or clonesize.recorded_virtual_size(source) is not None:
            return 0.2  # measured already: the cache has not caught up yet
        owner = next((r for r in ClaimView(source).owner_references
                      if r.get("controller") and r.get("kind") == "DataVolume"), None)
        if owner is not None:
            filler = self.ctx.cached(groups.DATAVOLUMES, str(owner.get("name")), source_ref.namespace)
            if filler is None or DataVolumeView(filler).phase != "Succeeded":
                return await self._size_status(dv, *sizedetection.IMPORT_PVC_NOT_READY, NORMAL)
        name = sizedetection.pod_name(source)
        pod = await self._get(groups.PODS, name, source_ref.namespace)
        if pod is None:
            manifest = sizedetection.size_detection_pod(source, dv, self.ctx.settings.importer_image,
                                                        pod_settings(self.ctx))
            try:
                await self.ctx.client.create(groups.PODS, manifest, source_ref.namespace)
            except AlreadyExists:
                pass
            return await self._size_status(dv, *sizedetection.SIZE_DETECTION_POD_CREATED, NORMAL)
        failed = sizedetection.failure(pod)
        if failed is not None:
            await self._delete(groups.PODS, name, source_ref.namespace)
            return await self._size_status(dv, failed, sizedetection.MESSAGE_POD_FAILED.format(failed), WARNING,
                                           requeue=10.0)
        virtual = sizedetection.result(pod)
        if virtual is None:
            return await self._size_status(dv, *sizedetection.SIZE_DETECTION_POD_NOT_READY, NORMAL)
        await self.ctx.client.patch(groups.PVCS, source_ref.name, {"metadata": {"annotations": {
            clonesize.VIRTUAL_SIZE: str(virtual),
            clonesize.SOURCE_CAPACITY: ClaimView(source).capacity}}}, source_ref.namespace)
        await self._delete(groups.PODS, name, source_ref.namespace)
        return 0.2  # the source claim's cache catches up with its new annotations

    async def _size_status(self, dv: Body, reason: str, message: str, kind: EventType,
                           requeue: float = POLL) -> float | None:
        """The DataVolume waits in CloneScheduled while the size is found; each step's event once."""
        bound = conditions.find(list(DataVolumeView(dv).status.get("conditions") or []), "Bound") or {}
        if bound.get("reason") != reason:
            self.ctx.recorder.record(dv, kind, reason, message)
        return await self._status(dv, None, reason=reason, message=message, phase="CloneScheduled",
                                  requeue=requeue, quiet=True)

    async def _delete(self, gvr: groups.GVR, name: str, namespace: str) -> None:
        await delete_if_present(self.ctx, gvr, name, namespace, cached=False)

    async def _get(self, gvr: groups.GVR, name: str, namespace: str) -> Obj | None:
        return await get_if_present(self.ctx, gvr, name, namespace)

    # -- the phases --------------------------------------------------------------------------------

    async def _advance(self, target: Body) -> Obj | None:
        """One look at the clone (`execute.advance`), once the source the target records is one it may
        read; the target as written when its phase changed."""
        kind, source_ns, source_name = recorded_source(target)
        why = await self._unauthorized(target, kind, source_ns, source_name)
        if why is not None:
            refuse(self.ctx, target, why)
            return None
        return await execute.advance(self.ctx, target)

    # -- status ------------------------------------------------------------------------------------

    async def _status(self, dv: Body, pvc: Body | None, *, reason: str = "", message: str = "",
                      phase: str | None = None, requeue: float | None = None,
                      scheduled_why: str | None = None, quiet: bool = False) -> float | None:
        """`quiet`: no phase event (CloneScheduled is announced with the plan, once the target exists)."""
        view = DataVolumeView(dv)
        status: Obj = json.loads(json.dumps(view.status))
        old_phase = status.get("phase", "")
        status.setdefault("progress", PROGRESS_UNKNOWN)
        running_message: str | None = None
        if phase is not None:
            status["phase"] = phase
        elif pvc is not None:
            status["claimName"] = ClaimView(pvc).name
            clone_phase = clone_phase_of(pvc)
            restarts = ClaimView(pvc).annotations.get(ann.POD_RESTARTS, "")
            if restarts.isdigit():
                status["restartCount"] = int(restarts)
            status["phase"] = PHASE_MAP.get(clone_phase, status.get("phase") or "CloneScheduled")
            if status["phase"] == "Succeeded" and old_phase != "Succeeded":  # a finished one keeps its progress
                status["progress"] = PROGRESS_COMPLETE
            elif status["phase"] == "CloneInProgress":
                running_message = await self._refresh_progress(view.key, pvc, status)
        elif not old_phase:
            status["phase"] = "Pending"
        conditions.update_all(status, pvc, message, reason, running_message=running_message,
                              worker_running=running_message is not None)
        if status.get("phase") != "CloneInProgress":
            self.ctx.metrics.worker_step(view.key, None)
        if status != view.status:
            await write_status(self.ctx.client, groups.DATAVOLUMES, dv, status)
            if (status.get("phase") != old_phase and not quiet) or scheduled_why is not None:
                self._phase_event(dv, str(status["phase"]), scheduled_why)
        return requeue

    async def _refresh_progress(self, key: str, target: Body, status: Obj) -> str | None:
        """The clone source pod's `kubevirt_cdi_clone_progress_total{ownerUID}`, as CDI reads it; and the step
        it is in, for the Running condition. None while no source pod runs; what the condition says when the
        pod did not answer (a frozen or busy pod keeps its last word)."""
        source = hostclone.copy_source(self.ctx, target)
        if source is None:
            self.ctx.metrics.worker_step(key, None)
            return None
        report = await self.ctx.progress.read(*source)
        if report is None:
            return conditions.running_message(status)
        if report.progress is not None:
            status["progress"] = format_progress(min(report.progress, 99.99))
        self.ctx.metrics.worker_step(key, report.step)
        return report.running_message() or ""

    def _phase_event(self, dv: Body, phase: str, why: str | None) -> None:
        view = DataVolumeView(dv)
        try:
            source = resolve_source_ref(dv, self.lookup)
            src_ns, src_name = source.namespace, source.name
        except ChainError:
            return
        target = f"{view.namespace}/{view.name}"
        events = {
            "CloneScheduled": ("CloneScheduled", f"Cloning from {src_ns}/{src_name} into {target} scheduled"
                               + (f": {why}" if why else "")),
            "SnapshotForSmartCloneInProgress": ("SnapshotForSmartCloneInProgress",
                                                f"Creating snapshot for smart-clone is in progress (for pvc "
                                                f"{src_ns}/{src_name})"),
            "CloneFromSnapshotSourceInProgress": ("CloneFromSnapshotSourceInProgress",
                                                  f"Creating PVC from snapshot source is in progress (for "
                                                  f"{'snapshot' if view.source.get('snapshot') else 'pvc'}"
                                                  f" {src_ns}/{src_name})"),
            "CSICloneInProgress": ("CSICloneInProgress", f"CSI Volume clone in progress (for pvc {src_ns}/{src_name})"),
            "CloneInProgress": ("CloneInProgress", f"Cloning from {src_ns}/{src_name} into {target} in progress"),
            "PrepClaimInProgress": ("PrepClaimInProgress", f"Prepping PersistentVolumeClaim for DataVolume {target}"),
            "RebindInProgress": ("RebindInProgress", f"Rebinding PersistentVolumeClaim for DataVolume {target}"),
            "Succeeded": ("CloneSucceeded", f"Successfully cloned from {src_ns}/{src_name} into {target}"),
            "Failed": ("CloneFailed", f"Cloning from {src_ns}/{src_name} into {target} failed"),
        }
        if phase in events:
            reason, message = events[phase]
            self.ctx.recorder.record(dv, WARNING if phase == "Failed" else NORMAL, reason, message)
