"""The controller runtime: the shared context (client, informers, recorder, settings), and a
level-triggered reconciler that drains a deduplicating, rate-limited work queue of object keys."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdi.api import groups
from cdi.api.groups import GVR
from cdi.controller.metrics import ControllerMetrics
from cdi.controller.progress import ProgressScraper
from cdi.controller.watches import Watch
from cdi.kube import (
    Conflict,
    EventRecorder,
    Forbidden,
    Informer,
    KubeClient,
    NotFound,
    ShutDown,
    WorkQueue,
    default_rate_limiter,
)

log = logging.getLogger(__name__)
Obj = dict[str, Any]
# kinds cached in CDI's namespace only, as CDI's manager caches them (its cache options' namespace field
# selector), which is all the controller's Role there lets it list: what fronts the upload proxy
IN_CDI_NAMESPACE: frozenset[GVR] = frozenset({groups.INGRESSES, groups.ROUTES})


@dataclass
class Settings:
    """How this controller runs; worker-pod images and retry policy are CDI's knobs plus ours."""

    namespace: str = "cdi"
    importer_image: str = "cdi-importer"
    uploadserver_image: str = "cdi-uploadserver"
    cloner_image: str = "cdi-cloner"
    pull_policy: str = "IfNotPresent"
    retry_budget: int = 5  # importer pods started again after a retryable failure
    import_retry_budget: float = 180.0  # seconds an import may keep failing on its source (IMPORTER_RETRY_BUDGET)
    poller_timeout: float = 600.0  # seconds a DataImportCron's poller pod may take before it is given up on
    retry_base: float = 2.0
    retry_max: float = 300.0
    progress_interval: float = 2.0
    workers: int = 4
    leader_election: bool = True
    # unique per process, as controller-runtime's `<hostname>_<uuid>`: a container restarted in the same pod runs
    # as PID 1 again, and with `<hostname>-<pid>` would take the lease its crashed predecessor never released as
    # its own, without the expiry a successor owes it
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}_{uuid.uuid4()}")
    upload_proxy_url: str = ""
    # without an operator (cdi up, a bare `cdi controller`) the controller reports the CDI resource Deployed;
    # under cdi-operator the operator owns that status
    report_cdi_status: bool = True


class RetryLater(Exception):
    """A reconcile that cannot go on yet, for a reason it has already reported (an event, a condition):
    the key is retried with its backoff, as after an error, without an error's traceback in the log."""


class Context:
    """What every reconciler shares."""

    def __init__(self, client: KubeClient, settings: Settings, metrics: ControllerMetrics) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.informers: dict[GVR, Informer] = {}
        self.recorder = EventRecorder(client, "cdi-controller")
        self.progress = ProgressScraper()

    def informer(self, gvr: GVR) -> Informer:
        if gvr not in self.informers:
            namespace = self.settings.namespace if gvr in IN_CDI_NAMESPACE else None
            self.informers[gvr] = Informer(self.client, gvr, namespace)
        return self.informers[gvr]

    def cached(self, gvr: GVR, name: str, namespace: str | None = None) -> Obj | None:
        return self.informer(gvr).get_by_name(name, namespace)

    def cached_list(self, gvr: GVR, namespace: str | None = None) -> list[Obj]:
        return self.informer(gvr).list(namespace)


class Reconciler:
    """Subclasses implement `reconcile(key)`; the return value asks for a requeue after that many seconds.
    They declare what brings a key back in `watches()` (and `initial_keys()`); the manager runs those.

    Errors (and `RetryLater`) are retried with per-key exponential backoff; a 409 is retried promptly (the
    cache is merely behind); a 404 means the object went away while reconciling, and a 403 from a namespace
    being deleted that it is going, which are no errors."""

    name = "reconciler"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.queue: WorkQueue[str] = WorkQueue(default_rate_limiter(), name=self.name)
        self.log = logging.getLogger(f"cdi.controller.{self.name}")

    def enqueue(self, key: str) -> None:
        self.queue.add(key)

    def watches(self) -> Sequence[Watch]:
        """The events that requeue keys of this reconciler: one `Watch` per kind it depends on."""
        return ()

    def initial_keys(self) -> Iterable[str]:
        """Keys reconciled once the caches are synced, whatever events come (a singleton's key)."""
        return ()

    async def reconcile(self, key: str) -> float | None:
        raise NotImplementedError  # pragma: no cover - every reconciler overrides it

    async def run(self, workers: int) -> None:
        await asyncio.gather(*(self._worker() for _ in range(workers)))

    async def _worker(self) -> None:
        metrics = self.ctx.metrics
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            started = time.monotonic()
            outcome = "success"
            try:
                after = await self.reconcile(key)
                self.queue.forget(key)
                if after is not None:
                    self.queue.add_after(key, after)
            except Conflict:
                outcome = "conflict"
                self.queue.add_after(key, 0.05)
            except NotFound:
                outcome = "gone"
                self.queue.forget(key)
            except RetryLater as exc:
                outcome = "retry"
                self.log.info("%s: retrying later: %s", key, exc)
                self.queue.add_rate_limited(key)
            except asyncio.CancelledError:
                raise
            except Forbidden as exc:
                if exc.namespace_terminating:  # the namespace goes, and with it what this would have made
                    outcome = "gone"
                    self.queue.forget(key)
                    self.log.debug("%s: its namespace is being deleted: %s", key, exc)
                else:
                    outcome = "error"
                    self.log.exception("reconciling %s failed", key)
                    self.queue.add_rate_limited(key)
            except Exception:
                outcome = "error"
                self.log.exception("reconciling %s failed", key)
                self.queue.add_rate_limited(key)
            finally:
                self.queue.done(key)
                metrics.reconciled(self.name, outcome, time.monotonic() - started)
                self.log.debug("reconciled %s: %s in %.3fs", key, outcome, time.monotonic() - started)
                metrics.queue_depth.labels(self.name).set(len(self.queue))


async def write_status(client: KubeClient, gvr: GVR, obj: Mapping[str, Any], status: Mapping[str, Any]) -> Obj:
    """Replace the status subresource as computed from `obj`, only if `obj` is still current: the PUT
    carries its resourceVersion, so a reconcile working from a stale cache gets a 409 and runs again.
    A replacement, not a merge, so fields that went away go."""
    body = {**obj, "status": dict(status)}
    result: Obj = await client.replace(gvr, body, (obj.get("metadata") or {}).get("namespace") or None,
                                       subresource="status")
    return result

