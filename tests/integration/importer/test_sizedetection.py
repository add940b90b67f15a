"""`cdi-image-size-detection` (the size-detection pod's program) on real images with the real qemu-img:
the virtual size alone as the termination message, CDI's exit codes otherwise."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

from tests.support.cluster import ROOT


def detect(tmp_path: Path, *args: str) -> tuple[int, str]:
    log = tmp_path / "termination-log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERMINATION_LOG": str(log)}
    done = subprocess.run([sys.executable, "-m", "cdi.importer.sizedetection", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    return done.returncode, log.read_text() if log.exists() else ""


def test_the_virtual_size_is_the_termination_message(tmp_path: Path) -> None:
    raw = tmp_path / "disk.img"
    with raw.open("wb") as f:
        f.truncate(40 * 1024 * 1024)  # sparse: 40 MiB virtual, nothing allocated
    assert detect(tmp_path, "-image-path", str(raw)) == (0, str(40 * 1024 * 1024))
    qcow2 = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(qcow2), "3G"], check=True)
    assert detect(tmp_path, "-image-path=" + str(qcow2)) == (0, str(3 << 30))


def test_cdis_exit_codes(tmp_path: Path) -> None:
    assert detect(tmp_path)[0] == 1  # ErrBadArguments
    assert detect(tmp_path, "-image-path", str(tmp_path / "missing.img"))[0] == 3  # ErrInvalidPath
    bad = tmp_path / "bad.qcow2"
    # a qcow2 version 3 header asking for 2^40-byte clusters: qemu-img cannot open it
    bad.write_bytes(b"QFI\xfb" + struct.pack(">I", 3) + bytes(12) + struct.pack(">I", 40) + bytes(600))
    assert detect(tmp_path, "-image-path", str(bad))[0] == 2  # ErrInvalidFile
