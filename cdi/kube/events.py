"""Kubernetes Events (core/v1), recorded the way client-go's `record.EventRecorder` does.

CDI reports progress and failures as events on DataVolumes and PVCs (`ImportScheduled`,
`ImportSucceeded`, `ErrImportFailed`...), and users read them with `kubectl describe`. Two rules make
the difference between useful events and an API-server DoS during a crash loop:

- Repeats aggregate: the same (object, type, reason, message) from the same component bumps `count`
  and `lastTimestamp` of the existing Event (a PATCH) instead of creating a new one.
- Recording never fails the caller: events are best effort. `record()` only queues; a background
  task writes, and failures are logged and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

from cdi.api.groups import EVENTS
from cdi.kube.client import KubeClient
from cdi.kube.errors import ApiError, NotFound

log = logging.getLogger(__name__)

Obj = dict[str, Any]
EventType = Literal["Normal", "Warning"]
NORMAL: EventType = "Normal"
WARNING: EventType = "Warning"
MAX_MESSAGE = 4096


def rfc3339(moment: datetime | None = None) -> str:
    """A `Time` as Kubernetes writes it: RFC 3339 in UTC, whole seconds."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_reference(obj: Mapping[str, Any]) -> Obj:
    """The `involvedObject` for `obj`: apiVersion, kind, namespace, name, uid, resourceVersion."""
    meta = obj.get("metadata") or {}
    ref: Obj = {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""), "name": meta.get("name", "")}
    for key in ("namespace", "uid", "resourceVersion"):
        if meta.get(key):
            ref[key] = meta[key]
    return ref


@dataclass
class _Recorded:
    name: str
    namespace: str
    count: int


@dataclass
class _Pending:
    ref: Obj
    type: str
    reason: str
    message: str

    @property
    def key(self) -> tuple[str, ...]:
        """What makes two events the same one (a repeat bumps the first one's count)."""
        ref = self.ref
        return (ref["apiVersion"], ref["kind"], str(ref.get("namespace") or "default"), ref["name"],
                str(ref.get("uid", "")), self.type, self.reason, self.message)


class EventRecorder:
    """Records Events for one component (`source.component`, `reportingComponent`)."""

    def __init__(self, client: KubeClient, component: str, *, host: str | None = None,
                 instance: str | None = None, max_pending: int = 1000, cache_size: int = 4096) -> None:
        self.client = client
        self.component = component
        self.host = host if host is not None else socket.gethostname()
        self.instance = instance or self.host
        self.cache_size = cache_size
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(max_pending)
        self._recorded: OrderedDict[tuple[str, ...], _Recorded] = OrderedDict()
        self._queued: dict[tuple[str, ...], int] = {}  # what record() accepted and the worker has not written
        self._worker: asyncio.Task[None] | None = None
        self.dropped = 0  # refused by record() (invalid, or the queue was full)
        self.failed = 0  # the API refused to store them

    def record(self, obj: Mapping[str, Any], type: EventType, reason: str, message: str) -> None:
        """Queue an event about `obj`; returns at once and never raises."""
        try:
            if type not in (NORMAL, WARNING):
                raise ValueError(f"event type must be Normal or Warning, not {type!r}")
            ref = object_reference(obj)
            if not ref["name"] or not ref["kind"]:
                raise ValueError("the object needs kind and metadata.name")
            self._ensure_worker()
            pending = _Pending(ref, type, reason, message[:MAX_MESSAGE])
            self._queue.put_nowait(pending)
            self._queued[pending.key] = self._queued.get(pending.key, 0) + 1
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("event queue full; dropped %s event %s on %s", type, reason, _describe(obj))
        except Exception as exc:
            self.dropped += 1
            log.warning("not recording %s event %s on %s: %s", type, reason, _describe(obj), exc)

    def recorded(self, obj: Mapping[str, Any], type: EventType, reason: str, message: str) -> bool:
        """Whether this event about `obj` was recorded by this recorder (and is still in its cache) or is
        queued: what a caller that must not repeat an event asks before the event can be listed back."""
        key = _Pending(object_reference(obj), type, reason, message[:MAX_MESSAGE]).key
        return key in self._queued or key in self._recorded

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued event has been written (or given up on)."""
        if self._worker is None:
            return
        async with asyncio.timeout(timeout):
            await self._queue.join()

    async def close(self, timeout: float | None = 5.0) -> None:
        """Write what is queued (for at most `timeout` seconds), then stop."""
        try:
            await self.flush(timeout)
        except TimeoutError:
            log.warning("gave up writing %d queued events", self._queue.qsize())
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.cancel()
            try:
                await worker
            except asyncio.CancelledError:
                pass

    async def __aenter__(self) -> EventRecorder:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work(), name=f"events-{self.component}")

    async def _work(self) -> None:
        while True:
            pending = await self._queue.get()
            try:
                await self._write(pending)
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                self.failed += 1
                log.warning("could not record %s event %s on %s/%s: %s", pending.type, pending.reason,
                            pending.ref["kind"], pending.ref["name"], exc)
            except Exception:
                self.failed += 1
                log.exception("could not record %s event %s", pending.type, pending.reason)
            finally:
                left = self._queued.get(pending.key, 1) - 1
                if left > 0:
                    self._queued[pending.key] = left
                else:
                    self._queued.pop(pending.key, None)
                self._queue.task_done()

    async def _write(self, pending: _Pending) -> None:
        ref = pending.ref
        namespace = str(ref.get("namespace") or "default")
        key = pending.key
        now = rfc3339()
        seen = self._recorded.get(key)
        if seen is not None:
            try:
                await self.client.patch(EVENTS, seen.name, {"count": seen.count + 1, "lastTimestamp": now},
                                        seen.namespace)
                seen.count += 1
                self._recorded.move_to_end(key)
                return
            except NotFound:
                del self._recorded[key]  # the event expired or was deleted: start a new one
        body: Obj = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{ref['name']}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": ref, "reason": pending.reason, "message": pending.message, "type": pending.type,
            "source": {"component": self.component, "host": self.host},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": self.component, "reportingInstance": self.instance,
        }
        created = await self.client.create(EVENTS, body, namespace)
        self._recorded[key] = _Recorded(created["metadata"]["name"], namespace, 1)
        while len(self._recorded) > self.cache_size:
            self._recorded.popitem(last=False)


def _describe(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')} {meta.get('namespace', '')}/{meta.get('name', '?')}"
