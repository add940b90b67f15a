"""Shared fixtures of the importer's integration tests: real servers, the image set, volumes, a runner.

Every test runs the real program (`python -m cdi.importer`) in a subprocess, configured only by
environment variables as in a pod, against servers these fixtures start (aiohttp, moto,
docker-registry). Servers and images are session-scoped (`tests.support.sourceservers`, which the
end-to-end tests share); volumes are per test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.sourceservers import (  # noqa: F401 - re-exported fixtures
    big,
    ca,
    ca_dir,
    gcs,
    https_server,
    images,
    plain_server,
    range_server,
    registries,
    s3,
    served_dir,
    server_pair,
)

from .harness import BLOCK_SIZE, Volume


@pytest.fixture
def make_volume(tmp_path: Path) -> Callable[..., Volume]:
    counter = iter(range(1000))

    def make(mode: str = "fs", scratch: bool = False, block_size: int = BLOCK_SIZE) -> Volume:
        return Volume(tmp_path / f"vol{next(counter)}", mode, scratch, block_size)

    return make
