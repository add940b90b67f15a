"""Fixtures of the end-to-end tests: the importer tests' real servers and image set are shared here
(session-scoped, built once per run)."""

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
