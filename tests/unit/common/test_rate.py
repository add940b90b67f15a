"""The rate of a step over a moving window, on an injected clock: steady, after a change of pace, stalled,
young, and bounded in what it keeps however many notes it gets."""

from __future__ import annotations

import pytest

from cdi.common.rate import RateWindow

MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(window: RateWindow, clock: Clock, start: int, rate: int, seconds: float, step: float = 0.25) -> int:
    """Notes every `step` seconds at `rate` bytes/s; the bytes done at the end."""
    done = start
    for _ in range(round(seconds / step)):
        clock.now += step
        done += int(rate * step)
        window.note(done)
    return done


def test_a_steady_step_shows_its_rate() -> None:
    clock = Clock()
    window = RateWindow(clock)
    run(window, clock, 0, 100 * MIB, 30)
    assert window.rate() == pytest.approx(100 * MIB, rel=0.01)


def test_the_rate_follows_a_change_of_pace_within_the_window() -> None:
    clock = Clock()
    window = RateWindow(clock)
    done = run(window, clock, 0, 100 * MIB, 30)
    run(window, clock, done, 10 * MIB, 12)
    assert window.rate() == pytest.approx(10 * MIB, rel=0.05)


def test_a_stalled_step_shows_zero_once_the_window_passed_not_its_old_rate() -> None:
    clock = Clock()
    window = RateWindow(clock)
    run(window, clock, 0, 100 * MIB, 30)
    clock.now += 5
    half = window.rate()
    assert half is not None and 0 < half < 100 * MIB  # half the window moved
    clock.now += 5
    assert window.rate() == 0


def test_a_step_resuming_after_a_long_stall_is_measured_from_the_stall_not_before() -> None:
    clock = Clock()
    window = RateWindow(clock)
    done = run(window, clock, 0, 100 * MIB, 30)
    clock.now += 60
    run(window, clock, done, 20 * MIB, 5)
    # five seconds at 20 MiB/s in a window of ten: 10 MiB/s, not diluted by the minute of silence
    assert window.rate() == pytest.approx(10 * MIB, rel=0.1)


def test_a_young_step_has_no_rate_yet() -> None:
    clock = Clock()
    window = RateWindow(clock)
    clock.now += 0.5
    window.note(50 * MIB)
    assert window.rate() is None
    clock.now += 0.5
    assert window.rate() == pytest.approx(50 * MIB)


def test_restart_begins_a_new_step_where_it_is() -> None:
    """A resumed transfer starts 1 GiB in: the bytes it already had are no part of its rate."""
    clock = Clock()
    window = RateWindow(clock)
    window.restart(1 << 30)
    run(window, clock, 1 << 30, 5 * MIB, 4)
    assert window.rate() == pytest.approx(5 * MIB, rel=0.01)


def test_what_it_keeps_is_bounded_however_many_notes() -> None:
    clock = Clock()
    window = RateWindow(clock)
    run(window, clock, 0, MIB, 600, step=0.001)
    assert len(window._samples) <= 12
