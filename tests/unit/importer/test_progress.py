"""The importer's progress as its metrics say it, on an injected clock: the current phase's rate and time
left, how long each phase took, and what a phase that has not moved yet (or no longer moves) says."""

from __future__ import annotations

import re

from prometheus_client import generate_latest

from cdi.importer.progress import CONVERT, PREALLOCATE, RESIZE, SYNC, TRANSFER_DATA_FILE, Progress

MIB = 1 << 20
UID = "uid-1"


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def series(progress: Progress, name: str, **labels: str) -> float | None:
    text = generate_latest(progress.registry).decode()
    wanted = ",".join(f'{k}="{v}"' for k, v in {"ownerUID": UID, **labels}.items())
    match = re.search(r"^" + re.escape(f"{name}{{{wanted}}}") + r" (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def transfer(progress: Progress, clock: Clock, rate: int, seconds: int, start: int = 0) -> int:
    done = start
    for _ in range(seconds * 4):
        clock.now += 0.25
        done += rate // 4
        progress.update(done)
    return done


def test_the_current_phase_says_its_rate_and_time_left() -> None:
    clock = Clock()
    progress = Progress(UID, clock=clock)
    progress.plan([(TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3)])
    progress.begin(TRANSFER_DATA_FILE, 400 * MIB)
    transfer(progress, clock, 10 * MIB, 20)  # 200 MiB of 400 at 10 MiB/s
    rate = series(progress, "cdi_importer_phase_rate_bytes_per_second", phase=TRANSFER_DATA_FILE)
    assert rate is not None and abs(rate - 10 * MIB) < MIB / 10
    left = series(progress, "cdi_importer_phase_seconds_left", phase=TRANSFER_DATA_FILE)
    assert left is not None and abs(left - 20) < 0.5
    assert series(progress, "cdi_importer_phase_duration_seconds", phase=TRANSFER_DATA_FILE) == 20


def test_a_phase_that_has_not_moved_yet_has_no_rate_and_a_stalled_one_says_zero() -> None:
    clock = Clock()
    progress = Progress(UID, clock=clock)
    progress.begin(TRANSFER_DATA_FILE, 400 * MIB)
    clock.now += 30  # waiting for the first byte: no rate, no estimate
    assert series(progress, "cdi_importer_phase_rate_bytes_per_second", phase=TRANSFER_DATA_FILE) is None
    assert series(progress, "cdi_importer_phase_seconds_left", phase=TRANSFER_DATA_FILE) is None
    transfer(progress, clock, 10 * MIB, 5)
    clock.now += 11  # nothing for longer than the window: stalled, and no estimate
    assert series(progress, "cdi_importer_phase_rate_bytes_per_second", phase=TRANSFER_DATA_FILE) == 0
    assert series(progress, "cdi_importer_phase_seconds_left", phase=TRANSFER_DATA_FILE) is None


def test_a_resumed_transfer_is_timed_from_where_it_resumed() -> None:
    """The first count of a phase (the bytes an earlier attempt left) is no part of its rate."""
    clock = Clock()
    progress = Progress(UID, clock=clock)
    progress.begin(TRANSFER_DATA_FILE, 4096 * MIB)
    progress.update(3000 * MIB)
    transfer(progress, clock, 10 * MIB, 4, start=3000 * MIB)
    rate = series(progress, "cdi_importer_phase_rate_bytes_per_second", phase=TRANSFER_DATA_FILE)
    assert rate is not None and abs(rate - 10 * MIB) < MIB / 10


def test_each_phase_keeps_its_duration_and_only_the_current_one_has_a_rate() -> None:
    clock = Clock()
    progress = Progress(UID, clock=clock)
    progress.plan([(TRANSFER_DATA_FILE, 48), (CONVERT, 48), (RESIZE, 1), (PREALLOCATE, 2), (SYNC, 1)])
    progress.begin(TRANSFER_DATA_FILE, 100 * MIB)
    transfer(progress, clock, 10 * MIB, 10)
    progress.begin(CONVERT, 1000 * MIB)
    for step in range(1, 9):
        clock.now += 1
        progress.advance_fraction(step / 100)
    assert series(progress, "cdi_importer_phase", phase=CONVERT) == 1
    assert series(progress, "cdi_importer_phase_rate_bytes_per_second", phase=TRANSFER_DATA_FILE) is None
    rate = series(progress, "cdi_importer_phase_rate_bytes_per_second", phase=CONVERT)
    assert rate is not None and abs(rate - 10 * MIB) < MIB  # 1% of 1000 MiB a second
    progress.begin(RESIZE)
    progress.begin(PREALLOCATE)
    clock.now += 3
    progress.begin(SYNC)
    clock.now += 2
    assert series(progress, "cdi_importer_phase_duration_seconds", phase=TRANSFER_DATA_FILE) == 10
    assert series(progress, "cdi_importer_phase_duration_seconds", phase=CONVERT) == 8
    assert series(progress, "cdi_importer_phase_duration_seconds", phase=PREALLOCATE) == 3
    assert series(progress, "cdi_importer_phase_duration_seconds", phase=SYNC) == 2
    assert series(progress, "cdi_importer_phase_rate_bytes_per_second", phase=SYNC) is None  # no bytes to count
    assert 98 <= progress.percent < 100
    progress.complete()
    assert progress.percent == 100
    assert series(progress, "cdi_importer_phase_duration_seconds", phase=SYNC) == 2
