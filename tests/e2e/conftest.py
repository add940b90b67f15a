"""Fixtures of the end-to-end tests: the real source servers and the image set of the importer's tests
(`tests.support.sourceservers`, session-scoped, built once per run), and the cluster under test
(`tests/e2e/target.py`): `cdi up`, or the cluster of `CDI_E2E_KUBECONFIG`, where only the `anycluster`
and `realcluster` scenarios run (the latter only there)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.target import TARGET, External, own_cluster
from tests.support.cluster import CdiUp, Kubectl
from tests.support.sourceservers import (  # noqa: F401 - re-exported fixtures
    ca,
    ca_dir,
    gated_server,
    gcs,
    https_server,
    images,
    range_server,
    registries,
    s3,
    served_dir,
    server_pair,
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TARGET.embedded:
        real_only = pytest.mark.skip(reason="needs a real cluster's pods and node (CDI_E2E_KUBECONFIG)")
        for item in items:
            if item.get_closest_marker("realcluster") is not None:
                item.add_marker(real_only)
        return
    skip = pytest.mark.skip(reason=f"needs `cdi up` (not marked anycluster); the target is {TARGET.describe()}")
    for item in items:
        if ("tests/e2e/" in str(item.path) and item.get_closest_marker("anycluster") is None
                and item.get_closest_marker("realcluster") is None):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def shared_cdi_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp | External]:
    """One cluster for a whole module (tests use their own namespaces or names)."""
    yield from own_cluster(tmp_path_factory, "cdi-shared")


@pytest.fixture(scope="module")
def cluster(shared_cdi_up: CdiUp) -> CdiUp:
    """A module's cluster: the shared one, unless the module starts its own (with its own flags)."""
    return shared_cdi_up


@pytest.fixture(scope="module")
def k(shared_kubectl: Kubectl) -> Kubectl:
    return shared_kubectl
