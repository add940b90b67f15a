"""The watches each reconciler declares, run as the manager runs them (`all_reconcilers`, `watch_all`) on
the fake client's informers: an event on one object requeues exactly the keys of the reconcilers that
depend on it, and nothing else. Each test writes through the client (which runs the informers' handlers
before the write returns) and reads every queue, in milliseconds."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.owners import owner_reference
from cdi.controller.capabilities import NO_PROVISIONER
from cdi.controller.manager import all_reconcilers, watch_all
from cdi.controller.runtime import Context, Reconciler
from cdi.controller.watches import Watch, register
from tests.support.fakekube import FakeKube
from tests.unit.controller.conftest import NAMESPACE, STORAGE_CLASS

Obj = dict[str, Any]
NS = NAMESPACE


def key(name: str) -> str:
    return f"{NS}/{name}"


def datavolume(name: str, source: Obj | None, **labels: str) -> Obj:
    storage: Obj = {"resources": {"requests": {"storage": "1Gi"}}}
    spec: Obj = {"storage": storage}
    if source is None:  # filled by the claim's own populator
        storage["dataSourceRef"] = {"apiGroup": "populator.example.com", "kind": "Example", "name": "g"}
    else:
        spec["source"] = source
    return {"metadata": {"name": name, "namespace": NS, "labels": labels}, "spec": spec}


def claim(name: str, *, annotations: dict[str, str] | None = None, owner: Obj | None = None,
          storage_class: str = STORAGE_CLASS, labels: dict[str, str] | None = None, **spec: Any) -> Obj:
    meta: Obj = {"name": name, "namespace": NS, "annotations": annotations or {}, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "spec": {"storageClassName": storage_class, **spec}}


def pod(name: str, *, owner: Obj | None = None, mounts: tuple[str, ...] = ()) -> Obj:
    meta: Obj = {"name": name, "namespace": NS}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(mounts)]}}


def populated_by(kind: str, source: str) -> Obj:
    return {"dataSourceRef": {"apiGroup": groups.CDI_GROUP, "kind": kind, "name": source}}


HTTP = {"http": {"url": "https://images.example/disk.img"}}
IMPORT_CLAIM = {ann.IMPORT_SOURCE: "http", ann.IMPORT_ENDPOINT: "https://images.example/disk.img"}


@pytest.fixture
def reconcilers(ctx: Context) -> list[Reconciler]:
    """The controller's reconcilers with their watches registered, as the manager starts them."""
    found = all_reconcilers(ctx)
    watch_all(ctx, found)
    return found


async def requeued(reconcilers: list[Reconciler]) -> dict[str, set[str]]:
    """Each reconciler's queued keys by its name (emptying the queues), leaving out the empty ones."""
    found: dict[str, set[str]] = {}
    for reconciler in reconcilers:
        while len(reconciler.queue):
            item = await reconciler.queue.get()
            reconciler.queue.done(item)
            found.setdefault(reconciler.name, set()).add(item)
    return found


def test_every_reconciler_has_a_queue_of_its_own_name(reconcilers: list[Reconciler]) -> None:
    names = [r.name for r in reconcilers]
    assert len(names) == len(set(names))
    # only the CDIConfig singleton is reconciled at start without an event naming it
    assert {r.name: list(r.initial_keys()) for r in reconcilers if list(r.initial_keys())} == \
        {"cdiconfig": [groups.CDI_CONFIG_NAME]}


async def test_a_datavolume_requeues_the_reconciler_of_its_source_kind_only(
        kube: FakeKube, reconcilers: list[Reconciler]) -> None:
    await kube.create(groups.DATAVOLUMES, datavolume("web", HTTP))
    await kube.create(groups.DATAVOLUMES, datavolume("vd", {"vddk": {"url": "https://vcenter"}}))
    await kube.create(groups.DATAVOLUMES, datavolume("up", {"upload": {}}))
    await kube.create(groups.DATAVOLUMES, datavolume("copy", {"pvc": {"namespace": NS, "name": "web"}}))
    await kube.create(groups.DATAVOLUMES, datavolume("golden", None))
    assert await requeued(reconcilers) == {
        "datavolume-import": {key("web"), key("vd")}, "datavolume-upload": {key("up")},
        "clone": {key("copy")}, "datavolume-external-population": {key("golden")}}

    # a deleted DataVolume comes back once more (its progress metric goes)
    await kube.delete(groups.DATAVOLUMES, "web", NS)
    assert await requeued(reconcilers) == {"datavolume-import": {key("web")}}


async def test_a_claim_requeues_its_datavolume_and_its_workers_reconciler(
        kube: FakeKube, reconcilers: list[Reconciler]) -> None:
    web = kube.add(groups.DATAVOLUMES, datavolume("web", HTTP))
    up = kube.add(groups.DATAVOLUMES, datavolume("up", {"upload": {}}))
    await kube.create(groups.PVCS, claim("web", annotations=IMPORT_CLAIM, owner=owner_reference(groups.DATAVOLUMES,
                                                                                              web)))
    await kube.create(groups.PVCS, claim("up", annotations={ann.UPLOAD_TARGET: ""},
                                         owner=owner_reference(groups.DATAVOLUMES, up)))
    assert await requeued(reconcilers) == {"datavolume-import": {key("web")}, "import": {key("web")},
                                           "datavolume-upload": {key("up")}, "upload": {key("up")}}

    # a DataVolume's claim of another name, found by its owner; a bare claim asking for an import (no
    # DataVolume); a scratch claim, which brings back the claim owning it to both worker reconcilers
    await kube.create(groups.PVCS, claim("web-restored", owner=owner_reference(groups.DATAVOLUMES, web)))
    await kube.create(groups.PVCS, claim("bare", annotations=IMPORT_CLAIM))
    web_claim = kube.object(groups.PVCS, "web", NS)
    assert web_claim is not None
    await kube.create(groups.PVCS, claim("web-scratch", owner=owner_reference(groups.PVCS, web_claim)))
    assert await requeued(reconcilers) == {"datavolume-import": {key("web")},
                                           "import": {key("bare"), key("web")}, "upload": {key("web")}}


async def test_a_pod_requeues_the_claim_it_works_for_or_mounts(kube: FakeKube, reconcilers: list[Reconciler]) -> None:
    kube.add(groups.DATAVOLUMES, datavolume("web", HTTP))
    web_claim = kube.add(groups.PVCS, claim("web", annotations=IMPORT_CLAIM))
    await kube.create(groups.PODS, pod("importer-web", owner=owner_reference(groups.PVCS, web_claim)))
    assert await requeued(reconcilers) == {"datavolume-import": {key("web")}, "import": {key("web")},
                                           "upload": {key("web")}}

    await kube.patch(groups.PODS, "importer-web", {"status": {"phase": "Running", "podIP": "10.0.0.9"}}, NS)
    assert await requeued(reconcilers) == {"datavolume-import": {key("web")}, "import": {key("web")},
                                           "upload": {key("web")}}

    # a consumer mounting the claim (the first consumer a WaitForFirstConsumer claim waits for)
    await kube.create(groups.PODS, pod("vm", mounts=("web",)))
    assert await requeued(reconcilers) == {"datavolume-import": {key("web")}, "import": {key("web")}}


async def test_a_storage_class_brings_back_what_waits_for_it(kube: FakeKube, reconcilers: list[Reconciler]) -> None:
    """A DataVolume without a claim (whatever class it names: a new default changes its class), a claim
    to be populated in that class without its prime yet, every cron; and the class's profile and the
    CDIConfig."""
    kube.add(groups.DATAVOLUMES, datavolume("waiting", HTTP))
    kube.add(groups.DATAVOLUMES, datavolume("copy", {"pvc": {"namespace": NS, "name": "web"}}))
    kube.add(groups.DATAVOLUMES, datavolume("placed", HTTP))
    kube.add(groups.PVCS, claim("placed", annotations=IMPORT_CLAIM))
    kube.add(groups.PVCS, claim("filled", storage_class="fast", **populated_by("VolumeImportSource", "src")))
    kube.add(groups.PVCS, claim("elsewhere", **populated_by("VolumeImportSource", "src")))
    kube.add(groups.DATAIMPORTCRONS, {"metadata": {"name": "daily", "namespace": NS}, "spec": {}})
    await kube.create(groups.STORAGECLASSES, {"metadata": {"name": "fast"}, "provisioner": "csi.example"})
    assert await requeued(reconcilers) == {
        "datavolume-import": {key("waiting")}, "clone": {key("copy")}, "import-populator": {key("filled")},
        "dataimportcron": {key("daily")}, "storageprofile": {"fast"}, "cdiconfig": {groups.CDI_CONFIG_NAME}}

    # its profile completed: the same, but for the CDIConfig, which reads classes, not profiles
    await kube.create(groups.STORAGEPROFILES, {"metadata": {"name": "fast"}, "status": {"claimPropertySets": [
        {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"}]}})
    assert await requeued(reconcilers) == {
        "datavolume-import": {key("waiting")}, "clone": {key("copy")}, "import-populator": {key("filled")},
        "dataimportcron": {key("daily")}, "storageprofile": {"fast"}}


async def test_volumes_and_snapshot_classes_bring_back_profiles_and_static_datavolumes(
        kube: FakeKube, reconcilers: list[Reconciler]) -> None:
    kube.add(groups.DATAVOLUMES, datavolume("static", HTTP))
    await kube.create(groups.PVS, {"metadata": {"name": "pv-static"}, "spec": {
        "storageClassName": STORAGE_CLASS, "claimRef": {"namespace": NS, "name": "static"}}})
    assert await requeued(reconcilers) == {"datavolume-import": {key("static")}}

    # a no-provisioner class's profile takes its claim property sets from the class's volumes
    kube.add(groups.STORAGECLASSES, {"metadata": {"name": "disks"}, "provisioner": NO_PROVISIONER})
    await kube.create(groups.PVS, {"metadata": {"name": "pv-disk"}, "spec": {"storageClassName": "disks"}})
    assert await requeued(reconcilers) == {"storageprofile": {"disks"}}

    # which classes can be snapshotted: every profile
    await kube.create(groups.VOLUMESNAPSHOTCLASSES, {"metadata": {"name": "snaps"}, "driver": "cdi.local"})
    assert await requeued(reconcilers) == {"storageprofile": {STORAGE_CLASS, "disks"}}


async def test_the_cdi_resource_and_cdiconfig_bring_back_the_config(kube: FakeKube,
                                                                     reconcilers: list[Reconciler]) -> None:
    await kube.create(groups.CDIS, {"metadata": {"name": groups.CDI_CR_NAME}, "spec": {}})
    assert await requeued(reconcilers) == {"cdiconfig": {groups.CDI_CONFIG_NAME}}
    await kube.patch(groups.CDICONFIGS, groups.CDI_CONFIG_NAME, {"spec": {"scratchSpaceStorageClass": "x"}})
    assert await requeued(reconcilers) == {"cdiconfig": {groups.CDI_CONFIG_NAME}}


async def test_datasources_follow_what_they_name(kube: FakeKube, reconcilers: list[Reconciler]) -> None:
    def data_source(name: str, **source: Obj) -> Obj:
        return {"metadata": {"name": name, "namespace": NS}, "spec": {"source": source}}

    kube.add(groups.DATASOURCES, data_source("golden", pvc={"namespace": NS, "name": "disk"}))
    kube.add(groups.DATASOURCES, data_source("alias", dataSource={"namespace": NS, "name": "golden"}))
    kube.add(groups.DATASOURCES, data_source("snapped", snapshot={"namespace": NS, "name": "s1"}))
    await kube.create(groups.PVCS, claim("disk"))
    assert await requeued(reconcilers) == {"datasource": {key("golden")}}

    # the DataVolume of the claim's name (its phase says whether the claim is ready)
    await kube.create(groups.DATAVOLUMES, datavolume("disk", HTTP))
    assert await requeued(reconcilers) == {"datasource": {key("golden")}, "datavolume-import": {key("disk")}}

    await kube.patch(groups.DATASOURCES, "golden", {"metadata": {"labels": {"x": "y"}}}, NS)
    assert await requeued(reconcilers) == {"datasource": {key("golden"), key("alias")}}

    await kube.create(groups.VOLUMESNAPSHOTS, {"metadata": {"name": "s1", "namespace": NS}, "spec": {}})
    assert await requeued(reconcilers) == {"datasource": {key("snapped")}}


async def test_a_cron_follows_what_it_made_and_what_uses_its_images(kube: FakeKube,
                                                                       reconcilers: list[Reconciler]) -> None:
    cron = {ann.LABEL_DATAIMPORTCRON: "daily"}
    kube.add(groups.DATAIMPORTCRONS, {"metadata": {"name": "daily", "namespace": NS}, "spec": {}})
    await kube.patch(groups.DATAIMPORTCRONS, "daily", {"metadata": {"labels": {"x": "y"}}}, NS)
    assert await requeued(reconcilers) == {"dataimportcron": {key("daily")}}

    # an import it made, by its label
    await kube.create(groups.DATAVOLUMES, datavolume("img-1", HTTP, **cron))
    assert await requeued(reconcilers) == {"dataimportcron": {key("daily")}, "datavolume-import": {key("img-1")}}
    kube.add(groups.PVCS, claim("img-1", labels=cron))

    # a DataSource that stops using the import: the DataSource as it was names the cron's claim
    kube.add(groups.DATASOURCES, {"metadata": {"name": "golden", "namespace": NS},
                                  "spec": {"source": {"pvc": {"namespace": NS, "name": "img-1"}}}})
    await kube.patch(groups.DATASOURCES, "golden", {"spec": {"source": {"pvc": {"name": "other"}}}}, NS)
    assert await requeued(reconcilers) == {"dataimportcron": {key("daily")}, "datasource": {key("golden")}}

    # a pod that mounted the import goes
    kube.add(groups.PODS, pod("reader", mounts=("img-1",)))
    await kube.delete(groups.PODS, "reader", NS)
    assert await requeued(reconcilers) == {"dataimportcron": {key("daily")}, "datavolume-import": {key("img-1")},
                                           "import": {key("img-1")}}


async def test_populators_follow_their_sources_and_prime_claims(kube: FakeKube,
                                                                 reconcilers: list[Reconciler]) -> None:
    user = kube.add(groups.PVCS, claim("target", **populated_by("VolumeUploadSource", "src")))
    await kube.create(groups.VOLUMEUPLOADSOURCES, {"metadata": {"name": "src", "namespace": NS}, "spec": {}})
    await kube.create(groups.VOLUMEIMPORTSOURCES, {"metadata": {"name": "src", "namespace": NS}, "spec": {}})
    assert await requeued(reconcilers) == {"upload-populator": {key("target")}}

    # the prime claim the upload server fills, owned by the user's claim
    await kube.create(groups.PVCS, claim("prime-x", annotations={
        ann.POPULATOR_KIND: "VolumeUploadSource", ann.UPLOAD_TARGET: ""}, owner=owner_reference(groups.PVCS, user)))
    assert await requeued(reconcilers) == {"upload-populator": {key("target")},
                                           "upload": {key("prime-x"), key("target")}, "import": {key("target")}}


def test_a_watch_maps_the_object_before_an_update_only_when_asked() -> None:
    def names(obj: Obj) -> list[str]:
        return [str(obj["uses"])]

    assert Watch(groups.PODS, names).keys_of({"uses": "b"}, {"uses": "a"}) == ["b"]
    assert Watch(groups.PODS, names, before_too=True).keys_of({"uses": "b"}, {"uses": "a"}) == ["b", "a"]
    assert Watch(groups.PODS, names, before_too=True).keys_of({"uses": "a"}, {"uses": "a"}) == ["a"]


def test_a_watch_is_registered_on_its_own_kind_only(kube: FakeKube) -> None:
    with pytest.raises(ValueError, match="Pod"):
        register(kube.informer(groups.PVCS), Watch(groups.PODS, lambda _: []), lambda _: None)
