"""The data directory is private (cdi.embedded.datadir): never one shared with other users, such as /tmp."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cdi.embedded.datadir import DataDirError, prepare


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_shared_directory_is_refused_not_made_private(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(DataDirError, match="shared with other users"):
        prepare(shared)
    assert mode(shared) == 0o1777


def test_volumes_are_left_as_they_are(tmp_path: Path) -> None:
    volume = tmp_path / "cdi" / "storage" / "volumes" / "pvc-1"
    volume.mkdir(parents=True)
    (volume / "tls.key").write_text("a pod's file")
    os.chmod(volume / "tls.key", 0o644)
    (tmp_path / "cdi" / "uploadproxy").mkdir()
    (tmp_path / "cdi" / "uploadproxy" / "ca.key").write_text("key")
    os.chmod(tmp_path / "cdi" / "uploadproxy" / "ca.key", 0o644)
    prepare(tmp_path / "cdi")
    assert (mode(tmp_path / "cdi"), mode(tmp_path / "cdi" / "uploadproxy"),
            mode(tmp_path / "cdi" / "uploadproxy" / "ca.key")) == (0o700, 0o700, 0o600)
    assert mode(volume / "tls.key") == 0o644
