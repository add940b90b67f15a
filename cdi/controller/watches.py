"""What a reconciler watches, declared by the reconciler itself, as CDI's controllers declare theirs
(`add...ControllerWatches`) and kopf's handlers are declared beside what they handle: a `Watch` names a
kind and maps an event's object to the keys the reconciler looks at again. Keeping the mapping next to
the reconcile it feeds means a reconciler that comes to depend on another kind says so where its
readers look, and the manager stays a loop that registers every declaration on the shared informers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cdi.api.groups import GVR
from cdi.kube import Informer

Obj = dict[str, Any]
KeysOf = Callable[[Obj], Iterable[str]]


@dataclass(frozen=True)
class Watch:
    """An event on an object of `kind` (added, updated, deleted) requeues `keys(object)`: the object as it
    is now, and, with `before_too`, also as it was before an update (for what an object stopped naming:
    a claim that no longer uses a cron's image lets the cron collect it)."""

    kind: GVR
    keys: KeysOf
    before_too: bool = False

    def keys_of(self, obj: Obj, before: Obj | None = None) -> list[str]:
        """The keys one event requeues, each once: `obj` is the object after the event (the deleted one
        for a delete), `before` the object an update replaced."""
        keys = dict.fromkeys(self.keys(obj))
        if before is not None and self.before_too:
            keys.update(dict.fromkeys(self.keys(before)))
        return list(keys)


def register(informer: Informer, watch: Watch, enqueue: Callable[[str], None]) -> None:
    """Run `watch` on `informer`'s events, putting the keys it maps to on a queue through `enqueue`."""
    if informer.gvr != watch.kind:
        raise ValueError(f"a watch of {watch.kind.kind} registered on the {informer.gvr.kind} informer")

    def added(obj: Obj) -> None:
        for key in watch.keys_of(obj):
            enqueue(key)

    def updated(old: Obj, new: Obj) -> None:
        for key in watch.keys_of(new, old):
            enqueue(key)

    informer.add_handler(added, updated, added)
