"""An informer: a local, always-converging copy of one kind, plus callbacks on every change.

The loop is client-go's reflector, shaped after KubeSpawner's `reflector.py` and kopf's `watching.py`:

1. List (paged) and remember the list's resourceVersion.
2. Watch from that resourceVersion with bookmarks, so that a quiet watch still moves the
   resourceVersion forward and a reconnect does not replay (or outlive) the server's history.
3. The server ends every watch after `timeoutSeconds` (jittered, so a fleet of informers does not
   reconnect in lockstep); reconnect from the last resourceVersion seen, event or bookmark.
4. If no byte arrives for `inactivity_timeout` seconds, assume a dead connection (a half-open TCP
   connection looks exactly like a quiet resource) and reconnect the same way.
5. On 410 Gone, as an HTTP answer or as an in-stream ERROR event, the history we need is gone:
   relist, and turn the difference between the old cache and the new list into synthetic
   add/update/delete callbacks, so an object deleted while we were away still produces a delete.
6. Any other failure: jittered exponential backoff, then continue from where we were.

Callbacks run one at a time, in event order, on the informer's task; they may be plain functions
or coroutines. They should be quick (typically: put a key into a `WorkQueue`). Objects handed to
callbacks and returned by the cache are shared: treat them as read-only."""

from __future__ import annotations

import asyncio
import builtins
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from cdi.api.groups import GVR
from cdi.kube.client import KubeClient, ObjectList, WatchEvent
from cdi.kube.errors import ApiError, Gone, WatchInactive
from cdi.kube.paths import make_key, object_key
from cdi.kube.retry import Backoff

log = logging.getLogger(__name__)

Obj = dict[str, Any]
AddHandler = Callable[[Obj], Awaitable[None] | None]
UpdateHandler = Callable[[Obj, Obj], Awaitable[None] | None]
DeleteHandler = Callable[[Obj], Awaitable[None] | None]
IndexFunc = Callable[[Obj], Iterable[str]]


@dataclass
class InformerStats:
    """Counters for metrics and tests: what the loop has done so far."""

    lists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    gone: int = 0
    inactivity_timeouts: int = 0
    errors: int = 0


@dataclass
class _Handler:
    on_add: AddHandler | None
    on_update: UpdateHandler | None
    on_delete: DeleteHandler | None


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    """List+watch of one `GVR` (optionally one namespace and selectors) into a cache keyed by
    "namespace/name" ("name" for cluster-scoped kinds).

    Use as `async with Informer(...) as informer: await informer.wait_synced()`, or `start()`/`stop()`."""

    def __init__(self, client: KubeClient, gvr: GVR, namespace: str | None = None, *,
                 label_selector: str | None = None, field_selector: str | None = None,
                 watch_timeout: float = 300.0, inactivity_timeout: float | None = 150.0,
                 page_size: int = 500, backoff: Backoff | None = None) -> None:
        self.client = client
        self.gvr = gvr
        self.namespace = namespace if gvr.namespaced else None
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.inactivity_timeout = inactivity_timeout
        self.page_size = page_size
        self.backoff = backoff or Backoff(initial=0.2, maximum=30.0)
        self.stats = InformerStats()
        self._cache: dict[str, Obj] = {}
        self._indexers: dict[str, IndexFunc] = {}
        self._indices: dict[str, dict[str, set[str]]] = {}
        self._handlers: list[_Handler] = []
        self._resource_version = ""
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()

    def __repr__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"<Informer {self.gvr.plural}.{self.gvr.group or 'core'}{where} rv={self._resource_version}>"

    # -- cache -------------------------------------------------------------------------------------

    def get(self, key: str) -> Obj | None:
        """The cached object for "namespace/name" (or "name"), or None."""
        return self._cache.get(key)

    def get_by_name(self, name: str, namespace: str | None = None) -> Obj | None:
        return self._cache.get(make_key(namespace if self.gvr.namespaced else None, name))

    def list(self, namespace: str | None = None) -> builtins.list[Obj]:
        """Every cached object, or those of one namespace."""
        if namespace is None:
            return list(self._cache.values())
        return [o for o in self._cache.values() if (o.get("metadata") or {}).get("namespace") == namespace]

    def keys(self) -> builtins.list[str]:
        return list(self._cache)

    def __len__(self) -> int:
        return len(self._cache)

    def __contains__(self, key: object) -> bool:
        return key in self._cache

    def add_index(self, name: str, func: IndexFunc) -> None:
        """Maintain a secondary index: `func(obj)` yields the values `by_index(name, value)` finds it under
        (for example the uids of its owners, so a controller can find a DataVolume's pods)."""
        self._indexers[name] = func
        self._indices[name] = {}
        for key, obj in self._cache.items():
            self._index(name, func, key, obj)

    def has_index(self, name: str) -> bool:
        return name in self._indexers

    def by_index(self, name: str, value: str) -> builtins.list[Obj]:
        keys = self._indices[name].get(value, set())
        return [self._cache[k] for k in sorted(keys) if k in self._cache]

    def _index(self, name: str, func: IndexFunc, key: str, obj: Obj) -> None:
        try:
            values = list(func(obj))
        except Exception:
            log.exception("%r: index %s failed on %s", self, name, key)
            return
        index = self._indices[name]
        for value in values:
            index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: Obj) -> None:
        for name, func in self._indexers.items():
            index = self._indices[name]
            try:
                values = list(func(obj))
            except Exception:
                continue
            for value in values:
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]

    def _store(self, key: str, obj: Obj) -> Obj | None:
        old = self._cache.get(key)
        if old is not None:
            self._unindex(key, old)
        self._cache[key] = obj
        for name, func in self._indexers.items():
            self._index(name, func, key, obj)
        return old

    def _remove(self, key: str) -> Obj | None:
        old = self._cache.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    # -- handlers ----------------------------------------------------------------------------------

    def add_handler(self, on_add: AddHandler | None = None, on_update: UpdateHandler | None = None,
                    on_delete: DeleteHandler | None = None) -> None:
        """Register callbacks (before `start`, so that no object is missed)."""
        if self._task is not None:
            raise RuntimeError("register informer handlers before starting it")
        self._handlers.append(_Handler(on_add, on_update, on_delete))

    async def _call(self, what: str, fn: Callable[..., Awaitable[None] | None] | None, *args: Obj) -> None:
        if fn is None:
            return
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%r: %s handler failed", self, what)

    async def _added(self, obj: Obj) -> None:
        for h in self._handlers:
            await self._call("add", h.on_add, obj)

    async def _updated(self, old: Obj, new: Obj) -> None:
        for h in self._handlers:
            await self._call("update", h.on_update, old, new)

    async def _deleted(self, obj: Obj) -> None:
        for h in self._handlers:
            await self._call("delete", h.on_delete, obj)

    # -- state -------------------------------------------------------------------------------------

    @property
    def has_synced(self) -> bool:
        """True once the first list is in the cache and its add callbacks have run."""
        return self._synced.is_set()

    async def wait_synced(self, timeout: float | None = None) -> None:
        async with asyncio.timeout(timeout):
            await self._synced.wait()

    @property
    def resource_version(self) -> str:
        """The last resourceVersion seen: from the last list, event or bookmark."""
        return self._resource_version

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"informer-{self.gvr.plural}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def __aenter__(self) -> Informer:
        self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def run(self) -> None:
        """The list/watch loop; runs until cancelled."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                    self.backoff.reset()
                if not await self._watch():
                    await self.backoff.sleep()  # a server that keeps ending empty watches at once
            except Gone as exc:
                self.stats.gone += 1
                log.info("%r: %s; relisting", self, exc)
                need_list = True
            except WatchInactive as exc:
                self.stats.inactivity_timeouts += 1
                log.info("%r: %s; reconnecting", self, exc)
            except ApiError as exc:
                self.stats.errors += 1
                delay = self.backoff.next()
                log.warning("%r: %s; retrying in %.1fs", self, exc, delay)
                await asyncio.sleep(delay)
            except Exception:
                self.stats.errors += 1
                delay = self.backoff.next()
                log.exception("%r: unexpected failure; retrying in %.1fs", self, delay)
                await asyncio.sleep(delay)

    async def _list(self) -> ObjectList:
        try:
            return await self.client.list_all(self.gvr, self.namespace, label_selector=self.label_selector,
                                              field_selector=self.field_selector, page_size=self.page_size)
        except Gone:
            # A continue token can expire between pages on a busy server; one unpaged list avoids it.
            page = await self.client.list(self.gvr, self.namespace, label_selector=self.label_selector,
                                          field_selector=self.field_selector)
            return ObjectList(page.items, page.resource_version)

    async def _relist(self) -> None:
        listed = await self._list()
        fresh = {object_key(obj): obj for obj in listed.items}
        previous = self._cache
        self._cache = {}
        self._indices = {name: {} for name in self._indexers}
        for key, obj in fresh.items():
            self._store(key, obj)
        self._resource_version = listed.resource_version
        self.stats.lists += 1
        log.debug("%r: listed %d objects", self, len(fresh))
        for key, obj in fresh.items():
            old = previous.get(key)
            if old is None:
                await self._added(obj)
            elif _rv(old) != _rv(obj):
                await self._updated(old, obj)
        for key, old in previous.items():
            if key not in fresh:
                await self._deleted(old)
        self._synced.set()

    async def _watch(self) -> bool:
        """One watch request; False if the server ended it at once without sending anything."""
        timeout = max(1, int(self.watch_timeout * (1 + self._rng.random())))
        started = time.monotonic()
        received = 0
        async with self.client.watch(self.gvr, self.namespace, resource_version=self._resource_version,
                                     label_selector=self.label_selector, field_selector=self.field_selector,
                                     timeout_seconds=timeout, allow_bookmarks=True,
                                     inactivity_timeout=self.inactivity_timeout) as stream:
            self.stats.watches += 1
            async for event in stream:
                if received == 0:
                    self.backoff.reset()
                received += 1
                await self._apply(event)
        return received > 0 or time.monotonic() - started >= min(1.0, self.watch_timeout / 2)

    async def _apply(self, event: WatchEvent) -> None:
        if event.resource_version:
            self._resource_version = event.resource_version
        if event.type == "BOOKMARK":
            self.stats.bookmarks += 1
            return
        self.stats.events += 1
        obj = event.object
        key = object_key(obj)
        if event.type in ("ADDED", "MODIFIED"):
            old = self._store(key, obj)
            if old is None:
                await self._added(obj)
            else:
                await self._updated(old, obj)
        elif event.type == "DELETED":
            if self._remove(key) is not None:
                await self._deleted(obj)
        else:
            log.warning("%r: ignoring watch event of type %s", self, event.type)
