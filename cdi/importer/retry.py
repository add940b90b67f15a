"""Retrying transient failures inside the run, with capped exponential backoff and a time budget.

CDI leaves retries to kubelet restarting the pod (CrashLoopBackOff), which starts the download over;
here a reset or a 503 costs one range request and a pause. The budget (IMPORTER_RETRY_BUDGET, set
by the controller's `--import-retry-budget`) bounds how long an operation may keep failing, counted
from the start of its first failed attempt, or from the last failure that still delivered bytes.
Once spent, the import fails for good (`retryable: false`): a new pod would only wait on the same
silent source again. Every retry is announced to the listeners (the progress endpoint shows it, the
DataVolume's Running condition says it)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from cdi.common.backoff import backoff_delay

from .errors import ImporterError, Reason, TransientError

log = logging.getLogger(__name__)
T = TypeVar("T")


class Terminated(BaseException):
    """The importer was asked to stop (SIGTERM)."""


DEFAULT_BUDGET = 180.0


@dataclass
class RetryPolicy:
    budget: float = DEFAULT_BUDGET
    initial_delay: float = 0.5
    max_delay: float = 15.0
    # told (failure, attempt) before each pause, and () when an operation that had failed succeeds
    listeners: list[Callable[[ImporterError, int], None]] = field(default_factory=list, compare=False)
    recovered: list[Callable[[], None]] = field(default_factory=list, compare=False)

    def run(
        self,
        fn: Callable[[], T],
        what: str,
        stop: threading.Event | None = None,
        on_retry: Callable[[ImporterError], None] | None = None,
    ) -> T:
        started: float | None = None
        attempt = 0
        while True:
            if stop is not None and stop.is_set():
                raise Terminated()
            began = time.monotonic()
            try:
                result = fn()
            except TransientError as exc:
                now = time.monotonic()
                if getattr(exc, "partial", 0):  # bytes arrived before it failed: count afresh from here
                    started, attempt = now, 0
                # from the start of the first failed attempt: a server that never answers spends
                # the budget in read timeouts, not only in pauses
                started = began if started is None else started
                attempt += 1
                if now - started >= self.budget:
                    raise ImporterError(
                        exc.reason,
                        f"{exc.message} (gave up after {attempt} attempts in {now - started:.0f}s)",
                        # a source that changed is worth a fresh start; one that stays silent is not
                        retryable=exc.reason == Reason.SOURCE_CHANGED,
                    ) from exc
                pause = backoff_delay(attempt - 1, self.initial_delay, self.max_delay) * (0.75 + random.random() / 2)
                pause = min(pause, max(0.0, self.budget - (now - started)))
                log.warning(
                    "%s failed (%s), attempt %d, retrying in %.1fs", what, exc.message, attempt, pause
                )
                if on_retry is not None:
                    on_retry(exc)
                for listener in self.listeners:
                    listener(exc, attempt)
                if stop is not None:
                    if stop.wait(pause):
                        raise Terminated() from None
                else:
                    time.sleep(pause)
            else:
                if attempt:
                    for callback in self.recovered:
                        callback()
                return result


def transient(reason: Reason, message: str) -> TransientError:
    return TransientError(reason, message, retryable=True)
