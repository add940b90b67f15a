"""Progress of a running worker pod, read from its metrics endpoint as CDI does
(`https://<podIP>:8443/metrics`, self-signed, so not verified), and formatted as DataVolume
`status.progress` ("45.67%"); with it, what the importer is retrying, if anything
(`cdi_importer_retrying`), for the DataVolume's Running condition.

Every reconciler that shows a worker's progress (import DataVolumes, clones, the import populator)
reads it through the one `ProgressScraper` of the controller's `Context`."""

from __future__ import annotations

import re
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


@dataclass(frozen=True)
class PodReport:
    progress: float | None
    retry: Retry | None


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
    return PodReport(parse_progress(text, owner_uid), parse_retry(text, owner_uid))



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
