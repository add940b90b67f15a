"""The fake client keeps the API server's rules that reconcilers depend on; if it did not, a unit test
of a reconciler could pass where the real server would refuse the reconciler's writes."""

from __future__ import annotations

import pytest

from cdi.api import groups
from cdi.kube import AlreadyExists, Conflict, NotFound
from tests.support.fakekube import FakeKube

CM = {"metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}}


async def test_a_stale_replace_conflicts_and_a_current_one_goes_through() -> None:
    kube = FakeKube()
    created = await kube.create(groups.CONFIGMAPS, CM)
    await kube.patch(groups.CONFIGMAPS, "c", {"data": {"a": "2"}}, "ns")
    with pytest.raises(Conflict):
        await kube.replace(groups.CONFIGMAPS, {**created, "data": {"a": "3"}}, "ns")
    current = await kube.get(groups.CONFIGMAPS, "c", "ns")
    replaced = await kube.replace(groups.CONFIGMAPS, {**current, "data": {"a": "3"}}, "ns")
    assert replaced["data"] == {"a": "3"}
    with pytest.raises(AlreadyExists):
        await kube.create(groups.CONFIGMAPS, CM)


async def test_status_is_written_only_through_its_subresource() -> None:
    kube = FakeKube()
    pvc = await kube.create(groups.PVCS, {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}})
    assert pvc["status"] == {"phase": "Pending"}
    patched = await kube.patch(groups.PVCS, "p", {"status": {"phase": "Bound"}, "metadata": {"labels": {"x": "y"}}},
                               "ns")
    assert patched["status"] == {"phase": "Pending"} and patched["metadata"]["labels"] == {"x": "y"}
    written = await kube.replace(groups.PVCS, {**patched, "status": {"phase": "Bound"}, "spec": {"changed": 1}}, "ns",
                                 subresource="status")
    assert written["status"] == {"phase": "Bound"} and written["spec"] == {}


async def test_finalizers_hold_a_deleted_object_until_they_go() -> None:
    kube = FakeKube()
    informer = kube.informer(groups.PVCS)
    await kube.create(groups.PVCS, {"metadata": {"name": "p", "namespace": "ns", "finalizers": ["f"]}})
    await kube.delete(groups.PVCS, "p", "ns")
    held = informer.get_by_name("p", "ns")
    assert held is not None and held["metadata"]["deletionTimestamp"]
    await kube.patch(groups.PVCS, "p", {"metadata": {"finalizers": None}}, "ns")
    assert informer.get_by_name("p", "ns") is None
    with pytest.raises(NotFound):
        await kube.get(groups.PVCS, "p", "ns")
    assert [w.verb for w in kube.writes] == ["create", "delete", "delete"]
