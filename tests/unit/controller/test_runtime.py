"""The reconcilers' worker loop: what an error from the API server means for the key. A refusal because the
namespace is being deleted drops it (everything the reconcile would make there goes with the namespace; a
real cluster refuses each retry again, and the controller's log filled with them); any other refusal is
retried with backoff."""

from __future__ import annotations

import asyncio

from cdi.controller.runtime import Context, Reconciler
from cdi.kube import Forbidden

TERMINATING = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403, "details": {
    "name": "volume-import-source-1", "kind": "volumeimportsources", "causes": [{
        "reason": "NamespaceTerminating", "message": "namespace gone is being terminated",
        "field": "metadata.namespace"}]}}


class Refused(Reconciler):
    name = "refused"

    def __init__(self, ctx: Context, error: Exception) -> None:
        super().__init__(ctx)
        self.error = error
        self.calls = 0

    async def reconcile(self, key: str) -> float | None:
        self.calls += 1
        raise self.error


async def reconciled_once(reconciler: Refused) -> int:
    """The key's requeue count after one reconcile by a worker (which handles the error in the same step of
    the event loop as the reconcile raised it: seeing the call, the test sees its outcome)."""
    reconciler.enqueue("gone/disk")
    worker = asyncio.create_task(reconciler.run(1))
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while reconciler.calls < 1:
            assert asyncio.get_running_loop().time() < deadline, "no reconcile within 10 s"
            await asyncio.sleep(0.01)
    finally:
        worker.cancel()
    return reconciler.queue.num_requeues("gone/disk")


async def test_a_refusal_from_a_namespace_being_deleted_drops_the_key(ctx: Context) -> None:
    error = Forbidden("unable to create new content in namespace gone because it is being terminated",
                      reason="Forbidden", status=TERMINATING)
    assert error.namespace_terminating
    assert await reconciled_once(Refused(ctx, error)) == 0


async def test_another_refusal_is_retried_with_backoff(ctx: Context) -> None:
    error = Forbidden('volumeimportsources is forbidden: User "system:serviceaccount:cdi:cdi-sa" cannot create',
                      reason="Forbidden", status={"kind": "Status", "code": 403, "details": {}})
    assert not error.namespace_terminating
    assert await reconciled_once(Refused(ctx, error)) >= 1  # its first retry may already have come
