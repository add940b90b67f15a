"""Failing in reasonable time, and saying so while trying (issue #14, point 6): against a source that
never delivers a byte, an import fails within `--import-retry-budget` (not after six pods of five
minutes each), the Running condition names what is being retried while it is, and restartCount
counts pod restarts, not the retries inside one pod."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.importing import condition, datavolume, phase
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.servers import MuteServer

BUDGET = 20  # seconds


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp]:
    up = CdiUp(tmp_path_factory.mktemp("budget") / "cdi", "--import-retry-budget", str(BUDGET),
               "--retry-backoff", "0.5")
    up.start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def k(cluster: CdiUp, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("kc"))


@pytest.mark.parametrize(("cut", "cause"), [
    (False, "timed out talking to"),  # accepts, reads the request, never answers
    (True, "Remote end closed connection without response"),  # closes before the first byte
])
def test_a_source_that_never_delivers_fails_within_the_budget(
        k: Kubectl, cluster: CdiUp, cut: bool, cause: str) -> None:
    server = MuteServer(cut=cut)
    name = "cut" if cut else "silent"
    retrying: list[str] = []
    try:
        # the legacy path: the importer pod is named after the DataVolume's claim
        k.apply(datavolume(name, {"http": {"url": f"{server.url}/disk.img"}}, "64Mi",
                           annotations={"cdi.kubevirt.io/storage.usePopulator": "false"}))
        wait_for(lambda: phase(k, name) == "ImportInProgress", 60, interval=0.2, message=f"{name} in progress")
        started = time.monotonic()

        def failed() -> dict[str, Any] | None:
            dv: dict[str, Any] = k.get("dv", name)
            running = next((c for c in dv.get("status", {}).get("conditions", []) if c["type"] == "Running"), {})
            if running.get("status") == "True" and running.get("message", "").startswith("retrying: "):
                retrying.append(running["message"])
            return dv if dv["status"].get("phase") == "Failed" else None
        # the budget, plus one read timeout the last attempt may overrun it by, plus pod start and
        # status updates on a busy machine; without a bound this takes half an hour
        dv = wait_for(failed, BUDGET * 3 + 30, interval=0.3, message=f"{name} Failed")
        elapsed = time.monotonic() - started
    finally:
        server.close()
    assert elapsed < BUDGET * 3 + 30
    assert retrying, "the Running condition never said what was being retried"
    assert cause in retrying[-1] and "(attempt " in retrying[-1], retrying
    running = condition(dv, "Running")
    assert running["status"] == "False"
    assert running["reason"] == "ConnectionFailed"
    assert cause in running["message"] and "gave up after" in running["message"], running
    assert dv["status"].get("restartCount", 0) == 0
    pods = k.json("get", "pods", "-l", "cdi.kubevirt.io=importer")["items"]
    mine = [p for p in pods if p["metadata"]["name"].startswith(f"importer-{name}")]
    assert [p["metadata"]["name"] for p in mine] == [f"importer-{name}"]  # one pod, never restarted
    assert mine[0]["status"]["containerStatuses"][0]["restartCount"] == 0
    described = k("describe", "dv", name).stdout
    assert "ImportFailed" in described

