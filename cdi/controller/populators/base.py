"""What the populators share (CDI's populator-base and its util): which claims a populator serves,
the prime claim it creates for them, the annotations it mirrors from the prime onto the user's claim,
the hand-over of the prime's volume, and the deletion of the prime once the claim holds that volume.

A populator's reconcile key is the user's claim (`namespace/name`); events on the prime claim, on
the source object and on the pods map back to it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups, referencegrant
from cdi.api.owners import owner_reference
from cdi.api.views import ClaimView, ObjectView, PersistentVolumeView
from cdi.api.workeroverrides import WORKER_OVERRIDES
from cdi.controller import quota
from cdi.controller.claims import annotate
from cdi.controller.copyevents import copy_events
from cdi.controller.runtime import Context, Reconciler
from cdi.controller.watches import Watch
from cdi.kube import NORMAL, WARNING, AlreadyExists, ApiError, NotFound, split_key

Obj = dict[str, Any]
Body = Mapping[str, Any]

PRIME_PREFIX = "prime"
PVC_PRIME_NAME = ann.PVC_PRIME_NAME
REFERENCE_NOT_GRANTED = "CrossNamespaceSourceNotGranted"  # ours: the claim waits for a ReferenceGrant
GRANT_POLL = 10.0  # seconds between looks for a missing ReferenceGrant (nothing watches grants)

# events, as CDI names them
ERR_CREATING_PVC_PRIME = "ErrCreatingPVCPrime"
CREATED_PVC_PRIME = "CreatedPVCPrimeSuccessfully"
MESSAGE_CREATED_PVC_PRIME = "PVC Prime created successfully"
RETAINED_PVC_PRIME = "RetainedPVCPrime"
MESSAGE_RETAINED_PVC_PRIME = "PVC Prime retained in Lost state for debugging purposes"
MIGRATED_TO = "pv.kubernetes.io/migrated-to"

# what the worker reconcilers write on the prime and the user's claim shows (CDI's desiredAnnotations,
# plus ours that say why an import failed or what it verified)
MIRRORED_ANNOTATIONS = (
    ann.POD_PHASE, ann.POD_READY, ann.POD_RESTARTS, ann.PREALLOCATION_REQUESTED, ann.PREALLOCATION_APPLIED,
    ann.CONDITION_RUNNING, ann.CONDITION_RUNNING_MESSAGE, ann.CONDITION_RUNNING_REASON, ann.POD_SCHEDULABLE,
    ann.IMPORT_FATAL_ERROR, ann.IMPORT_REASON, ann.IMPORT_RETRIES, ann.IMPORT_CHECKSUM_RESULT, ann.REQUIRES_SCRATCH,
    ann.SOURCE_SHA256, ann.SOURCE_FORMAT,
)


def prime_name(pvc: Body) -> str:
    """`prime-<uid of the user's claim>` (CDI's PVCPrimeName)."""
    return f"{PRIME_PREFIX}-{ClaimView(pvc).uid}"


def data_source_ref(pvc: Body) -> Body:
    return ClaimView(pvc).populator_ref


def refers_to(pvc: Body, kind: str) -> bool:
    """The claim's dataSourceRef names a cdi.kubevirt.io object of this kind (CDI's IsPVCDataSourceRefKind)."""
    ref = data_source_ref(pvc)
    return ref.get("apiGroup") == groups.CDI_GROUP and ref.get("kind") == kind and bool(ref.get("name"))


def source_namespace(pvc: Body) -> str:
    """Where the claim's population source lives: its own namespace, or the one its dataSourceRef names
    (which the API server keeps only under CrossNamespaceVolumeDataSource, and which is honoured only with a
    ReferenceGrant: `reference_granted`). Never an annotation: whoever may edit the claim writes those."""
    view = ClaimView(pvc)
    return str(view.populator_ref.get("namespace") or view.namespace)


async def reference_granted(ctx: Context, pvc: Body) -> bool:
    """A claim whose dataSourceRef names another namespace is filled only when a ReferenceGrant there allows
    it, as the CSI external-provisioner decides for PVC and VolumeSnapshot sources; else a warning says why
    and the claim waits (the grant is looked for again at the next look)."""
    view = ClaimView(pvc)
    ref = data_source_ref(pvc)
    namespace = referencegrant.cross_namespace(view.namespace, ref)
    if namespace is None:
        return True
    try:
        grants = (await ctx.client.list(groups.REFERENCEGRANTS, namespace)).items
    except ApiError:  # the Gateway API's CRD is not installed (or not readable): nothing is granted
        grants = []
    if referencegrant.granted(grants, view.namespace, ref):
        return True
    ctx.recorder.record(pvc, WARNING, REFERENCE_NOT_GRANTED, referencegrant.refusal(view.namespace, view.name, ref))
    return False


def owning_claim(pvc: Body) -> str | None:
    """The user's claim a prime claim serves (its controller owner), as `namespace/name`."""
    view = ClaimView(pvc)
    for ref in view.owner_references:
        if ref.get("kind") == "PersistentVolumeClaim" and ref.get("controller"):
            return f"{view.namespace}/{ref['name']}"
    return None


def is_complete(pvc: Body) -> bool:
    return ClaimView(pvc).annotations.get(ann.POD_PHASE) == "Succeeded"


def is_bound(pvc: Body) -> bool:
    return ClaimView(pvc).bound


async def rebind(ctx: Context, source: Body, target: Body) -> None:
    """Hand `source`'s volume to `target`: the PV's claimRef moves (CDI's Rebind). Nothing to do when it
    already names the target; an error when it names neither."""
    old, new = ClaimView(source), ClaimView(target)
    pv_name = old.volume_name
    if not pv_name:
        raise RuntimeError(f"PVC {old.name} has no volume to hand over")
    pv = await ctx.client.get(groups.PVS, pv_name)
    ref = PersistentVolumeView(pv).claim_ref
    if ref.get("uid") == new.uid:
        return
    if ref.get("uid") != old.uid:
        raise RuntimeError(f"PV {pv_name} bound to unexpected claim {ref.get('name')}")
    # an update carrying the PV's resourceVersion (CDI's controller may update PVs, not patch them)
    pv["spec"]["claimRef"] = {
        "kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": new.namespace, "name": new.name, "uid": new.uid, "resourceVersion": new.resource_version}
    await ctx.client.replace(groups.PVS, pv)


class PopulatorReconciler(Reconciler):
    """One populator kind. Subclasses say which source kind they serve, how its object is read, what
    the prime claim gets from it, and what happens on the user's claim while the prime fills."""

    source_kind = ""
    source_gvr: groups.GVR = groups.VOLUMEIMPORTSOURCES

    # -- what each kind provides ----------------------------------------------------------------------

    def population_source(self, pvc: Body) -> Body | None:
        """The source object the claim names, if it exists and is meant for this claim."""
        return self.ctx.cached(self.source_gvr, str(data_source_ref(pvc).get("name")), source_namespace(pvc))

    def prime_annotations(self, pvc: Body, source: Body) -> dict[str, str]:
        """What the prime claim needs so that the worker reconciler picks it up (CDI's updatePVCForPopulation)."""
        raise NotImplementedError  # pragma: no cover - every populator overrides it

    async def reconcile_target(self, pvc: Body, prime: Body) -> float | None:
        raise NotImplementedError  # pragma: no cover - every populator overrides it

    # -- event mapping --------------------------------------------------------------------------------

    def watches(self) -> list[Watch]:
        """Claims naming this kind, or primed for it; the source objects claims name; StorageClasses
        and StorageProfiles, for the claims waiting for their class; and ResourceQuotas, for the claims whose
        prime a quota refused."""
        def waiting(storage: Obj) -> Iterable[str]:  # a class, or its profile of the same name
            return self.keys_waiting_on_class(ObjectView(storage).name)
        return [Watch(groups.PVCS, self.keys_for_claim), Watch(self.source_gvr, self.keys_for_source),
                Watch(groups.STORAGECLASSES, waiting), Watch(groups.STORAGEPROFILES, waiting),
                quota.quota_watch(self.ctx, groups.PVCS, lambda pvc: refers_to(pvc, self.source_kind)),
                Watch(groups.EVENTS, self.keys_for_event)]

    def keys_for_claim(self, pvc: Body) -> Iterable[str]:
        """A claim event: the claim itself if it names our kind; its owner if it is our prime."""
        view = ClaimView(pvc)
        if refers_to(pvc, self.source_kind):
            yield view.key
        if view.annotations.get(ann.POPULATOR_KIND) == self.source_kind:
            owner = owning_claim(pvc)
            if owner:
                yield owner

    def keys_for_event(self, event: Body) -> Iterable[str]:
        """An event about one of our prime claims: the claim it works for, which repeats it (CDI's
        addEventWatcher), read from the cache once it is there."""
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "PersistentVolumeClaim":
            return
        prime = self.ctx.cached(groups.PVCS, str(involved.get("name", "")), involved.get("namespace"))
        if prime is not None and ClaimView(prime).annotations.get(ann.POPULATOR_KIND) == self.source_kind:
            owner = owning_claim(prime)
            if owner:
                yield owner

    def keys_for_source(self, source: Body) -> Iterable[str]:
        """A source event: every claim naming it (CDI's mapSourceToPVCs)."""
        namespace, name = ObjectView(source).namespace, ObjectView(source).name
        for pvc in self.ctx.cached_list(groups.PVCS):
            if refers_to(pvc, self.source_kind) and data_source_ref(pvc).get("name") == name and \
                    source_namespace(pvc) == namespace:
                yield ClaimView(pvc).key

    def keys_waiting_on_class(self, storage_class: str) -> Iterable[str]:
        """A StorageClass or StorageProfile event: the unbound claims of that class naming our kind that have
        no prime yet. Their population waits for the class to exist (CDI retries that wait with back-off;
        here the class's arrival is what brings them back)."""
        for pvc in self.ctx.cached_list(groups.PVCS):
            view = ClaimView(pvc)
            if refers_to(pvc, self.source_kind) and view.storage_class == storage_class and \
                    view.phase in ("", "Pending") and \
                    self.ctx.cached(groups.PVCS, prime_name(pvc), view.namespace) is None:
                yield view.key

    # -- the shared flow ------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        pvc = self.ctx.cached(groups.PVCS, name, namespace)
        if pvc is None or ClaimView(pvc).deleting or not refers_to(pvc, self.source_kind):
            return None
        prime = self.ctx.cached(groups.PVCS, prime_name(pvc), namespace)
        if prime is None:
            return await self._create_prime(pvc)
        requeue = await self.reconcile_target(pvc, prime)
        if is_complete(pvc) and is_bound(pvc):
            await self._cleanup(prime, pvc)
        return requeue

    async def _create_prime(self, pvc: Body) -> float | None:
        view = ClaimView(pvc)
        if view.phase not in ("", "Pending"):
            return None
        if not await reference_granted(self.ctx, pvc):
            return GRANT_POLL
        source = self.population_source(pvc)
        if source is None:
            return None  # a source event brings the claim back
        ready, node = self._ready_for_population(pvc)
        if not ready:
            return None
        annotations: dict[str, str] = {ann.BIND_IMMEDIATE: ""}
        claim_annotations = view.annotations
        if node:
            annotations[ann.SELECTED_NODE] = node
        if ann.RETAIN_AFTER_COMPLETION in claim_annotations:
            annotations[ann.RETAIN_AFTER_COMPLETION] = claim_annotations[ann.RETAIN_AFTER_COMPLETION]
        for key in (ann.MULTUS_NETWORKS, ann.MULTUS_DEFAULT_NETWORK, ann.ISTIO_INJECT, ann.LINKERD_INJECT,
                    ann.POD_PRIORITY_CLASS, ann.POD_SERVICE_ACCOUNT, ann.UPLOAD_FORMAT, ann.UPLOAD_CHECKSUM,
                    *WORKER_OVERRIDES):
            if claim_annotations.get(key):
                annotations[key] = claim_annotations[key]
        annotations.update(self.prime_annotations(pvc, source))
        spec: Obj = {k: view.spec[k] for k in ("accessModes", "resources", "storageClassName", "volumeMode")
                     if view.spec.get(k) is not None}
        namespace = view.namespace
        prime: Obj = {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": prime_name(pvc), "namespace": namespace,
                         "labels": {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_EXCLUDE_FROM_BACKUP: "true"},
                         "annotations": annotations, "ownerReferences": [owner_reference(groups.PVCS, pvc)]},
            "spec": spec,
        }
        try:
            await self.ctx.client.create(groups.PVCS, prime, namespace)
        except AlreadyExists:
            return None
        except Exception as exc:
            message = quota.refusal(exc)
            self.ctx.recorder.record(pvc, WARNING, ERR_CREATING_PVC_PRIME, message or str(exc))
            if message is None:
                raise
            # the prime over a quota: the claim's Running condition says so (its DataVolume shows it), and
            # the claim is tried again until the quota has room
            raise await quota.worker_refused(self.ctx, pvc, message) from exc
        self.ctx.recorder.record(pvc, NORMAL, CREATED_PVC_PRIME, MESSAGE_CREATED_PVC_PRIME)
        return None

    def _ready_for_population(self, pvc: Body) -> tuple[bool, str]:
        """CDI's claimReadyForPopulation: a CSI (not in-tree) class, and on WaitForFirstConsumer a node
        chosen by the scheduler for a consumer, unless immediate binding is asked for."""
        view = ClaimView(pvc)
        if not view.storage_class:
            return False, ""
        storage_class = self.ctx.cached(groups.STORAGECLASSES, view.storage_class)
        if storage_class is None:
            return False, ""
        annotations = view.annotations
        if str(storage_class.get("provisioner", "")).startswith("kubernetes.io/") and not annotations.get(MIGRATED_TO):
            return False, ""
        if storage_class.get("volumeBindingMode") == "WaitForFirstConsumer":
            node = annotations.get(ann.SELECTED_NODE, "")
            if not node and ann.BIND_IMMEDIATE not in annotations:
                return False, ""
            return True, node
        return True, ""

    async def mirror(self, pvc: Body, prime: Body, extra: Mapping[str, str | None] | None = None) -> None:
        """Copy the worker's annotations from the prime onto the user's claim (present or removed),
        with the prime's name (CDI's AnnPVCPrimeName) and what the kind adds."""
        theirs, mine = ClaimView(prime).annotations, ClaimView(pvc).annotations
        changes: dict[str, str | None] = {k: theirs.get(k) for k in MIRRORED_ANNOTATIONS if k in theirs or k in mine}
        if PVC_PRIME_NAME not in mine:
            changes[PVC_PRIME_NAME] = ClaimView(prime).name
        changes.update(extra or {})
        await annotate(self.ctx, pvc, changes)
        await copy_events(self.ctx, prime, pvc)

    async def hand_over(self, pvc: Body, prime: Body) -> None:
        """The prime is filled: the user's claim gets the prime's CDI labels, then its volume."""
        view = ClaimView(pvc)
        labels = {k: v for k, v in ClaimView(prime).labels.items() if k not in view.labels and "kubevirt.io" in k}
        if labels:
            await self.ctx.client.patch(groups.PVCS, view.name, {"metadata": {"labels": labels}}, view.namespace)
        fresh = await self.ctx.client.get(groups.PVCS, view.name, view.namespace)
        await rebind(self.ctx, prime, fresh)

    async def _cleanup(self, prime: Body, pvc: Body) -> None:
        """The prime goes (or stays, with an event, when asked to) as soon as the user's claim holds its
        volume. CDI waits for the PV controller to mark the prime Lost, which it does only at its next
        resync of that claim (tens of seconds later); the PV's claimRef naming the bound claim is the same
        proof, and the PV controller that bound the claim has seen it, so deleting the prime releases
        nothing."""
        view = ClaimView(prime)
        if view.phase != "Lost" and not await self._handed_over(prime, pvc):
            return
        if view.annotations.get(ann.RETAIN_AFTER_COMPLETION) == "true":
            # said once: an event about a prime brings its claim back (`keys_for_event`), so repeating it at
            # each look would be a loop (client-go's spam filter is what spares CDI's; our recorder has none)
            if view.phase == "Lost" and not self.ctx.recorder.recorded(prime, WARNING, RETAINED_PVC_PRIME,
                                                                     MESSAGE_RETAINED_PVC_PRIME):
                self.ctx.recorder.record(prime, WARNING, RETAINED_PVC_PRIME, MESSAGE_RETAINED_PVC_PRIME)
            return
        if view.deleting:
            return
        try:
            await self.ctx.client.delete(groups.PVCS, view.name, view.namespace)
        except NotFound:
            pass

    async def _handed_over(self, prime: Body, pvc: Body) -> bool:
        """The prime's volume is bound to the user's claim (read from the API: the volume's cache may trail
        the claim's)."""
        name, claim = ClaimView(prime).volume_name, ClaimView(pvc)
        if not name or claim.volume_name != name:
            return False
        try:
            pv = await self.ctx.client.get(groups.PVS, name)
        except NotFound:
            return False
        return PersistentVolumeView(pv).claim_ref.get("uid") == claim.uid
