"""The clone populator (CDI's clone-populator): a claim naming a `VolumeCloneSource` is cloned from
the PVC or VolumeSnapshot the source names, with the strategy the clone planner picks (csi-clone,
snapshot, host-assisted copy), through the same phases and temporary objects as a clone DataVolume:
the claim records them in `cdi.kubevirt.io/clonePhase` and `cdi.controller.clone.execute` walks the
planner's phases, ending with the volume rebound to the claim and the temporary objects deleted. While a
host-assisted copy runs, the claim shows its progress in `cdi.kubevirt.io/storage.populator.progress`.

Claims created by a clone DataVolume are the clone reconciler's own and are left to it."""

from __future__ import annotations

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.views import ClaimView, ObjectView, SnapshotView
from cdi.controller.claims import annotate
from cdi.controller.clone import execute, hostclone, planner
from cdi.controller.clone.hostclone import HOST_CLONE
from cdi.controller.clone.phase import ERROR, PENDING, SUCCEEDED
from cdi.controller.clone.target import recorded_source, refuse
from cdi.controller.populators.base import (
    GRANT_POLL,
    Body,
    PopulatorReconciler,
    reference_granted,
    source_namespace,
)
from cdi.controller.progress import format_progress
from cdi.controller.runtime import Context
from cdi.kube import WARNING, split_key

VOLUME_CLONE_SOURCE = "VolumeCloneSource"
SOURCE_MISSING_POLL = 5.0  # seconds: nothing maps a source claim's creation back to the claims naming it


def unnamed_source(ctx: Context, pvc: Body) -> str | None:
    """Why the source the claim records is not the one its VolumeCloneSource names, or None. A claim of the
    clone populator reads what its VolumeCloneSource names, from that source's namespace (its own, or one
    a ReferenceGrant opened, checked when the clone was planned)."""
    claim = ClaimView(pvc)
    kind, source_ns, source_name = recorded_source(pvc)
    recorded = f"{kind}/{source_ns}/{source_name}"
    ref = claim.populator_ref
    namespace = str(ref.get("namespace") or claim.namespace)
    source = ctx.cached(groups.VOLUMECLONESOURCES, str(ref.get("name") or ""), namespace)
    named: Body = ObjectView(source or {}).spec.get("source") or {}
    wanted = f"{'snapshot' if named.get('kind') == 'VolumeSnapshot' else 'pvc'}/{namespace}/{named.get('name')}"
    if source is None or recorded != wanted:
        return f"its VolumeCloneSource does not name {recorded}"
    return None


class ClonePopulator(PopulatorReconciler):
    name = "clone-populator"
    source_kind = VOLUME_CLONE_SOURCE
    source_gvr = groups.VOLUMECLONESOURCES

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        pvc = self.ctx.cached(groups.PVCS, name, namespace)
        if pvc is None or ClaimView(pvc).deleting or not self.refers_to_us(pvc):
            return None
        if any(r.get("kind") == "DataVolume" for r in ClaimView(pvc).owner_references):
            return None  # a clone DataVolume's target: the clone reconciler drives it
        annotations = ClaimView(pvc).annotations
        if ann.CLONE_SOURCE not in annotations:
            return await self._plan(pvc)
        if annotations.get(ann.CLONE_PHASE) in (SUCCEEDED, ERROR):
            return None
        why = unnamed_source(self.ctx, pvc)
        if why is not None:
            refuse(self.ctx, pvc, why)
        else:
            written = await execute.advance(self.ctx, pvc)
            await self._copy_progress(written or pvc)
        return execute.POLL

    async def _copy_progress(self, pvc: Body) -> None:
        """While a host-assisted copy runs, its clone source pod's progress on the claim, as CDI's clone
        populator shows it (`storage.populator.progress`; 100% is written when the clone succeeded)."""
        if ClaimView(pvc).annotations.get(ann.CLONE_PHASE) != HOST_CLONE:
            return
        source = hostclone.copy_source(self.ctx, pvc)
        report = await self.ctx.progress.read(*source) if source is not None else None
        if report is not None and report.progress is not None:
            await annotate(self.ctx, pvc, {ann.POPULATOR_PROGRESS: format_progress(min(report.progress, 99.99))})

    def refers_to_us(self, pvc: Body) -> bool:
        ref = ClaimView(pvc).populator_ref
        return ref.get("apiGroup") == groups.CDI_GROUP and ref.get("kind") == VOLUME_CLONE_SOURCE and \
            bool(ref.get("name"))

    async def _plan(self, pvc: Body) -> float | None:
        """Pick the strategy (CDI's planner) and record it with the source on the claim."""
        if ClaimView(pvc).phase not in ("", "Pending"):
            return None
        ready, _ = self._ready_for_population(pvc)
        if not ready:
            return None  # CDI's reconcilePending: a WaitForFirstConsumer claim waits for its consumer's node
        if not await reference_granted(self.ctx, pvc):
            return GRANT_POLL
        source = self.population_source(pvc)
        if source is None:
            return None
        ref: Body = ObjectView(source).spec.get("source") or {}
        namespace = source_namespace(pvc)
        kind = "snapshot" if ref.get("kind") == "VolumeSnapshot" else "pvc"
        source_name = str(ref.get("name") or "")
        cluster = planner.cluster_from(self.ctx)
        spec: Body = pvc.get("spec") or {}
        try:
            if kind == "pvc":
                source_obj = self.ctx.cached(groups.PVCS, source_name, namespace)
                if source_obj is None:
                    return SOURCE_MISSING_POLL
                plan = planner.plan_from_pvc(source_obj, spec, ClaimView(pvc).annotations, cluster)
            else:
                source_obj = self.ctx.cached(groups.VOLUMESNAPSHOTS, source_name, namespace)
                if source_obj is None:
                    return SOURCE_MISSING_POLL
                content_name = SnapshotView(source_obj).content_name
                content = self.ctx.cached(groups.VOLUMESNAPSHOTCONTENTS, content_name) if content_name else None
                plan = planner.plan_from_snapshot(source_obj, content, spec, cluster)
        except planner.CloneValidationError as exc:
            self.ctx.recorder.record(pvc, WARNING, planner.CLONE_VALIDATION_FAILED,
                                     f"{planner.MESSAGE_CLONE_VALIDATION_FAILED}: {exc}")
            return None
        changes: dict[str, str | None] = {
            ann.CLONE_TYPE: plan.strategy, ann.CLONE_PHASE: PENDING,
            ann.CLONE_SOURCE: f"{kind}/{namespace}/{source_name}",
            ann.CLONE_REQUEST: f"{namespace}/{source_name}"}
        if plan.fallback_message:
            changes[ann.CLONE_FALLBACK_REASON] = plan.fallback_message
        await annotate(self.ctx, pvc, changes)
        if plan.fallback_reason and plan.fallback_message:
            self.ctx.recorder.record(pvc, WARNING, plan.fallback_reason, plan.fallback_message)
        return execute.POLL

    def prime_annotations(self, pvc: Body, source: Body) -> dict[str, str]:
        return {}  # no prime claim: the phases' temporary claims stand in for it

    async def reconcile_target(self, pvc: Body, prime: Body) -> float | None:
        return None
