"""The planner returns the phases of the strategy a target records, in CDI's order."""

from __future__ import annotations

import pytest

from cdi.api import groups
from cdi.controller.clone import planner
from cdi.controller.clone.hostclone import HostClonePhase
from cdi.controller.clone.snapclone import SnapshotClonePhase
from cdi.controller.clone.snapshot import SnapshotPhase
from cdi.controller.clone.target import temp_snapshot_name, temp_source_claim_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import SOURCE, clone, target_claim


@pytest.mark.parametrize(("strategy", "kind", "names"), [
    (planner.CSI_CLONE, "pvc", ["CSIClone", "PrepClaim", "Rebind"]),
    (planner.SNAPSHOT, "pvc", ["Snapshot", "SnapshotClone", "PrepClaim", "Rebind"]),
    (planner.SNAPSHOT, "snapshot", ["SnapshotClone", "PrepClaim", "Rebind"]),
    (planner.COPY, "pvc", ["HostClone", "Rebind"]),
    (planner.COPY, "snapshot", ["SnapshotClone", "HostClone", "Rebind"]),
])
async def test_each_strategy_has_its_phases(kube: FakeKube, ctx: Context, strategy: str, kind: str,
                                            names: list[str]) -> None:
    target_claim(kube, strategy, kind=kind)
    phases = planner.phases(clone(ctx, kube), planner.cluster_from(ctx))
    assert [p.name for p in phases] == names


async def test_what_each_phase_reads_and_restores(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.VOLUMESNAPSHOTCLASSES, {"metadata": {"name": "snapclass"}, "driver": "cdi.local"})
    target = target_claim(kube, planner.SNAPSHOT)
    snapshot, restore, _, _ = planner.phases(clone(ctx, kube), planner.cluster_from(ctx))
    assert isinstance(snapshot, SnapshotPhase) and snapshot.snapshot_class == "snapclass"
    assert isinstance(restore, SnapshotClonePhase)
    assert (restore.snapshot, restore.taken_of) == (temp_snapshot_name(target), SOURCE)

    target = target_claim(kube, planner.COPY, kind="snapshot", source="snap")
    _, copy, _ = planner.phases(clone(ctx, kube), planner.cluster_from(ctx))
    assert isinstance(copy, HostClonePhase) and copy.source_claim == temp_source_claim_name(target)


async def test_a_target_that_records_no_strategy_is_copied(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.COPY)
    del target["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"]
    kube.add(groups.PVCS, target)
    assert [p.name for p in planner.phases(clone(ctx, kube), planner.cluster_from(ctx))] == ["HostClone", "Rebind"]
