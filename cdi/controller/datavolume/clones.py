"""The clone DataVolume reconciler (`source.pvc`, `source.snapshot`, or a `sourceRef` DataSource that
names one), beside the import and upload ones as CDI has one controller per source kind.

It renders the target claim (size taken from the source when the `storage` API omits it), asks the
planner for a strategy, and creates the target with a `dataSourceRef` to its VolumeCloneSource so
that no provisioner fills it; then it runs the strategy's phases as CDI's clone populator does,
recording each in the target's `cdi.kubevirt.io/clonePhase`:

- csi-clone: a temporary claim `tmp-pvc-<target uid>` in the source namespace with the source as
  `dataSource` (CSIClone), grown to the target's size (PrepClaim), its volume handed to the target
  by moving the PV's claimRef (Rebind);
- snapshot: a temporary VolumeSnapshot `tmp-snapshot-<target uid>` of the source (Snapshot), a
  temporary claim restored from it (SnapshotClone), then PrepClaim and Rebind as above; a
  `source.snapshot` DataVolume restores the user's snapshot directly;
- copy (host-assisted): a temporary claim filled by an upload server from a clone source pod (HostClone),
  then Rebind as above; from a VolumeSnapshot (restored elsewhere than its driver, for example), the
  snapshot is first restored into `tmp-source-pvc-<target uid>` in its namespace, of the first class of
  its driver (SnapshotClone), and the copy reads that claim, as CDI's planHostAssistedFromSnapshot.

Every temporary object is deleted when the clone succeeds. The DataVolume's phase follows the
clonePhase (CDI's populator phase map), with CDI's events."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from cdi.api import annotations as ann
from cdi.api import clonesourcerequest, groups
from cdi.api.clonesourcerequest import CloneSourceRequest
from cdi.api.phases import PROGRESS_COMPLETE, PROGRESS_UNKNOWN
from cdi.api.quantity import QuantityError, parse_bytes
from cdi.api.rendering import ClusterStorage, RenderError, render_claim_spec
from cdi.api.targetvolume import TargetVolume
from cdi.api.upload import SYNC_PATHS, upload_service_name
from cdi.api.views import (
    ClaimView,
    DataVolumeView,
    ObjectView,
    PersistentVolumeView,
    PodView,
    SnapshotContentView,
    SnapshotView,
)
from cdi.common import pki
from cdi.controller import conditions
from cdi.controller.claims import cluster_storage
from cdi.controller.clone import planner, sizedetection
from cdi.controller.clone import size as clonesize
from cdi.controller.clone import token as clonetoken
from cdi.controller.copyevents import copy_events
from cdi.controller.datasource import ChainError, CloneSource, Lookup, resolve_source_ref
from cdi.controller.datavolume.progress import format_progress, scrape
from cdi.controller.datavolume.uploadpki import UploadPki, cert_days, ensure_upload_pki
from cdi.controller.datavolume.uploads import UPLOAD_PORT
from cdi.controller.runtime import Context, Reconciler, write_status
from cdi.controller.workerpod import pod_settings, worker_pod
from cdi.kube import NORMAL, WARNING, AlreadyExists, NotFound, split_key
from cdi.kube.events import EventType

Obj = dict[str, Any]
Body = Mapping[str, Any]

POLL = 1.0  # seconds between looks while a clone moves (temporary objects carry no owner to map back)

# clonePhase values (CDI's populator phase names) and the DataVolume phase each shows as
PENDING, SNAPSHOT_PHASE, SNAPSHOT_CLONE, CSI_CLONE, HOST_CLONE = "Pending", "Snapshot", "SnapshotClone", "CSIClone", \
    "HostClone"
PREP_CLAIM, REBIND, SUCCEEDED, ERROR = "PrepClaim", "Rebind", "Succeeded", "Error"
PHASE_MAP = {"": "CloneScheduled", PENDING: "CloneScheduled", SUCCEEDED: "Succeeded", CSI_CLONE: "CSICloneInProgress",
             HOST_CLONE: "CloneInProgress", PREP_CLAIM: "PrepClaimInProgress", REBIND: "RebindInProgress",
             SNAPSHOT_CLONE: "CloneFromSnapshotSourceInProgress", SNAPSHOT_PHASE: "SnapshotForSmartCloneInProgress",
             ERROR: "Failed"}
CLONE_SOURCE_KIND = "VolumeCloneSource"
DATA_SOURCE_NAMESPACE = "cdi.kubevirt.io/dataSourceNamespace"
SOURCE_CONTAINER = "cdi-clone-source"
CLONE_SOURCE_IN_USE = "CloneSourceInUse"
CLONE_WITHOUT_SOURCE = "CloneWithoutSource"
SIGNING_KEY_SECRET = "cdi-api-signing-key"  # cdi-apiserver's, which signs and checks clone tokens
CLONE_SOURCE_ANNOTATION = "cdi.kubevirt.io/storage.clone.source"  # ours: kind/namespace/name the target clones
SOURCE_UNAUTHORIZED = "CloneSourceUnauthorized"  # ours: the recorded source is not one the clone may read
MESSAGE_SOURCE_UNAUTHORIZED = "The clone does not go on"


def is_clone(dv: Body) -> bool:
    view = DataVolumeView(dv)
    return view.source_ref is not None or view.source_kind in ("pvc", "snapshot")


def clone_source_name(dv: Body) -> str:
    return f"volume-clone-source-{DataVolumeView(dv).uid}"


def temp_claim_name(target: Body) -> str:
    return f"tmp-pvc-{ClaimView(target).uid}"


def source_pod_name(temp: Body) -> str:
    """CDI's `<uid>-source-pod` (the uid of the claim the upload server fills)."""
    return f"{ClaimView(temp).uid}-source-pod"


def temp_source_claim_name(target: Body) -> str:
    """CDI's `tmp-source-pvc-<target uid>`: a snapshot restored for a host-assisted copy to read."""
    return f"tmp-source-pvc-{ClaimView(target).uid}"


def temp_snapshot_name(target: Body) -> str:
    return f"tmp-snapshot-{ClaimView(target).uid}"


def _bytes(value: Any) -> int | None:
    try:
        return parse_bytes(value) if value is not None else None
    except QuantityError:
        return None


def planner_cluster(ctx: Context) -> planner.Cluster:
    cdi = next(iter(ctx.cached_list(groups.CDIS)), None)
    override = ObjectView(cdi or {}).spec.get("cloneStrategyOverride")
    profiles = {ObjectView(p).name: p for p in ctx.cached_list(groups.STORAGEPROFILES)}
    return planner.Cluster(ctx.cached_list(groups.STORAGECLASSES), profiles,
                           ctx.cached_list(groups.VOLUMESNAPSHOTCLASSES), str(override) if override else None)


def _writes(pod: PodView, claim: str) -> bool:
    """The pod mounts the claim writable in one of its containers (a block device always is)."""
    for volume in pod.volumes:
        source: Body = volume.get("persistentVolumeClaim") or {}
        if source.get("claimName") != claim or source.get("readOnly"):
            continue
        for container in pod.containers:
            if any(m.get("name") == volume.get("name") and not m.get("readOnly")
                   for m in container.get("volumeMounts") or []):
                return True
            if any(d.get("name") == volume.get("name") for d in container.get("volumeDevices") or []):
                return True
    return False


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
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def lookup(self, gvr: groups.GVR, name: str, namespace: str) -> Obj | None:
        return self.ctx.cached(gvr, name, namespace)

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        dv = self.ctx.cached(groups.DATAVOLUMES, name, namespace)
        if dv is None or DataVolumeView(dv).deleting or not is_clone(dv):
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
        phase = ClaimView(target).annotations.get(ann.CLONE_PHASE, "")
        # a step is taken only once the DataVolume shows the current phase, so that every phase shows
        # (with its event) however short it is
        if phase in (SUCCEEDED, ERROR) or view.phase != PHASE_MAP.get(phase):
            requeue = await self._status(dv, target)
            return requeue if phase in (SUCCEEDED, ERROR) else POLL
        await self._status(dv, await self._advance(target) or target)
        return POLL

    # -- the target claim -------------------------------------------------------------------------

    async def _create_target(self, dv: Body) -> float | None:
        view = DataVolumeView(dv)
        try:
            decided = plan_datavolume(dv, self.lookup, cluster_storage(self.ctx), planner_cluster(self.ctx))
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
            CLONE_SOURCE_ANNOTATION: f"{source.kind}/{source.namespace}/{source.name}",
            ann.CLONE_REQUEST: f"{source.namespace}/{source.name}"}
        if plan.fallback_message:
            annotations[ann.CLONE_FALLBACK_REASON] = plan.fallback_message
        if source.namespace != view.namespace:
            annotations[DATA_SOURCE_NAMESPACE] = source.namespace
        for key in (ann.PERMISSIVE_CLONE, ann.BIND_IMMEDIATE, ann.RETAIN_AFTER_COMPLETION):
            if key in view.annotations:
                annotations[key] = view.annotations[key]
        spec["dataSourceRef"] = {"apiGroup": groups.CDI_GROUP, "kind": CLONE_SOURCE_KIND,
                                 "name": clone_source_name(dv)}
        labels = {k: v for k, v in view.labels.items() if "kubevirt.io/" in k}
        labels.update({ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_FILLING_UP_ALERT: "disabled"})
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": view.name, "namespace": view.namespace, "labels": labels,
                              "annotations": annotations, "ownerReferences": [{
                                  "apiVersion": groups.CDI_API_VERSION, "kind": "DataVolume", "name": view.name,
                                  "uid": view.uid, "controller": True, "blockOwnerDeletion": True}]},
                 "spec": spec}
        try:
            created = await self.ctx.client.create(groups.PVCS, claim, view.namespace)
        except AlreadyExists:
            return 0.5
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
        token names; a claim of the clone populator reads what its VolumeCloneSource names, from that
        source's namespace (its own, or one a ReferenceGrant opened, checked when the clone was planned)."""
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
        ref = claim.populator_ref
        namespace = str(ref.get("namespace") or claim.namespace)
        source = self.ctx.cached(groups.VOLUMECLONESOURCES, str(ref.get("name") or ""), namespace)
        named: Body = ObjectView(source or {}).spec.get("source") or {}
        wanted = f"{'snapshot' if named.get('kind') == 'VolumeSnapshot' else 'pvc'}/{namespace}/{named.get('name')}"
        if source is None or recorded != wanted:
            return f"its VolumeCloneSource does not name {recorded}"
        return None

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
        try:
            await self.ctx.client.delete(gvr, name, namespace)
        except NotFound:
            pass

    # -- the phases --------------------------------------------------------------------------------

    async def _set_phase(self, target: Body, phase: str,
                         extra: Mapping[str, str | None] | None = None) -> Obj | None:
        """Record the clone phase on the target; the DataVolume's status is computed from the
        written claim at once, so that every phase shows (and has its event) however short."""
        changes: dict[str, str | None] = {ann.CLONE_PHASE: phase, **(extra or {})}
        claim = ClaimView(target)
        if all(claim.annotations.get(k) == v for k, v in changes.items()):
            return None
        result: Obj = await self.ctx.client.patch(groups.PVCS, claim.name, {"metadata": {"annotations": changes}},
                                                  claim.namespace)
        return result

    async def _advance(self, target: Body) -> Obj | None:
        """One step of the strategy; the target as written when its phase changed."""
        annotations = ClaimView(target).annotations
        kind, _, rest = annotations.get(CLONE_SOURCE_ANNOTATION, "").partition("/")
        source_ns, _, source_name = rest.partition("/")
        why = await self._unauthorized(target, kind, source_ns, source_name)
        if why is not None:
            self.ctx.recorder.record(target, WARNING, SOURCE_UNAUTHORIZED,
                                     f"{MESSAGE_SOURCE_UNAUTHORIZED}: {CLONE_SOURCE_ANNOTATION}: {why}")
            return None
        strategy = annotations.get(ann.CLONE_TYPE, planner.COPY)
        if ClaimView(target).volume_name:
            return await self._finish(target, source_ns)
        temp_name = temp_claim_name(target)
        temp = await self._get(groups.PVCS, temp_name, source_ns)
        if temp is not None:  # what happens to the temporary claim shows on the target (CDI's CopyEvents)
            await copy_events(self.ctx, temp, target)
        if strategy == planner.COPY:
            if kind == "snapshot":
                restored, written = await self._restored_source(target, source_ns, source_name)
                if restored is None:
                    return written
                source_name = ClaimView(restored).name
            return await self._host_clone(target, temp, source_ns, source_name)
        if temp is None:
            return await self._start(target, kind, source_ns, source_name, strategy)
        temp_claim, target_claim = ClaimView(temp), ClaimView(target)
        if not temp_claim.bound:
            return None
        want = _bytes(target_claim.requested_storage) or 0
        have = _bytes(temp_claim.capacity) or 0
        if have < want:
            if (_bytes(temp_claim.requested_storage) or 0) < want:
                await self.ctx.client.patch(groups.PVCS, temp_name, {"spec": {"resources": {"requests": {
                    "storage": target_claim.requested_storage}}}}, source_ns)
            return await self._set_phase(target, PREP_CLAIM)
        written = await self._set_phase(target, REBIND)
        await self._rebind(temp, written or target)
        return written

    async def _host_clone(self, target: Body, temp: Body | None, source_ns: str, source_name: str) -> Obj | None:
        """Host-assisted copy (HostClone): the temporary claim is an upload target that takes the
        stream of a clone source pod reading the source; then its volume goes to the target (Rebind)."""
        target_claim = ClaimView(target)
        if temp is None:
            client_name = f"{source_ns}/{source_name}-{target_claim.key}"
            if len(client_name) > 64:  # a certificate's CN holds 64 characters
                client_name = f"clone-source-{target_claim.uid}"
            claim = self._temp_claim(target, source_ns, target_claim.requested_storage, None)
            claim["metadata"]["annotations"].update({
                ann.UPLOAD_TARGET: "", ann.UPLOAD_CLIENT_NAME: client_name, ann.CONTENT_TYPE: "kubevirt",
                ann.CLONE_REQUEST: f"{source_ns}/{source_name}"})
            try:
                await self.ctx.client.create(groups.PVCS, claim, source_ns)
            except AlreadyExists:
                pass
            return await self._set_phase(target, HOST_CLONE)
        temp_annotations = ClaimView(temp).annotations
        restarts = temp_annotations.get(ann.POD_RESTARTS)
        if restarts and restarts != target_claim.annotations.get(ann.POD_RESTARTS):
            # the upload server's restarts are the DataVolume's restartCount, as CDI's populator copies them
            await self.ctx.client.patch(groups.PVCS, target_claim.name, {"metadata": {
                "annotations": {ann.POD_RESTARTS: restarts}}}, target_claim.namespace)
        pod_name = source_pod_name(temp)
        if temp_annotations.get(ann.POD_PHASE) == "Succeeded":
            for gvr in (groups.PODS, groups.SECRETS):
                try:
                    await self.ctx.client.delete(gvr, pod_name, source_ns)
                except NotFound:
                    pass
            written = await self._set_phase(target, REBIND)
            await self._rebind(temp, written or target)
            return written
        if temp_annotations.get(ann.POD_READY) != "true" or \
                self.ctx.cached(groups.PODS, pod_name, source_ns) is not None:
            return None
        users = self._pods_using(source_ns, source_name, target_claim.uid)
        if users:
            return await self._wait(target, HOST_CLONE, CLONE_SOURCE_IN_USE,
                                    [f"pod {PodView(p).key} using PersistentVolumeClaim {source_name}" for p in users])
        written = await self._set_phase(target, HOST_CLONE, {
            ann.CONDITION_RUNNING: None, ann.CONDITION_RUNNING_REASON: None, ann.CONDITION_RUNNING_MESSAGE: None})
        await self._create_source_pod(target, temp, source_ns, source_name)
        return written

    async def _restored_source(self, target: Body, namespace: str,
                               snapshot_name: str) -> tuple[Obj | None, Obj | None]:
        """A host-assisted copy reads a claim, never a snapshot: as CDI's planHostAssistedFromSnapshot, the
        snapshot is restored into `tmp-source-pvc-<target uid>` beside it, of the first class (by name) of
        the snapshot's driver, ReadWriteOnce, in the volume mode the snapshot was taken of, at its restore
        size (SnapshotClone). Returns that claim once it exists, else the target as written when its phase
        changed. Not waiting for the claim to bind: on a WaitForFirstConsumer class the clone source pod is
        its consumer."""
        name = temp_source_claim_name(target)
        restored = await self._get(groups.PVCS, name, namespace)
        if restored is not None:
            return restored, None
        snapshot = self.ctx.cached(groups.VOLUMESNAPSHOTS, snapshot_name, namespace)
        content_name = SnapshotView(snapshot or {}).content_name
        content = self.ctx.cached(groups.VOLUMESNAPSHOTCONTENTS, content_name, "") if content_name else None
        if snapshot is None or content is None or not SnapshotView(snapshot).ready_to_use:
            return None, None  # the DataVolume's planning waits for a ready snapshot; the cache is behind
        driver = SnapshotContentView(content).driver
        classes = sorted(ObjectView(sc).name for sc in self.ctx.cached_list(groups.STORAGECLASSES)
                         if sc.get("provisioner") == driver)
        if not classes:
            # CDI's error, retried with back-off; the target's DataVolume stays in CloneScheduled
            raise RuntimeError("unable to find a valid storage class for the temporal source claim")
        target_claim = ClaimView(target)
        size = SnapshotView(snapshot).restore_size
        if not _bytes(size):
            size = target_claim.requested_storage
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": name, "namespace": namespace,
                              "labels": {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_EXCLUDE_FROM_BACKUP: "true",
                                         ann.LABEL_OWNED_BY_UID: target_claim.uid},
                              "annotations": {ann.BIND_IMMEDIATE: "true"}},
                 "spec": {"storageClassName": classes[0], "accessModes": ["ReadWriteOnce"],
                          "volumeMode": SnapshotContentView(content).source_volume_mode or target_claim.volume_mode,
                          "resources": {"requests": {"storage": size}},
                          "dataSource": {"apiGroup": groups.SNAPSHOT_GROUP, "kind": "VolumeSnapshot",
                                         "name": snapshot_name}}}
        try:
            await self.ctx.client.create(groups.PVCS, claim, namespace)
        except AlreadyExists:
            pass
        return None, await self._set_phase(target, SNAPSHOT_CLONE)

    def _pods_using(self, namespace: str, claim: str, target_uid: str) -> list[Obj]:
        """Running pods that may write to the source (CDI's GetPodsUsingPVCs allowing read-only users): no
        strategy starts while they do, since a copy or a snapshot of a volume being written is not the
        disk anyone meant. Pods that only read it, and clone source pods, do not hold a clone."""
        out = []
        for pod in self.ctx.cached_list(groups.PODS, namespace):
            view = PodView(pod)
            if view.finished or view.labels.get(ann.LABEL_OWNED_BY_UID) == target_uid or \
                    view.labels.get(ann.LABEL_COMPONENT) == SOURCE_CONTAINER:
                continue
            if _writes(view, claim):
                out.append(pod)
        return out

    async def _wait(self, target: Body, phase: str, reason: str, messages: list[str]) -> Obj | None:
        """The clone cannot start yet (CloneSourceInUse, CloneWithoutSource): a Warning event per cause on
        the DataVolume (the claim of a clone populator), and its Running condition says why, once."""
        target_claim = ClaimView(target)
        if target_claim.annotations.get(ann.CONDITION_RUNNING_MESSAGE) == "; ".join(messages) and \
                target_claim.annotations.get(ann.CLONE_PHASE) == phase:
            return None
        owner = self.ctx.cached(groups.DATAVOLUMES, target_claim.name, target_claim.namespace)
        for message in messages:
            self.ctx.recorder.record(owner or target, WARNING, reason, message)
        return await self._set_phase(target, phase, {
            ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: reason,
            ann.CONDITION_RUNNING_MESSAGE: "; ".join(messages)})

    async def pki(self) -> UploadPki:
        """The upload signers as they are now, read for each pod: rotated per certConfig, a pod made after
        a renewal gets a certificate from the new signer (a copy kept since start would be the old one)."""
        return await ensure_upload_pki(self.ctx.client, self.ctx.settings.namespace)

    async def _create_source_pod(self, target: Body, temp: Body, namespace: str, source_name: str) -> None:
        """`<uid>-source-pod` (container `cdi-clone-source`) in the source namespace: the source read-only,
        a client certificate for the upload server's CLIENT_NAME, the server's CA, the Service's address."""
        source = self.ctx.cached(groups.PVCS, source_name, namespace)
        temp_name = ClaimView(temp).name
        service = await self._get(groups.SERVICES, upload_service_name(temp_name), namespace)
        cluster_ip = ObjectView(service or {}).spec.get("clusterIP")
        if source is None or not cluster_ip:
            return
        pod_name = source_pod_name(temp)
        pki_ = await self.pki()
        client_name = ClaimView(temp).annotations.get(ann.UPLOAD_CLIENT_NAME, "")
        cdi = next(iter(self.ctx.cached_list(groups.CDIS)), None)
        pair = pki.issue(pki_.client_signer, client_name, None, server=False, client=True,
                         days=cert_days(cdi, "client"))
        owner = [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": temp_name,
                  "uid": ClaimView(temp).uid, "controller": True, "blockOwnerDeletion": True}]
        labels = {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_COMPONENT: SOURCE_CONTAINER,
                  ann.LABEL_OWNED_BY_UID: ClaimView(target).uid}
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": pod_name, "namespace": namespace, "labels": labels, "ownerReferences": owner},
                  "stringData": {"tls.crt": pair.cert_pem.decode(), "tls.key": pair.key_pem.decode()}}
        try:
            await self.ctx.client.create(groups.SECRETS, secret, namespace)
        except AlreadyExists:
            pass
        block = ClaimView(source).block
        host = f"[{cluster_ip}]" if ":" in str(cluster_ip) else str(cluster_ip)
        owner_uid = ClaimView(target).annotations.get(ann.CREATED_FOR_DATAVOLUME) or \
            ClaimView(target).uid
        request = CloneSourceRequest(
            upload_url=f"https://{host}:{UPLOAD_PORT}{SYNC_PATHS[0]}", server_ca=pki_.server_signer.cert_pem.decode(),
            server_name=f"{upload_service_name(temp_name)}.{namespace}.svc", client_secret=pod_name,
            volume=TargetVolume(path=clonesourcerequest.source_path(block), owner_uid=owner_uid))
        mount = request.mount_point
        container: Obj = {
            "name": SOURCE_CONTAINER, "image": self.ctx.settings.cloner_image, "env": request.to_env(),
            "ports": [{"name": "metrics", "containerPort": 8443, "protocol": "TCP"}],
        }
        if block:
            container["volumeDevices"] = [{"name": "cdi-data-vol", "devicePath": mount}]
        else:
            container["volumeMounts"] = [{"name": "cdi-data-vol", "mountPath": mount, "readOnly": True}]
        pod = worker_pod(name=pod_name, namespace=namespace, component=SOURCE_CONTAINER, annotated=target,
                         owner=owner[0], containers=[container], restart_policy="OnFailure",
                         volumes=[{"name": "cdi-data-vol", "persistentVolumeClaim": {"claimName": source_name,
                                                                                     "readOnly": True}}],
                         settings=pod_settings(self.ctx), labels=labels)
        try:
            await self.ctx.client.create(groups.PODS, pod, namespace)
        except AlreadyExists:
            pass

    async def _get(self, gvr: groups.GVR, name: str, namespace: str) -> Obj | None:
        try:
            result: Obj = await self.ctx.client.get(gvr, name, namespace)
            return result
        except NotFound:
            return None

    def _temp_claim(self, target: Body, namespace: str, size: str, data_source: Obj | None) -> Obj:
        spec = json.loads(json.dumps(ClaimView(target).spec))
        for key in ("dataSourceRef", "dataSource", "volumeName"):
            spec.pop(key, None)
        spec["resources"]["requests"]["storage"] = size
        if data_source is not None:
            spec["dataSource"] = data_source
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": temp_claim_name(target), "namespace": namespace,
                             "labels": {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_EXCLUDE_FROM_BACKUP: "true",
                                        ann.LABEL_OWNED_BY_UID: ClaimView(target).uid},
                             "annotations": {ann.BIND_IMMEDIATE: "true"}},
                "spec": spec}

    async def _start(self, target: Body, kind: str, source_ns: str, source_name: str, strategy: str) -> Obj | None:
        """Create what the strategy copies through: the temporary claim (cloning the source, or
        restoring a snapshot), after the temporary snapshot is ready for a smart clone. Like CDI's
        IsSourceClaimReady, nothing starts while the source is missing or a running pod writes to it; the
        clone waits in its first phase and its Running condition and an event say why."""
        target_claim = ClaimView(target)
        if kind == "snapshot":
            snapshot = self.ctx.cached(groups.VOLUMESNAPSHOTS, source_name, source_ns)
            size = SnapshotView(snapshot or {}).restore_size or target_claim.requested_storage
            await self._create_temp(target, source_ns, size,
                                    {"apiGroup": groups.SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": source_name})
            return await self._set_phase(target, SNAPSHOT_CLONE)
        first = CSI_CLONE if strategy == planner.CSI_CLONE else SNAPSHOT_PHASE
        if first == SNAPSHOT_PHASE:
            # once taken, the snapshot holds the data: the clone goes on from it whatever became of the source
            snapshot = await self._get(groups.VOLUMESNAPSHOTS, temp_snapshot_name(target), source_ns)
            if snapshot is not None:
                return await self._from_snapshot(target, snapshot, source_ns, source_name)
        source = self.ctx.cached(groups.PVCS, source_name, source_ns)
        if source is None or not ClaimView(source).bound:
            return await self._wait(target, first, CLONE_WITHOUT_SOURCE,
                                    [f"The source pvc {source_ns}/{source_name} doesn't exist" if source is None else
                                     f"The source pvc {source_ns}/{source_name} is not bound"])
        users = self._pods_using(source_ns, source_name, target_claim.uid)
        if users:
            return await self._wait(target, first, CLONE_SOURCE_IN_USE,
                                    [f"pod {PodView(p).key} using PersistentVolumeClaim {source_name}" for p in users])
        started = {ann.CONDITION_RUNNING: None, ann.CONDITION_RUNNING_REASON: None, ann.CONDITION_RUNNING_MESSAGE: None}
        if first == CSI_CLONE:
            # CDI's CSIClonePhase: the clone has the source's size (a driver clones no smaller), grown after
            await self._create_temp(target, source_ns, ClaimView(source).capacity or target_claim.requested_storage,
                                    {"kind": "PersistentVolumeClaim", "name": source_name})
            return await self._set_phase(target, CSI_CLONE, started)
        cluster = planner_cluster(self.ctx)
        target_class = cluster.storage_class(target_claim.storage_class)
        klass = planner.snapshot_class_for(str((target_class or {}).get("provisioner") or ""), cluster,
                                           target_claim.storage_class)
        body: Obj = {"apiVersion": groups.SNAPSHOT_API_VERSION, "kind": "VolumeSnapshot",
                     "metadata": {"name": temp_snapshot_name(target), "namespace": source_ns,
                                  "labels": {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_EXCLUDE_FROM_BACKUP: "true",
                                             ann.LABEL_OWNED_BY_UID: target_claim.uid}},
                     "spec": {"source": {"persistentVolumeClaimName": source_name}}}
        if klass:
            body["spec"]["volumeSnapshotClassName"] = klass
        try:
            await self.ctx.client.create(groups.VOLUMESNAPSHOTS, body, source_ns)
        except AlreadyExists:
            pass
        return await self._set_phase(target, SNAPSHOT_PHASE, started)

    async def _from_snapshot(self, target: Body, snapshot: Body, source_ns: str, source_name: str) -> Obj | None:
        """Restore the temporary snapshot once it is ready. One that is not, of a source that is gone, never
        will be: the clone fails with CDI's reason rather than wait for good, and the snapshot goes."""
        taken = SnapshotView(snapshot)
        if taken.ready_to_use:
            source = self.ctx.cached(groups.PVCS, source_name, source_ns)
            size = taken.restore_size or ClaimView(source or {}).capacity or ClaimView(target).requested_storage
            await self._create_temp(target, source_ns, size, {"apiGroup": groups.SNAPSHOT_GROUP,
                                                              "kind": "VolumeSnapshot", "name": taken.name})
            return await self._set_phase(target, SNAPSHOT_CLONE)
        if self.ctx.cached(groups.PVCS, source_name, source_ns) is not None:
            return None  # the snapshotter is still at it
        error = str((taken.status.get("error") or {}).get("message") or "")
        why = f"the source pvc {source_ns}/{source_name} was deleted before its snapshot {taken.name} was taken"
        return await self._fail(target, source_ns, f"{why}: {error}" if error else why)

    async def _fail(self, target: Body, source_ns: str, why: str) -> Obj | None:
        """CDI's Error phase: the cause in `cdi.kubevirt.io/cloneError` and the Running condition (reason
        `Error`), the DataVolume Failed with CloneFailed, and no temporary object left behind."""
        await self._delete_temporaries(target, source_ns)
        return await self._set_phase(target, ERROR, {
            ann.CLONE_ERROR: why, ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: "Error",
            ann.CONDITION_RUNNING_MESSAGE: why})

    async def _create_temp(self, target: Body, namespace: str, size: str, data_source: Obj) -> None:
        try:
            await self.ctx.client.create(groups.PVCS, self._temp_claim(target, namespace, size, data_source),
                                         namespace)
        except AlreadyExists:
            pass

    async def _rebind(self, temp: Body, target: Body) -> None:
        """Hand the temporary claim's volume to the target: the PV's claimRef moves (CDI's Rebind)."""
        pv_name = ClaimView(temp).volume_name
        pv = await self._get(groups.PVS, pv_name, "") if pv_name else None
        if pv is None:
            return
        ref, claim = PersistentVolumeView(pv).claim_ref, ClaimView(target)
        if ref.get("uid") == claim.uid:
            return
        if ref.get("uid") != ClaimView(temp).uid:
            raise RuntimeError(f"PV {pv_name} bound to unexpected claim {ref.get('name')}")
        await self.ctx.client.patch(groups.PVS, pv_name, {"spec": {"claimRef": {
            "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": claim.namespace, "name": claim.name,
            "uid": claim.uid, "resourceVersion": claim.resource_version}}})

    async def _finish(self, target: Body, source_ns: str) -> Obj | None:
        """The target holds the volume: remove every temporary object, then say so."""
        if not ClaimView(target).bound:
            return None
        await self._delete_temporaries(target, source_ns)
        return await self._set_phase(target, SUCCEEDED, {ann.POPULATOR_PROGRESS: PROGRESS_COMPLETE})

    async def _delete_temporaries(self, target: Body, source_ns: str) -> None:
        for gvr, name in ((groups.PVCS, temp_claim_name(target)), (groups.VOLUMESNAPSHOTS, temp_snapshot_name(target)),
                          (groups.PVCS, temp_source_claim_name(target))):
            await self._delete(gvr, name, source_ns)

    # -- status ------------------------------------------------------------------------------------

    async def _status(self, dv: Body, pvc: Body | None, *, reason: str = "", message: str = "",
                      phase: str | None = None, requeue: float | None = None,
                      scheduled_why: str | None = None, quiet: bool = False) -> float | None:
        """`quiet`: no phase event (CloneScheduled is announced with the plan, once the target exists)."""
        view = DataVolumeView(dv)
        status: Obj = json.loads(json.dumps(view.status))
        old_phase = status.get("phase", "")
        status.setdefault("progress", PROGRESS_UNKNOWN)
        if phase is not None:
            status["phase"] = phase
        elif pvc is not None:
            status["claimName"] = ClaimView(pvc).name
            clone_phase = ClaimView(pvc).annotations.get(ann.CLONE_PHASE, "")
            restarts = ClaimView(pvc).annotations.get(ann.POD_RESTARTS, "")
            if restarts.isdigit():
                status["restartCount"] = int(restarts)
            status["phase"] = PHASE_MAP.get(clone_phase, status.get("phase") or "CloneScheduled")
            if status["phase"] == "Succeeded":
                status["progress"] = PROGRESS_COMPLETE
            elif status["phase"] == "CloneInProgress":
                await self._refresh_progress(view, pvc, status)
        elif not old_phase:
            status["phase"] = "Pending"
        conditions.update_all(status, pvc, message, reason)
        if status != view.status:
            await write_status(self.ctx.client, groups.DATAVOLUMES, dv, status)
            if (status.get("phase") != old_phase and not quiet) or scheduled_why is not None:
                self._phase_event(dv, str(status["phase"]), scheduled_why)
        return requeue

    async def _refresh_progress(self, view: DataVolumeView, target: Body, status: Obj) -> None:
        """The clone source pod's `kubevirt_cdi_clone_progress_total{ownerUID}`, as CDI reads it."""
        source = ClaimView(target).annotations.get(CLONE_SOURCE_ANNOTATION, "")
        source_ns = source.split("/")[1] if source.count("/") >= 2 else ""
        temp = self.ctx.cached(groups.PVCS, temp_claim_name(target), source_ns)
        pod = self.ctx.cached(groups.PODS, source_pod_name(temp), source_ns) if temp else None
        pod_ip = PodView(pod).pod_ip if pod else ""
        if not pod_ip:
            return
        if self._session is None:
            self._session = aiohttp.ClientSession()
        report = await scrape(self._session, pod_ip, view.uid)
        if report is not None and report.progress is not None:
            status["progress"] = format_progress(min(report.progress, 99.99))

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
