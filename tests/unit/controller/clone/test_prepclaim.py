"""PrepClaim: a filled temporary claim smaller than the target is grown to the target's size."""

from __future__ import annotations

from cdi.api import groups
from cdi.controller.clone import planner
from cdi.controller.clone.phase import WAIT, Step
from cdi.controller.clone.prepclaim import PrepClaimPhase
from cdi.controller.clone.target import temp_claim_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import bind, clone, stored, target_claim
from tests.unit.controller.conftest import NAMESPACE


def temporary(kube: FakeKube, target: dict[str, object], requested: str, capacity: str | None) -> str:
    name = temp_claim_name(target)
    kube.add(groups.PVCS, {"metadata": {"name": name, "namespace": NAMESPACE},
                           "spec": {"resources": {"requests": {"storage": requested}}}})
    if capacity is not None:
        bind(kube, name, capacity)
    return name


async def test_a_smaller_clone_is_grown_to_the_targets_size(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.CSI_CLONE, size="2Gi", phase="CSIClone")
    name = temporary(kube, target, "1Gi", "1Gi")
    assert await PrepClaimPhase(clone(ctx, kube)).reconcile() == Step()
    assert stored(kube, groups.PVCS, name)["spec"]["resources"]["requests"]["storage"] == "2Gi"
    writes = len(kube.writes)
    assert await PrepClaimPhase(clone(ctx, kube)).reconcile() == Step()  # asked: the driver is growing it
    assert len(kube.writes) == writes
    bind(kube, name, "2Gi")
    assert await PrepClaimPhase(clone(ctx, kube)).reconcile() is None


async def test_a_clone_as_large_as_the_target_needs_nothing(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.CSI_CLONE, size="2Gi", phase="CSIClone")
    temporary(kube, target, "2Gi", "2Gi")
    assert await PrepClaimPhase(clone(ctx, kube)).reconcile() is None
    assert kube.writes == []


async def test_an_unbound_clone_is_not_prepared(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.CSI_CLONE, size="2Gi", phase="CSIClone")
    assert await PrepClaimPhase(clone(ctx, kube)).reconcile() is WAIT
    temporary(kube, target, "1Gi", None)
    assert await PrepClaimPhase(clone(ctx, kube)).reconcile() is WAIT
    assert kube.writes == []
