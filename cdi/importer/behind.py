"""`Behind`: one kind of work done in a thread of its own, in the order it was handed over, at most
`depth` items behind the thread that hands it over.

Two users: `WriteBehind` (a decompressing reader's chunks written while it reads on), and the hashing of
fetched spans (`ImportContext.fetch_spans`: the spans' sha256 computed while the next spans are fetched,
written and checkpointed). Both do work that lets go of the GIL (pwrite, memmove, hashlib on more than
2047 bytes), so the two threads really run at once.

The first failure of the work is raised in the handing thread, by its next `put` or by `close`; the items
handed over after it are dropped, so a `put` never waits for a thread that has stopped working. `depth=0`
does the work in the caller's thread instead (no thread, no hand-off).

Items are handed over by reference: the caller must not touch what an item refers to until the work is
done with it. `Behind` says when that is only through the work itself (the hashing of a span hands its
buffer back to the fetcher's pool as its last step); `close` waits for all of it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Behind(Generic[T]):
    def __init__(self, work: Callable[[T], None], depth: int, name: str) -> None:
        self._work = work
        self.queue: queue.Queue[tuple[T] | None] = queue.Queue(depth)
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        if depth:
            self.thread = threading.Thread(target=self._run, name=name, daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self._work(item[0])
                except BaseException as exc:  # re-raised in the handing thread
                    self.error = exc

    def put(self, item: T) -> None:
        """Hand `item` over (waiting while `depth` items are still to do); raise an earlier failure."""
        if self.error is not None:
            raise self.error
        if self.thread is None:
            self._work(item)
        else:
            self.queue.put((item,))

    def close(self, quiet: bool = False) -> None:
        """Wait until every item handed over is done; re-raise a failure (unless `quiet`: already failing)."""
        if self.thread is None:
            return
        self.queue.put(None)
        self.thread.join()
        if self.error is not None and not quiet:
            raise self.error
