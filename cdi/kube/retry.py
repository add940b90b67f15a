"""Jittered exponential backoff, and client-go's `RetryOnConflict`.

Jitter matters more than the exact curve: after an API server restart every informer and every
controller of every component reconnects at once, and without jitter they keep doing it in lockstep."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from cdi.common.backoff import backoff_delay
from cdi.kube.errors import Conflict

T = TypeVar("T")


class Backoff:
    """Delays on the shared curve (`backoff_delay`), each stretched by up to `jitter` (a fraction)."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0, jitter: float = 0.2,
                 rng: random.Random | None = None) -> None:
        if initial <= 0 or maximum < initial or factor < 1 or jitter < 0:
            raise ValueError("backoff needs 0 < initial <= maximum, factor >= 1, jitter >= 0")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self.attempts = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        """The delay before the next attempt (and count this attempt)."""
        base = backoff_delay(self.attempts, self.initial, self.maximum, self.factor)
        self.attempts += 1
        return base * (1 + self.jitter * self._rng.random())

    def reset(self) -> None:
        self.attempts = 0

    async def sleep(self) -> float:
        delay = self.next()
        await asyncio.sleep(delay)
        return delay


async def retry_on_conflict(fn: Callable[[], Awaitable[T]], *, attempts: int = 5,
                            backoff: Backoff | None = None) -> T:
    """Run `fn` again while it raises `Conflict` (a stale resourceVersion), at most `attempts` times.

    `fn` must re-read the object each time: retrying the same stale body only conflicts again. The
    defaults are client-go's `retry.DefaultRetry` (5 steps starting at 10 ms, with jitter). After the
    last attempt the `Conflict` propagates. `AlreadyExists` is not a conflict and is never retried."""
    backoff = backoff or Backoff(initial=0.01, maximum=0.5, factor=1.5, jitter=0.1)
    for attempt in range(1, attempts + 1):
        try:
            return await fn()
        except Conflict:
            if attempt == attempts:
                raise
            await backoff.sleep()
    raise AssertionError("unreachable")
