"""One look at a clone: the planner's phases walked in order, the first not done recorded on the target;
Succeeded once the target holds the volume, with nothing temporary left; Error when a phase finds the
clone can never complete."""

from __future__ import annotations

from typing import Any

from cdi.api import groups
from cdi.controller.clone import execute, planner
from cdi.controller.clone.target import temp_claim_name, temp_snapshot_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import A, annotations, bind, source_claim, stored, target_claim
from tests.unit.controller.conftest import NAMESPACE, events_of

Obj = dict[str, Any]


async def look(ctx: Context, kube: FakeKube) -> Obj | None:
    return await execute.advance(ctx, stored(kube, groups.PVCS, "copy"))


def hand_over(kube: FakeKube, target: Obj, *, lost_first: bool = False) -> None:
    """What the PV controller does once the PV's claimRef names the target: the target is bound to it and
    the temporary claim is Lost (`lost_first`: the temporary claim is seen Lost before the target binds)."""
    temp = stored(kube, groups.PVCS, temp_claim_name(target))
    temp["status"]["phase"] = "Lost"
    kube.add(groups.PVCS, temp)
    if not lost_first:
        bind(kube, "copy", "2Gi", pv=temp["spec"]["volumeName"])


async def test_a_csi_clone_walks_its_phases_to_success(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="1Gi")
    target = target_claim(kube, planner.CSI_CLONE, size="2Gi")
    written = await look(ctx, kube)
    assert written is not None and written["metadata"]["annotations"][A + "clonePhase"] == "CSIClone"
    assert await look(ctx, kube) is None  # the clone is not bound yet: nothing to write

    temp = temp_claim_name(target)
    bind(kube, temp, "1Gi")
    await look(ctx, kube)  # CSIClone is done: the clone is smaller than the target
    assert annotations(kube)[A + "clonePhase"] == "PrepClaim"
    bind(kube, temp, "2Gi")
    await look(ctx, kube)  # PrepClaim is done too: the volume goes to the target
    assert annotations(kube)[A + "clonePhase"] == "Rebind"
    assert stored(kube, groups.PVS, f"pv-{temp}")["spec"]["claimRef"]["name"] == "copy"

    hand_over(kube, target, lost_first=True)
    assert await look(ctx, kube) is None  # a Lost temporary claim does not take the clone back to CSIClone
    assert annotations(kube)[A + "clonePhase"] == "Rebind"
    hand_over(kube, target)
    await look(ctx, kube)
    assert annotations(kube)[A + "clonePhase"] == "Succeeded"
    assert annotations(kube)[A + "storage.populator.progress"] == "100.0%"
    assert kube.object(groups.PVCS, temp, NAMESPACE) is None
    assert await look(ctx, kube) is None


async def test_what_happens_to_the_temporary_claim_shows_on_the_target(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.CSI_CLONE)
    await look(ctx, kube)
    temp = stored(kube, groups.PVCS, temp_claim_name(target))
    ctx.recorder.record(temp, "Warning", "ProvisioningFailed", "no space left")
    await ctx.recorder.flush(5)
    await look(ctx, kube)
    assert ("Warning", "ProvisioningFailed", f"[{temp_claim_name(target)}] : no space left") in \
        await events_of(ctx, "copy")


async def test_a_clone_that_can_never_complete_ends_in_error_and_leaves_nothing(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.SNAPSHOT, phase="Snapshot")
    kube.add(groups.VOLUMESNAPSHOTS, {"metadata": {"name": temp_snapshot_name(target), "namespace": NAMESPACE},
                                      "spec": {}, "status": {"readyToUse": False}})  # and its source is gone
    written = await look(ctx, kube)
    assert written is not None
    why = f"the source pvc {NAMESPACE}/golden was deleted before its snapshot {temp_snapshot_name(target)} was taken"
    assert {k: v for k, v in annotations(kube).items() if k.startswith(A + "clone") or "running" in k} == {
        A + "clonePhase": "Error", A + "cloneType": "snapshot", A + "cloneError": why,
        A + "storage.condition.running": "false", A + "storage.condition.running.reason": "Error",
        A + "storage.condition.running.message": why}
    assert kube.object(groups.VOLUMESNAPSHOTS, temp_snapshot_name(target), NAMESPACE) is None


async def test_a_target_holding_its_volume_unbound_waits(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.CSI_CLONE, phase="Rebind")
    target["spec"]["volumeName"] = "pv-x"
    kube.add(groups.PVCS, target)
    assert await look(ctx, kube) is None
    assert kube.writes == []
