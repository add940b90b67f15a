"""Retrying transient failures inside the run, with capped exponential backoff and a time budget.

CDI leaves retries to kubelet restarting the pod (CrashLoopBackOff), which starts the download over;
here a reset or a 503 costs one range request and a pause. Only when one operation has kept
failing for `budget` seconds does the import give up, as `retryable: true`."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .errors import ImporterError, Reason, TransientError

log = logging.getLogger(__name__)
T = TypeVar("T")


class Terminated(BaseException):
    """The importer was asked to stop (SIGTERM)."""


@dataclass
class RetryPolicy:
    budget: float = 300.0
    initial_delay: float = 0.5
    max_delay: float = 15.0
    listeners: list[Callable[[ImporterError], None]] = field(default_factory=list, compare=False)

    def run(
        self,
        fn: Callable[[], T],
        what: str,
        stop: threading.Event | None = None,
        on_retry: Callable[[ImporterError], None] | None = None,
    ) -> T:
        started: float | None = None
        delay = self.initial_delay
        attempt = 0
        while True:
            if stop is not None and stop.is_set():
                raise Terminated()
            try:
                return fn()
            except TransientError as exc:
                now = time.monotonic()
                started = now if started is None else started
                attempt += 1
                if now - started >= self.budget:
                    raise ImporterError(
                        exc.reason,
                        f"{exc.message} (gave up after {attempt} attempts in {now - started:.0f}s)",
                        retryable=True,
                    ) from exc
                pause = min(delay, self.max_delay) * (0.75 + random.random() / 2)
                pause = min(pause, max(0.0, self.budget - (now - started)))
                log.warning(
                    "%s failed (%s), attempt %d, retrying in %.1fs", what, exc.message, attempt, pause
                )
                if on_retry is not None:
                    on_retry(exc)
                for listener in self.listeners:
                    listener(exc)
                if stop is not None:
                    if stop.wait(pause):
                        raise Terminated() from None
                else:
                    time.sleep(pause)
                delay *= 2


def transient(reason: Reason, message: str) -> TransientError:
    return TransientError(reason, message, retryable=True)
