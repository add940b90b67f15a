"""The DataImportCron reconciler's run, import, garbage collection and status against the in-memory
fake client and a clock the test moves: what a schedule does at each time, the DataVolume a new version
makes and how its phase shows on the cron's conditions, the DataSource following the last good import,
which imports are collected and which are kept, and what a cron says when it cannot import. In
milliseconds; the end-to-end tests (tests/e2e/test_dataimportcron.py) show the same with real images."""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cdi.api import groups
from cdi.controller.dataimportcron import POLLER_RECHECK, DataImportCronReconciler, dv_name, poller_name
from cdi.controller.metrics import ControllerMetrics
from cdi.controller.runtime import Context, Settings
from tests.support.fakekube import FakeKube, all_gvrs
from tests.unit.controller.conftest import NAMESPACE, events_of, reconciled

Obj = dict[str, Any]
IMPORT = "cdi.kubevirt.io/storage.import."
ONE, TWO = ("sha256:" + c * 64 for c in "12")
REGISTRY = "docker://registry.example:5000/golden/fedora:latest"
START = datetime.datetime(2026, 3, 2, 10, 15, tzinfo=datetime.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime.datetime:
        return self.now

    def forward(self, **delta: float) -> None:
        self.now += datetime.timedelta(**delta)


def cron(kube: FakeKube, name: str = "fedora", *, schedule: str = "0 * * * *", **spec: Any) -> Obj:
    return kube.add(groups.DATAIMPORTCRONS, {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {}},
        "spec": {"schedule": schedule, "managedDataSource": name,
                 "template": {"spec": {"source": {"registry": {"url": REGISTRY}},
                                       "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}, **spec}})


async def look(reconciler: DataImportCronReconciler, name: str = "fedora") -> float | None:
    """One reconcile of the cron (`fedora` unless named)."""
    return await reconciled(reconciler, name)


def stored(kube: FakeKube, gvr: groups.GVR, name: str) -> Obj:
    found = kube.object(gvr, name, NAMESPACE)
    assert found is not None, f"no {gvr.plural}/{name}"
    return found


def condition(kube: FakeKube, type_: str, name: str = "fedora") -> tuple[str, str]:
    found = next(c for c in stored(kube, groups.DATAIMPORTCRONS, name)["status"]["conditions"] if c["type"] == type_)
    return found["status"], found["reason"]


def said(kube: FakeKube, type_: str, name: str = "fedora") -> tuple[str, str, str]:
    found = next(c for c in stored(kube, groups.DATAIMPORTCRONS, name)["status"]["conditions"] if c["type"] == type_)
    return found["status"], found["reason"], found["message"]


async def poll(kube: FakeKube, reconciler: DataImportCronReconciler, digest: str, name: str = "fedora") -> None:
    """The run's poller pod reports `digest`; the cron takes it."""
    c = stored(kube, groups.DATAIMPORTCRONS, name)
    pod = stored(kube, groups.PODS, poller_name(c))
    pod["status"] = {"phase": "Succeeded", "containerStatuses": [{"name": "importer", "state": {"terminated": {
        "exitCode": 0, "message": json.dumps({"sourceDigest": digest})}}}]}
    kube.add(groups.PODS, pod)
    await look(reconciler, name)
    await look(reconciler, name)


def import_phase(kube: FakeKube, name: str, phase: str) -> None:
    """What the DataVolume reconciler shows of the import (and its claim, once it succeeded)."""
    dv = stored(kube, groups.DATAVOLUMES, name)
    dv["status"] = {"phase": phase}
    kube.add(groups.DATAVOLUMES, dv)
    if phase == "Succeeded":
        kube.add(groups.PVCS, {"metadata": {"name": name, "namespace": NAMESPACE, "labels": dv["metadata"]["labels"],
                                            "annotations": dict(dv["metadata"]["annotations"])},
                               "spec": {}, "status": {"phase": "Bound"}})


async def polled(kube: FakeKube, ctx: Context, clock: Clock, **spec: Any) -> DataImportCronReconciler:
    """A cron `fedora` (with `spec`) made, looked at once, and its first run reporting ONE."""
    reconciler = DataImportCronReconciler(ctx, clock=clock)
    cron(kube, **spec)
    await look(reconciler)
    await poll(kube, reconciler, ONE)
    return reconciler


async def imported(kube: FakeKube, reconciler: DataImportCronReconciler, clock: Clock, digest: str) -> str:
    """A run that reports `digest`, and its import succeeding; the import's name."""
    clock.forward(hours=1)
    await look(reconciler)  # due: a poller
    await poll(kube, reconciler, digest)
    name = str(dv_name("fedora", digest))
    import_phase(kube, name, "Succeeded")
    await look(reconciler)
    return name


# -- schedule ------------------------------------------------------------------------------------------

async def test_a_cron_polls_when_created_then_on_its_schedule(kube: FakeKube, ctx: Context) -> None:
    clock = Clock()
    reconciler = DataImportCronReconciler(ctx, clock=clock)
    c = cron(kube)
    await look(reconciler)
    pod = stored(kube, groups.PODS, poller_name(c))
    [container] = pod["spec"]["containers"]
    variables = {e["name"]: e.get("value") for e in container["env"]}
    assert (variables["IMPORTER_POLL"], variables["IMPORTER_ENDPOINT"]) == ("true", REGISTRY)
    assert not container.get("volumeMounts") and not container.get("volumeDevices")  # polls, writes nothing
    assert pod["metadata"]["ownerReferences"][0]["uid"] == c["metadata"]["uid"]
    assert await look(reconciler) == POLLER_RECHECK  # while it runs

    await poll(kube, reconciler, ONE)
    annotations = stored(kube, groups.DATAIMPORTCRONS, "fedora")["metadata"]["annotations"]
    assert annotations[IMPORT + "sourceDesiredDigest"] == ONE
    assert annotations[IMPORT + "lastCronTime"] == "2026-03-02T10:15:00Z"
    assert annotations[IMPORT + "nextCronTime"] == "2026-03-02T11:00:00Z"
    assert kube.object(groups.PODS, poller_name(c), NAMESPACE) is None
    assert ("Normal", "SourceDigestUpdated", f"Source digest updated to {ONE}") in await events_of(ctx, "fedora")

    clock.forward(minutes=5)
    assert await look(reconciler) == 40 * 60  # not due: the seconds until 11:00
    assert kube.created(groups.PODS) == [f"{NAMESPACE}/{poller_name(c)}"]
    clock.forward(minutes=40)
    await look(reconciler)
    assert kube.created(groups.PODS) == [f"{NAMESPACE}/{poller_name(c)}"] * 2


async def test_refresh_now_polls_at_once_and_is_taken_away(kube: FakeKube, ctx: Context) -> None:
    reconciler = DataImportCronReconciler(ctx, clock=Clock())
    c = cron(kube)
    await look(reconciler)
    await poll(kube, reconciler, ONE)
    stamped = stored(kube, groups.DATAIMPORTCRONS, "fedora")
    stamped["metadata"]["annotations"]["cdi.kubevirt.io/refreshNow"] = ""
    kube.add(groups.DATAIMPORTCRONS, stamped)
    await look(reconciler)
    assert len(kube.created(groups.PODS)) == 2
    await poll(kube, reconciler, ONE)
    assert "cdi.kubevirt.io/refreshNow" not in stored(kube, groups.DATAIMPORTCRONS, "fedora")["metadata"][
        "annotations"]
    assert kube.object(groups.PODS, poller_name(c), NAMESPACE) is None


async def test_a_run_that_tells_no_version_says_why(kube: FakeKube, ctx: Context) -> None:
    reconciler = DataImportCronReconciler(ctx, clock=Clock())
    c = cron(kube)
    await look(reconciler)
    pod = stored(kube, groups.PODS, poller_name(c))
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "importer", "state": {"terminated": {
        "exitCode": 1, "message": json.dumps({"message": "registry answered 401"})}}}]}
    kube.add(groups.PODS, pod)
    await look(reconciler)
    await look(reconciler)
    assert condition(kube, "UpToDate") == ("False", "PollFailed")
    assert ("Warning", "PollFailed", "Polling the source failed: registry answered 401") in \
        await events_of(ctx, "fedora")
    assert kube.created(groups.DATAVOLUMES) == []


# -- import and status ---------------------------------------------------------------------------------

async def test_a_new_version_is_imported_and_the_data_source_follows(kube: FakeKube, ctx: Context) -> None:
    reconciler = await polled(kube, ctx, Clock())
    name = str(dv_name("fedora", ONE))
    assert kube.created(groups.DATAVOLUMES) == [f"{NAMESPACE}/{name}"]
    dv = stored(kube, groups.DATAVOLUMES, name)
    assert dv["spec"]["source"]["registry"]["url"] == f"docker://registry.example:5000/golden/fedora@{ONE}"
    assert dv["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"] == "fedora"
    assert dv["metadata"]["annotations"]["cdi.kubevirt.io/storage.bind.immediate.requested"] == "true"
    status = stored(kube, groups.DATAIMPORTCRONS, "fedora")["status"]
    assert status["currentImports"] == [{"DataVolumeName": name, "Digest": ONE}]
    assert condition(kube, "UpToDate") == ("False", "Outdated")  # as the run found it
    await look(reconciler)
    assert condition(kube, "UpToDate") == ("False", "ImportProgressing")
    source = stored(kube, groups.DATASOURCES, "fedora")  # made at once, pointing at nothing yet
    assert source["spec"]["source"] == {}

    for phase, progressing in (("ImportScheduled", ("False", "ImportScheduled")),
                               ("ImportInProgress", ("True", "ImportProgressing"))):
        import_phase(kube, name, phase)
        await look(reconciler)
        assert condition(kube, "Progressing") == progressing
    import_phase(kube, name, "Succeeded")
    await look(reconciler)
    status = stored(kube, groups.DATAIMPORTCRONS, "fedora")["status"]
    assert status["lastImportedPVC"] == {"namespace": NAMESPACE, "name": name}
    assert condition(kube, "UpToDate") == ("True", "UpToDate")
    assert condition(kube, "Progressing") == ("False", "NoImport")
    assert stored(kube, groups.DATASOURCES, "fedora")["spec"]["source"] == {
        "pvc": {"namespace": NAMESPACE, "name": name}}
    reasons = [e[1] for e in await events_of(ctx, "fedora")]
    assert "ImportCreated" in reasons and "ImportSucceeded" in reasons and "DataSourceUpdated" in reasons


async def test_a_failed_import_does_not_block_the_next_version(kube: FakeKube, ctx: Context) -> None:
    clock = Clock()
    reconciler = await polled(kube, ctx, clock)
    first = str(dv_name("fedora", ONE))
    import_phase(kube, first, "Failed")
    await look(reconciler)
    assert condition(kube, "Progressing") == ("False", "Failed")
    assert ("Warning", "Failed", "Import DataVolume phase Failed") in await events_of(ctx, "fedora")

    clock.forward(hours=1)
    await look(reconciler)
    await poll(kube, reconciler, TWO)
    await look(reconciler)
    assert kube.object(groups.DATAVOLUMES, first, NAMESPACE) is None  # replaced
    second = str(dv_name("fedora", TWO))
    assert stored(kube, groups.DATAIMPORTCRONS, "fedora")["status"]["currentImports"] == [
        {"DataVolumeName": second, "Digest": TWO}]


async def test_a_data_source_of_another_cron_is_left_alone(kube: FakeKube, ctx: Context) -> None:
    reconciler = DataImportCronReconciler(ctx, clock=Clock())
    cron(kube, "first")
    kube.add(groups.DATASOURCES, {"metadata": {"name": "shared", "namespace": NAMESPACE, "labels": {
        "cdi.kubevirt.io/dataImportCron": "first"}}, "spec": {"source": {}}})
    second = cron(kube, "second")
    second["spec"]["managedDataSource"] = "shared"
    kube.add(groups.DATAIMPORTCRONS, second)
    assert await look(reconciler, "second") is None
    assert condition(kube, "UpToDate", "second") == ("False", "ErrDataSourceAlreadyManaged")
    assert kube.created(groups.PODS) == []


async def test_a_snapshot_format_keeps_the_image_as_a_snapshot(kube: FakeKube, ctx: Context) -> None:
    profile = stored(kube, groups.STORAGEPROFILES, "local")
    profile["status"]["dataImportCronSourceFormat"] = "snapshot"
    kube.add(groups.STORAGEPROFILES, profile)
    reconciler = await polled(kube, ctx, Clock())
    name = str(dv_name("fedora", ONE))
    import_phase(kube, name, "Succeeded")
    await look(reconciler)
    snapshot = stored(kube, groups.VOLUMESNAPSHOTS, name)
    assert snapshot["spec"]["source"] == {"persistentVolumeClaimName": name}
    assert condition(kube, "UpToDate") == ("False", "ImportProgressing")  # until the snapshot is ready
    snapshot["status"] = {"readyToUse": True}
    kube.add(groups.VOLUMESNAPSHOTS, snapshot)
    await look(reconciler)
    assert kube.object(groups.DATAVOLUMES, name, NAMESPACE) is None  # the snapshot is the golden image
    await look(reconciler)
    assert condition(kube, "UpToDate") == ("True", "UpToDate")
    assert stored(kube, groups.DATASOURCES, "fedora")["spec"]["source"] == {
        "snapshot": {"namespace": NAMESPACE, "name": name}}


# -- garbage collection --------------------------------------------------------------------------------

async def test_outdated_imports_beyond_imports_to_keep_are_collected(kube: FakeKube, ctx: Context) -> None:
    clock = Clock()
    reconciler = await polled(kube, ctx, clock, importsToKeep=1)
    first = str(dv_name("fedora", ONE))
    import_phase(kube, first, "Succeeded")
    await look(reconciler)
    second = await imported(kube, reconciler, clock, TWO)
    # collected in the look that points the DataSource at the new one: the cron's own DataSource moving on
    # is no use that keeps an import (nor one the cron would say it keeps)
    assert stored(kube, groups.DATASOURCES, "fedora")["spec"]["source"]["pvc"]["name"] == second
    assert kube.object(groups.DATAVOLUMES, first, NAMESPACE) is None
    assert kube.object(groups.DATAVOLUMES, second, NAMESPACE) is not None
    assert ("Normal", "GarbageCollected", f"Deleted outdated import {first}") in await events_of(ctx, "fedora")


async def test_an_outdated_import_in_use_is_kept_until_it_is_free(kube: FakeKube, ctx: Context) -> None:
    clock = Clock()
    reconciler = await polled(kube, ctx, clock, importsToKeep=1)
    first = str(dv_name("fedora", ONE))
    import_phase(kube, first, "Succeeded")
    await look(reconciler)
    kube.add(groups.PODS, {"metadata": {"name": "vm", "namespace": NAMESPACE}, "spec": {
        "containers": [{"name": "c"}], "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": first}}]},
        "status": {"phase": "Running"}})
    await imported(kube, reconciler, clock, TWO)
    assert kube.object(groups.DATAVOLUMES, first, NAMESPACE) is not None
    assert any(e[1] == "OutdatedImportInUse" and f"Pod {NAMESPACE}/vm" in e[2] for e in await events_of(ctx, "fedora"))
    assert said(kube, "OutdatedImportsInUse") == (
        "True", "OutdatedImportInUse",
        f"Keeping outdated imports beyond importsToKeep (1) while in use: {first} (used by Pod {NAMESPACE}/vm)")
    await kube.delete(groups.PODS, "vm", NAMESPACE)
    await look(reconciler)
    assert kube.object(groups.DATAVOLUMES, first, NAMESPACE) is None
    assert said(kube, "OutdatedImportsInUse") == (
        "False", "OutdatedImportsCollected", "No outdated import is kept beyond importsToKeep (1)")
    assert condition(kube, "UpToDate") == ("True", "UpToDate")  # CDI's conditions as they were


async def test_a_cron_that_never_kept_an_import_has_no_in_use_condition(kube: FakeKube, ctx: Context) -> None:
    clock = Clock()
    reconciler = await polled(kube, ctx, clock, importsToKeep=1)
    import_phase(kube, str(dv_name("fedora", ONE)), "Succeeded")
    await look(reconciler)
    await imported(kube, reconciler, clock, TWO)
    await look(reconciler)
    types = [c["type"] for c in stored(kube, groups.DATAIMPORTCRONS, "fedora")["status"]["conditions"]]
    assert sorted(types) == ["Progressing", "UpToDate"]


async def test_garbage_collection_can_be_turned_off(kube: FakeKube, ctx: Context) -> None:
    clock = Clock()
    reconciler = await polled(kube, ctx, clock, importsToKeep=1, garbageCollect="Never")
    first = str(dv_name("fedora", ONE))
    import_phase(kube, first, "Succeeded")
    await look(reconciler)
    await imported(kube, reconciler, clock, TWO)
    assert kube.object(groups.DATAVOLUMES, first, NAMESPACE) is not None


async def test_with_retention_none_what_the_cron_made_goes_with_it(kube: FakeKube, ctx: Context) -> None:
    reconciler = await polled(kube, ctx, Clock(), retentionPolicy="None")
    name = str(dv_name("fedora", ONE))
    import_phase(kube, name, "Succeeded")
    await look(reconciler)
    await kube.delete(groups.DATAIMPORTCRONS, "fedora", NAMESPACE)
    await look(reconciler)
    assert kube.object(groups.DATASOURCES, "fedora", NAMESPACE) is None
    assert kube.object(groups.DATAVOLUMES, name, NAMESPACE) is None
    assert kube.object(groups.PVCS, name, NAMESPACE) is None


async def test_by_default_the_images_outlive_the_cron(kube: FakeKube, ctx: Context) -> None:
    reconciler = await polled(kube, ctx, Clock())
    name = str(dv_name("fedora", ONE))
    import_phase(kube, name, "Succeeded")
    await look(reconciler)
    await kube.delete(groups.DATAIMPORTCRONS, "fedora", NAMESPACE)
    await look(reconciler)
    assert kube.object(groups.DATASOURCES, "fedora", NAMESPACE) is not None
    assert kube.object(groups.DATAVOLUMES, name, NAMESPACE) is not None


# -- a claim as the source, and a new default class -----------------------------------------------------

def claim_cron(kube: FakeKube) -> Obj:
    c = cron(kube)
    c["spec"]["template"]["spec"]["source"] = {"pvc": {"namespace": "golden", "name": "disk"}}
    return kube.add(groups.DATAIMPORTCRONS, c)


async def test_a_claims_version_is_its_uid_read_without_a_poller(kube: FakeKube, ctx: Context) -> None:
    reconciler = DataImportCronReconciler(ctx, clock=Clock())
    claim_cron(kube)
    await look(reconciler)
    await look(reconciler)
    assert condition(kube, "UpToDate") == ("False", "PollFailed")  # not there (yet)
    assert ("Warning", "PollFailed", "Polling the source failed: PVC golden/disk not found") in \
        await events_of(ctx, "fedora")
    disk = kube.add(groups.PVCS, {"metadata": {"name": "disk", "namespace": "golden"}, "spec": {},
                                  "status": {"phase": "Bound"}})
    stamped = stored(kube, groups.DATAIMPORTCRONS, "fedora")
    stamped["metadata"]["annotations"]["cdi.kubevirt.io/refreshNow"] = ""
    kube.add(groups.DATAIMPORTCRONS, stamped)
    await look(reconciler)
    annotations = stored(kube, groups.DATAIMPORTCRONS, "fedora")["metadata"]["annotations"]
    assert annotations[IMPORT + "sourceDesiredDigest"] == f"uid:{disk['metadata']['uid']}"
    assert kube.created(groups.PODS) == []


class Authorizer(FakeKube):
    """The fake cluster answering SubjectAccessReviews: `allowed` says which (user, resource) may."""

    def __init__(self, *allowed: tuple[str, str]) -> None:
        super().__init__(NAMESPACE)
        self.allowed = set(allowed)
        self.reviews: list[Obj] = []

    async def create(self, gvr: groups.GVR, body: Any, namespace: str | None = None, **kwargs: Any) -> Obj:
        if gvr != groups.SUBJECTACCESSREVIEWS:
            return await super().create(gvr, body, namespace, **kwargs)
        spec = body["spec"]
        self.reviews.append(spec)
        attributes = spec["resourceAttributes"]
        resource = "/".join(p for p in (attributes["resource"], attributes["subresource"]) if p)
        return {**body, "status": {"allowed": (spec["user"], resource) in self.allowed}}


@pytest.fixture
async def authorizing() -> AsyncIterator[tuple[Authorizer, Context]]:
    kube = Authorizer()
    context = Context(kube, Settings(namespace="cdi"), ControllerMetrics())
    context.informers.update({gvr: kube.informer(gvr) for gvr in all_gvrs()})
    yield kube, context
    await context.recorder.close()


@pytest.mark.parametrize("resource", ["datavolumes/source", "pods"])
async def test_a_claim_the_crons_account_may_clone_is_imported(authorizing: tuple[Authorizer, Context],
                                                               resource: str) -> None:
    """The controller may read every claim: whether the cron may is asked for its service account, as the
    DataVolume webhook asks it for a user."""
    kube, ctx = authorizing
    kube.allowed.add(("system:serviceaccount:ns:importer", resource))
    reconciler = DataImportCronReconciler(ctx, clock=Clock())
    c = claim_cron(kube)
    c["spec"]["serviceAccountName"] = "importer"
    kube.add(groups.DATAIMPORTCRONS, c)
    kube.add(groups.PVCS, {"metadata": {"name": "disk", "namespace": "golden"}, "spec": {},
                           "status": {"phase": "Bound"}})
    await look(reconciler)
    await look(reconciler)
    [created] = kube.created(groups.DATAVOLUMES)
    assert stored(kube, groups.DATAVOLUMES, created.split("/")[1])["spec"]["source"] == {
        "pvc": {"namespace": "golden", "name": "disk"}}
    assert kube.reviews[0]["resourceAttributes"]["namespace"] == "golden"


async def test_a_claim_the_crons_account_may_not_clone_is_not_imported(
        authorizing: tuple[Authorizer, Context]) -> None:
    kube, ctx = authorizing
    reconciler = DataImportCronReconciler(ctx, clock=Clock())
    claim_cron(kube)
    kube.add(groups.PVCS, {"metadata": {"name": "disk", "namespace": "golden"}, "spec": {},
                           "status": {"phase": "Bound"}})
    await look(reconciler)
    await look(reconciler)
    assert condition(kube, "Progressing") == ("False", "NotAuthorized")
    message = ("Not authorized to create DataVolume: system:serviceaccount:ns:default may not clone PVC "
               "golden/disk")
    assert ("Warning", "NotAuthorized", message) in await events_of(ctx, "fedora")
    assert kube.created(groups.DATAVOLUMES) == []


async def test_a_new_default_class_imports_the_image_again_onto_it(kube: FakeKube, ctx: Context) -> None:
    reconciler = await polled(kube, ctx, Clock())
    name = str(dv_name("fedora", ONE))
    import_phase(kube, name, "Succeeded")
    await look(reconciler)
    assert stored(kube, groups.DATAIMPORTCRONS, "fedora")["metadata"]["annotations"][
        "cdi.kubevirt.io/storage.import.storageClass"] == "local"
    old = stored(kube, groups.STORAGECLASSES, "local")
    del old["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"]
    kube.add(groups.STORAGECLASSES, old)
    kube.add(groups.STORAGECLASSES, {"metadata": {"name": "fast", "annotations": {
        "storageclass.kubernetes.io/is-default-class": "true"}}, "provisioner": "cdi.local"})
    await look(reconciler)  # the image on the old class goes, then the new class is recorded
    assert kube.object(groups.DATAVOLUMES, name, NAMESPACE) is None
    assert kube.object(groups.PVCS, name, NAMESPACE) is None
    assert stored(kube, groups.DATAIMPORTCRONS, "fedora")["metadata"]["annotations"][
        "cdi.kubevirt.io/storage.import.storageClass"] == "fast"
    assert ("Normal", "StorageClassChanged", "Importing again onto storage class fast") in \
        await events_of(ctx, "fedora")
    await look(reconciler)
    await look(reconciler)
    assert kube.created(groups.DATAVOLUMES) == [f"{NAMESPACE}/{name}"] * 2  # imported again
