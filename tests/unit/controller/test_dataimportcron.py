"""The DataImportCron schedule and naming rules, with the clock given: no test waits for a cron minute."""

from __future__ import annotations

import datetime

from cdi.api.annotations import REFRESH_NOW, SOURCE_DESIRED_DIGEST
from cdi.controller.dataimportcron import (
    LAST_CRON,
    NEXT_CRON,
    dv_name,
    next_run,
    pinned_registry_url,
    run_due,
)

UTC = datetime.UTC
NOW = datetime.datetime(2026, 11, 23, 12, 30, 10, tzinfo=UTC)
HOURLY = "0 * * * *"
RAN = {SOURCE_DESIRED_DIGEST: "sha256:" + "a" * 64, LAST_CRON: "2026-11-23T11:00:00Z"}


def test_the_first_reconcile_polls_at_once() -> None:
    assert run_due(HOURLY, {}, NOW) == (True, None)


def test_not_due_before_the_next_time() -> None:
    due, next_time = run_due(HOURLY, {**RAN, NEXT_CRON: "2026-11-23T13:00:00Z"}, NOW)
    assert not due and next_time == datetime.datetime(2026, 11, 23, 13, 0, tzinfo=UTC)


def test_refresh_now_polls_whatever_the_schedule() -> None:
    assert run_due(HOURLY, {**RAN, NEXT_CRON: "2026-11-23T13:00:00Z", REFRESH_NOW: ""}, NOW)[0]
    assert run_due("", {**RAN, REFRESH_NOW: ""}, NOW)[0]


def test_an_empty_schedule_never_polls_by_itself() -> None:
    assert not run_due("", {**RAN, NEXT_CRON: "2020-01-01T00:00:00Z"}, NOW)[0]


def test_runs_missed_while_the_controller_was_down_run_once() -> None:
    # the controller stopped before 09:00 and is back at 12:30: three slots passed
    annotations = {**RAN, NEXT_CRON: "2026-11-23T09:00:00Z"}
    assert run_due(HOURLY, annotations, NOW)[0]
    # the run records its next time from now, so the next reconcile does not catch up slot by slot
    after = next_run(HOURLY, NOW)
    assert after == datetime.datetime(2026, 11, 23, 13, 0, tzinfo=UTC)
    assert not run_due(HOURLY, {**annotations, NEXT_CRON: after.strftime("%Y-%m-%dT%H:%M:%SZ")}, NOW)[0]


def test_dv_names_as_cdi() -> None:
    digest = "sha256:0123456789abcdef" + "0" * 48
    assert dv_name("fedora", digest) == "fedora-0123456789ab"
    assert dv_name("fedora", "uid:abcdef0123456789") == "fedora-abcdef012345"
    assert dv_name("fedora", "md5:0123456789abcdef") is None


def test_registry_urls_pinned_to_the_digest() -> None:
    digest = "sha256:" + "b" * 64
    assert pinned_registry_url("docker://quay.io/containerdisks/fedora:latest", digest) == \
        f"docker://quay.io/containerdisks/fedora@{digest}"
    assert pinned_registry_url("docker://127.0.0.1:5000/disk", digest) == f"docker://127.0.0.1:5000/disk@{digest}"
    assert pinned_registry_url("docker://127.0.0.1:5000/disk:v1", digest) == f"docker://127.0.0.1:5000/disk@{digest}"
