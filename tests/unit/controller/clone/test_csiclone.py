"""CSIClone: the temporary claim clones the source through the CSI driver, once the source may be read."""

from __future__ import annotations

from cdi.api import groups
from cdi.controller.clone import planner
from cdi.controller.clone.csiclone import CSIClonePhase
from cdi.controller.clone.phase import STARTED, WAIT
from cdi.controller.clone.target import temp_claim_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import (
    ALLOW_IN_USE,
    SOURCE,
    A,
    bind,
    clone,
    pod,
    source_claim,
    stored,
    target_claim,
)
from tests.unit.controller.conftest import NAMESPACE, events_of


async def test_the_temporary_claim_clones_the_source_at_its_size(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="1Gi")
    target = target_claim(kube, planner.CSI_CLONE, size="2Gi")
    assert await CSIClonePhase(clone(ctx, kube)).reconcile() == STARTED
    temp = stored(kube, groups.PVCS, temp_claim_name(target))
    assert temp["spec"]["dataSource"] == {"kind": "PersistentVolumeClaim", "name": SOURCE}
    assert "dataSourceRef" not in temp["spec"]
    # a driver clones no smaller than the source: PrepClaim grows it to the target's 2Gi after
    assert temp["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert temp["metadata"]["labels"] == {"app": "containerized-data-importer", "velero.io/exclude-from-backup": "true",
                                          A + "OwnedByUID": target["metadata"]["uid"]}
    assert temp["metadata"]["annotations"] == {"cdi.kubevirt.io/storage.bind.immediate.requested": "true"}


async def test_done_once_the_clone_is_bound(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.CSI_CLONE, phase="CSIClone")
    await CSIClonePhase(clone(ctx, kube)).reconcile()
    assert await CSIClonePhase(clone(ctx, kube)).reconcile() is WAIT  # made, not bound yet
    bind(kube, temp_claim_name(target), "1Gi")
    assert await CSIClonePhase(clone(ctx, kube)).reconcile() is None
    assert kube.created(groups.PVCS) == [f"{NAMESPACE}/{temp_claim_name(target)}"]  # made once


async def test_a_missing_or_unbound_source_is_waited_for_and_said(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.CSI_CLONE)
    step = await CSIClonePhase(clone(ctx, kube)).reconcile()
    missing = f"The source pvc {NAMESPACE}/{SOURCE} doesn't exist"
    assert step is not None and dict(step.annotations) == {
        A + "storage.condition.running": "false", A + "storage.condition.running.reason": "CloneWithoutSource",
        A + "storage.condition.running.message": missing}
    assert ("Warning", "CloneWithoutSource", missing) in await events_of(ctx, "copy")  # on the DataVolume
    source_claim(kube, bound=False)
    step = await CSIClonePhase(clone(ctx, kube)).reconcile()
    assert step is not None
    assert step.annotations[A + "storage.condition.running.message"] == \
        f"The source pvc {NAMESPACE}/{SOURCE} is not bound"
    assert kube.object(groups.PVCS, temp_claim_name(target), NAMESPACE) is None


async def test_a_source_a_pod_writes_to_is_waited_for_once_said(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.CSI_CLONE)
    pod(kube, "vm")
    pod(kube, "reader", read_only=True)  # a reader holds no clone, as in CDI
    pod(kube, "done", phase="Succeeded")  # nor a pod that has ended
    step = await CSIClonePhase(clone(ctx, kube)).reconcile()
    message = f"pod {NAMESPACE}/vm using PersistentVolumeClaim {SOURCE}"
    assert step is not None and step.record
    assert step.annotations[A + "storage.condition.running.reason"] == "CloneSourceInUse"
    assert step.annotations[A + "storage.condition.running.message"] == message
    # once the target says so, the wait writes nothing and says nothing again
    claim = stored(kube, groups.PVCS, "copy")
    claim["metadata"]["annotations"].update({A + "clonePhase": "CSIClone", **step.annotations})
    kube.add(groups.PVCS, claim)
    assert await CSIClonePhase(clone(ctx, kube)).reconcile() is WAIT
    assert [e for e in await events_of(ctx, "copy") if e[1] == "CloneSourceInUse"] == \
        [("Warning", "CloneSourceInUse", message)]
    await kube.delete(groups.PODS, "vm", NAMESPACE)
    assert await CSIClonePhase(clone(ctx, kube)).reconcile() == STARTED  # clears what the wait said
    assert kube.object(groups.PVCS, temp_claim_name(target), NAMESPACE) is not None


async def test_a_target_that_allows_it_is_cloned_from_a_source_in_use_and_told(kube: FakeKube, ctx: Context) -> None:
    """The extension `clone.allowSourceInUse`: a CSI clone is taken at one instant, so it goes on while a pod
    writes to the source (crash-consistent), and a Warning on the DataVolume names the writer."""
    source_claim(kube)
    target = target_claim(kube, planner.CSI_CLONE, extra=ALLOW_IN_USE)
    pod(kube, "vm")
    assert await CSIClonePhase(clone(ctx, kube)).reconcile() == STARTED
    assert kube.object(groups.PVCS, temp_claim_name(target), NAMESPACE) is not None
    assert await events_of(ctx, "copy") == [(
        "Warning", "CrashConsistentClone", f"cloning PersistentVolumeClaim {NAMESPACE}/{SOURCE} while pod "
        f"{NAMESPACE}/vm may write to it (extensions.cdi.dev/clone.allowSourceInUse): the copy is crash-consistent")]
