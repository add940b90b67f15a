"""Every refusal: the reason code, a message a person can act on, nothing (or nothing unsafe) written,
and a target the next attempt can use."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.images import Image, file_name
from tests.support.servers import FileServer

from .bad_images import build_bad_images
from .harness import REQUESTED, USABLE, Volume, assert_failed, assert_imported, run_importer


@pytest.fixture(scope="session")
def bad(served_dir: Path, images: dict[str, Image]) -> Path:
    build_bad_images(served_dir, images)
    return served_dir


def http(server: FileServer, name: str, **extra: str) -> dict[str, str]:
    env = {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": f"{server.url}/{name}"}
    env.update(extra)
    return env


def assert_untouched(volume: Volume) -> None:
    """Nothing was written: no disk.img, or the block device still holds its old bytes."""
    if volume.mode == "fs":
        assert not volume.target.exists(), "disk.img was created although the image was refused"
    else:
        assert volume.untouched(), "the block device was written"
    assert not (volume.data_dir / ".cdi-import-state").exists()


def assert_next_attempt_works(volume: Volume, server: FileServer, images: dict[str, Image]) -> None:
    image = images[file_name("qcow2")]
    assert_imported(volume, image, run_importer(volume, http(server, image.name)))


REFUSALS = [
    ("backing.qcow2", "BackingFileNotAllowed", ["backing file", "bad-base.qcow2"]),
    ("datafile.qcow2", "BackingFileNotAllowed", ["external data file", "datafile.raw"]),
    ("encrypted.qcow2", "UnsupportedFormat", ["encrypted"]),
    ("split.vmdk", "BackingFileNotAllowed", ["descriptor", "other files"]),
    ("extents.vmdk", "BackingFileNotAllowed", ["extents in other files", "/etc/shadow"]),
    ("diff.vhd", "BackingFileNotAllowed", ["differencing"]),
    ("diff.vdi", "BackingFileNotAllowed", ["differencing"]),
    ("v1.qcow", "UnsupportedFormat", ["qcow (version 1)"]),
    ("image.qed", "UnsupportedFormat", ["QED"]),
    ("image.luks", "UnsupportedFormat", ["LUKS"]),
    ("unknown-feature.qcow2", "UnsupportedFormat", ["incompatible features"]),
    ("big.qcow2", "ImageTooLarge", ["1073741824", str(USABLE), str(REQUESTED), "0.055"]),
    ("big.img", "ImageTooLarge", ["41943040", str(USABLE)]),
    ("truncated.qcow2", "InvalidImage", ["beyond the end of the file"]),
    ("truncated.img.gz", "InvalidImage", ["gz", "ends before the end"]),
    ("empty.img", "InvalidImage", ["empty"]),
    ("bomb.img.gz", "ImageTooLarge", ["decompressed image is larger", str(USABLE), "stopped"]),
]


@pytest.mark.parametrize("refusal", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_before_writing(
    refusal: tuple[str, str, list[str]],
    bad: Path,
    range_server: FileServer,
    images: dict[str, Image],
    make_volume: Callable[..., Volume],
) -> None:
    name, reason, fragments = refusal
    volume = make_volume("fs", scratch=True)
    result = run_importer(volume, http(range_server, name))
    assert_failed(result, reason, *fragments, retryable=False)
    if name not in ("bomb.img.gz", "truncated.img.gz"):  # those are only known while streaming
        assert_untouched(volume)
    else:
        assert not volume.target.exists(), "the partial image of a permanent failure was left behind"
    assert list(volume.scratch_dir.iterdir()) == []
    assert_next_attempt_works(volume, range_server, images)


@pytest.mark.parametrize("name", ["backing.qcow2", "extents.vmdk", "big.img", "encrypted.qcow2"])
def test_refused_before_writing_a_block_device(
    name: str,
    bad: Path,
    range_server: FileServer,
    images: dict[str, Image],
    make_volume: Callable[..., Volume],
) -> None:
    volume = make_volume("block")
    result = run_importer(volume, http(range_server, name))
    assert result.message["retryable"] is False
    assert_untouched(volume)
    assert_next_attempt_works(volume, range_server, images)


def test_unsafe_images_are_refused_from_a_stream_too(
    bad: Path, plain_server: FileServer, images: dict[str, Image], make_volume: Callable[..., Volume]
) -> None:
    """Without Range support the header check happens before staging anything on scratch."""
    volume = make_volume("fs", scratch=True)
    plain_server.reset_counters()
    result = run_importer(volume, http(plain_server, "backing.qcow2"))
    assert_failed(result, "BackingFileNotAllowed", "backing file", retryable=False)
    assert list(volume.scratch_dir.iterdir()) == []
    assert_untouched(volume)


ARCHIVES = [
    ("absolute.tar", ["/etc/cdi-evil", "absolute path"]),
    ("dotdot.tar", ["..", "sub/../../cdi-evil"]),
    ("symlink.tar", ["symlink that leaves the volume", "../../etc"]),
    ("abs-symlink.tar", ["symlink to an absolute path", "/etc"]),
    ("hardlink.tar", ["'..'", "passwd"]),
]


@pytest.mark.parametrize("archive", ARCHIVES, ids=[a[0] for a in ARCHIVES])
def test_unsafe_archives(
    archive: tuple[str, list[str]],
    bad: Path,
    range_server: FileServer,
    tmp_path: Path,
    make_volume: Callable[..., Volume],
) -> None:
    name, fragments = archive
    volume = make_volume("fs")
    (volume.data_dir / "leftover").write_text("from an earlier attempt")
    result = run_importer(volume, http(range_server, name, IMPORTER_CONTENTTYPE="archive"))
    assert_failed(result, "UnsafeArchive", *fragments, retryable=False)
    assert list(volume.data_dir.iterdir()) == [], "a refused archive left files behind"
    assert not Path("/etc/cdi-evil").exists()
    assert not (tmp_path / "cdi-evil").exists()


def test_archive_larger_than_the_volume(
    bad: Path, range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    volume = make_volume("fs")
    result = run_importer(volume, http(range_server, "big.tar", IMPORTER_CONTENTTYPE="archive"))
    assert_failed(result, "ImageTooLarge", str(USABLE), retryable=False)
    assert list(volume.data_dir.iterdir()) == []
