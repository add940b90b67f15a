"""Readiness, liveness and startup probes (`httpGet`, `tcpSocket`, `exec`) with the kubelet's timing
and thresholds: after `initialDelaySeconds`, one probe every `periodSeconds`, each allowed
`timeoutSeconds`; the result flips after `successThreshold` successes or `failureThreshold`
failures in a row. HTTP and TCP probes go to the pod's own IP; `exec` runs inside the container's
namespaces with `nsenter`."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from cdi.common import pki

Obj = dict[str, Any]


@dataclass
class ProbeResult:
    ok: bool
    message: str = ""


def resolve_port(port: Any, container: Obj) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    text = str(port)
    if text.isdigit():
        return int(text)
    for spec in container.get("ports") or []:
        if spec.get("name") == text:
            return int(spec["containerPort"])
    raise ValueError(f"port {text!r} is not a named port of the container")


async def http_probe(action: Obj, host: str, container: Obj, timeout: float) -> ProbeResult:
    """One `httpGet` probe with aiohttp, the HTTP client of the rest of the embedded control plane: a new
    connection each time, closed once the status is known (the body is never read), redirects not
    followed (a 3xx counts as success, as any status from 200 to 399), the certificate of an HTTPS
    endpoint not verified (as the kubelet)."""
    port = resolve_port(action.get("port"), container)
    host = action.get("host") or host
    path = action.get("path") or "/"
    if not path.startswith("/"):
        path = "/" + path
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    headers = {"Host": netloc, "User-Agent": "kube-probe/1.32", "Accept": "*/*", "Connection": "close"}
    for header in action.get("httpHeaders") or []:
        headers[header.get("name", "")] = header.get("value", "")
    scheme = (action.get("scheme") or "HTTP").lower()
    context = _insecure_context() if scheme == "https" else None
    try:
        async with asyncio.timeout(timeout), \
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context or False, force_close=True),
                                      skip_auto_headers=("Accept-Encoding",)) as session, \
                session.get(f"{scheme}://{netloc}{path}", headers=headers,
                            allow_redirects=False) as response:
            code = response.status
    except aiohttp.ClientResponseError as exc:  # an answer that is not HTTP
        return ProbeResult(False, f"malformed HTTP response from {host}:{port}: {exc.message}")
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        cause = getattr(exc, "os_error", None) or exc  # the connection's own error, without aiohttp's wording
        return ProbeResult(False, f'Get "{_url(action, host, port, path)}": {cause or type(exc).__name__}')
    if 200 <= code < 400:
        return ProbeResult(True)
    return ProbeResult(False, f"HTTP probe failed with statuscode: {code}")


def _url(action: Obj, host: str, port: int, path: str) -> str:
    return f"{(action.get('scheme') or 'HTTP').lower()}://{host}:{port}{path}"


async def tcp_probe(action: Obj, host: str, container: Obj, timeout: float) -> ProbeResult:
    port = resolve_port(action.get("port"), container)
    host = action.get("host") or host
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError) as exc:
        return ProbeResult(False, f"dial tcp {host}:{port}: {exc or 'i/o timeout'}")
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return ProbeResult(True)


# runs argv inside the container: (argv, timeout) -> (exit code, output)
ExecFn = Callable[[list[str], float], Awaitable[tuple[int, str]]]


async def exec_probe(action: Obj, run: ExecFn, timeout: float) -> ProbeResult:
    try:
        code, output = await run(list(action.get("command") or []), timeout)
    except TimeoutError:
        return ProbeResult(False, f"command timed out after {timeout:g}s")
    if code == 0:
        return ProbeResult(True)
    return ProbeResult(False, output.strip()[-1024:] or f"command exited with {code}")


async def run_probe(probe: Obj, host: str, container: Obj, run: ExecFn) -> ProbeResult:
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            return await http_probe(probe["httpGet"] or {}, host, container, timeout)
        if "tcpSocket" in probe:
            return await tcp_probe(probe["tcpSocket"] or {}, host, container, timeout)
        if "exec" in probe:
            return await exec_probe(probe["exec"] or {}, run, timeout)
    except ValueError as exc:
        return ProbeResult(False, str(exc))
    return ProbeResult(False, "probe has no handler (httpGet, tcpSocket or exec)")


class Prober:
    """Runs one probe of one container until cancelled. `changed(True, ...)` when successes reach
    the threshold from a failed state, `changed(False, ...)` when a streak of failures reaches the
    failure threshold (liveness and startup probes kill the container then); `failed` on every
    failure, for events."""

    def __init__(self, probe: Obj, host: str, container: Obj, run: ExecFn, initial: bool,
                 changed: Callable[[bool, ProbeResult], None],
                 failed: Callable[[ProbeResult], None] | None = None) -> None:
        self.probe = probe
        self.host = host
        self.container = container
        self.run = run
        self.result = initial
        self.changed = changed
        self.failed = failed

    async def loop(self) -> None:
        probe = self.probe
        period = float(probe.get("periodSeconds") or 10)
        success_needed = int(probe.get("successThreshold") or 1)
        failure_needed = int(probe.get("failureThreshold") or 3)
        await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
        successes = failures = 0
        while True:
            result = await run_probe(probe, self.host, self.container, self.run)
            if result.ok:
                successes, failures = successes + 1, 0
                if not self.result and successes >= success_needed:
                    self.result = True
                    self.changed(True, result)
            else:
                successes, failures = 0, failures + 1
                if self.failed is not None:
                    self.failed(result)
                if failures == failure_needed:  # once per streak of failures
                    self.result = False
                    self.changed(False, result)
            await asyncio.sleep(period)


_INSECURE: ssl.SSLContext | None = None


def _insecure_context() -> ssl.SSLContext:
    """The kubelet does not verify probe certificates. One context for all probes, made once, not one per
    HTTPS probe of every pod each period."""
    global _INSECURE
    if _INSECURE is None:
        _INSECURE = pki.insecure_client_context()
    return _INSECURE
