"""What a running worker reports, as the DataVolume shows it: the step with its bytes, rate and time left in
the Running condition's message (a retry under way still wins), `status.progress` moving for uploads and
host-assisted clones (CDI's stay "N/A"), and a ready upload server looked at seldom until an upload begins.
The worker's metrics are stood in for by a scraper that answers a given report."""

from __future__ import annotations

from typing import Any

from cdi.api import groups
from cdi.api.upload import upload_resource_name
from cdi.controller.clone.target import temp_claim_name
from cdi.controller.datavolume.clones import CloneReconciler
from cdi.controller.datavolume.importsource import ImportDataVolumeReconciler
from cdi.controller.datavolume.uploadsource import IDLE_POLL, UploadDataVolumeReconciler
from cdi.controller.populators.clones import ClonePopulator
from cdi.controller.progress import PodReport, ProgressScraper, Retry, Step
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller import test_populators as populators
from tests.unit.controller.clone.objects import settle, source_claim, stored
from tests.unit.controller.conftest import NAMESPACE
from tests.unit.controller.test_clone_reconciler import KEY as CLONE_KEY
from tests.unit.controller.test_clone_reconciler import datavolume as clone_datavolume
from tests.unit.controller.test_clone_reconciler import run, strategy, upload_server
from tests.unit.controller.test_reconcilers import A, annotate, bind, datavolume

Obj = dict[str, Any]
MIB = 1 << 20
POD_IP = "10.244.0.9"


class Reports(ProgressScraper):
    """Answers `report` for every pod asked, and remembers who was asked."""

    def __init__(self, report: PodReport | None) -> None:
        super().__init__()
        self.report = report
        self.asked: list[tuple[str, str]] = []

    async def read(self, pod_ip: str, owner_uid: str) -> PodReport | None:
        self.asked.append((pod_ip, owner_uid))
        return self.report


def step_series(ctx: Context, name: str, step: str = "Transfer") -> tuple[float | None, float | None]:
    """The controller's `cdi_datavolume_step_rate_bytes_per_second` and `..._seconds_left` of DataVolume `name`."""
    labels = {"namespace": NAMESPACE, "datavolume": name, "step": step}
    registry = ctx.metrics.registry
    return (registry.get_sample_value("cdi_datavolume_step_rate_bytes_per_second", labels),
            registry.get_sample_value("cdi_datavolume_step_seconds_left", labels))


def running(obj: Obj) -> tuple[str, str, str]:
    condition = next(c for c in obj["status"]["conditions"] if c["type"] == "Running")
    return condition["status"], condition.get("reason", ""), condition.get("message", "")


def pod(kube: FakeKube, name: str, namespace: str = NAMESPACE) -> None:
    kube.add(groups.PODS, {"metadata": {"name": name, "namespace": namespace},
                           "status": {"phase": "Running", "podIP": POD_IP}})


TRANSFER = Step("TransferDataFile", 12 * MIB, 48 * MIB, 3 * MIB, 12.0)


async def test_an_import_shows_its_step_and_a_retry_wins(kube: FakeKube, ctx: Context) -> None:
    dv = kube.add(groups.DATAVOLUMES, datavolume("disk", {"http": {"url": "https://images.example/disk.img"}}))
    reconciler = ImportDataVolumeReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    bind(kube, "disk")
    annotate(kube, "disk", {A + "pod.phase": "Running", A + "condition.running": "true",
                            A + "condition.running.reason": "Pod is running",
                            A + "import.importPodName": "importer-disk"})
    pod(kube, "importer-disk")
    ctx.progress = reports = Reports(PodReport(25.0, None, TRANSFER))
    assert await reconciler.reconcile(f"{NAMESPACE}/disk") == ctx.settings.progress_interval
    shown = stored(kube, groups.DATAVOLUMES, "disk")
    assert shown["status"]["progress"] == "25.00%"
    assert running(shown) == ("True", "Pod is running", "Transfer: 12 MiB of 48 MiB, 3.0 MiB/s, about 10 s left")
    assert reports.asked == [(POD_IP, dv["metadata"]["uid"])]
    assert step_series(ctx, "disk") == (3 * MIB, 12.0)  # and on the controller's /metrics

    written = kube.writes[:]
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    assert kube.writes == written  # the same report: nothing to write

    reports.report = PodReport(25.0, Retry("ConnectionFailed", "connection to https://images.example failed", 2),
                               TRANSFER)
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    assert running(stored(kube, groups.DATAVOLUMES, "disk"))[2] == \
        "retrying: connection to https://images.example failed (attempt 2)"

    annotate(kube, "disk", {A + "pod.phase": "Succeeded"})  # done: no step series outlives the import
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    assert stored(kube, groups.DATAVOLUMES, "disk")["status"]["phase"] == "Succeeded"
    assert step_series(ctx, "disk") == (None, None)


async def test_a_populated_import_shows_the_further_of_its_claims_progress_and_the_importers(
        kube: FakeKube, ctx: Context) -> None:
    """The import populator copies the importer's progress to the claim on its own round; the Running message
    comes from a reading of the importer made now. The two never disagree on screen: the percentage shown is
    the further on of the claim's and that reading (both of the same importer, and a counter)."""
    kube.add(groups.DATAVOLUMES, datavolume("pop", {"http": {"url": "https://images.example/disk.img"}}))
    reconciler = ImportDataVolumeReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/pop")
    bind(kube, "pop")
    claim = kube.object(groups.PVCS, "pop", NAMESPACE)
    assert claim is not None
    claim["spec"]["dataSourceRef"] = {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource",
                                      "name": "volume-import-source-x"}
    kube.add(groups.PVCS, claim)
    annotate(kube, "pop", {A + "usePopulator": "true", A + "populator.progress": "0.00%",
                           A + "populator.pvcPrime": "prime-x", A + "pod.phase": "Running",
                           A + "condition.running": "true", A + "condition.running.reason": "Pod is running"})
    kube.add(groups.PVCS, {"metadata": {"name": "prime-x", "namespace": NAMESPACE,
                                        "annotations": {A + "import.importPodName": "importer-prime-x"}}})
    pod(kube, "importer-prime-x")
    ctx.progress = Reports(PodReport(25.0, None, TRANSFER))
    await reconciler.reconcile(f"{NAMESPACE}/pop")
    shown = stored(kube, groups.DATAVOLUMES, "pop")
    assert (shown["status"]["progress"], running(shown)[2]) == \
        ("25.00%", "Transfer: 12 MiB of 48 MiB, 3.0 MiB/s, about 10 s left")

    annotate(kube, "pop", {A + "populator.progress": "40.00%"})  # the claim is further on
    await reconciler.reconcile(f"{NAMESPACE}/pop")
    assert stored(kube, groups.DATAVOLUMES, "pop")["status"]["progress"] == "40.00%"


async def test_an_upload_shows_progress_once_it_began(kube: FakeKube, ctx: Context) -> None:
    dv = kube.add(groups.DATAVOLUMES, datavolume("up", {"upload": {}}))
    reconciler = UploadDataVolumeReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/up")
    bind(kube, "up")
    annotate(kube, "up", {A + "pod.ready": "true", A + "pod.phase": "Running", A + "condition.running": "true",
                          A + "condition.running.reason": "Pod is running"})
    pod(kube, upload_resource_name("up"))
    ctx.progress = reports = Reports(PodReport(None, None, None))  # ready, nothing sent yet
    assert await reconciler.reconcile(f"{NAMESPACE}/up") == IDLE_POLL
    shown = stored(kube, groups.DATAVOLUMES, "up")
    assert (shown["status"]["phase"], shown["status"]["progress"]) == ("UploadReady", "N/A")
    assert running(shown) == ("True", "Pod is running", "")

    reports.report = PodReport(24.0, None, TRANSFER)
    await reconciler.reconcile(f"{NAMESPACE}/up")
    shown = stored(kube, groups.DATAVOLUMES, "up")
    assert (shown["status"]["phase"], shown["status"]["progress"]) == ("UploadReady", "24.00%")
    assert running(shown)[2] == "Transfer: 12 MiB of 48 MiB, 3.0 MiB/s, about 10 s left"
    assert step_series(ctx, "up") == (3 * MIB, 12.0)
    assert await reconciler.reconcile(f"{NAMESPACE}/up") == ctx.settings.progress_interval  # now it moves
    assert reports.asked[-1] == (POD_IP, dv["metadata"]["uid"])


async def test_a_host_assisted_copy_shows_the_clone_sources_progress(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="1Gi")
    strategy(kube, None)  # a copy
    clone_datavolume(kube, "1Gi")
    reconciler = CloneReconciler(ctx)
    for _ in range(30):
        await run(kube, ctx, reconciler, looks=1)
        source_pods = [p for p in kube.objects(groups.PODS, NAMESPACE) if p["metadata"]["name"].endswith("-source-pod")]
        if source_pods:
            break
        upload_server(kube)
    [source] = source_pods
    pod(kube, source["metadata"]["name"])
    ctx.progress = Reports(PodReport(40.0, None, Step("Transfer", 400 * MIB, 1024 * MIB, 100 * MIB, 6.2)))
    await reconciler.reconcile(CLONE_KEY)
    shown = stored(kube, groups.DATAVOLUMES, "copy")
    assert (shown["status"]["phase"], shown["status"]["progress"]) == ("CloneInProgress", "40.00%")
    assert running(shown) == ("True", "Pod is running", "Transfer: 400 MiB of 1.0 GiB, 100 MiB/s, about 6 s left")
    assert step_series(ctx, "copy") == (100 * MIB, 6.2)

    ctx.progress = Reports(None)  # the pod does not answer (frozen, busy): the condition keeps its last word
    await reconciler.reconcile(CLONE_KEY)
    assert running(stored(kube, groups.DATAVOLUMES, "copy"))[2] == \
        "Transfer: 400 MiB of 1.0 GiB, 100 MiB/s, about 6 s left"

    await ctx.client.delete(groups.PODS, source["metadata"]["name"], NAMESPACE)  # no source pod any more
    await reconciler.reconcile(CLONE_KEY)
    assert running(stored(kube, groups.DATAVOLUMES, "copy"))[0] == "False"
    assert step_series(ctx, "copy") == (None, None)


async def test_a_volume_clone_source_claim_shows_the_copys_progress(kube: FakeKube, ctx: Context) -> None:
    """A claim filled from a VolumeCloneSource by a host-assisted copy: `storage.populator.progress` moves with
    the clone source's counter, as CDI's clone populator shows it."""
    source_claim(kube, capacity="1Gi")
    populators.clone_source(kube)
    user = populators.claim(kube, "VolumeCloneSource")
    populator = ClonePopulator(ctx)
    ctx.progress = Reports(PodReport(40.0, None, Step("Transfer", 400 * MIB, 1024 * MIB, 100 * MIB, 6.2)))
    for _ in range(20):
        await populator.reconcile(populators.KEY)
        if kube.objects(groups.PODS, NAMESPACE):
            break
        settle(kube)
        temp = kube.object(groups.PVCS, temp_claim_name(user), NAMESPACE)
        if temp is not None and temp["status"]["phase"] == "Bound":  # its upload server is ready
            populators.annotate(kube, temp_claim_name(user), **{populators.S + "pod.ready": "true"})
            kube.add(groups.SERVICES, {"metadata": {"name": f"cdi-upload-{temp_claim_name(user)}",
                                                    "namespace": NAMESPACE}, "spec": {"clusterIP": "10.0.0.9"}})
    [source] = kube.objects(groups.PODS, NAMESPACE)
    pod(kube, source["metadata"]["name"])
    await populator.reconcile(populators.KEY)
    annotations = stored(kube, groups.PVCS, "disk")["metadata"]["annotations"]
    assert (annotations[populators.A + "clonePhase"], annotations[populators.S + "populator.progress"]) == \
        ("HostClone", "40.00%")
