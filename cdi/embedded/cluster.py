"""The embedded control plane as one object: the API server now; the local node and local storage
join it (issue #3). `cdi up` starts it and adds CDI's own components on top."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cdi.embedded.apiserver.server import ApiServer, ServerConfig


@dataclass
class ClusterConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    watch_history: int = 20_000
    bookmark_interval: float = 10.0
    token_auth_file: Path | None = None


class EmbeddedCluster:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.apiserver = ApiServer(ServerConfig(config.data_dir, config.host, config.port, config.watch_history,
                                                config.bookmark_interval, config.token_auth_file))

    @property
    def kubeconfig_path(self) -> Path:
        return self.apiserver.kubeconfig_path

    @property
    def url(self) -> str:
        return self.apiserver.url

    async def start(self) -> None:
        await self.apiserver.start()

    async def stop(self) -> None:
        await self.apiserver.stop()
