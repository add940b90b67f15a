"""CDI's CopyEvents: what happened on a prime or temporary claim is repeated, once, on the user's claim."""

from __future__ import annotations

from typing import Any

from cdi.api import groups
from cdi.controller.copyevents import copy_events
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.conftest import NAMESPACE, events_of


def claim(kube: FakeKube, name: str) -> dict[str, Any]:
    kube.add(groups.PVCS, {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {}})
    stored = kube.object(groups.PVCS, name, NAMESPACE)
    assert stored is not None
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", **stored}


async def test_events_of_the_prime_are_repeated_once_on_the_users_claim(kube: FakeKube, ctx: Context) -> None:
    prime, target = claim(kube, "prime-1"), claim(kube, "disk")
    ctx.recorder.record(prime, "Warning", "ImportFailed", "http://x/disk.img does not exist (HTTP 404)")
    ctx.recorder.record(prime, "Normal", "Provisioning", "provisioning")
    ctx.recorder.record(target, "Normal", "Provisioning", "provisioning")  # the target has it already
    await ctx.recorder.flush(5)

    assert await copy_events(ctx, prime, target) == 1
    await ctx.recorder.flush(5)
    assert ("Warning", "ImportFailed", "[prime-1] : http://x/disk.img does not exist (HTTP 404)") in \
        await events_of(ctx, "disk")
    assert await copy_events(ctx, prime, target) == 0  # not twice
    assert [e for e in await events_of(ctx, "disk") if e[1] == "ImportFailed"] == \
        [("Warning", "ImportFailed", "[prime-1] : http://x/disk.img does not exist (HTTP 404)")]


async def test_a_copy_not_yet_written_is_not_queued_again(kube: FakeKube, ctx: Context) -> None:
    """Reconciles come faster than the recorder writes and the cache hears back: the copy still happens once."""
    prime, target = claim(kube, "prime-2"), claim(kube, "disk2")
    ctx.recorder.record(prime, "Warning", "ImportFailed", "refused")
    await ctx.recorder.flush(5)
    assert await copy_events(ctx, prime, target) == 1
    assert await copy_events(ctx, prime, target) == 0  # queued, not written yet
    assert await events_of(ctx, "disk2") == [("Warning", "ImportFailed", "[prime-2] : refused")]
    assert [e["count"] for e in kube.objects(groups.EVENTS) if e["involvedObject"]["name"] == "disk2"] == [1]
