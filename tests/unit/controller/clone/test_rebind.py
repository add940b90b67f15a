"""Rebind: the filled temporary claim's volume is handed to the target by moving the PV's claimRef."""

from __future__ import annotations

import pytest

from cdi.api import groups
from cdi.controller.clone import planner
from cdi.controller.clone.phase import WAIT, Step
from cdi.controller.clone.rebind import RebindPhase
from cdi.controller.clone.target import temp_claim_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import bind, clone, stored, target_claim
from tests.unit.controller.conftest import NAMESPACE


def filled(kube: FakeKube, target: dict[str, object]) -> str:
    name = temp_claim_name(target)
    kube.add(groups.PVCS, {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {}})
    bind(kube, name, "2Gi")
    return f"pv-{name}"


async def test_the_volume_is_handed_to_the_target(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.CSI_CLONE, phase="PrepClaim")
    pv = filled(kube, target)
    assert await RebindPhase(clone(ctx, kube)).reconcile() == Step()
    ref = stored(kube, groups.PVS, pv)["spec"]["claimRef"]
    assert ref == {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": NAMESPACE, "name": "copy",
                   "uid": target["metadata"]["uid"], "resourceVersion": target["metadata"]["resourceVersion"]}
    writes = len(kube.writes)
    # until the PV controller binds the target, the clone stays in Rebind and the PV is left as it is
    assert await RebindPhase(clone(ctx, kube)).reconcile() == Step()
    assert len(kube.writes) == writes


async def test_a_volume_bound_to_another_claim_is_not_taken(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.CSI_CLONE, phase="PrepClaim")
    pv = filled(kube, target)
    volume = stored(kube, groups.PVS, pv)
    volume["spec"]["claimRef"] = {"namespace": NAMESPACE, "name": "someone-else", "uid": "other"}
    kube.add(groups.PVS, volume)
    with pytest.raises(RuntimeError, match="bound to unexpected claim someone-else"):
        await RebindPhase(clone(ctx, kube)).reconcile()
    assert stored(kube, groups.PVS, pv)["spec"]["claimRef"]["uid"] == "other"


async def test_nothing_to_hand_over_without_a_filled_claim(kube: FakeKube, ctx: Context) -> None:
    target_claim(kube, planner.CSI_CLONE, phase="PrepClaim")
    assert await RebindPhase(clone(ctx, kube)).reconcile() is WAIT
    assert kube.writes == []
