"""HTTP(S) imports: every format x compression x volume mode, from a range-capable HTTPS server with
basic auth and a test CA, and from a plain server without Range support."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.common.imageprobe import ACCESS_NBD, ACCESS_STREAM
from tests.support.images import Image, file_name
from tests.support.servers import Fault, FileServer
from tests.support.sourceservers import PASSWORD, USER, Big

from .harness import (
    CASES,
    USABLE_BIG,
    Case,
    Volume,
    assert_failed,
    assert_imported,
    assert_transferred,
    rule_says_scratch,
    run_importer,
)

NATIVE = {
    "raw": "ranges",
    "iso": "ranges",
    "qcow2": "qcow2-ranges",
    "qcow2-v2": "qcow2-ranges",
    "qcow2-compressed": "qcow2-ranges",
    "qcow2-zstd": "qcow2-ranges",
    "vmdk": "vmdk-ranges",
    "vmdk-stream": "vmdk-ranges",
    "vhd": "vhd-ranges",
    "vhdx": "vhdx-ranges",
    "vdi": "vdi-ranges",
}


def expected_route(fmt: str, compression: str, ranges: bool) -> str:
    raw = fmt in ("raw", "iso")
    if compression == "xz" and raw and ranges:
        return "xz-blocks"
    if compression or not ranges:
        if raw:
            return "stream"
        return "qcow2-stream" if fmt.startswith("qcow2") else "scratch-convert"
    return NATIVE.get(fmt, "nbdkit-convert")


def https_env(server: FileServer, name: str, ca_dir: Path) -> dict[str, str]:
    return {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{server.url}/{name}",
        "IMPORTER_CERT_DIR": str(ca_dir),
        "IMPORTER_ACCESS_KEY_ID": USER,
        "IMPORTER_SECRET_KEY": PASSWORD,
    }


@pytest.mark.parametrize("case", CASES, ids=str)
def test_https_with_ranges(
    case: Case,
    images: dict[str, Image],
    https_server: FileServer,
    ca_dir: Path,
    make_volume: Callable[..., Volume],
) -> None:
    image = images[case.name]
    route = expected_route(case.fmt, case.compression, ranges=True)
    assert (route == "scratch-convert") == rule_says_scratch(image, ACCESS_NBD)  # the controller agrees
    volume = make_volume(case.mode, scratch=route == "scratch-convert")
    result = run_importer(volume, https_env(https_server, image.name, ca_dir))
    assert_imported(volume, image, result, route=route)
    assert result.message["sourceFormat"] == case.source_format
    assert_transferred(result, image, route)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_http_without_ranges(
    case: Case, images: dict[str, Image], plain_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = images[case.name]
    route = expected_route(case.fmt, case.compression, ranges=False)
    assert (route == "scratch-convert") == rule_says_scratch(image, ACCESS_STREAM)
    volume = make_volume(case.mode, scratch=route == "scratch-convert")
    result = run_importer(
        volume, {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": f"{plain_server.url}/{image.name}"}
    )
    assert_imported(volume, image, result, route=route)
    assert_transferred(result, image, route)


@pytest.mark.parametrize("kind", ["vmdk", "vmdk_stream"])
def test_vmdk_is_read_in_large_ranges_not_grain_by_grain(
    kind: str, big: Big, range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    """A 48 MiB vmdk (two grain tables) arrives in a few large ranges, its bytes those of qemu-img's
    own conversion (qemu-img through nbdkit-curl asked for every 64 KiB grain alone)."""
    image = getattr(big, kind)
    volume = make_volume("fs")
    range_server.reset_counters()
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{range_server.url}/{image.name}",
        "IMPORTER_IMAGE_SIZE": str(256 << 20),
        "IMPORTER_CHECKSUM": f"sha256:{image.file_sha256}",
    }
    result = run_importer(volume, env)
    assert_imported(volume, image, result, route="vmdk-ranges", sparse=False, usable=USABLE_BIG)
    assert result.message["checksum"] == f"sha256:{image.file_sha256}"
    assert_transferred(result, image, "ranges")  # a checksum needs every byte, so all are fetched
    requests = [r for r in range_server.requests if r[1] == image.name]
    assert len(requests) <= image.file_size // (1 << 20), f"{len(requests)} requests for {image.file_size} bytes"


def test_non_raw_without_ranges_needs_scratch_and_says_so_up_front(
    images: dict[str, Image], plain_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("vmdk")]
    volume = make_volume("fs")
    plain_server.reset_counters()
    head = 2 << 20
    assert image.file_size > 2 * head
    plain_server.close_gate(head)  # the rest of the image waits: the decision must come from the first MiBs
    try:
        result = run_importer(
            volume, {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": f"{plain_server.url}/{image.name}"}
        )
    finally:
        plain_server.open_gate()
    assert_failed(result, "ScratchSpaceRequired", "scratch", retryable=True)
    assert result.message["scratchSpaceRequired"] is True
    assert not volume.target.exists()
    assert plain_server.served(image.name) <= head


def test_compressed_vhdx_needs_scratch(
    images: dict[str, Image], https_server: FileServer, ca_dir: Path, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("vhdx", "gz")]
    volume = make_volume("fs")
    result = run_importer(volume, https_env(https_server, image.name, ca_dir))
    assert_failed(result, "ScratchSpaceRequired", "vhdx compressed with gz", retryable=True)
    assert result.message["scratchSpaceRequired"] is True
    # the next attempt, with scratch, works
    volume.scratch_dir.mkdir()
    assert_imported(volume, image, run_importer(volume, https_env(https_server, image.name, ca_dir)))


def test_redirect_is_followed_once_and_pinned(
    images: dict[str, Image], range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw")]
    volume = make_volume("fs")
    range_server.reset_counters()
    result = run_importer(
        volume, {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": f"{range_server.url}/redirect/{image.name}"}
    )
    assert_imported(volume, image, result, route="ranges")
    redirects = [r for r in range_server.requests if r[1].startswith("redirect/")]
    ranged = [r for r in range_server.requests if r[1] == image.name]
    assert len(redirects) == 1
    assert len(ranged) > 1  # every range went straight to the final URL


def test_extra_headers_are_sent(
    images: dict[str, Image],
    https_server: FileServer,
    ca_dir: Path,
    make_volume: Callable[..., Volume],
    tmp_path: Path,
) -> None:
    image = images[file_name("raw", "gz")]
    volume = make_volume("block")
    seen: list[dict[str, str]] = []
    original = https_server._authorized

    def spy(request):  # type: ignore[no-untyped-def]
        seen.append(dict(request.headers))
        return original(request)

    https_server._authorized = spy  # type: ignore[method-assign]
    try:
        env = https_env(https_server, image.name, ca_dir)
        env.update(
            {"IMPORTER_EXTRA_HEADER_0": "X-Cdi-Test: zero", "IMPORTER_EXTRA_HEADER_1": "X-Another: one"}
        )
        assert_imported(volume, image, run_importer(volume, env))
    finally:
        https_server._authorized = original  # type: ignore[method-assign]
    assert seen
    assert all(h.get("X-Cdi-Test") == "zero" and h.get("X-Another") == "one" for h in seen)


def test_insecure_tls_skips_verification(
    images: dict[str, Image], https_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw")]
    volume = make_volume("fs")
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{https_server.url}/{image.name}",
        "INSECURE_TLS": "true",
        "IMPORTER_ACCESS_KEY_ID": USER,
        "IMPORTER_SECRET_KEY": PASSWORD,
    }
    assert_imported(volume, image, run_importer(volume, env))


def test_transient_failures_are_retried_within_the_run(
    images: dict[str, Image], range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("qcow2")]
    volume = make_volume("fs")
    # the probe fails twice, then a range is cut off mid-body, then a 502
    range_server.fail_next(image.name, Fault(503), Fault(500), Fault(drop_after=1000), Fault(502))
    result = run_importer(
        volume,
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"{range_server.url}/{image.name}",
            "IMPORTER_RETRY_BUDGET": "30",
        },
    )
    assert_imported(volume, image, result, route="qcow2-ranges")
    assert not range_server.faults[image.name]


def test_stream_is_resumed_after_a_dropped_connection(
    images: dict[str, Image], plain_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw", "xz")]
    volume = make_volume("fs")
    plain_server.fail_next(image.name, Fault(drop_after=image.file_size // 2))
    result = run_importer(
        volume,
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"{plain_server.url}/{image.name}",
            "IMPORTER_RETRY_BUDGET": "30",
        },
    )
    assert_imported(volume, image, result, route="stream")


def test_concatenated_xz_streams_with_padding(
    images: dict[str, Image],
    range_server: FileServer,
    served_dir: Path,
    make_volume: Callable[..., Volume],
    tmp_path: Path,
) -> None:
    """Two xz streams (the second one multi-block) with stream padding between and after them."""
    import subprocess

    base = images[file_name("raw")]
    half = base.virtual_size // 2
    parts = []
    for i, (start, options) in enumerate([(0, ["-0"]), (half, ["-1", "-T2", "--block-size=512KiB"])]):
        piece = tmp_path / f"part{i}"
        with open(base.path, "rb") as f:
            f.seek(start)
            piece.write_bytes(f.read(half))
        parts.append(
            subprocess.run(["xz", *options, "-c", str(piece)], capture_output=True, check=True).stdout
        )
    name = "concatenated.img.xz"
    (served_dir / name).write_bytes(parts[0] + bytes(8) + parts[1] + bytes(4))
    volume = make_volume("fs")
    result = run_importer(
        volume, {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": f"{range_server.url}/{name}"}
    )
    assert_imported(volume, base, result, route="xz-blocks")


def test_bytes_after_a_gzip_are_hashed_with_it(
    images: dict[str, Image], range_server: FileServer, served_dir: Path, make_volume: Callable[..., Volume]
) -> None:
    """What follows the last gzip member (ignored by the decompressor, as by `gzip -d`) is downloaded and
    hashed too: the digest and a checksum asked for are of the published file."""
    import hashlib

    base = images[file_name("raw", "gz")]
    name = "padded.img.gz"
    (served_dir / name).write_bytes(base.path.read_bytes() + b"not a gzip member" * 1000)
    whole = hashlib.sha256((served_dir / name).read_bytes()).hexdigest()
    volume = make_volume("fs")
    result = run_importer(volume, {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": f"{range_server.url}/{name}",
                                   "IMPORTER_CHECKSUM": f"sha256:{whole}"})
    assert_imported(volume, images[file_name("raw")], result, route="stream")
    assert (result.message["checksum"], result.message["sourceSha256"]) == (f"sha256:{whole}", whole)
