"""Reconcilers against `tests.support.fakekube.FakeKube`: a Context whose informers the fake keeps
current, so a reconcile reads what the previous one wrote, in milliseconds and without `cdi up`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cdi.api import groups
from cdi.controller.metrics import ControllerMetrics
from cdi.controller.runtime import Context, Reconciler, Settings
from cdi.kube import Conflict
from tests.support.fakekube import FakeKube, all_gvrs

NAMESPACE = "ns"
STORAGE_CLASS = "local"


@pytest.fixture
def kube() -> FakeKube:
    fake = FakeKube(NAMESPACE)
    fake.add(groups.STORAGECLASSES, {"metadata": {"name": STORAGE_CLASS, "annotations": {
        "storageclass.kubernetes.io/is-default-class": "true"}}, "provisioner": "cdi.local",
        "volumeBindingMode": "Immediate"})
    fake.add(groups.STORAGEPROFILES, {"metadata": {"name": STORAGE_CLASS}, "status": {
        "storageClass": STORAGE_CLASS, "claimPropertySets": [
            {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}]}})
    fake.add(groups.CDICONFIGS, {"metadata": {"name": groups.CDI_CONFIG_NAME}, "spec": {},
                                 "status": {"filesystemOverhead": {"global": "0.06"}}})
    return fake


@pytest.fixture
async def ctx(kube: FakeKube) -> AsyncIterator[Context]:
    context = Context(kube, Settings(namespace="cdi", progress_interval=2.0), ControllerMetrics())
    context.informers.update({gvr: kube.informer(gvr) for gvr in all_gvrs()})
    yield context
    await context.recorder.close()


async def events_of(ctx: Context, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every Event recorded about `name`, once the recorder wrote them."""
    await ctx.recorder.flush(5)
    kube: Any = ctx.client
    return [(e["type"], e["reason"], e["message"]) for e in kube.objects(groups.EVENTS)
            if e["involvedObject"]["name"] == name]


async def reconciled(reconciler: Reconciler, name: str) -> float | None:
    """One reconcile of `NAMESPACE/name` as the work queue makes it: a 409 (status written against the version
    before the reconciler's own annotation patch) is retried at once."""
    for _ in range(5):
        try:
            return await reconciler.reconcile(f"{NAMESPACE}/{name}")
        except Conflict:
            continue
    raise AssertionError("conflicts did not settle")
