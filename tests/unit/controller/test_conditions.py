"""DataVolume conditions are computed idempotently: the same claim and phase a second later give the same
conditions, so the status is not written again and the transition's event is not repeated (a refused
DataVolume once recorded its UnsupportedSource event twice whenever two reconciles straddled a second)."""

from __future__ import annotations

import copy

import pytest

from cdi.controller import conditions


@pytest.mark.parametrize("pvc", [None, {"metadata": {"name": "disk", "annotations": {
    "cdi.kubevirt.io/storage.condition.running": "true"}}, "status": {"phase": "Bound"}}])
def test_the_same_inputs_a_second_later_give_the_same_conditions(monkeypatch: pytest.MonkeyPatch,
                                                                 pvc: dict[str, object] | None) -> None:
    status: dict[str, object] = {"phase": "Failed" if pvc is None else "ImportInProgress"}
    monkeypatch.setattr(conditions, "now", lambda: "2026-11-23T19:53:53Z")
    conditions.update_all(status, pvc, "spec.source.vddk: not supported", "UnsupportedSource")
    first = copy.deepcopy(status)
    monkeypatch.setattr(conditions, "now", lambda: "2026-11-23T19:53:54Z")
    conditions.update_all(status, pvc, "spec.source.vddk: not supported", "UnsupportedSource")
    assert status == first


def test_a_changed_message_stamps_the_heartbeat_and_keeps_the_transition(monkeypatch: pytest.MonkeyPatch) -> None:
    status: dict[str, object] = {"phase": "Pending"}
    monkeypatch.setattr(conditions, "now", lambda: "2026-11-23T19:53:53Z")
    conditions.update_all(status, None, "first", "Pending")
    monkeypatch.setattr(conditions, "now", lambda: "2026-11-23T19:53:59Z")
    conditions.update_all(status, None, "second", "Pending")
    bound = conditions.find(status["conditions"], "Bound")  # type: ignore[arg-type]
    assert bound is not None and bound["message"] == "second"
    assert (bound["lastTransitionTime"], bound["lastHeartbeatTime"]) == ("2026-11-23T19:53:53Z", "2026-11-23T19:53:59Z")
