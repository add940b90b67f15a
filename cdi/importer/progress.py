"""Progress per phase, exported as Prometheus text over HTTPS on $POD_IP:8443/metrics.

CDI's progress counts downloaded bytes only: it reaches 100% before conversion, then sits there
while qemu-img and the resize run (CDI#3537, CDI#1845). Here every route announces its phases
with weights up front, the overall percentage moves through each phase by bytes, and it reaches
100 only after the final fdatasync.

Metrics (registry of their own, no `_created` series):

* `kubevirt_cdi_import_progress_total{ownerUID}`: CDI's counter, holding the overall percentage
  (monotonic, as CDI's controller expects).
* `cdi_importer_phase{ownerUID,phase}`: 1 for the current phase, 0 for the others seen.
* `cdi_importer_phase_bytes_done{ownerUID,phase}` / `cdi_importer_phase_bytes_total{ownerUID,phase}`:
  byte progress of each phase (total 0 while unknown).
* `cdi_importer_phase_rate_bytes_per_second{ownerUID,phase}`: the current phase's rate over its last 10 s
  (`cdi.common.rate`; 0: nothing moved in that time, stalled), once it has run for a second.
* `cdi_importer_phase_seconds_left{ownerUID,phase}`: the current phase's estimated time left at that rate,
  when its total is known and it moves.
* `cdi_importer_phase_duration_seconds{ownerUID,phase}`: how long each phase seen took (the current
  one: so far).
* `cdi_importer_bytes_transferred_total{ownerUID}`: bytes received from the source.
* `cdi_importer_retries_total{ownerUID}`: transient failures retried inside the run.
* `cdi_importer_retrying{ownerUID,reason,message}`: while a failed operation is being retried, the
  attempt number, labelled with the failure's reason code and message (absent otherwise). The
  controller puts it in the DataVolume's Running condition.
"""

from __future__ import annotations

import ipaddress
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdi.common.rate import RateWindow

log = logging.getLogger(__name__)

# phase names (stable: they appear in metrics and logs)
INFO = "Info"
TRANSFER_DATA_FILE = "TransferDataFile"
TRANSFER_DATA_DIR = "TransferDataDir"
TRANSFER_SCRATCH = "TransferScratch"
CONVERT = "Convert"
RESIZE = "Resize"
PREALLOCATE = "Preallocate"
SYNC = "Sync"
COMPLETE = "Complete"
FAILED = "Failed"


@dataclass(frozen=True)
class Snapshot:
    """What the metrics say, read at once under the lock."""

    percent: float
    current: str
    phases: dict[str, list[int]]  # phase -> [done, total], in the order seen
    transferred: int
    retries: int
    rate: float | None  # the current phase's bytes per second over the window; None: too early to tell
    seconds_left: float | None  # the current phase's, at that rate; None: unknown
    durations: dict[str, float]  # phase -> seconds it took (the current one: so far)


class Progress:
    """Phase and byte progress; plain state, turned into metrics only when scraped. `clock` (monotonic
    seconds) is injectable for tests of the rate and the time left."""

    # the names it exports under: the importer's (the clone source exports the same families as its own)
    COUNTER = "kubevirt_cdi_import_progress"
    COUNTER_HELP = "The import progress in percentage"
    PREFIX = "cdi_importer"
    NAME = "cdi-importer"  # the metrics certificate's

    def __init__(self, owner_uid: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.owner_uid = owner_uid
        self._registry: Any = None
        self._lock = threading.Lock()
        self._clock = clock
        self._plan: list[tuple[str, float]] = [(INFO, 0.0)]
        self.current = INFO
        self._current_total = 0
        self._current_done = 0
        self._percent = 0.0
        self._transferred_value = 0
        self._retry_count = 0
        self._retrying: tuple[str, str, int] | None = None  # (reason, message, attempt) of the retry under way
        self._phases: dict[str, list[int]] = {}  # phase -> [done, total], in the order seen
        self._rate = RateWindow(clock)  # the current phase's
        self._fresh = True  # no byte count reported in the current phase yet
        self._started = clock()  # when the current phase began
        self._durations: dict[str, float] = {}  # phases left: how long they took
        self._set_phase(INFO)

    # -- phases -------------------------------------------------------------------------------------
    def plan(self, phases: list[tuple[str, float]]) -> None:
        """The phases this import will go through, each with its share of the 100%."""
        total = sum(w for _, w in phases) or 1.0
        with self._lock:
            self._plan = [(name, w / total) for name, w in phases]

    def begin(self, phase: str, total: int | None = None) -> None:
        with self._lock:
            self._finish_current()
            self.current = phase
            self._current_total = total or 0
            self._current_done = 0
            self._set_phase(phase)
            self._phases[phase] = [0, total or 0]
            self._start_clock()
            self._update_percent()
        log.info("phase %s%s", phase, f" ({total} bytes)" if total else "")

    def update(self, done: int) -> None:
        with self._lock:
            self._current_done = done
            self._phases[self.current][0] = done
            self._note(done)
            self._update_percent()

    def advance_fraction(self, fraction: float) -> None:
        """Progress of a phase measured as a fraction (qemu-img's percentage)."""
        with self._lock:
            if not self._current_total:
                self._current_total = 10000
            self._current_done = int(self._current_total * min(max(fraction, 0.0), 1.0))
            self._phases[self.current] = [self._current_done, self._current_total]
            self._note(self._current_done)
            self._update_percent()

    def complete(self) -> None:
        with self._lock:
            self._finish_current()
            self.current = COMPLETE
            self._set_phase(COMPLETE)
            self._start_clock()
            self._raise_to(100.0)

    def failed(self) -> None:
        with self._lock:
            self._time_current()  # what it did stays as it was
            self.current = FAILED
            self._set_phase(FAILED)
            self._start_clock()

    def transferred(self, total: int) -> None:
        with self._lock:
            self._transferred_value = max(self._transferred_value, total)

    def retried(self, reason: str, message: str, attempt: int) -> None:
        """A transient failure is being retried (attempt `attempt` of this operation failed)."""
        with self._lock:
            self._retry_count += 1
            self._retrying = (reason, message, attempt)

    def recovered(self) -> None:
        """The operation that was being retried went through."""
        with self._lock:
            self._retrying = None

    @property
    def retrying(self) -> tuple[str, str, int] | None:
        with self._lock:
            return self._retrying

    @property
    def retries(self) -> int:
        with self._lock:
            return self._retry_count

    @property
    def percent(self) -> float:
        return self._percent

    # -- internals (lock held) ----------------------------------------------------------------------
    def _set_phase(self, phase: str) -> None:
        self._phases.setdefault(phase, [0, 0])

    def _finish_current(self) -> None:
        if self._current_total:
            self._phases[self.current][0] = self._current_total
        self._time_current()

    def _time_current(self) -> None:
        if self.current not in (COMPLETE, FAILED):
            self._durations[self.current] = self._durations.get(self.current, 0.0) + \
                self._clock() - self._started

    def _start_clock(self) -> None:
        self._started = self._clock()
        self._rate.restart(0)
        self._fresh = True

    def _note(self, done: int) -> None:
        """The phase's rate window told `done`. Its first count restarts the window there: the bytes a resumed
        transfer already had, and the wait for the first byte, are no part of the rate."""
        if self._fresh:
            self._fresh = False
            self._rate.restart(done)
        else:
            self._rate.note(done)

    def _update_percent(self) -> None:
        before = 0.0
        share = 0.0
        for name, weight in self._plan:
            if name == self.current:
                share = weight
                break
            before += weight
        else:
            return
        fraction = self._current_done / self._current_total if self._current_total else 0.0
        value = 100.0 * (before + share * min(fraction, 1.0))
        self._raise_to(min(value, 99.99))

    def _raise_to(self, value: float) -> None:
        self._percent = max(self._percent, value)  # a counter: it never goes back

    # -- exposition ---------------------------------------------------------------------------------
    @property
    def registry(self) -> Any:
        """A dedicated CollectorRegistry (prometheus_client is imported only by pods that serve)."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(_Collector(self))
        return self._registry

    def snapshot(self) -> Snapshot:
        with self._lock:
            moving = self.current not in (COMPLETE, FAILED) and not self._fresh
            rate = self._rate.rate() if moving else None
            total = self._current_total
            left = max(0, total - self._current_done) / rate if rate and total else None
            durations = dict(self._durations)
            if self.current not in (COMPLETE, FAILED):
                durations[self.current] = durations.get(self.current, 0.0) + self._clock() - self._started
            return Snapshot(self._percent, self.current, {k: list(v) for k, v in self._phases.items()},
                            self._transferred_value, self._retry_count, rate, left, durations)

    def extra_metrics(self, now: Snapshot) -> Iterator[Any]:
        """The importer's own series besides the phases' (a subclass exports its own)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        uid = self.owner_uid
        sent = CounterMetricFamily(
            "cdi_importer_bytes_transferred", "Bytes received from the source", labels=["ownerUID"]
        )
        sent.add_metric([uid], now.transferred)
        yield sent
        retried = CounterMetricFamily(
            "cdi_importer_retries", "Transient failures retried inside the run", labels=["ownerUID"]
        )
        retried.add_metric([uid], now.retries)
        yield retried
        retrying = self.retrying
        if retrying is not None:
            reason, message, attempt = retrying
            gauge = GaugeMetricFamily(
                "cdi_importer_retrying",
                "The attempt of the failing operation being retried, with the failure's reason and message",
                labels=["ownerUID", "reason", "message"],
            )
            gauge.add_metric([uid, reason, message], attempt)
            yield gauge

    # -- serving ------------------------------------------------------------------------------------
    def serve(self, pod_ip: str, port: int) -> Any:
        """HTTPS /metrics on pod_ip:port with a fresh self-signed certificate (as CDI's importer)."""
        hosts = [pod_ip]
        try:
            ipaddress.ip_address(pod_ip)
        except ValueError:
            hosts = [pod_ip]
        from cdi.common import pki  # only pods that serve metrics pay for importing cryptography

        pair = pki.issue(None, self.NAME, hosts)
        directory = Path(tempfile.mkdtemp(prefix=f"{self.NAME}-metrics-"))
        cert, key = directory / "tls.crt", directory / "tls.key"
        pair.write(cert, key)
        import prometheus_client

        try:
            server, _thread = prometheus_client.start_http_server(
                port, addr=pod_ip, registry=self.registry, certfile=str(cert), keyfile=str(key)
            )
        except OSError as exc:  # progress is a nicety: an import never fails for want of it
            log.warning("not serving metrics on %s:%d: %s", pod_ip, port, exc)
            return None
        log.info("serving metrics on https://%s:%d/metrics", pod_ip, port)
        return server


class _Collector:
    """Builds the metric families from a Progress snapshot at each scrape (no `_created` series)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        progress = self.progress
        now = progress.snapshot()
        uid, prefix = progress.owner_uid, progress.PREFIX
        counter = CounterMetricFamily(progress.COUNTER, progress.COUNTER_HELP, labels=["ownerUID"])
        counter.add_metric([uid], now.percent)
        yield counter
        labels = ["ownerUID", "phase"]
        phase = GaugeMetricFamily(f"{prefix}_phase", "1 for the current phase", labels=labels)
        done = GaugeMetricFamily(f"{prefix}_phase_bytes_done", "Bytes processed in the phase", labels=labels)
        total = GaugeMetricFamily(f"{prefix}_phase_bytes_total", "Bytes the phase will process (0: unknown)",
                                  labels=labels)
        took = GaugeMetricFamily(f"{prefix}_phase_duration_seconds",
                                 "Seconds the phase took (the current one: so far)", labels=labels)
        for name, (phase_done, phase_total) in now.phases.items():
            phase.add_metric([uid, name], 1 if name == now.current else 0)
            done.add_metric([uid, name], phase_done)
            total.add_metric([uid, name], phase_total)
            if name in now.durations:
                took.add_metric([uid, name], round(now.durations[name], 3))
        yield from (phase, done, total, took)
        if now.rate is not None:
            rate = GaugeMetricFamily(f"{prefix}_phase_rate_bytes_per_second",
                                     "Bytes per second of the current phase over its last 10 s (0: stalled)",
                                     labels=labels)
            rate.add_metric([uid, now.current], round(now.rate))
            yield rate
        if now.seconds_left is not None:
            left = GaugeMetricFamily(f"{prefix}_phase_seconds_left",
                                     "Estimated seconds the current phase has left at its rate", labels=labels)
            left.add_metric([uid, now.current], round(now.seconds_left, 1))
            yield left
        yield from progress.extra_metrics(now)
