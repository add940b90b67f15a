"""The README's first command: `cdi demo` imports a DataVolume end to end and verifies its bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.cluster import ROOT


def test_cdi_demo_runs_the_main_job(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "cdi.cli.main", "demo", "--data-dir", str(tmp_path / "demo")],
                            capture_output=True, text=True, timeout=300, check=False,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Successfully imported into PVC example" in result.stdout
    assert "matches the image's" in result.stdout
