"""S3 imports from moto's S3 server: every format x compression x volume mode, TLS with a custom CA,
the s3:// URL form, and S3's own error answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.common.imageprobe import ACCESS_NBD
from tests.support.images import Image, file_name
from tests.support.sourceservers import S3, S3_KEY, S3_SECRET

from .harness import (
    CHECKERBOARD,
    Case,
    Volume,
    assert_failed,
    assert_imported,
    assert_transferred,
    rule_says_scratch,
    run_importer,
)
from .test_http import expected_route


def s3_env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {
        "IMPORTER_SOURCE": "s3",
        "IMPORTER_ENDPOINT": endpoint,
        "IMPORTER_ACCESS_KEY_ID": S3_KEY,
        "IMPORTER_SECRET_KEY": S3_SECRET,
    }
    env.update(extra)
    return env


@pytest.mark.parametrize("case", CHECKERBOARD, ids=str)
def test_s3_import(case: Case, images: dict[str, Image], s3: S3, make_volume: Callable[..., Volume]) -> None:
    image = images[case.name]
    route = expected_route(case.fmt, case.compression, ranges=True)
    assert (route == "scratch-convert") == rule_says_scratch(image, ACCESS_NBD)  # the controller agrees
    volume = make_volume(case.mode, scratch=route == "scratch-convert")
    result = run_importer(volume, s3_env(s3.endpoint(image.name)))
    assert_imported(volume, image, result, route=route)
    assert_transferred(result, image, route)


@pytest.mark.parametrize("fmt", ["raw", "qcow2-compressed", "vdi"])
def test_s3_over_tls_with_custom_ca(
    fmt: str, images: dict[str, Image], s3: S3, ca_dir: Path, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name(fmt)]
    volume = make_volume("fs")
    result = run_importer(volume, s3_env(s3.endpoint(image.name, tls=True), IMPORTER_CERT_DIR=str(ca_dir)))
    assert_imported(volume, image, result)


def test_s3_over_tls_without_the_ca_is_a_tls_error(
    images: dict[str, Image], s3: S3, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw")]
    volume = make_volume("fs")
    result = run_importer(volume, s3_env(s3.endpoint(image.name, tls=True)))
    assert_failed(result, "TLSError", "TLS", retryable=False)


def test_s3_url_form_with_endpoint_from_the_environment(
    images: dict[str, Image], s3: S3, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("qcow2")]
    volume = make_volume("block")
    result = run_importer(volume, s3_env(f"s3://{s3.bucket}/{image.name}", AWS_ENDPOINT_URL=s3.url))
    assert_imported(volume, image, result, route="qcow2-ranges")


def test_missing_object_is_not_found(s3: S3, make_volume: Callable[..., Volume]) -> None:
    volume = make_volume("fs")
    result = run_importer(volume, s3_env(s3.endpoint("no-such-image.qcow2")))
    assert_failed(result, "NotFound", "s3://images/no-such-image.qcow2", retryable=False)
    result = run_importer(volume, s3_env(f"{s3.url}/no-such-bucket/x.img"))
    assert_failed(result, "NotFound", "no-such-bucket", retryable=False)


def test_checksum_is_verified_for_s3(
    images: dict[str, Image], s3: S3, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("qcow2-compressed", "zst")]
    volume = make_volume("fs", scratch=True)
    result = run_importer(
        volume, s3_env(s3.endpoint(image.name), IMPORTER_CHECKSUM=f"sha256:{image.file_sha256}")
    )
    assert_imported(volume, image, result)
    assert result.message["checksum"] == f"sha256:{image.file_sha256}"
