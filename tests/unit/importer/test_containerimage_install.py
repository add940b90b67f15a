"""What the node-pull init container installs (`cdi-importer --install-containerimage-server`): the
server script, started by the static busybox copied beside it, since the user's image may hold
nothing but its disk. A dynamically linked busybox would fail there with a bare "no such file or
directory", so it is refused here, where the message can say what is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cdi.importer import containerimage


def test_the_server_starts_with_the_busybox_beside_it(tmp_path: Path) -> None:
    assert containerimage.install(str(tmp_path / "server")) == 0
    first_line = (tmp_path / "server").read_text().splitlines()[0]
    assert first_line == f"#!{tmp_path / 'busybox'} sh"
    assert (tmp_path / "server").stat().st_mode & 0o111 and (tmp_path / "busybox").stat().st_mode & 0o111


def test_a_dynamically_linked_busybox_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    dynamic = Path(shutil.which("ls") or "/bin/ls")  # any program of the system: linked against its libc
    monkeypatch.setattr(containerimage, "BUSYBOX_PATHS", (dynamic,))
    assert containerimage.install(str(tmp_path / "server")) == 1
    assert "busybox-static" in capsys.readouterr().out
    assert not (tmp_path / "server").exists()
