"""Checksums, source errors (404, auth, TLS, network, 5xx) and bad configuration: reason codes,
retryable flags, messages, and a target the next attempt can use."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.images import Image, file_name
from tests.support.servers import Fault, FileServer, free_port
from tests.support.sourceservers import PASSWORD, USER

from .harness import Volume, assert_failed, assert_imported, run_importer

CHECKSUM_CASES = [  # (image, route) covering every way the bytes can travel
    (file_name("raw"), "ranges"),
    (file_name("raw", "gz"), "stream"),
    (file_name("qcow2-compressed"), "qcow2-ranges"),
    (file_name("vmdk"), "vmdk-ranges"),
    (file_name("vhd"), "vhd-ranges"),
    (file_name("vhdx"), "vhdx-ranges"),
    (file_name("vdi"), "vdi-ranges"),
    (file_name("qcow2", "xz"), "qcow2-stream"),
    (file_name("vdi", "zst"), "scratch-convert"),
]


def digest(path: Path, algorithm: str) -> str:
    return f"{algorithm}:{hashlib.new(algorithm, path.read_bytes()).hexdigest()}"


@pytest.mark.parametrize(("name", "route"), CHECKSUM_CASES)
def test_checksum_mismatch_is_permanent_and_cleans_up(
    name: str,
    route: str,
    images: dict[str, Image],
    range_server: FileServer,
    make_volume: Callable[..., Volume],
) -> None:
    image = images[name]
    volume = make_volume("fs", scratch=True)
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{range_server.url}/{name}",
        "IMPORTER_CHECKSUM": "sha256:" + "0" * 64,
    }
    result = run_importer(volume, env)
    assert_failed(
        result, "ChecksumMismatch", "expected sha256:000", f"got sha256:{image.file_sha256}", retryable=False
    )
    assert not volume.target.exists(), "data that failed its checksum was left on the volume"
    assert list(volume.scratch_dir.iterdir()) == []
    env["IMPORTER_CHECKSUM"] = f"sha256:{image.file_sha256}"
    result = run_importer(volume, env)
    assert_imported(volume, image, result, route=route)
    assert result.message["checksum"] == f"sha256:{image.file_sha256}"


@pytest.mark.parametrize("algorithm", ["md5", "sha1", "sha512"])
def test_checksum_algorithms(
    algorithm: str,
    images: dict[str, Image],
    https_server: FileServer,
    ca_dir: Path,
    make_volume: Callable[..., Volume],
) -> None:
    image = images[file_name("qcow2")]
    volume = make_volume("block")
    expected = digest(image.path, algorithm)
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{https_server.url}/{image.name}",
        "IMPORTER_CERT_DIR": str(ca_dir),
        "IMPORTER_ACCESS_KEY_ID": USER,
        "IMPORTER_SECRET_KEY": PASSWORD,
        "IMPORTER_CHECKSUM": expected.upper().replace(algorithm.upper() + ":", algorithm + ":"),
    }
    result = run_importer(volume, env)
    assert_imported(volume, image, result)
    assert result.message["checksum"] == expected


def test_not_found(range_server: FileServer, make_volume: Callable[..., Volume]) -> None:
    result = run_importer(
        make_volume("fs"), {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": f"{range_server.url}/no-such.img"}
    )
    assert_failed(result, "NotFound", "404", "/no-such.img", retryable=False)


@pytest.mark.parametrize("password", [None, "wrong"])
def test_unauthorized(
    password: str | None,
    images: dict[str, Image],
    https_server: FileServer,
    ca_dir: Path,
    make_volume: Callable[..., Volume],
) -> None:
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{https_server.url}/{file_name('raw')}",
        "IMPORTER_CERT_DIR": str(ca_dir),
    }
    if password:
        env.update({"IMPORTER_ACCESS_KEY_ID": USER, "IMPORTER_SECRET_KEY": password})
    result = run_importer(make_volume("fs"), env)
    assert_failed(result, "Unauthorized", "401", "credentials", retryable=False)


def test_untrusted_certificate(
    images: dict[str, Image], https_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    result = run_importer(
        make_volume("fs"),
        {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": f"{https_server.url}/{file_name('raw')}"},
    )
    assert_failed(result, "TLSError", "certificate", "not trusted", retryable=False)


def test_connection_refused_fails_once_the_retry_budget_is_spent(make_volume: Callable[..., Volume]) -> None:
    volume = make_volume("fs")
    result = run_importer(
        volume,
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"http://127.0.0.1:{free_port()}/disk.img",
            "IMPORTER_RETRY_BUDGET": "1",
        },
    )
    assert_failed(result, "ConnectionFailed", "refused", "gave up after", retryable=False)


def test_server_errors_are_retried_until_the_budget_is_spent(
    images: dict[str, Image], range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    name = file_name("raw")
    range_server.fail_next(name, *[Fault(503)] * 200)
    try:
        result = run_importer(
            make_volume("fs"),
            {
                "IMPORTER_SOURCE": "http",
                "IMPORTER_ENDPOINT": f"{range_server.url}/{name}",
                "IMPORTER_RETRY_BUDGET": "1.5",
            },
        )
    finally:
        range_server.faults[name].clear()
    assert_failed(result, "ServerError", "503", "gave up after", retryable=False)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"IMPORTER_SOURCE": "ftp", "IMPORTER_ENDPOINT": "ftp://x/y"}, "IMPORTER_SOURCE"),
        ({"IMPORTER_SOURCE": "http"}, "IMPORTER_ENDPOINT is missing"),
        ({"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": "file:///etc/passwd"}, "http or https"),
        (
            {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": "http://x/y", "IMPORTER_CHECKSUM": "sha256:abc"},
            "64 hex",
        ),
        (
            {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": "http://x/y", "IMPORTER_CHECKSUM": "crc32:00"},
            "algorithm",
        ),
        (
            {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": "http://x/y", "PREALLOCATION": "maybe"},
            "PREALLOCATION",
        ),
        (
            {
                "IMPORTER_SOURCE": "http",
                "IMPORTER_ENDPOINT": "http://x/y",
                "IMPORTER_IMAGE_SIZE": "12 parsecs",
            },
            "IMPORTER_IMAGE_SIZE",
        ),
        (
            {
                "IMPORTER_SOURCE": "registry",
                "IMPORTER_ENDPOINT": "docker://x/y",
                "IMPORTER_CONTENTTYPE": "archive",
            },
            "archive",
        ),
        ({"IMPORTER_SOURCE": "registry", "IMPORTER_ENDPOINT": "oci-archive:/x.tar"}, "docker://"),
        ({"IMPORTER_SOURCE": "s3", "IMPORTER_ENDPOINT": "s3://bucket-only"}, "bucket and key"),
    ],
)
def test_invalid_configuration(
    env: dict[str, str], fragment: str, make_volume: Callable[..., Volume]
) -> None:
    result = run_importer(make_volume("fs"), env)
    assert_failed(result, "InvalidConfiguration", fragment, retryable=False)


def test_archive_on_a_block_volume_is_refused(
    range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    result = run_importer(
        make_volume("block"),
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_CONTENTTYPE": "archive",
            "IMPORTER_ENDPOINT": f"{range_server.url}/x.tar",
        },
    )
    assert_failed(result, "InvalidConfiguration", "Block", retryable=False)


def test_no_target_volume(tmp_path: Path) -> None:
    volume = Volume(tmp_path / "v", "fs")
    volume.data_dir.rmdir()
    result = run_importer(volume, {"IMPORTER_SOURCE": "blank"})
    assert_failed(result, "InvalidConfiguration", "no target volume", retryable=False)
