"""The shared backoff curve: doubling from `initial`, capped, and safe after any number of failures."""

from __future__ import annotations

import pytest

from cdi.common.backoff import backoff_delay


def test_the_curve_doubles_from_initial_up_to_the_cap() -> None:
    assert [backoff_delay(n, 10.0, 300.0) for n in range(7)] == [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]


def test_another_factor() -> None:
    assert [backoff_delay(n, 0.2, 2.0, factor=1.5) for n in range(3)] == pytest.approx([0.2, 0.3, 0.45])


def test_a_long_run_of_failures_stays_at_the_cap() -> None:
    assert backoff_delay(10_000, 0.005, 1000.0) == 1000.0


def test_a_negative_attempt_is_a_bug() -> None:
    with pytest.raises(ValueError, match="attempt"):
        backoff_delay(-1, 1.0, 2.0)
