"""The test harness: a pod's volumes as temp dirs, the importer run as a subprocess, result checks.

The importer is run exactly as in a pod (`python -m cdi.importer`, configured by environment
variables only); only the four in-pod paths are redirected into the test's temp dir.
"""

from __future__ import annotations

import json
import os
import random
import ssl
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdi.api.sizing import usable_space
from cdi.common.imageprobe import HEAD_BYTES, head_needs_scratch
from tests.support.images import COMPRESSIONS, FORMATS, Image, file_name, sha256_file

REPO_ROOT = Path(__file__).resolve().parents[3]
REQUESTED = 32 << 20
OVERHEAD = "0.055"
USABLE = usable_space(OVERHEAD, REQUESTED)
USABLE_BIG = usable_space(OVERHEAD, 256 << 20)  # the 256 MiB volume of the tests with the 48 MiB disk
BLOCK_SIZE = 16 << 20
GARBAGE = b"\xaa"
GARBAGE_STRIPE = GARBAGE * 4096


@dataclass(frozen=True)
class Case:
    """One cell of the format x compression x volume mode matrix."""

    fmt: str
    compression: str
    mode: str

    @property
    def name(self) -> str:
        return file_name(self.fmt, self.compression)

    @property
    def source_format(self) -> str:
        return self.fmt.split("-", maxsplit=1)[0] + (f".{self.compression}" if self.compression else "")

    def __str__(self) -> str:
        return f"{self.fmt}-{self.compression or 'plain'}-{self.mode}"


CASES = [Case(f, c, m) for f in FORMATS for c in COMPRESSIONS for m in ("fs", "block")]
# every format x compression once, the volume mode alternating so that each format and each
# compression still runs on both modes: for sources whose only difference from HTTP is the transport
CHECKERBOARD = [
    Case(f, c, ("fs", "block")[(i + j) % 2])
    for i, f in enumerate(FORMATS)
    for j, c in enumerate(COMPRESSIONS)
]


# -- volumes and the importer -------------------------------------------------------------------------
@dataclass
class Volume:
    """The mounts of one importer pod, as directories and files under a test's tmp dir."""

    root: Path
    mode: str  # "fs" or "block"
    scratch: bool = False
    block_size: int = BLOCK_SIZE
    data_dir: Path = field(init=False)
    block_path: Path = field(init=False)
    scratch_dir: Path = field(init=False)
    termination_log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.data_dir = self.root / "data"
        self.block_path = self.root / "cdi-block-volume"
        self.scratch_dir = self.root / "scratch"
        self.termination_log = self.root / "termination-log"
        self.root.mkdir(parents=True)
        if self.mode == "fs":
            self.data_dir.mkdir(parents=True)
        else:
            # a "device" with old contents: zero regions of the image must really be zeroed. A stripe
            # of garbage in every 64 KiB (the importer's zero-detection block) is enough to tell.
            with open(self.block_path, "wb") as f:
                f.truncate(self.block_size)
                for offset in range(0, min(self.block_size, 32 << 20), 64 << 10):
                    f.seek(offset)
                    f.write(GARBAGE_STRIPE)
        if self.scratch:
            self.scratch_dir.mkdir(parents=True)

    def untouched(self) -> bool:
        """Whether the block device still holds its old garbage."""
        with open(self.block_path, "rb") as f:
            return all(f.read(64 << 10).startswith(GARBAGE_STRIPE) for _ in range(16))

    @property
    def target(self) -> Path:
        return self.data_dir / "disk.img" if self.mode == "fs" else self.block_path

    def env(self) -> dict[str, str]:
        return {
            "IMPORTER_DATA_DIR": str(self.data_dir),
            "IMPORTER_BLOCK_PATH": str(self.block_path),
            "IMPORTER_SCRATCH_DIR": str(self.scratch_dir),
            "TERMINATION_LOG": str(self.termination_log),
        }


@dataclass
class Result:
    code: int
    message: dict[str, Any]
    stderr: str

    def __repr__(self) -> str:
        return f"Result(code={self.code}, message={self.message}, stderr=...{self.stderr[-3000:]})"


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("IMPORTER_", "AWS_"))
        and k.lower() not in ("http_proxy", "https_proxy", "no_proxy")
        and k not in ("POD_IP", "OWNER_UID", "INSECURE_TLS", "PREALLOCATION", "FILESYSTEM_OVERHEAD")
    }
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(
        {
            "IMPORTER_IMAGE_SIZE": str(REQUESTED),
            "FILESYSTEM_OVERHEAD": OVERHEAD,
            "IMPORTER_RETRY_BUDGET": "3",
            "IMPORTER_READ_TIMEOUT": "20",
            "OWNER_UID": "test-owner-uid",
        }
    )
    return env


def importer_command() -> list[str]:
    return [sys.executable, "-m", "cdi.importer"]


def read_message(volume: Volume) -> dict[str, Any]:
    text = volume.termination_log.read_text()
    assert "\n" not in text.strip()
    assert len(text.encode()) <= 4096
    data: dict[str, Any] = json.loads(text)
    return data


def run_importer(volume: Volume, env: dict[str, str], timeout: float = 120) -> Result:
    full = base_env()
    full.update(volume.env())
    full.update(env)
    proc = subprocess.run(
        importer_command(),
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=volume.root,
    )
    return Result(proc.returncode, read_message(volume), proc.stderr)


# -- checks -----------------------------------------------------------------------------------------------
def assert_zero_beyond(path: Path, start: int, end: int) -> None:
    with open(path, "rb") as f:
        f.seek(start)
        remaining = end - start
        while remaining:
            chunk = f.read(min(remaining, 4 << 20))
            assert chunk.count(0) == len(chunk), "bytes beyond the image are not zero"
            remaining -= len(chunk)


def rule_says_scratch(image: Image, access: str) -> bool:
    """What the controller decides from the image's first bytes, before any importer pod exists."""
    with open(image.path, "rb") as f:
        head = f.read(HEAD_BYTES)
    return head_needs_scratch(head, access)


def assert_imported(
    volume: Volume,
    image: Image,
    result: Result,
    *,
    route: str | None = None,
    sparse: bool = True,
    usable: int = USABLE,
) -> None:
    assert result.code == 0, result
    msg = result.message
    assert msg["reason"] == "Complete", msg
    assert msg["retryable"] is False
    assert msg["message"] == "Import Complete"
    assert msg["scratchSpaceRequired"] is False
    assert msg["virtualSize"] == image.virtual_size, msg
    if route is not None:
        assert msg["route"] == route, msg
    target = volume.target
    assert sha256_file(target, image.virtual_size) == image.sha256, "imported bytes differ from qemu-img's"
    st = target.stat()
    if volume.mode == "fs":
        assert st.st_size == usable, f"disk.img is {st.st_size} bytes, the usable size is {usable}"
        assert st.st_mode & 0o777 == 0o660
        assert_zero_beyond(target, image.virtual_size, st.st_size)
        if sparse:
            assert st.st_blocks * 512 < image.virtual_size * 0.7, (
                f"disk.img is not sparse: {st.st_blocks * 512} bytes allocated"
            )
        assert not (volume.data_dir / ".cdi-import-state").exists()
    else:
        assert st.st_size == volume.block_size
    if volume.scratch:
        assert list(volume.scratch_dir.iterdir()) == [], "scratch space was not cleaned up"


def assert_transferred(result: Result, image: Image, route: str) -> None:
    """bytesTransferred is what came over the wire: all of the file (at most the head twice more) for
    the routes that read it whole, and no more than the file for those that read only its data."""
    sent = result.message["bytesTransferred"]
    # these skip unallocated areas
    whole = route not in ("qcow2-ranges", "vmdk-ranges", "vdi-ranges", "vhd-ranges", "vhdx-ranges", "nbdkit-convert")
    low = image.file_size if whole else image.file_size // 3
    assert low <= sent <= image.file_size + (3 << 20), (
        f"bytesTransferred {sent} for a {image.file_size}-byte file by {route}"
    )


def assert_failed(result: Result, reason: str, *fragments: str, retryable: bool | None = None) -> None:
    assert result.code != 0, result
    msg = result.message
    assert msg["reason"] == reason, result
    if retryable is not None:
        assert msg["retryable"] is retryable, msg
    for fragment in fragments:
        assert fragment in msg["message"], msg


def pod_ip() -> str:
    """A loopback address of our own for the metrics port (as the embedded node gives each pod)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or "0"
    return f"127.{10 + int(worker) % 200}.{random.randint(1, 250)}.{random.randint(2, 250)}"


def scrape(ip: str) -> str | None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://{ip}:8443/metrics", context=context, timeout=5) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        metric_name, _, label_text = key.partition("{")
        if metric_name != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            return float(value)
    return None
