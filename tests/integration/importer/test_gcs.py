"""GCS imports (`IMPORTER_SOURCE=gcs`) from gcp-storage-emulator: CDI's two URL forms, formats that
stream and formats that need scratch, anonymous reads and service-account credentials (a key file
whose token endpoint the test runs), and a missing object."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.images import Image
from tests.support.servers import OAuthTokenServer
from tests.support.sourceservers import Gcs

from .harness import Volume, assert_failed, assert_imported, assert_transferred, run_importer


def gcs_env(endpoint: str, **extra: str) -> dict[str, str]:
    return {"IMPORTER_SOURCE": "gcs", "IMPORTER_ENDPOINT": endpoint, **extra}


@pytest.fixture(scope="module")
def token_server() -> Iterator[OAuthTokenServer]:
    server = OAuthTokenServer()
    yield server
    server.close()


@pytest.mark.parametrize(("name", "mode", "route"), [
    ("qcow2.qcow2", "fs", "qcow2-ranges"),
    ("raw.img.xz", "block", None),
    ("qcow2.qcow2.gz", "fs", None),
    ("vmdk.vmdk", "fs", "vmdk-ranges"),
])
def test_gcs_import_anonymous(name: str, mode: str, route: str | None, images: dict[str, Image], gcs: Gcs,
                              make_volume: Callable[..., Volume]) -> None:
    image = images[name]
    volume = make_volume(mode)
    result = run_importer(volume, gcs_env(gcs.url(name)))
    assert_imported(volume, image, result, route=route)
    assert_transferred(result, image, result.message["route"])


def test_gs_url_with_the_emulator_named_by_the_library_variable(
        images: dict[str, Image], gcs: Gcs, make_volume: Callable[..., Volume]) -> None:
    image = images["raw.img.zst"]
    volume = make_volume("fs")
    result = run_importer(volume, gcs_env(gcs.url(image.name, form="gs"), STORAGE_EMULATOR_HOST=gcs.api))
    assert_imported(volume, image, result)


def test_service_account_credentials_are_exchanged_for_a_token(
        images: dict[str, Image], gcs: Gcs, token_server: OAuthTokenServer, tmp_path: Path,
        make_volume: Callable[..., Volume]) -> None:
    image = images["qcow2.qcow2"]
    key = tmp_path / "credentials.json"
    key.write_text(token_server.key_file())
    before = len(token_server.grants)
    volume = make_volume("fs")
    result = run_importer(volume, gcs_env(gcs.url(image.name), GOOGLE_APPLICATION_CREDENTIALS=str(key)))
    assert_imported(volume, image, result)
    grants = token_server.grants[before:]
    assert grants, "the importer never asked the key's token endpoint for a token"
    assert grants[0]["iss"] == "importer@cdi-test.iam.gserviceaccount.com"
    assert grants[0]["scope"] == "https://www.googleapis.com/auth/devstorage.read_only"


def test_refused_credentials_end_as_unauthorized(
        gcs: Gcs, images: dict[str, Image], token_server: OAuthTokenServer, tmp_path: Path,
        make_volume: Callable[..., Volume]) -> None:
    key = tmp_path / "credentials.json"
    key.write_text(token_server.key_file(other_key=True))
    volume = make_volume("block")
    result = run_importer(volume, gcs_env(gcs.url("raw.img"), GOOGLE_APPLICATION_CREDENTIALS=str(key)))
    assert_failed(result, "Unauthorized", "gs://images/raw.img", retryable=False)
    assert volume.untouched()


def test_missing_object_is_not_found(gcs: Gcs, make_volume: Callable[..., Volume]) -> None:
    volume = make_volume("block")
    result = run_importer(volume, gcs_env(gcs.url("no-such-object.img")))
    assert_failed(result, "NotFound", "gs://images/no-such-object.img", retryable=False)
    assert volume.untouched()


@pytest.mark.parametrize("endpoint", ["gs://only-a-bucket", "ftp://host/bucket/object"])
def test_endpoints_that_name_no_object_are_refused(endpoint: str, make_volume: Callable[..., Volume]) -> None:
    volume = make_volume("fs")
    result = run_importer(volume, gcs_env(endpoint))
    assert_failed(result, "InvalidConfiguration", endpoint, retryable=False)
