"""Progress of a running worker pod, read from its metrics endpoint as CDI does
(`https://<podIP>:8443/metrics`, self-signed, so not verified), and formatted as DataVolume
`status.progress` ("45.67%")."""

from __future__ import annotations

import re
import ssl

import aiohttp

_CONTEXT = ssl.create_default_context()
_CONTEXT.check_hostname = False
_CONTEXT.verify_mode = ssl.CERT_NONE


def parse_progress(text: str, owner_uid: str) -> float | None:
    pattern = re.compile(r'^kubevirt_cdi_(?:import|clone)_progress_total\{ownerUID="' + re.escape(owner_uid) +
                         r'"\}\s+([0-9.eE+-]+)', re.MULTILINE)
    match = pattern.search(text)
    return float(match.group(1)) if match else None


def format_progress(value: float) -> str:
    return f"{min(max(value, 0.0), 100.0):.2f}%"


async def scrape(session: aiohttp.ClientSession, pod_ip: str, owner_uid: str, port: int = 8443) -> float | None:
    """The pod's progress percentage, or None when it cannot be read (yet)."""
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    try:
        async with session.get(f"https://{host}:{port}/metrics", ssl=_CONTEXT,
                               timeout=aiohttp.ClientTimeout(total=2)) as resp:
            if resp.status != 200:
                return None
            return parse_progress(await resp.text(), owner_uid)
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
