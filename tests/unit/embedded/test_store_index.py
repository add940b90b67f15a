"""The store's indexes (client-go's Indexers for the in-process controllers): a lookup finds exactly the objects
whose current version the index function names, through creates, updates that move an object from one value
to another, and removals."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdi.embedded.kubeapi.store import Store

KEY = "/persistentvolumes"


def claim_of(pv: Mapping[str, Any]) -> Iterable[str]:
    ref = (pv.get("spec") or {}).get("claimRef") or {}
    if ref.get("name"):
        yield f"{ref.get('namespace', '')}/{ref['name']}"


def pv(name: str, claim: str | None = None) -> dict[str, Any]:
    spec = {"claimRef": {"namespace": "ns", "name": claim}} if claim else {}
    return {"metadata": {"name": name}, "spec": spec}


def names(store: Store, value: str) -> list[str]:
    return [name for _, name, _ in store.by_index(KEY, "claim", value)]


def test_an_index_follows_every_write() -> None:
    store = Store(None)
    store.put(KEY, "", "before", pv("before", "a"))  # present when the index is added
    store.add_index(KEY, "claim", claim_of)
    assert names(store, "ns/a") == ["before"]
    store.put(KEY, "", "pv-2", pv("pv-2", "a"))
    store.put(KEY, "", "pv-1", pv("pv-1"))
    assert names(store, "ns/a") == ["before", "pv-2"]
    store.put(KEY, "", "pv-1", pv("pv-1", "b"))  # bound later
    store.put(KEY, "", "pv-2", pv("pv-2", "b"))  # handed over from a to b
    assert names(store, "ns/a") == ["before"]
    assert names(store, "ns/b") == ["pv-1", "pv-2"]
    store.remove(KEY, "", "pv-1")
    store.put(KEY, "", "before", pv("before"))  # released
    assert names(store, "ns/a") == []
    assert names(store, "ns/b") == ["pv-2"]
    assert names(store, "ns/nothing") == []
