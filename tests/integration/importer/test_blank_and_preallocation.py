"""Blank disks, preallocation (blank and imported), and CDI's sizing of the Filesystem result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.api.sizing import usable_space
from cdi.importer.target import FileTarget
from tests.support.images import Image, file_name
from tests.support.servers import FileServer

from .harness import (
    OVERHEAD,
    REQUESTED,
    USABLE,
    Volume,
    assert_failed,
    assert_imported,
    run_importer,
)


@pytest.mark.parametrize("source", ["blank", "none"])
def test_blank_filesystem(source: str, make_volume: Callable[..., Volume]) -> None:
    volume = make_volume("fs")
    (volume.data_dir / "disk.img").write_bytes(b"left by an earlier attempt" * 1000)
    result = run_importer(volume, {"IMPORTER_SOURCE": source})
    assert result.code == 0, result
    assert result.message["reason"] == "Complete"
    assert result.message["virtualSize"] == USABLE
    assert result.message["preallocationApplied"] is False
    st = volume.target.stat()
    assert st.st_size == USABLE
    assert st.st_blocks == 0
    assert st.st_mode & 0o777 == 0o660


def test_blank_filesystem_preallocated(make_volume: Callable[..., Volume]) -> None:
    volume = make_volume("fs")
    result = run_importer(volume, {"IMPORTER_SOURCE": "blank", "PREALLOCATION": "true"})
    assert result.code == 0, result
    assert result.message["preallocationApplied"] is True
    st = volume.target.stat()
    assert st.st_size == USABLE
    assert st.st_blocks * 512 >= USABLE


def test_blank_block_is_left_alone_without_preallocation(make_volume: Callable[..., Volume]) -> None:
    volume = make_volume("block")
    result = run_importer(volume, {"IMPORTER_SOURCE": "blank"})
    assert result.code == 0, result
    assert volume.untouched()  # "exactly an empty PVC", as in CDI


def test_blank_block_preallocated_is_zeroed(make_volume: Callable[..., Volume]) -> None:
    volume = make_volume("block")
    result = run_importer(volume, {"IMPORTER_SOURCE": "blank", "PREALLOCATION": "true"})
    assert result.code == 0, result
    assert result.message["preallocationApplied"] is True
    data = volume.target.read_bytes()
    assert data.count(0) == len(data)


def test_blank_archive_is_refused(make_volume: Callable[..., Volume]) -> None:
    result = run_importer(make_volume("fs"), {"IMPORTER_SOURCE": "blank", "IMPORTER_CONTENTTYPE": "archive"})
    assert_failed(result, "InvalidConfiguration", "archive", retryable=False)


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        (file_name("qcow2-compressed"), "fs"),
        (file_name("raw", "gz"), "fs"),
        (file_name("vmdk"), "fs"),
        (file_name("raw", "zst"), "block"),
    ],
)
def test_imports_with_preallocation(
    name: str,
    mode: str,
    images: dict[str, Image],
    range_server: FileServer,
    make_volume: Callable[..., Volume],
) -> None:
    image = images[name]
    volume = make_volume(mode)
    result = run_importer(
        volume,
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"{range_server.url}/{name}",
            "PREALLOCATION": "true",
        },
    )
    assert_imported(volume, image, result, sparse=False)
    assert result.message["preallocationApplied"] is True
    if mode == "fs":
        assert volume.target.stat().st_blocks * 512 >= USABLE


def test_requested_size_as_a_quantity(
    images: dict[str, Image], range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw")]
    volume = make_volume("fs")
    result = run_importer(
        volume,
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"{range_server.url}/{image.name}",
            "IMPORTER_IMAGE_SIZE": "20Mi",
            "FILESYSTEM_OVERHEAD": "0",
        },
    )
    assert_imported(volume, image, result, usable=20 << 20)


def test_leftover_disk_counts_as_free_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial disk.img from a killed attempt must not shrink the next attempt's space (HVdocs#1113)."""
    target = FileTarget(tmp_path)
    free = 20 << 20

    class Stat:
        f_bavail = free // 4096
        f_bsize = 4096

    monkeypatch.setattr("os.statvfs", lambda _path: Stat())
    assert target.available(REQUESTED) == free
    with open(target.path, "wb") as f:
        f.write(b"\x01" * (12 << 20))
    assert target.available(REQUESTED) >= free + (12 << 20)
    assert target.usable(REQUESTED, OVERHEAD) == usable_space(
        OVERHEAD, min(REQUESTED, target.available(REQUESTED))
    )
