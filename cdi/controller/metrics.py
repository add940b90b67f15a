"""The controller's Prometheus metrics: CDI's names for what users alert on
(kubevirt_cdi_datavolume_pending, kubevirt_cdi_storageprofile_info, kubevirt_cdi_cr_ready, which CDI's
operator exports and the CDI resource's reconciler here), the import progress re-exported while an
import runs, the rate and time left of the step a DataVolume's worker is in (ours: CDI has none), plus
ours for the controller itself (reconciles, their duration, queue depth)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client import disable_created_metrics as _disable_created

from cdi.controller.progress import STEP_NAMES, Step

_disable_created()  # type: ignore[no-untyped-call]


def waits_on_default_class(dv: Mapping[str, Any]) -> bool:
    """CDI's rule for kubevirt_cdi_datavolume_pending: the DataVolume names no storage class (it depends
    on the cluster's default) and is Pending or has no phase yet. One that names a class, or waits for
    its first consumer, does not say anything about the default class."""
    spec = dv.get("spec") or {}
    claim = spec.get("pvc") if spec.get("pvc") is not None else spec.get("storage")
    if (claim or {}).get("storageClassName") is not None:
        return False
    return (dv.get("status") or {}).get("phase") in (None, "", "Pending")


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # process_cpu_seconds_total, process_resident_memory_bytes, ...: what CDI's controller exports as any
        # Go binary does, and what a scale benchmark reads from the leader pod on a real cluster
        ProcessCollector(registry=self.registry)
        self.datavolume_pending = Gauge(
            "kubevirt_cdi_datavolume_pending", "Number of DataVolumes pending for default storage class to be "
            "configured", registry=self.registry)
        self.storageprofile_info = Gauge(
            "kubevirt_cdi_storageprofile_info", "`StorageProfiles` info labels: `storageclass`, `provisioner`, "
            "`complete` indicates if all storage profiles recommended PVC settings are complete, `default` "
            "indicates if it's the Kubernetes default storage class, `virtdefault` indicates if it's the default "
            "virtualization storage class, `rwx` indicates if the storage class supports `ReadWriteMany`, "
            "`smartclone` indicates if it supports snapshot or CSI based clone, `degraded` indicates it is not "
            "optimal for virtualization",
            ["storageclass", "provisioner", "complete", "default", "virtdefault", "rwx", "smartclone", "degraded"],
            registry=self.registry)
        self.cr_ready = Gauge("kubevirt_cdi_cr_ready", "CDI install ready", registry=self.registry)
        self.cr_ready.set(-1)  # as CDI: unknown until the CDI resource is seen (0 is what alerts)
        self.import_progress = Gauge(
            "kubevirt_cdi_import_progress_total", "The import progress in percentage, as last scraped from the "
            "importer pod", ["ownerUID"], registry=self.registry)
        self.cron_outdated_gauge = Gauge(
            "kubevirt_cdi_dataimportcron_outdated", "DataImportCron has an outdated import",
            ["namespace", "cron_name", "pending"], registry=self.registry)
        self.reconciles = Counter("cdi_controller_reconciles_total", "Reconciles by controller and outcome",
                                  ["controller", "outcome"], registry=self.registry)
        self.reconcile_seconds = Histogram("cdi_controller_reconcile_duration_seconds", "Reconcile duration",
                                           ["controller"], registry=self.registry,
                                           buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5))
        self.queue_depth = Gauge("cdi_controller_workqueue_depth", "Keys waiting in a controller's work queue",
                                 ["controller"], registry=self.registry)
        self.import_retries = Counter("cdi_controller_import_retries_total", "Importer pods retried after a "
                                      "transient failure", registry=self.registry)
        self.import_failures = Counter("cdi_controller_import_failures_total", "Imports ended as Failed, by "
                                       "importer reason", ["reason"], registry=self.registry)

        self.step_rate = Gauge(
            "cdi_datavolume_step_rate_bytes_per_second", "Bytes per second of the step a DataVolume's worker is in, "
            "over the worker's last 10 s (0: stalled), as last read from the worker (imports, uploads, "
            "host-assisted clones)", ["namespace", "datavolume", "step"], registry=self.registry)
        self.step_seconds_left = Gauge(
            "cdi_datavolume_step_seconds_left", "Estimated seconds the step a DataVolume's worker is in has left "
            "at its rate, as last read from the worker", ["namespace", "datavolume", "step"], registry=self.registry)

        self._progress_series: dict[str, str] = {}  # DataVolume key -> ownerUID of its series
        self._step_series: dict[str, tuple[str, str, str]] = {}  # DataVolume key -> labels of its step series

    def count_pending_datavolumes(self, datavolumes: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        """kubevirt_cdi_datavolume_pending is counted when scraped, over the DataVolumes `datavolumes`
        returns (the controller's cache), so it never lags behind or outlives them."""
        self.datavolume_pending.set_function(lambda: sum(1 for dv in datavolumes() if waits_on_default_class(dv)))

    def set_import_progress(self, key: str, owner_uid: str, value: float) -> None:
        if self._progress_series.get(key, owner_uid) != owner_uid:
            self.clear_import_progress(key)  # a DataVolume of the same name, recreated
        self._progress_series[key] = owner_uid
        self.import_progress.labels(owner_uid).set(value)

    def clear_import_progress(self, key: str) -> None:
        """The import of DataVolume `key` is over (done, failed, deleted): its series goes, as the
        importer's own does when it exits, instead of staying at its last value forever."""
        owner_uid = self._progress_series.pop(key, None)
        if owner_uid is not None:
            self.import_progress.remove(owner_uid)

    def worker_step(self, key: str, step: Step | None) -> None:
        """The step DataVolume `key`'s worker said it is in (None: none, or the work is over): its rate and
        time left, each while the worker knows it; a step's series goes when the next one comes."""
        labels = self._step_series.pop(key, None)
        if labels is not None:
            for gauge in (self.step_rate, self.step_seconds_left):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        if step is None or (step.rate is None and step.seconds_left is None):
            return
        namespace, _, name = key.partition("/")
        labels = (namespace, name, STEP_NAMES.get(step.phase, step.phase))
        self._step_series[key] = labels
        if step.rate is not None:
            self.step_rate.labels(*labels).set(step.rate)
        if step.seconds_left is not None:
            self.step_seconds_left.labels(*labels).set(step.seconds_left)

    def cron_outdated(self, namespace: str, name: str, outdated: bool, pending: bool) -> None:
        """CDI's kubevirt_cdi_dataimportcron_outdated: one series per cron, `pending` when its import waits
        for a default storage class."""
        self.cron_gone(namespace, name)
        self.cron_outdated_gauge.labels(namespace, name, "true" if pending else "false").set(1 if outdated else 0)

    def cron_gone(self, namespace: str, name: str) -> None:
        for pending in ("true", "false"):
            try:
                self.cron_outdated_gauge.remove(namespace, name, pending)
            except KeyError:
                pass

    def cdi_resource_seen(self, conditions: list[dict[str, str]]) -> None:
        """CDI's operator rule: ready while Available is True; not ready when it is not and nothing is
        Progressing either (an install or upgrade under way does not alert)."""
        def true(kind: str) -> bool:
            return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)
        if true("Available"):
            self.cr_ready.set(1)
        elif not true("Progressing"):
            self.cr_ready.set(0)

    def reconciled(self, controller: str, outcome: str, seconds: float) -> None:
        self.reconciles.labels(controller, outcome).inc()
        self.reconcile_seconds.labels(controller).observe(seconds)
