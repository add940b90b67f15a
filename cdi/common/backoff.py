"""The one backoff curve of cdi: every retry, requeue and restart waits `initial * factor**attempt`,
capped at `maximum`.

Each caller keeps its own numbers (client-go's 5 ms to 1000 s for the work queue, kubelet's 10 s to
5 min for restarts, the importer's 0.5 s to 15 s inside its time budget ...) and its own jitter, but
not its own arithmetic: a curve written out at each site drifts (an off-by-one in the exponent, a
linear step where the others double, a float overflow after a few hundred failures)."""

from __future__ import annotations

_MAX_EXPONENT = 64  # far beyond any cap; keeps `factor**attempt` from overflowing a float


def backoff_delay(attempt: int, initial: float, maximum: float, factor: float = 2.0) -> float:
    """The pause before retry `attempt` (0: the first retry waits `initial`), at most `maximum`."""
    if attempt < 0:
        raise ValueError(f"attempt must be 0 or more, not {attempt}")
    return min(maximum, initial * factor ** min(attempt, _MAX_EXPONENT))
