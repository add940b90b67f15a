"""The scratch claim a worker pod mounts, against the fake client: named and sized as CDI's, and on the node of
a populated claim (found on the several-node kit: an upload onto a WaitForFirstConsumer class never started)."""

from __future__ import annotations

from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.controller.claims import ensure_scratch
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.conftest import NAMESPACE, STORAGE_CLASS

Obj = dict[str, Any]


def prime(annotations: dict[str, str]) -> Obj:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "prime-1", "namespace": NAMESPACE, "uid": "u-1", "annotations": annotations},
            "spec": {"storageClassName": STORAGE_CLASS, "resources": {"requests": {"storage": "64Mi"}}}}


async def test_a_populators_scratch_claim_is_made_on_its_selected_node(kube: FakeKube, ctx: Context) -> None:
    """The populator's pod goes straight to the selected node (nodeName: the scheduler never sees it, and it is
    the scheduler that names the node of a WaitForFirstConsumer claim), so its scratch claim is given that node."""
    claim = prime({ann.POPULATOR_KIND: "VolumeUploadSource", ann.SELECTED_NODE: "node-2"})
    name = await ensure_scratch(ctx, claim)
    scratch = kube.object(groups.PVCS, name, NAMESPACE)
    assert scratch is not None and name == "prime-1-scratch"
    assert scratch["metadata"]["annotations"][ann.SELECTED_NODE] == "node-2"


async def test_a_scheduled_workers_scratch_claim_is_left_to_the_scheduler(kube: FakeKube, ctx: Context) -> None:
    """A pod the scheduler places (no populator) binds its WaitForFirstConsumer claims itself: no node is named."""
    name = await ensure_scratch(ctx, prime({ann.SELECTED_NODE: "node-2"}))
    scratch = kube.object(groups.PVCS, name, NAMESPACE)
    assert scratch is not None and ann.SELECTED_NODE not in scratch["metadata"]["annotations"]
