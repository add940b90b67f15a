"""Fixtures shared by all test packages."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.support.cluster import CdiUp, Kubectl

TIER = Path(__file__).parent / "realk8s"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-cluster tier (one test of ~25 minutes) first: with `--dist worksteal` (pyproject's addopts) the
    worker that takes it starts it at once and the other works through everything else, stealing what was queued
    behind it; last in collection order it started late, and what xdist had queued behind it waited for it while
    the other worker sat idle."""
    items.sort(key=lambda item: not str(item.path).startswith(str(TIER)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                           pytest.TestReport]:
    """A failing test that ran against `cdi up` shows the last container logs on its node and the
    control plane's log (worker pods, and their logs with `kubectl`, are gone by the time it fails)."""
    report = yield
    if report.failed and call.when == "call":
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, CdiUp):
                report.sections.append((f"cdi up {value.data_dir}: recent logs", value.recent_logs()))
    return report


@pytest.fixture
def cdi_up(tmp_path: Path) -> Iterator[CdiUp]:
    """A fresh embedded control plane for one test."""
    up = CdiUp(tmp_path / "cdi")
    up.start()
    yield up
    up.stop()


@pytest.fixture
def kubectl(cdi_up: CdiUp, tmp_path: Path) -> Kubectl:
    return Kubectl(cdi_up.kubeconfig, tmp_path / "kubectl-cache")


@pytest.fixture(scope="module")
def shared_cdi_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp]:
    """One embedded control plane for a whole module (tests must use their own namespaces or names)."""
    up = CdiUp(tmp_path_factory.mktemp("cdi-shared") / "cdi")
    up.start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def shared_kubectl(shared_cdi_up: CdiUp, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(shared_cdi_up.kubeconfig, tmp_path_factory.mktemp("kubectl-cache"))
