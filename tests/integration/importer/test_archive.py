"""The archive content type: a tar (optionally compressed) extracted onto the Filesystem volume."""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from tests.support.servers import FileServer

from .harness import Volume, assert_failed, run_importer

BIG_FILE = os.urandom(3 << 20) + bytes(5 << 20) + b"end"


def make_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data, mode in [
            ("README", b"hello\n", 0o644),
            ("bin/run.sh", b"#!/bin/sh\necho hi\n", 0o755),
            ("data/big.bin", BIG_FILE, 0o600),
            ("deep/" + "very-long-directory-name/" * 6 + "leaf.txt", b"long path", 0o644),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            t.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("bin/latest")
        link.type, link.linkname = tarfile.SYMTYPE, "run.sh"
        t.addfile(link)
        hard = tarfile.TarInfo("data/again.bin")
        hard.type, hard.linkname = tarfile.LNKTYPE, "data/big.bin"
        t.addfile(hard)
    return out.getvalue()


@pytest.fixture(scope="module")
def archives(served_dir: Path) -> dict[str, Path]:
    raw = make_tar()
    out = {
        "tar": raw,
        "tar.gz": None,
        "tar.xz": lzma.compress(raw, preset=0),
        "tar.zst": zstandard.ZstdCompressor().compress(raw),
    }
    import gzip

    out["tar.gz"] = gzip.compress(raw, 1)
    paths = {}
    for ext, data in out.items():
        assert data is not None
        path = served_dir / f"archive-test.{ext}"
        path.write_bytes(data)
        paths[ext] = path
    return paths


@pytest.mark.parametrize("ext", ["tar", "tar.gz", "tar.xz", "tar.zst"])
def test_archive_is_extracted(
    ext: str, archives: dict[str, Path], range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    volume = make_volume("fs")
    (volume.data_dir / "disk.img").write_bytes(b"an old image")
    (volume.data_dir / "lost+found").mkdir()
    path = archives[ext]
    checksum = "sha512:" + hashlib.sha512(path.read_bytes()).hexdigest()
    result = run_importer(
        volume,
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"{range_server.url}/{path.name}",
            "IMPORTER_CONTENTTYPE": "archive",
            "IMPORTER_CHECKSUM": checksum,
        },
    )
    assert result.code == 0, result
    assert result.message["reason"] == "Complete"
    assert result.message["route"] == "archive"
    assert result.message["checksum"] == checksum
    root = volume.data_dir
    assert sorted(p.name for p in root.iterdir()) == ["README", "bin", "data", "deep", "lost+found"]
    assert (root / "README").read_bytes() == b"hello\n"
    assert (root / "bin" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert os.readlink(root / "bin" / "latest") == "run.sh"
    assert (root / "data" / "big.bin").read_bytes() == BIG_FILE
    assert (root / "data" / "again.bin").stat().st_ino == (root / "data" / "big.bin").stat().st_ino
    assert (root / "data" / "big.bin").stat().st_blocks * 512 < len(BIG_FILE)  # the zeros stayed holes
    assert (root / "deep").rglob("leaf.txt")


def test_archive_checksum_mismatch_leaves_an_empty_volume(
    archives: dict[str, Path], range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    volume = make_volume("fs")
    path = archives["tar.gz"]
    result = run_importer(
        volume,
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"{range_server.url}/{path.name}",
            "IMPORTER_CONTENTTYPE": "archive",
            "IMPORTER_CHECKSUM": "md5:" + "1" * 32,
        },
    )
    assert_failed(result, "ChecksumMismatch", retryable=False)
    assert list(volume.data_dir.iterdir()) == []


def test_not_a_tar(range_server: FileServer, served_dir: Path, make_volume: Callable[..., Volume]) -> None:
    (served_dir / "not-a-tar.bin").write_bytes(os.urandom(4096))
    volume = make_volume("fs")
    result = run_importer(
        volume,
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_CONTENTTYPE": "archive",
            "IMPORTER_ENDPOINT": f"{range_server.url}/not-a-tar.bin",
        },
    )
    assert_failed(result, "InvalidImage", "tar", retryable=False)
