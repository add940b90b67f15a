"""The controller's Prometheus metrics: CDI's names for what users alert on
(kubevirt_cdi_datavolume_pending, kubevirt_cdi_storageprofile_info, the re-exported import progress),
plus ours for the controller itself (reconciles, their duration, queue depth)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import disable_created_metrics as _disable_created

_disable_created()  # type: ignore[no-untyped-call]


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.import_progress = Gauge(
            "kubevirt_cdi_import_progress_total", "The import progress in percentage, as last scraped from the "
            "importer pod", ["ownerUID"], registry=self.registry)
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

    def reconciled(self, controller: str, outcome: str, seconds: float) -> None:
        self.reconciles.labels(controller, outcome).inc()
        self.reconcile_seconds.labels(controller).observe(seconds)
