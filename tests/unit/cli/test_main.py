"""The `cdi` entry point loads only the command asked for, and still knows them all."""

from __future__ import annotations

import subprocess
import sys

from cdi.cli.main import COMMANDS

_LOADED = """
import sys
from cdi.cli import main
try:
    main.main({argv!r})
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m.startswith(("cdi.embedded", "cdi.apiserver", "cdi.controller.manager",
                                                     "cdi.uploadproxy.server"))))
"""


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _LOADED.format(argv=argv)], capture_output=True, text=True,
                          check=True, timeout=60)


def test_image_upload_does_not_load_the_control_plane() -> None:
    result = _run(["-v", "image-upload", "--help"])
    assert "usage: cdi image-upload" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"  # no control plane, API server, controller or proxy


def test_the_top_level_help_and_errors_name_every_command() -> None:
    result = _run(["--help"])
    assert result.stdout.strip().splitlines()[-1] != "[]"  # all commands were loaded
    for name in COMMANDS:
        assert name in result.stdout
    result = _run(["bogus"])
    assert "invalid choice: 'bogus'" in result.stderr
    assert all(repr(name) in result.stderr for name in COMMANDS)
