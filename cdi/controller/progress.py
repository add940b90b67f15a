"""Progress of a running worker pod, read from its metrics endpoint as CDI does
(`https://<podIP>:8443/metrics`, self-signed, so not verified), and formatted as DataVolume
`status.progress` ("45.67%"); with it, for the DataVolume's Running condition, what the importer is
retrying, if anything (`cdi_importer_retrying`), else the step the worker is in with its bytes, rate and
time left (`cdi_importer_phase*` of an importer or an upload server, `cdi_cloner_phase*` of a clone
source), as "Convert: 1.2 GiB of 4.0 GiB, 310 MiB/s, about 7 s left".

Every reconciler that shows a worker's progress (import, upload and clone DataVolumes, the populators)
reads it through the one `ProgressScraper` of the controller's `Context`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp

from cdi.common import pki

_CONTEXT = pki.insecure_client_context()
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Retry:
    """A failing operation the importer is retrying: its reason code, message and attempt number."""

    reason: str
    message: str
    attempt: int

    def describe(self) -> str:
        return f"retrying: {self.message} (attempt {self.attempt})"


# the worker's phases as the Running condition names them (those not named say nothing: the worker is
# starting, or done and about to exit)
STEP_NAMES = {"TransferDataFile": "Transfer", "TransferDataDir": "Transfer", "TransferScratch": "Transfer",
              "Transfer": "Transfer", "Convert": "Convert", "Resize": "Resize", "Preallocate": "Preallocate",
              "Sync": "Sync"}
_PHASE_PREFIXES = ("cdi_importer", "cdi_cloner")


@dataclass(frozen=True)
class Step:
    """The step a worker is in: its phase's bytes done and total (0: unknown), the rate over the worker's
    window (0: stalled; None: too early to tell) and the time left at that rate (None: unknown)."""

    phase: str
    done: int = 0
    total: int = 0
    rate: float | None = None
    seconds_left: float | None = None

    def describe(self) -> str:
        """"Transfer: 1.2 GiB of 4.0 GiB, 310 MiB/s, about 7 s left"; rounded, so that it changes only when
        what it says does (not with every byte)."""
        name = STEP_NAMES.get(self.phase, self.phase)
        parts: list[str] = []
        if self.total:
            parts.append(f"{human_bytes(self.done)} of {human_bytes(self.total)}")
        elif self.done:
            parts.append(human_bytes(self.done))
        if self.rate is not None and (self.done or self.total):
            parts.append("stalled" if self.rate < 1 else f"{human_bytes(self.rate)}/s")
        if self.seconds_left is not None and self.rate and self.total:
            parts.append(f"about {human_seconds(self.seconds_left)} left")
        return f"{name}: {', '.join(parts)}" if parts else name


@dataclass(frozen=True)
class PodReport:
    progress: float | None
    retry: Retry | None
    step: Step | None = None

    def running_message(self) -> str | None:
        """What the Running condition says while the worker runs: the retry under way, else the step it is in;
        None when it says neither."""
        if self.retry is not None:
            return self.retry.describe()
        if self.step is not None:
            return self.step.describe()
        return None


def human_bytes(n: float) -> str:
    """Binary units, two significant figures below 10 ("1.2 GiB", "310 MiB", "0 B")."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            break
        n /= 1024
    if unit == "B" or n >= 9.95:
        return f"{n:.0f} {unit}"
    return f"{n:.1f} {unit}"


def human_seconds(seconds: float) -> str:
    """"7 s" up to 10 s, then "15 s" in steps of 5, "12 min", "2 h 10 min" in steps of 10 min: coarse
    enough that an estimate does not change with every look."""
    if seconds < 9.5:
        return f"{max(1, round(seconds))} s"
    if seconds < 57.5:
        return f"{5 * round(seconds / 5)} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    tens = round(seconds / 600)
    hours, rest = divmod(tens, 6)
    return f"{hours} h {rest * 10} min" if rest else f"{hours} h"


def parse_progress(text: str, owner_uid: str) -> float | None:
    pattern = re.compile(r'^kubevirt_cdi_(?:import|clone)_progress_total\{ownerUID="' + re.escape(owner_uid) +
                         r'"\}\s+([0-9.eE+-]+)', re.MULTILINE)
    match = pattern.search(text)
    return float(match.group(1)) if match else None


def _labels(text: str) -> dict[str, str]:
    return {m.group(1): re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], m.group(2))
            for m in _LABEL.finditer(text)}


def parse_retry(text: str, owner_uid: str) -> Retry | None:
    """The importer's `cdi_importer_retrying{ownerUID,reason,message} attempt`, if it is retrying."""
    for match in re.finditer(r'^cdi_importer_retrying\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}\s+([0-9.eE+-]+)',
                             text, re.MULTILINE):
        labels = _labels(match.group(1))
        if labels.get("ownerUID") == owner_uid:
            return Retry(labels.get("reason", ""), labels.get("message", ""), int(float(match.group(2))))
    return None


def _series(text: str, name: str, owner_uid: str) -> Iterator[tuple[dict[str, str], float]]:
    """The samples of metric `name` for `owner_uid`: their labels and values."""
    for match in re.finditer(r'^' + re.escape(name) + r'\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}\s+([0-9.eE+-]+)',
                             text, re.MULTILINE):
        labels = _labels(match.group(1))
        if labels.get("ownerUID") == owner_uid:
            yield labels, float(match.group(2))


def _phase_value(text: str, name: str, owner_uid: str, phase: str) -> float | None:
    return next((value for labels, value in _series(text, name, owner_uid) if labels.get("phase") == phase), None)


def parse_step(text: str, owner_uid: str) -> Step | None:
    """The worker's current phase (`<prefix>_phase{phase} 1`, prefix `cdi_importer` or `cdi_cloner`) with its
    bytes, rate and time left; None when it reports none."""
    for prefix in _PHASE_PREFIXES:
        current = next((labels["phase"] for labels, value in _series(text, f"{prefix}_phase", owner_uid)
                        if value == 1 and labels.get("phase")), None)
        if current is not None:
            if current not in STEP_NAMES:
                return None  # starting, or done
            done = _phase_value(text, f"{prefix}_phase_bytes_done", owner_uid, current)
            total = _phase_value(text, f"{prefix}_phase_bytes_total", owner_uid, current)
            return Step(current, int(done or 0), int(total or 0),
                        _phase_value(text, f"{prefix}_phase_rate_bytes_per_second", owner_uid, current),
                        _phase_value(text, f"{prefix}_phase_seconds_left", owner_uid, current))
    return None


def format_progress(value: float) -> str:
    return f"{min(max(value, 0.0), 100.0):.2f}%"


async def scrape(session: aiohttp.ClientSession, pod_ip: str, owner_uid: str,
                 port: int = 8443) -> PodReport | None:
    """What the pod reports, or None when it cannot be read (yet)."""
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    try:
        async with session.get(f"https://{host}:{port}/metrics", ssl=_CONTEXT,
                               timeout=aiohttp.ClientTimeout(total=2)) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    return PodReport(parse_progress(text, owner_uid), parse_retry(text, owner_uid), parse_step(text, owner_uid))



class ProgressScraper:
    """What worker pods report, read over one HTTP session the whole controller shares (opened at the
    first read, closed with the manager): a session per reconciler would keep a connection pool each
    to the same pods."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def read(self, pod_ip: str, owner_uid: str) -> PodReport | None:
        """The pod's report for `owner_uid`, or None when it cannot be read (yet)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return await scrape(self._session, pod_ip, owner_uid)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
