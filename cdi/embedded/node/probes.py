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
    port = resolve_port(action.get("port"), container)
    host = action.get("host") or host
    path = action.get("path") or "/"
    if not path.startswith("/"):
        path = "/" + path
    headers = {"Host": f"{host}:{port}", "User-Agent": "kube-probe/1.32", "Accept": "*/*",
               "Connection": "close"}
    for header in action.get("httpHeaders") or []:
        headers[header.get("name", "")] = header.get("value", "")
    context = _insecure_context() if (action.get("scheme") or "HTTP").upper() == "HTTPS" else None
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, ssl=context)
            request = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            writer.write(request.encode())
            await writer.drain()
            line = await reader.readline()
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        return ProbeResult(False, f'Get "{_url(action, host, port, path)}": {exc or type(exc).__name__}')
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    parts = line.decode(errors="replace").split()
    try:
        code = int(parts[1])
    except (IndexError, ValueError):
        return ProbeResult(False, f"malformed HTTP response from {host}:{port}")
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
