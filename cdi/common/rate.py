"""The rate of a step and the time it has left, from the byte counts it reports as it goes: what a
worker pod says in its metrics (`cdi.importer.progress`, `cdi.cloner.source`) and the controller turns
into the DataVolume's Running condition.

The rate is measured over the last `window` seconds of the step (a moving window), so a slow start, a
resumed transfer or a pause does not skew it for the rest of the step, and a step that stops moving shows
0 once the window has passed (stalled), not the rate it had before. Each `note` costs a clock read and a
comparison; a sample is kept at most every `window / 10` seconds, so at most a dozen are held, whatever
the number of notes: O(1) per note, however small the chunks."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_SECONDS = 10.0
SAMPLES_PER_WINDOW = 10


class RateWindow:
    """Bytes per second of one step over its last `window` seconds. Not thread-safe: its owner calls it under
    its own lock. `clock` is injectable for tests (monotonic seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window: float = WINDOW_SECONDS) -> None:
        self._clock = clock
        self.window = window
        self._every = window / SAMPLES_PER_WINDOW
        self._samples: deque[tuple[float, int]] = deque()
        self.done = 0
        self._last = 0.0
        self.restart(0)

    def restart(self, done: int = 0) -> None:
        """A new step begins, `done` bytes into it (a resumed transfer)."""
        now = self._clock()
        self._samples.clear()
        self._samples.append((now, done))
        self.done = done
        self._last = now  # when `done` was told

    def note(self, done: int) -> None:
        """`done` bytes of the step are done now."""
        self.done = done
        now = self._last = self._clock()
        if now - self._samples[-1][0] >= self._every:
            self._samples.append((now, done))
            self._trim(now)

    def _trim(self, now: float) -> None:
        """Drop the samples the window no longer needs: all but the last one at or before its start."""
        start = now - self.window
        samples = self._samples
        while len(samples) >= 2 and samples[1][0] <= start:
            samples.popleft()

    def rate(self) -> float | None:
        """Bytes per second over the window (0: nothing moved in it), None while the step is too young to tell
        (less than a sample interval old)."""
        now = self._clock()
        self._trim(now)
        start = now - self.window
        t0, d0 = self._samples[0]
        if t0 < start:
            # the window starts after the first sample: what was done at its start, interpolated between it and
            # the next sample (or the last count told, when none was kept since)
            t1, d1 = self._samples[1] if len(self._samples) >= 2 else (self._last, self.done)
            if t1 <= start:
                return 0.0  # nothing told since the window began
            at_start = d0 + (d1 - d0) * (start - t0) / (t1 - t0)
            return max(0.0, self.done - at_start) / self.window
        elapsed = now - t0
        if elapsed < self._every:
            return None
        return max(0.0, self.done - d0) / elapsed
