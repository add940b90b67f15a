"""What the Running condition says of a running worker: its metrics (as the importer, the upload server and
the clone source export them) read back into the step, its bytes, rate and time left, and the sentence they
make, rounded so that it changes only when what it says does."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from cdi.cloner.source import Progress as CloneProgress
from cdi.controller.progress import PodReport, Retry, Step, human_bytes, human_seconds, parse_step
from cdi.importer.progress import CONVERT, RESIZE, SYNC, TRANSFER_DATA_FILE, Progress

MIB, GIB = 1 << 20, 1 << 30
UID = "0b1d6e1c-4f1e-4d5e-9a57-1f3c0f2b7e11"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def text_of(progress: Progress) -> str:
    return generate_latest(progress.registry).decode()


def test_an_importer_converting_reads_back_as_its_step() -> None:
    clock = Clock()
    progress = Progress(UID, clock=clock)
    progress.plan([(TRANSFER_DATA_FILE, 48), (CONVERT, 48), (RESIZE, 1), (SYNC, 3)])
    progress.begin(TRANSFER_DATA_FILE, GIB)
    progress.begin(CONVERT, 4 * GIB)
    for percent in range(0, 31):
        clock.now += 0.4  # 1% of 4 GiB each 0.4 s: about 102 MiB/s
        progress.advance_fraction(percent / 100)
    step = parse_step(text_of(progress), UID)
    assert step is not None and step.phase == CONVERT and step.total == 4 * GIB
    assert step.describe() == "Convert: 1.2 GiB of 4.0 GiB, 102 MiB/s, about 30 s left"
    assert parse_step(text_of(progress), "another-uid") is None


def test_a_clone_source_reads_back_as_a_transfer() -> None:
    clock = Clock()
    progress = CloneProgress(UID, clock=clock)
    progress.start(800 * MIB)
    for _ in range(40):
        clock.now += 0.25
        progress.add(5 * MIB)
    step = parse_step(text_of(progress), UID)
    assert step == Step("Transfer", 200 * MIB, 800 * MIB, 20 * MIB, 30.0)
    assert step.describe() == "Transfer: 200 MiB of 800 MiB, 20 MiB/s, about 30 s left"


def test_a_worker_starting_or_done_names_no_step() -> None:
    progress = Progress(UID)
    assert parse_step(text_of(progress), UID) is None  # Info: still looking at the source
    progress.complete()
    assert parse_step(text_of(progress), UID) is None


@pytest.mark.parametrize(("step", "message"), [
    (Step("TransferDataFile", 12 * MIB, 48 * MIB, 3 * MIB, 12.0),
     "Transfer: 12 MiB of 48 MiB, 3.0 MiB/s, about 10 s left"),
    (Step("TransferScratch", 5 * GIB, 0, 80 * MIB), "Transfer: 5.0 GiB, 80 MiB/s"),  # size unknown: no estimate
    (Step("TransferDataFile", 40 * MIB, 48 * MIB, 0.0), "Transfer: 40 MiB of 48 MiB, stalled"),
    (Step("TransferDataFile", 0, 48 * MIB), "Transfer: 0 B of 48 MiB"),  # waiting for the first byte
    (Step("Resize"), "Resize"),
    (Step("Preallocate"), "Preallocate"),
    (Step("Sync"), "Sync"),
    (Step("Convert", 3 * GIB, 40 * GIB, 50 * MIB, 37 * 60.0),
     "Convert: 3.0 GiB of 40 GiB, 50 MiB/s, about 37 min left"),
])
def test_the_message_of_each_kind_of_step(step: Step, message: str) -> None:
    assert step.describe() == message


def test_a_retry_under_way_wins_over_the_step() -> None:
    step = Step("TransferDataFile", 12 * MIB, 48 * MIB, 0.0)
    retry = Retry("ConnectionFailed", "connection to http://x/y failed", 3)
    assert PodReport(40.0, retry, step).running_message() == "retrying: connection to http://x/y failed (attempt 3)"
    assert PodReport(40.0, None, step).running_message() == "Transfer: 12 MiB of 48 MiB, stalled"
    assert PodReport(None, None, None).running_message() is None


@pytest.mark.parametrize(("n", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (10 * MIB - 1, "10 MiB"),
                                         (310 * MIB, "310 MiB"), (1.24 * GIB, "1.2 GiB"), (5 << 40, "5.0 TiB")])
def test_bytes_have_two_significant_figures(n: float, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(("seconds", "text"), [(0.2, "1 s"), (7.4, "7 s"), (12, "10 s"), (13, "15 s"), (58, "1 min"),
                                               (12 * 60 + 20, "12 min"), (2 * 3600 + 9 * 60, "2 h 10 min"),
                                               (3 * 3600, "3 h")])
def test_the_time_left_is_rounded_coarser_as_it_grows(seconds: float, text: str) -> None:
    assert human_seconds(seconds) == text
