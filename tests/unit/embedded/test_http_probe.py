"""The embedded kubelet's `httpGet` probe against local servers: 200-399 succeed (a redirect is not
followed), other statuses, refused connections and answers that are not HTTP fail with a reason, HTTPS
is not verified, and the probe's headers reach the server."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from cdi.common import pki
from cdi.embedded.node.probes import http_probe

CONTAINER = {"ports": [{"name": "http", "containerPort": 0}]}


async def _serve(ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int, list[dict[str, str]]]:
    seen: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        status = int(request.match_info["status"])
        if status in (301, 302):
            raise web.HTTPFound("/status/500")
        return web.Response(status=status, text="x" * 100_000)

    app = web.Application()
    app.router.add_get("/status/{status}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], seen  # type: ignore[union-attr]


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, list[dict[str, str]]]]:
    runner, port, seen = await _serve()
    yield port, seen
    await runner.cleanup()


@pytest.mark.parametrize(("status", "ok"), [(200, True), (204, True), (302, True), (399, True), (400, False),
                                            (500, False)])
async def test_status_decides(server: tuple[int, list[dict[str, str]]], status: int, ok: bool) -> None:
    port, seen = server
    result = await http_probe({"path": f"/status/{status}", "port": port}, "127.0.0.1", {}, 2)
    assert result.ok is ok
    assert len(seen) == 1  # a redirect is not followed
    if not ok:
        assert result.message == f"HTTP probe failed with statuscode: {status}"


async def test_headers_and_named_port(server: tuple[int, list[dict[str, str]]]) -> None:
    port, seen = server
    container = {"ports": [{"name": "http", "containerPort": port}]}
    action = {"path": "status/200", "port": "http", "httpHeaders": [{"name": "X-Probe", "value": "yes"},
                                                                    {"name": "Host", "value": "example.test"}]}
    assert (await http_probe(action, "127.0.0.1", container, 2)).ok
    headers = seen[0]
    assert headers["User-Agent"].startswith("kube-probe/")
    assert headers["X-Probe"] == "yes" and headers["Host"] == "example.test"
    assert "Accept-Encoding" not in headers


async def test_https_is_not_verified(tmp_path: Path) -> None:
    context = pki.server_context(pki.issue(None, "self-signed", ["elsewhere.test"]), tmp_path)
    runner, port, _ = await _serve(context)
    try:
        result = await http_probe({"path": "/status/200", "port": port, "scheme": "HTTPS"}, "127.0.0.1", {}, 2)
    finally:
        await runner.cleanup()
    assert result.ok, result.message


async def test_a_refused_connection_fails_with_the_url() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: refused
        result = await http_probe({"path": "/healthz", "port": port}, "127.0.0.1", {}, 2)
    assert not result.ok
    assert result.message.startswith(f'Get "http://127.0.0.1:{port}/healthz": ')


async def test_an_answer_that_is_not_http_fails() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(garbage, "127.0.0.1", 0)
    try:
        port = listener.sockets[0].getsockname()[1]
        result = await http_probe({"port": port}, "127.0.0.1", {}, 2)
    finally:
        listener.close()
    assert not result.ok and result.message


async def test_a_silent_server_times_out() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        port = listener.sockets[0].getsockname()[1]
        result = await http_probe({"port": port}, "127.0.0.1", {}, 0.2)
    finally:
        listener.close()
    assert not result.ok and result.message.startswith(f'Get "http://127.0.0.1:{port}/": ')
