"""Fixtures of the end-to-end tests: the importer tests' real servers and image set are shared here
(session-scoped, built once per run)."""

import pytest

from tests.integration.importer.conftest import (  # noqa: F401 - re-exported fixtures
    ca,
    ca_dir,
    gcs,
    https_server,
    images,
    range_server,
    registries,
    s3,
    served_dir,
    server_pair,
)
from tests.support.cluster import CdiUp, Kubectl


@pytest.fixture(scope="module")
def cluster(shared_cdi_up: CdiUp) -> CdiUp:
    """A module's `cdi up`: the shared one, unless the module starts its own (with its own flags)."""
    return shared_cdi_up


@pytest.fixture(scope="module")
def k(shared_kubectl: Kubectl) -> Kubectl:
    return shared_kubectl
