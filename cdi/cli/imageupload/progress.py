"""What `cdi image-upload` shows while it sends: a bar with rate and ETA on a terminal, plain lines
(every few seconds, each a complete sentence) when the output is a file or a CI log, and a summary.

Rates and the ETA are measured over the last few seconds (a sliding window), so that a resumed
upload or a slow start does not skew them for the rest of the run."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TextIO

WINDOW_SECONDS = 5.0


def human(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass
class Progress:
    """Bytes of the image that the server has been sent, out of `total` (thread-safe)."""

    total: int
    out: TextIO = field(default_factory=lambda: sys.stdout)
    tty: bool | None = None
    interval: float | None = None
    done: int = 0
    _samples: deque[tuple[float, int]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last_draw: float = 0.0
    _drawn: bool = False

    def __post_init__(self) -> None:
        if self.tty is None:
            self.tty = self.out.isatty()
        if self.interval is None:
            self.interval = 0.2 if self.tty else 5.0
        self._samples.append((time.monotonic(), 0))

    def restart_at(self, offset: int, why: str) -> None:
        """The next attempt starts at `offset` (a resume, or 0 when starting over)."""
        with self._lock:
            self.done = offset
            now = time.monotonic()
            self._samples.clear()
            self._samples.append((now, offset))
        self._line(why)

    def note(self, text: str) -> None:
        """A message on a line of its own."""
        self._line(text)

    def add(self, n: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.done += n
            assert self.interval is not None
            if now - self._last_draw < self.interval:
                return
            self._last_draw = now
            self._samples.append((now, self.done))
            while len(self._samples) > 2 and now - self._samples[0][0] > WINDOW_SECONDS:
                self._samples.popleft()
            text = self._render(now)
        self._draw(text)

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        first_time, first_done = self._samples[0]
        elapsed = now - first_time
        return (self.done - first_done) / elapsed if elapsed > 0 else 0.0

    def _render(self, now: float) -> str:
        rate = self.rate(now)
        fraction = self.done / self.total if self.total else 1.0
        eta = duration((self.total - self.done) / rate) if rate > 0 else "--:--"
        numbers = f"{fraction * 100:5.1f}% {human(self.done)} / {human(self.total)}, {human(rate)}/s, ETA {eta}"
        if not self.tty:
            return f"uploaded {numbers}"
        width = max(10, min(40, shutil.get_terminal_size((80, 20)).columns - len(numbers) - 4))
        filled = int(width * fraction)
        return f"[{'#' * filled}{'-' * (width - filled)}] {numbers}"

    def _draw(self, text: str) -> None:
        if self.tty:
            self.out.write("\r" + text + "\x1b[K")
            self._drawn = True
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def finish(self) -> None:
        with self._lock:
            now = time.monotonic()
            self._samples.append((now, self.done))
            text = self._render(now)
        self._draw(text)
        if self.tty:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False

    def _line(self, text: str) -> None:
        """A message of its own line (not overwritten by the bar)."""
        if self.tty and self._drawn:
            self.out.write("\n")
            self._drawn = False
        self.out.write(text + "\n")
        self.out.flush()
