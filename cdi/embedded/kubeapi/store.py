"""Objects in memory, persisted to SQLite, with the global resourceVersion counter and a bounded
history of changes that watches replay from.

Objects are kept as canonical JSON bytes (what list and get send), with the few parsed fields that
selectors and garbage collection look at, so memory stays small and readers can never mutate the
stored state. Every write is committed before it is acknowledged: with SQLite's WAL journal a
committed write survives `kill -9` of the server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
# the values an object is found under in one index (client-go's IndexFunc), from the object as stored
IndexFunc = Callable[[Mapping[str, Any]], Iterable[str]]


def _private(path: Path) -> None:
    """The database holds every Secret: it is created 0600 before SQLite opens it (SQLite creates its
    `-wal` and `-shm` files with the database's mode), and one an older version left 0644 is made 0600
    with the journal files beside it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", 0o600)


@dataclass(slots=True, frozen=True)
class Entry:
    """One stored object: its JSON, revision, and the parsed fields indexes need."""

    raw: bytes
    rv: int
    uid: str
    labels: Mapping[str, str]
    owners: tuple[str, ...]

    def obj(self) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self.raw)
        return value

    @classmethod
    def of(cls, obj: Mapping[str, Any], rv: int) -> Entry:
        meta = obj.get("metadata") or {}
        owners = tuple(str(ref.get("uid", "")) for ref in meta.get("ownerReferences") or ())
        return cls(orjson.dumps(obj), rv, str(meta.get("uid", "")), dict(meta.get("labels") or {}), owners)


@dataclass(slots=True, frozen=True)
class Change:
    rv: int
    key: str
    namespace: str
    name: str
    type: str
    entry: Entry
    previous: Entry | None


class Subscription:
    """A queue of changes for one watcher; overflows (a stuck client) end the watch instead of
    growing without bound."""

    LIMIT = 10_000

    def __init__(self, store: Store, key: str | None) -> None:
        self._store = store
        self.key = key
        self.queue: asyncio.Queue[Change | None] = asyncio.Queue()
        self.overflowed = False

    def push(self, change: Change) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() >= self.LIMIT:
            self.overflowed = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(change)

    def close(self) -> None:
        self._store.unsubscribe(self)
        self.queue.put_nowait(None)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self._store.unsubscribe(self)


class TooOld(Exception):
    """A watch asked for history the store no longer holds (HTTP 410 Gone)."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested, self.oldest = requested, oldest


class Store:
    def __init__(self, path: Path | None, history: int = 20_000) -> None:
        self._objects: dict[str, dict[tuple[str, str], Entry]] = {}
        self._by_uid: dict[str, tuple[str, str, str]] = {}
        self._dependents: dict[str, set[tuple[str, str, str]]] = {}
        self._indexers: dict[str, dict[str, IndexFunc]] = {}  # key -> index name -> function
        # (key, index name) -> value -> (namespace, name) of the objects found under it, and the reverse
        self._indexed: dict[tuple[str, str], dict[str, set[tuple[str, str]]]] = {}
        self._values: dict[tuple[str, str], dict[tuple[str, str], tuple[str, ...]]] = {}
        self._history: deque[Change] = deque(maxlen=history)
        self._subscribers: dict[str | None, set[Subscription]] = {}
        self._rv = 0
        self._floor = 0
        self._db = self._open(path)
        self._load()

    # -- persistence -------------------------------------------------------------------------------

    @staticmethod
    def _open(path: Path | None) -> sqlite3.Connection:
        if path is not None:
            _private(path)
        db = sqlite3.connect(str(path) if path else ":memory:", isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE IF NOT EXISTS objects (key TEXT, ns TEXT, name TEXT, body BLOB, "
                   "PRIMARY KEY (key, ns, name)) WITHOUT ROWID")
        db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        return db

    def _load(self) -> None:
        row = self._db.execute("SELECT v FROM meta WHERE k = 'rv'").fetchone()
        self._rv = int(row[0]) if row else 0
        for key, ns, name, body in self._db.execute("SELECT key, ns, name, body FROM objects"):
            obj = orjson.loads(body)
            rv = int(obj.get("metadata", {}).get("resourceVersion") or 0)
            self._index(key, ns, name, Entry.of(obj, rv))
            self._rv = max(self._rv, rv)  # puts record their revision only in the object itself
        self._floor = self._rv

    def close(self) -> None:
        self._db.close()

    # -- reads -------------------------------------------------------------------------------------

    @property
    def rv(self) -> int:
        return self._rv

    def get(self, key: str, namespace: str, name: str) -> Entry | None:
        return self._objects.get(key, {}).get((namespace, name))

    def items(self, key: str, namespace: str | None = None) -> list[tuple[str, str, Entry]]:
        """Objects under `key` sorted by namespace and name (the order list pages follow)."""
        bucket = self._objects.get(key, {})
        pairs = bucket.items() if namespace is None else ((k, v) for k, v in bucket.items() if k[0] == namespace)
        return [(ns, name, entry) for (ns, name), entry in sorted(pairs, key=lambda kv: kv[0])]

    def count(self, key: str) -> int:
        return len(self._objects.get(key, {}))

    def stored_keys(self) -> list[str]:
        return [k for k, bucket in self._objects.items() if bucket]

    def locate(self, uid: str) -> tuple[str, str, str] | None:
        return self._by_uid.get(uid)

    def dependents(self, owner_uid: str) -> set[tuple[str, str, str]]:
        return set(self._dependents.get(owner_uid, ()))

    def add_index(self, key: str, name: str, function: IndexFunc) -> None:
        """Keep the objects under `key` findable by what `function` says of each (client-go's Indexers, which
        the in-process controllers have no informer cache for): kept on every write, so that a controller
        looking for "the volumes claiming this claim" reads a set instead of decoding the whole kind on
        every event, which made each DataVolume's cost grow with the number of DataVolumes."""
        self._indexers.setdefault(key, {})[name] = function
        self._indexed[(key, name)] = {}
        self._values[(key, name)] = {}
        for namespace, object_name, entry in self.items(key):
            self._index_values(key, name, function, (namespace, object_name), entry.obj())

    def by_index(self, key: str, name: str, value: str) -> list[tuple[str, str, Entry]]:
        """The objects under `key` that index `name` finds under `value`, sorted as `items`."""
        found = []
        bucket = self._objects.get(key, {})
        for ref in sorted(self._indexed[(key, name)].get(value, ())):
            entry = bucket.get(ref)
            if entry is not None:
                found.append((ref[0], ref[1], entry))
        return found

    def _index_values(self, key: str, name: str, function: IndexFunc, ref: tuple[str, str],
                      obj: Mapping[str, Any] | None) -> None:
        """File `ref` under the values `function` gives `obj` (under none when None: removed)."""
        indexed, values = self._indexed[(key, name)], self._values[(key, name)]
        for old in values.pop(ref, ()):
            refs = indexed.get(old)
            if refs is not None:
                refs.discard(ref)
                if not refs:
                    del indexed[old]
        if obj is None:
            return
        new = tuple(dict.fromkeys(function(obj)))
        if new:
            values[ref] = new
            for value in new:
                indexed.setdefault(value, set()).add(ref)

    def _reindex(self, key: str, ref: tuple[str, str], obj: Mapping[str, Any] | None) -> None:
        for name, function in self._indexers.get(key, {}).items():
            self._index_values(key, name, function, ref, obj)

    # -- writes ------------------------------------------------------------------------------------

    def put(self, key: str, namespace: str, name: str, obj: dict[str, Any]) -> Entry:
        """Store `obj` at the next revision (written into its metadata) and notify watchers."""
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        entry = Entry.of(obj, self._rv)
        # One autocommitted statement: the revision is inside the object, so the counter needs no row
        # of its own (removals, which leave no object behind, record it in `meta`).
        self._db.execute("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)", (key, namespace, name, entry.raw))
        previous = self.get(key, namespace, name)
        if previous is not None:
            self._unindex(key, namespace, name, previous)
        self._index(key, namespace, name, entry)
        self._reindex(key, (namespace, name), obj)
        self._publish(Change(self._rv, key, namespace, name, MODIFIED if previous else ADDED, entry, previous))
        return entry

    def remove(self, key: str, namespace: str, name: str) -> Entry | None:
        previous = self.get(key, namespace, name)
        if previous is None:
            return None
        self._rv += 1
        obj = previous.obj()
        obj["metadata"]["resourceVersion"] = str(self._rv)
        entry = Entry.of(obj, self._rv)
        self._db.execute("BEGIN")
        self._db.execute("DELETE FROM objects WHERE key = ? AND ns = ? AND name = ?", (key, namespace, name))
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('rv', ?)", (str(self._rv),))
        self._db.execute("COMMIT")
        self._unindex(key, namespace, name, previous)
        self._reindex(key, (namespace, name), None)
        self._publish(Change(self._rv, key, namespace, name, DELETED, entry, previous))
        return entry

    def _index(self, key: str, namespace: str, name: str, entry: Entry) -> None:
        self._objects.setdefault(key, {})[(namespace, name)] = entry
        if entry.uid:
            self._by_uid[entry.uid] = (key, namespace, name)
        for owner in entry.owners:
            self._dependents.setdefault(owner, set()).add((key, namespace, name))

    def _unindex(self, key: str, namespace: str, name: str, entry: Entry) -> None:
        self._objects.get(key, {}).pop((namespace, name), None)
        if entry.uid and self._by_uid.get(entry.uid) == (key, namespace, name):
            del self._by_uid[entry.uid]
        for owner in entry.owners:
            deps = self._dependents.get(owner)
            if deps is not None:
                deps.discard((key, namespace, name))
                if not deps:
                    del self._dependents[owner]

    # -- watch -------------------------------------------------------------------------------------

    def _publish(self, change: Change) -> None:
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        self._history.append(change)
        for sub in self._subscribers.get(change.key, ()):
            sub.push(change)
        for sub in self._subscribers.get(None, ()):
            sub.push(change)

    def subscribe(self, key: str | None) -> Subscription:
        """Changes under `key` (every key when None) from now on."""
        sub = Subscription(self, key)
        self._subscribers.setdefault(key, set()).add(sub)
        return sub

    def end_watches(self) -> None:
        """Ends every open watch (shutdown): each subscriber sees the end of its stream."""
        for subs in list(self._subscribers.values()):
            for sub in list(subs):
                sub.queue.put_nowait(None)

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.get(sub.key, set()).discard(sub)

    def history_since(self, rv: int, key: str | None) -> Iterator[Change]:
        """Changes after `rv`; raises TooOld when some of them are no longer held."""
        if rv < self._floor:
            raise TooOld(rv, self._floor)
        for change in self._history:
            if change.rv > rv and (key is None or change.key == key):
                yield change

    @property
    def watcher_count(self) -> int:
        return sum(len(s) for s in self._subscribers.values())
