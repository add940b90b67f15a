"""What the API server runs beside its handlers until it stops (kube-controller-manager's loops that this
server does itself: garbage collection, ClusterRole aggregation, resource quota)."""

from __future__ import annotations

import abc
import asyncio
import contextlib


class BackgroundLoop(abc.ABC):
    """One task, started with the server and cancelled (and awaited) when it stops."""

    task_name = "background"

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.task_name)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @abc.abstractmethod
    async def _run(self) -> None:
        """The loop; it runs until cancelled."""
