"""Closing a native TLS connection while another thread is blocked reading it (the GIL released, inside
OpenSSL or `poll`) ends that read at once and frees nothing under it: no crash, no use-after-free.

Each run is a process of its own (`closeprobe.py`), so that a crash fails the test instead of the run; the
second test runs the same rounds against a build of the extension with AddressSanitizer, which turns any
use of freed memory into a failure even where it would not crash."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from cdi.common import tlsfront
from tests.support.cluster import ROOT

PROBE = Path(__file__).with_name("closeprobe.py")
SOURCE = ROOT / "cdi/common/_tlsfront.c"
ROUNDS = 200


def _run(*extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROBE), str(ROUNDS), *extra], check=False, capture_output=True,
                          text=True, timeout=240, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"


@pytest.mark.skipif(not tlsfront.native_available(), reason="the C extension is not built")
def test_close_while_a_read_is_blocked_ends_it_and_crashes_nothing() -> None:
    done = _run()
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), _explain(done)


def test_the_same_under_address_sanitizer(tmp_path: Path) -> None:
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        pytest.skip("no C compiler")
    libasan = subprocess.run([compiler, "-print-file-name=libasan.so"], check=False, capture_output=True,
                             text=True).stdout.strip()
    if not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.skip("no AddressSanitizer runtime (libasan)")
    built = tmp_path / "_tlsfront_asan.so"
    compiled = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-g", "-fsanitize=address",
                               "-fno-omit-frame-pointer", f"-I{sysconfig.get_paths()['include']}", str(SOURCE),
                               "-o", str(built), "-lssl", "-lcrypto"], check=False, capture_output=True, text=True)
    if compiled.returncode != 0:
        pytest.skip(f"cannot build the extension with AddressSanitizer: {compiled.stderr[-500:]}")
    done = _run(str(built), env={"LD_PRELOAD": libasan, "ASAN_OPTIONS": "detect_leaks=0"})
    assert "AddressSanitizer" not in done.stderr, _explain(done)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), _explain(done)
