"""An in-process embedded API server per test (it starts in milliseconds), clients pointed at it
directly or through a `TcpProxy` that can cut or stall the connection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi.embedded.kubeapi.server import ApiServer, ServerConfig
from cdi.kube import KubeClient
from tests.support.tcpproxy import TcpProxy


async def eventually(predicate: Callable[[], Any], timeout: float = 10.0, message: str = "condition") -> Any:
    """Poll `predicate` (plain or async) until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if isinstance(last, Awaitable):
            last = await last
        if last:
            return last
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {last!r})")


class Cluster:
    """The server plus helpers to make clients for it (direct or through a proxy)."""

    def __init__(self, tmp_path: Path, **config: Any) -> None:
        self.tmp_path = tmp_path
        self.config = ServerConfig(data_dir=tmp_path / "apiserver", **config)
        self.server = ApiServer(self.config)
        self.proxies: list[TcpProxy] = []
        self.clients: list[KubeClient] = []

    async def start(self) -> None:
        await self.server.start()

    async def restart(self) -> None:
        """Stop and start the server on the same port with the same state (watches are cut; their
        old resourceVersions expire)."""
        port = self.server.port
        await self.server.stop()
        self.server = ApiServer(ServerConfig(**{**self.config.__dict__, "port": port}))
        await self.server.start()

    async def client(self, *, request_timeout: float = 10.0) -> KubeClient:
        client = await KubeClient.connect(self.server.kubeconfig_path, request_timeout=request_timeout)
        self.clients.append(client)
        return client

    async def proxy(self) -> TcpProxy:
        proxy = TcpProxy("127.0.0.1", self.server.port)
        await proxy.start()
        self.proxies.append(proxy)
        return proxy

    async def proxied_client(self, proxy: TcpProxy, *, request_timeout: float = 2.0) -> KubeClient:
        kubeconfig = yaml.safe_load(self.server.kubeconfig_path.read_text())
        kubeconfig["clusters"][0]["cluster"]["server"] = proxy.url
        path = self.tmp_path / f"kubeconfig-proxy-{proxy.port}"
        path.write_text(yaml.safe_dump(kubeconfig))
        client = await KubeClient.connect(path, request_timeout=request_timeout, connect_timeout=request_timeout)
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        for proxy in self.proxies:
            await proxy.stop()
        await self.server.stop()


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    """`@pytest.mark.server(watch_history=5, bookmark_interval=...)` overrides the server settings."""
    marker = request.node.get_closest_marker("server")
    config = {"watch_history": 1000, "bookmark_interval": 0.2, **(marker.kwargs if marker else {})}
    cluster = Cluster(tmp_path, **config)
    await cluster.start()
    yield cluster
    await cluster.close()


@pytest.fixture
async def client(cluster: Cluster) -> KubeClient:
    return await cluster.client()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "server(**config): settings of the embedded API server for this test")
