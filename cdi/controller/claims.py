"""What the worker-pod reconcilers (import, upload) do to the claims they serve: keep their memory in
annotations, read the effective CDIConfig, and create the scratch claim when a pod needs one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import featuregates, groups, naming, targetvolume
from cdi.api.owners import owner_keys, owner_reference
from cdi.api.quantity import parse_bytes
from cdi.api.rendering import ClusterStorage
from cdi.api.sizing import required_space, round_up, usable_space
from cdi.api.views import ClaimView, PodView, StorageProfileView
from cdi.controller.runtime import Context
from cdi.kube import AlreadyExists, NotFound

Obj = dict[str, Any]
Body = Mapping[str, Any]


def config_status(ctx: Context) -> Body:
    status: Body = (ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME) or {}).get("status") or {}
    return status


def filesystem_overhead(ctx: Context, storage_class: str | None) -> str:
    overhead = config_status(ctx).get("filesystemOverhead") or {}
    return str((overhead.get("storageClass") or {}).get(storage_class or "", overhead.get("global") or "0.06"))


def claim_overhead(ctx: Context, pvc: Body) -> str:
    """The overhead the worker must leave on this claim: none on a Block device."""
    if ClaimView(pvc).block:
        return "0"
    return filesystem_overhead(ctx, ClaimView(pvc).storage_class)


def preallocation_wanted(ctx: Context, pvc: Body) -> bool:
    """Whether the worker filling this claim preallocates it (`targetvolume.preallocation_wanted`)."""
    return targetvolume.preallocation_wanted(targetvolume.requested_preallocation(ClaimView(pvc).annotations),
                                             config_status(ctx))


def progress_owner_uid(pvc: Body) -> str:
    """The uid a worker pod's progress metric is labelled with (OWNER_UID): the claim's one owner (its
    DataVolume, as CDI), else the claim's own."""
    claim = ClaimView(pvc)
    owners = claim.owner_references
    return str(owners[0]["uid"]) if len(owners) == 1 else claim.uid


def waits_for_first_consumer(ctx: Context, pvc: Body) -> bool:
    """CDI's IsWaitForFirstConsumerEnabled: a worker pod waits for a first consumer to bind the claim only
    with the `HonorWaitForFirstConsumer` gate, and never for a claim annotated for immediate binding (the
    annotation counts whatever its value, as in CDI)."""
    if ann.BIND_IMMEDIATE in ClaimView(pvc).annotations:
        return False
    return featuregates.enabled(ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME),
                                featuregates.HONOR_WAIT_FOR_FIRST_CONSUMER)


def claim_keys_of_pod(pod: Body) -> list[str]:
    """namespace/name of the claims a pod works for: those owning it (a worker pod) and those it mounts."""
    view = PodView(pod)
    return [*owner_keys(pod, "PersistentVolumeClaim"), *(f"{view.namespace}/{claim}" for claim in view.claim_names)]


async def annotate(ctx: Context, pvc: Body, changes: Mapping[str, str | None]) -> None:
    """Merge `changes` into the claim's annotations (None removes one); no write when nothing changes."""
    claim = ClaimView(pvc)
    current = claim.annotations
    if all(current.get(k) == v for k, v in changes.items()):
        return
    await ctx.client.patch(groups.PVCS, claim.name, {"metadata": {"annotations": dict(changes)}}, claim.namespace)


def scratch_name(pvc: Body | str) -> str:
    """`<pvc>-scratch`, shortened as CDI does for long claim names."""
    return naming.resource_name(pvc if isinstance(pvc, str) else ClaimView(pvc).name, "scratch")


async def ensure_scratch(ctx: Context, pvc: Body) -> str:
    """`<pvc>-scratch` as CDI sizes it: room for the target's usable bytes plus the scratch class's
    overhead; Filesystem, RWO, CDIConfig's scratch class else the target's; owned by the target claim."""
    namespace, name = ClaimView(pvc).namespace, scratch_name(pvc)
    if ctx.cached(groups.PVCS, name, namespace) is not None:
        return name
    scratch_class = config_status(ctx).get("scratchSpaceStorageClass") or ClaimView(pvc).storage_class or None
    requested = parse_bytes(ClaimView(pvc).requested_storage or 0)
    size = round_up(required_space(filesystem_overhead(ctx, scratch_class),
                                   usable_space(claim_overhead(ctx, pvc), requested)))
    claim: Obj = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_EXCLUDE_FROM_BACKUP: "true"},
                     "annotations": {ann.BIND_IMMEDIATE: "true"},
                     "ownerReferences": [owner_reference(groups.PVCS, pvc)]},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                 "resources": {"requests": {"storage": str(size)}}},
    }
    if scratch_class:
        claim["spec"]["storageClassName"] = scratch_class
    # a populator's worker pod is put on the target's selected node directly (`nodeName`), so the scheduler,
    # which names the node of a WaitForFirstConsumer claim, never sees it: the scratch claim is given that node
    # (CDI's newScratchPersistentVolumeClaimSpec), or it waits for a consumer forever and the pod with it
    annotations = ClaimView(pvc).annotations
    if ann.POPULATOR_KIND in annotations and annotations.get(ann.SELECTED_NODE):
        claim["metadata"]["annotations"][ann.SELECTED_NODE] = annotations[ann.SELECTED_NODE]
    try:
        await ctx.client.create(groups.PVCS, claim, namespace)
    except AlreadyExists:
        pass
    return name


async def get_if_present(ctx: Context, gvr: groups.GVR, name: str, namespace: str | None) -> Obj | None:
    """The object as the API server has it now (never the cache), or None when there is none."""
    try:
        result: Obj = await ctx.client.get(gvr, name, namespace)
        return result
    except NotFound:
        return None


async def delete_if_present(ctx: Context, gvr: groups.GVR, name: str, namespace: str, *,
                            cached: bool = True, grace_period_seconds: int | None = None) -> None:
    if cached and ctx.cached(gvr, name, namespace) is None:
        return
    try:
        await ctx.client.delete(gvr, name, namespace, grace_period_seconds=grace_period_seconds)
    except NotFound:
        pass


def cluster_storage(ctx: Context) -> ClusterStorage:
    """What rendering a claim needs from the cluster, from the controller's caches: the StorageClasses,
    the StorageProfiles by class, and CDIConfig's status."""
    config = ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME) or {}
    profiles = {StorageProfileView(p).name: p for p in ctx.cached_list(groups.STORAGEPROFILES)}
    return ClusterStorage(ctx.cached_list(groups.STORAGECLASSES), profiles, config.get("status") or {})
