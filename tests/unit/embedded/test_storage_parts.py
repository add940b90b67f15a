"""The local storage's byte handling: hole-keeping copies, and volumes that are directories or
sparse files, cloned, snapshotted, restored, grown and deleted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi.embedded.storage.admission import default_class
from cdi.embedded.storage.backend import BLOCK, DIR, LocalVolumes, StorageError
from cdi.embedded.storage.claims import data_source, is_populated_elsewhere
from cdi.embedded.storage.copy import allocated_bytes, copy_file, copy_tree, data_extents

MIB = 1024 * 1024


def _sparse(path: Path, size: int = 32 * MIB) -> bytes:
    with open(path, "wb") as f:
        f.truncate(size)
        f.seek(8 * MIB)
        f.write(b"x" * 4096)
    return path.read_bytes()


def test_copy_file_keeps_bytes_and_holes(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    content = _sparse(src)
    copy_file(src, dst)
    assert dst.read_bytes() == content
    assert allocated_bytes(dst) <= allocated_bytes(src) + 64 * 1024
    with open(dst, "rb") as f:
        extents = data_extents(f.fileno(), os.fstat(f.fileno()).st_size)
    assert extents and all(offset >= 8 * MIB - 64 * 1024 and offset < 9 * MIB for offset, _ in extents)


def test_copy_tree_keeps_structure_links_and_modes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f").write_text("hello")
    os.chmod(src / "sub" / "f", 0o640)
    (src / "link").symlink_to("sub/f")
    dst = tmp_path / "dst"
    copy_tree(src, dst)
    assert (dst / "sub" / "f").read_text() == "hello"
    assert os.stat(dst / "sub" / "f").st_mode & 0o777 == 0o640
    assert os.readlink(dst / "link") == "sub/f"


def test_directory_volumes_clone_snapshot_restore_delete(tmp_path: Path) -> None:
    volumes = LocalVolumes(tmp_path)
    volumes.start()
    record = volumes.create("pvc-a", 10 * MIB, block=False)
    assert record.kind == DIR and volumes.path("pvc-a").is_dir()
    content = _sparse(volumes.path("pvc-a") / "disk.img")
    volumes.take_snapshot("snap-1", "pvc-a")
    (volumes.path("pvc-a") / "disk.img").write_bytes(b"changed")
    volumes.restore("pvc-b", "snap-1", 10 * MIB)
    assert (volumes.path("pvc-b") / "disk.img").read_bytes() == content
    volumes.clone("pvc-c", "pvc-a", 20 * MIB)
    assert (volumes.path("pvc-c") / "disk.img").read_bytes() == b"changed"
    assert volumes.get("pvc-c").size == 20 * MIB  # type: ignore[union-attr]
    volumes.delete("pvc-a")
    assert volumes.get("pvc-a") is None and not (tmp_path / "volumes" / "pvc-a").exists()
    volumes.delete_snapshot("snap-1")
    assert volumes.snapshot("snap-1") is None
    assert sorted(LocalVolumes(tmp_path).handles()) == ["pvc-b", "pvc-c"]  # records survive a restart


def test_block_volumes_are_sparse_files_that_grow(tmp_path: Path) -> None:
    volumes = LocalVolumes(tmp_path)
    record = volumes.create("pvc-b", 16 * MIB, block=True)
    path = volumes.path("pvc-b")
    assert record.kind == BLOCK and path.stat().st_size == 16 * MIB and allocated_bytes(path) == 0
    volumes.expand("pvc-b", 32 * MIB)
    assert path.stat().st_size == 32 * MIB and volumes.get("pvc-b").size == 32 * MIB  # type: ignore[union-attr]
    with pytest.raises(StorageError, match="less than"):
        volumes.clone("pvc-c", "pvc-b", 8 * MIB)
    with pytest.raises(StorageError, match="does not exist"):
        volumes.clone("pvc-d", "missing", 8 * MIB)


def test_default_class_and_data_sources() -> None:
    def sc(name: str, default: bool, stamp: str) -> dict:  # type: ignore[type-arg]
        annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
        return {"metadata": {"name": name, "annotations": annotations, "creationTimestamp": stamp}}

    assert default_class([sc("a", True, "1"), sc("b", False, "2"), sc("c", True, "3")]) == "c"
    assert default_class([sc("a", False, "1")]) is None
    claim = {"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "x"}}}
    assert data_source(claim) == {"kind": "PersistentVolumeClaim", "name": "x"}
    assert not is_populated_elsewhere(data_source(claim))
    assert not is_populated_elsewhere({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"})
    assert is_populated_elsewhere({"apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource"})
