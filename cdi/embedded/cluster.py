"""The embedded control plane as one object: the API server, the local storage and the local node.
`cdi up` starts it and adds CDI's own components on top.

Order matters both ways: storage and node need the API server to start, and stop before it, so
that every container is stopped (no process outlives `cdi up`) and every ext4 volume unmounted
while their objects can still be read."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from cdi.embedded.control import LocalApi
from cdi.embedded.kubeapi.server import ApiServer, ServerConfig
from cdi.embedded.node.node import LocalNode, node_name
from cdi.embedded.storage.local import LocalStorage

log = logging.getLogger(__name__)


@dataclass
class ClusterConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    watch_history: int = 20_000
    bookmark_interval: float = 10.0
    token_auth_file: Path | None = None
    ext4_volumes: bool = False      # each Filesystem volume a loop-mounted ext4 image of its size (root)
    restart_backoff: float = 10.0   # the kubelet's first CrashLoopBackOff delay, doubling up to 300s
    shutdown_grace: float = 5.0     # seconds containers get to exit when `cdi up` stops
    feature_gates: frozenset[str] = frozenset()  # kube-apiserver's gates that are on (`--feature-gates`)


class EmbeddedCluster:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.apiserver = ApiServer(ServerConfig(config.data_dir, config.host, config.port, config.watch_history,
                                                config.bookmark_interval, config.token_auth_file,
                                                config.feature_gates))
        self.api = LocalApi(self.apiserver.objects)
        name = node_name()
        self.storage = LocalStorage(self.api, config.data_dir / "storage", name, ext4=config.ext4_volumes)
        self.node = LocalNode(self.api, config.data_dir / "node", self.storage.publish, name=name,
                              hide=[config.data_dir], restart_backoff=config.restart_backoff,
                              shutdown_grace=config.shutdown_grace)

    @property
    def kubeconfig_path(self) -> Path:
        return self.apiserver.kubeconfig_path

    @property
    def url(self) -> str:
        return self.apiserver.url

    async def start(self) -> None:
        await self.apiserver.start()
        try:
            await self.storage.start()
            await self.node.start()
        except BaseException:
            await self.stop()
            raise
        self.apiserver.handlers.log_source = self.node.logs

    async def stop(self) -> None:
        self.apiserver.handlers.log_source = None
        for part in (self.node, self.storage):
            try:
                await part.stop()
            except Exception:
                log.exception("stopping %s failed", type(part).__name__)
        with contextlib.suppress(Exception):
            await self.apiserver.stop()
