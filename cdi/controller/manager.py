"""The controller manager: the shared informers, the reconcilers, each fed by the watches it declares
(`Reconciler.watches`, `cdi.controller.watches`), Lease leader election, and the metrics endpoint.
Runs the same against `cdi up` and a real cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cdi.api import groups
from cdi.controller.cdiconfig import ConfigReconciler
from cdi.controller.dataimportcron import DataImportCronReconciler
from cdi.controller.datasource import DataSourceReconciler
from cdi.controller.datavolume.clones import CloneReconciler
from cdi.controller.datavolume.externalpopulation import ExternalPopulationReconciler
from cdi.controller.datavolume.imports import ImportReconciler
from cdi.controller.datavolume.importsource import ImportDataVolumeReconciler
from cdi.controller.datavolume.uploads import UploadReconciler
from cdi.controller.datavolume.uploadsource import UploadDataVolumeReconciler
from cdi.controller.metrics import ControllerMetrics
from cdi.controller.populators.clones import ClonePopulator
from cdi.controller.populators.imports import ImportPopulator
from cdi.controller.populators.uploads import UploadPopulator
from cdi.controller.runtime import Context, Reconciler, Settings
from cdi.controller.storageprofile import StorageProfileReconciler
from cdi.controller.watches import register
from cdi.kube import Informer, KubeClient, LeaderElectionConfig, LeaderElector, NotFound

log = logging.getLogger(__name__)

# every kind a reconciler reads from the cache, watched or not (a declared watch adds its kind too)
CACHED = (groups.DATAVOLUMES, groups.PVCS, groups.PODS, groups.STORAGECLASSES, groups.STORAGEPROFILES,
          groups.CDICONFIGS, groups.CDIS, groups.VOLUMESNAPSHOTCLASSES, groups.NODES, groups.PVS,
          groups.DATASOURCES, groups.VOLUMESNAPSHOTS, groups.VOLUMESNAPSHOTCONTENTS, groups.DATAIMPORTCRONS,
          groups.VOLUMEIMPORTSOURCES, groups.VOLUMEUPLOADSOURCES, groups.VOLUMECLONESOURCES, groups.CSIDRIVERS,
          groups.EVENTS)
# kinds only some clusters serve (OpenShift's Routes): cached and watched only where the API server serves
# them when the controller starts, as CDI's watchRoutes; elsewhere their cache stays empty
IF_SERVED = frozenset({groups.ROUTES})
LEASE_NAME = "cdi-controller-leader-election-helper"


class Manager:
    def __init__(self, client: KubeClient, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.metrics = ControllerMetrics()
        self.ctx = Context(client, self.settings, self.metrics)
        self.reconcilers = all_reconcilers(self.ctx)
        for gvr in CACHED:
            self.ctx.informer(gvr)
        watch_all(self.ctx, self.reconcilers)
        self.metrics.count_pending_datavolumes(lambda: self.ctx.cached_list(groups.DATAVOLUMES))
        self._tasks: list[asyncio.Task[Any]] = []
        self.leading = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        informers = [informer for informer in self.ctx.informers.values() if await served(self.ctx.client, informer)]
        for informer in informers:
            informer.start()
        for informer in informers:
            await informer.wait_synced()
        for reconciler in self.reconcilers:
            for key in reconciler.initial_keys():
                reconciler.enqueue(key)
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


async def served(client: KubeClient, informer: Informer) -> bool:
    """False for a kind of `IF_SERVED` the API server does not serve (a 404 on listing it): an informer
    started on it would retry for ever and never sync. Any other error stops the start, as CDI's."""
    if informer.gvr not in IF_SERVED:
        return True
    try:
        await client.list(informer.gvr, informer.namespace, limit=1)
    except NotFound:
        log.info("%s is not served here: not watched", informer.gvr.kind)
        return False
    return True


def all_reconcilers(ctx: Context) -> list[Reconciler]:
    """Every reconciler the controller runs: the DataVolume ones by source kind, the claims' worker
    reconcilers, storage profiles, the CDIConfig, DataSources, DataImportCrons and the populators (the
    clone populator drives its claims through the clone reconciler's strategies)."""
    clones = CloneReconciler(ctx)
    return [ImportDataVolumeReconciler(ctx), UploadDataVolumeReconciler(ctx), ExternalPopulationReconciler(ctx),
            clones, ImportReconciler(ctx), UploadReconciler(ctx), StorageProfileReconciler(ctx),
            ConfigReconciler(ctx), DataSourceReconciler(ctx), DataImportCronReconciler(ctx), ImportPopulator(ctx),
            UploadPopulator(ctx), ClonePopulator(ctx)]


def watch_all(ctx: Context, reconcilers: list[Reconciler]) -> None:
    """Register every watch the reconcilers declare on the context's informers (made for a kind no
    reconciler reads otherwise), each feeding its own reconciler's queue."""
    for reconciler in reconcilers:
        for watch in reconciler.watches():
            register(ctx.informer(watch.kind), watch, reconciler.enqueue)
