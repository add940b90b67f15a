"""The controller manager: informers for the kinds CDI watches, the reconcilers and the events
that feed their queues (a Pod, PVC or StorageClass event re-queues the objects that depend on it),
Lease leader election, and the metrics endpoint. Runs the same against `cdi up` and a real cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cdi.api import groups
from cdi.api.views import ObjectView, PersistentVolumeView, PodView
from cdi.controller.capabilities import NO_PROVISIONER
from cdi.controller.cdiconfig import CONFIG_KEY, ConfigReconciler
from cdi.controller.dataimportcron import USER_KINDS, DataImportCronReconciler, cron_keys_of, cron_keys_of_user
from cdi.controller.datasource import DataSourceReconciler
from cdi.controller.datavolume.base import DataVolumeReconciler
from cdi.controller.datavolume.clones import CloneReconciler
from cdi.controller.datavolume.imports import ImportReconciler, is_import_claim
from cdi.controller.datavolume.uploads import UploadReconciler, is_upload_claim
from cdi.controller.metrics import ControllerMetrics
from cdi.controller.owners import owner_keys
from cdi.controller.populators.base import PopulatorReconciler
from cdi.controller.populators.clones import ClonePopulator
from cdi.controller.populators.imports import ImportPopulator
from cdi.controller.populators.uploads import UploadPopulator
from cdi.controller.runtime import Context, Reconciler, Settings
from cdi.controller.storageprofile import StorageProfileReconciler
from cdi.kube import KubeClient, LeaderElectionConfig, LeaderElector, object_key

log = logging.getLogger(__name__)
Obj = dict[str, Any]

WATCHED = (groups.DATAVOLUMES, groups.PVCS, groups.PODS, groups.STORAGECLASSES, groups.STORAGEPROFILES,
           groups.CDICONFIGS, groups.CDIS, groups.VOLUMESNAPSHOTCLASSES, groups.NODES, groups.PVS,
           groups.DATASOURCES, groups.VOLUMESNAPSHOTS, groups.VOLUMESNAPSHOTCONTENTS, groups.DATAIMPORTCRONS,
           groups.VOLUMEIMPORTSOURCES, groups.VOLUMEUPLOADSOURCES, groups.VOLUMECLONESOURCES, groups.CSIDRIVERS)
LEASE_NAME = "cdi-controller-leader-election-helper"


class Manager:
    def __init__(self, client: KubeClient, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.metrics = ControllerMetrics()
        self.ctx = Context(client, self.settings, self.metrics)
        self.datavolumes = DataVolumeReconciler(self.ctx)
        self.imports = ImportReconciler(self.ctx)
        self.profiles = StorageProfileReconciler(self.ctx)
        self.config = ConfigReconciler(self.ctx)
        self.uploads = UploadReconciler(self.ctx)
        self.datasources = DataSourceReconciler(self.ctx)
        self.clones = CloneReconciler(self.ctx)
        self.crons = DataImportCronReconciler(self.ctx)
        self.import_populator = ImportPopulator(self.ctx)
        self.populators: list[PopulatorReconciler] = [self.import_populator, UploadPopulator(self.ctx),
                                                      ClonePopulator(self.ctx, self.clones)]
        self.reconcilers: list[Reconciler] = [self.datavolumes, self.imports, self.uploads, self.profiles,
                                              self.config, self.datasources, self.clones, self.crons,
                                              *self.populators]
        for gvr in WATCHED:
            self.ctx.informer(gvr)
        self.metrics.count_pending_datavolumes(lambda: self.ctx.cached_list(groups.DATAVOLUMES))
        self._wire()
        self._tasks: list[asyncio.Task[Any]] = []
        self.leading = asyncio.Event()

    # -- event wiring ----------------------------------------------------------------------------------

    def _wire(self) -> None:
        inf = self.ctx.informers

        def on_dv(obj: Obj, *rest: Obj) -> None:
            new = rest[0] if rest else obj
            self.datavolumes.enqueue(object_key(new))
            self.clones.enqueue(object_key(new))
            self.datasources.enqueue_referring("pvc", object_key(new))

        def on_pvc(obj: Obj, *rest: Obj) -> None:
            new = rest[0] if rest else obj
            key = object_key(new)
            self.datavolumes.enqueue(key)  # the DataVolume of the same name, owned or not
            self.datasources.enqueue_referring("pvc", key)
            self.clones.enqueue(key)
            for owner in owner_keys(new, "DataVolume"):
                self.datavolumes.enqueue(owner)
                self.clones.enqueue(owner)
            if is_import_claim(new):
                self.imports.enqueue(key)
            if is_upload_claim(new):
                self.uploads.enqueue(key)
            for owner in owner_keys(new, "PersistentVolumeClaim"):  # scratch claims
                self.imports.enqueue(owner)
                self.uploads.enqueue(owner)
            for populator in self.populators:  # a claim naming a populator's kind, or its prime
                for populated in populator.keys_for_claim(new):
                    populator.enqueue(populated)

        def on_pod(obj: Obj, *rest: Obj) -> None:
            new = rest[0] if rest else obj
            for owner in owner_keys(new, "PersistentVolumeClaim"):
                self.imports.enqueue(owner)
                self.uploads.enqueue(owner)
                self.datavolumes.enqueue(owner)
            pod = PodView(new)
            for claim in pod.claim_names:
                self.imports.enqueue(f"{pod.namespace}/{claim}")
                self.datavolumes.enqueue(f"{pod.namespace}/{claim}")

        def waiting_on_storage(storage_class: str) -> None:
            """As CDI's DataVolume controllers watch StorageClasses and StorageProfiles: whatever could not
            have its claim yet (no class, or a profile without the access and volume modes the `storage`
            API leaves out) is looked at again, so that creating the class or completing its profile is
            all an admin has to do. Every DataVolume without a claim, whatever class it names: a new
            default class changes the one a DataVolume naming none gets."""
            for dv in self.ctx.cached_list(groups.DATAVOLUMES):
                view = ObjectView(dv)
                if self.ctx.cached(groups.PVCS, view.name, view.namespace) is None:
                    self.datavolumes.enqueue(view.key)
                    self.clones.enqueue(view.key)
            for populator in self.populators:
                for key in populator.keys_waiting_on_class(storage_class):
                    populator.enqueue(key)

        def on_storage(obj: Obj, *rest: Obj) -> None:
            self.profiles.enqueue(ObjectView(obj).name)
            self.config.enqueue(CONFIG_KEY)
            waiting_on_storage(ObjectView(obj).name)
            for cron in self.ctx.cached_list(groups.DATAIMPORTCRONS):  # a new default class moves their images
                self.crons.enqueue(object_key(cron))

        def on_profile(obj: Obj, *rest: Obj) -> None:
            self.profiles.enqueue(ObjectView(obj).name)
            for cron in self.ctx.cached_list(groups.DATAIMPORTCRONS):  # dataImportCronSourceFormat
                self.crons.enqueue(object_key(cron))
            waiting_on_storage(ObjectView(rest[0] if rest else obj).name)

        def on_snapshot_class(obj: Obj, *rest: Obj) -> None:
            for sc in self.ctx.cached_list(groups.STORAGECLASSES):
                self.profiles.enqueue(ObjectView(sc).name)

        def on_datasource(obj: Obj, *rest: Obj) -> None:
            key = object_key(rest[0] if rest else obj)
            self.datasources.enqueue(key)
            self.datasources.enqueue_referring("dataSource", key)

        def on_snapshot(obj: Obj, *rest: Obj) -> None:
            self.datasources.enqueue_referring("snapshot", object_key(rest[0] if rest else obj))

        def on_volume(obj: Obj, *rest: Obj) -> None:
            # a volume pre-bound to a DataVolume's claim (`storage.checkStaticVolume`)
            volume = PersistentVolumeView(rest[0] if rest else obj)
            ref = volume.claim_ref
            if ref.get("name") and ref.get("namespace"):
                self.datavolumes.enqueue(f"{ref['namespace']}/{ref['name']}")
            # a no-provisioner class's profile takes its claim property sets from the class's volumes
            name = volume.storage_class
            storage_class = self.ctx.cached(groups.STORAGECLASSES, name) if name else None
            if storage_class is not None and storage_class.get("provisioner") == NO_PROVISIONER:
                self.profiles.enqueue(name)

        def on_config(obj: Obj, *rest: Obj) -> None:
            self.config.enqueue(CONFIG_KEY)

        def on_cron(obj: Obj, *rest: Obj) -> None:
            self.crons.enqueue(object_key(rest[0] if rest else obj))

        def on_cron_object(obj: Obj, *rest: Obj) -> None:  # what a cron made, or a DataSource it may manage
            for key in {*cron_keys_of(obj), *(cron_keys_of(rest[0]) if rest else [])}:
                self.crons.enqueue(key)

        def cron_image_user(gvr: groups.GVR) -> Any:  # a pod, DataSource, DataVolume or claim using a cron's image
            def handler(obj: Obj, *rest: Obj) -> None:
                for o in (obj, *rest):
                    for key in cron_keys_of_user(self.ctx.cached, gvr, o):
                        self.crons.enqueue(key)
            return handler

        def populator_source(populator: PopulatorReconciler) -> Any:
            def handler(obj: Obj, *rest: Obj) -> None:
                for key in populator.keys_for_source(rest[0] if rest else obj):
                    populator.enqueue(key)
            return handler

        for populator in self.populators:
            on_source = populator_source(populator)
            inf[populator.source_gvr].add_handler(on_source, on_source, on_source)
        inf[groups.DATAIMPORTCRONS].add_handler(on_cron, on_cron, on_cron)
        for gvr in USER_KINDS:
            on_user = cron_image_user(gvr)
            inf[gvr].add_handler(on_user, on_user, on_user)
        for gvr in (groups.DATASOURCES, groups.VOLUMESNAPSHOTS):
            inf[gvr].add_handler(on_cron_object, on_cron_object, on_cron_object)
        inf[groups.DATAVOLUMES].add_handler(on_cron_object, on_cron_object, on_cron_object)
        inf[groups.PVCS].add_handler(on_cron_object, on_cron_object, on_cron_object)
        inf[groups.PODS].add_handler(on_cron_object, on_cron_object, on_cron_object)
        inf[groups.DATAVOLUMES].add_handler(on_dv, on_dv, on_dv)
        inf[groups.PVCS].add_handler(on_pvc, on_pvc, on_pvc)
        inf[groups.PODS].add_handler(on_pod, on_pod, on_pod)
        inf[groups.STORAGECLASSES].add_handler(on_storage, on_storage, on_storage)
        inf[groups.STORAGEPROFILES].add_handler(on_profile, on_profile, on_profile)
        inf[groups.VOLUMESNAPSHOTCLASSES].add_handler(on_snapshot_class, on_snapshot_class, on_snapshot_class)
        inf[groups.DATASOURCES].add_handler(on_datasource, on_datasource, on_datasource)
        inf[groups.VOLUMESNAPSHOTS].add_handler(on_snapshot, on_snapshot, on_snapshot)
        inf[groups.PVS].add_handler(on_volume, on_volume, on_volume)
        inf[groups.CDICONFIGS].add_handler(on_config, on_config, on_config)
        inf[groups.CDIS].add_handler(on_config, on_config, on_config)

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        for informer in self.ctx.informers.values():
            informer.start()
        for informer in self.ctx.informers.values():
            await informer.wait_synced()
        self.config.enqueue(CONFIG_KEY)
        if self.settings.leader_election:
            elector = LeaderElector(
                self.ctx.client, LeaderElectionConfig(LEASE_NAME, self.settings.namespace, self.settings.identity),
                on_started_leading=self._lead, recorder=self.ctx.recorder)
            self._tasks.append(asyncio.create_task(self._elect(elector), name="leader-election"))
        else:
            await self._lead()

    async def _elect(self, elector: LeaderElector) -> None:
        while True:
            await elector.run()
            log.warning("lost leadership; stopping reconcilers until it is regained")
            await self._stop_workers()
            self.leading.clear()

    async def _lead(self) -> None:
        if self.leading.is_set():
            return
        self.leading.set()
        workers = self.settings.workers
        for reconciler in self.reconcilers:
            self._tasks.append(asyncio.create_task(reconciler.run(workers), name=f"reconcile-{reconciler.name}"))

    async def _stop_workers(self) -> None:
        for task in [t for t in self._tasks if t.get_name().startswith("reconcile-")]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._tasks.remove(task)

    async def stop(self) -> None:
        for reconciler in self.reconcilers:
            reconciler.queue.shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for informer in self.ctx.informers.values():
            await informer.stop()
        await self.ctx.progress.close()
        await self.ctx.recorder.close()

    # -- metrics ---------------------------------------------------------------------------------------

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    def metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/healthz", lambda _: _ok())
        app.router.add_get("/readyz", lambda _: _ok())
        return app


async def _ok() -> web.Response:
    return web.Response(text="ok")

