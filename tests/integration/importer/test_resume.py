"""Resume: an importer killed half way continues from what it durably wrote.

The server holds every byte past the middle of the image behind a gate, so the importer is
reliably half way (never by timing): the test waits for the resume checkpoint to cover at least
40% of the image, kills the importer, opens the gate, and runs it again. The bytes the server sends
the second time are counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.images import Image
from tests.support.servers import FileServer, wait_for
from tests.support.sourceservers import BIG, Big

from .harness import (
    USABLE_BIG,
    Volume,
    assert_imported,
    base_env,
    importer_command,
    read_message,
    run_importer,
)

STATE = ".cdi-import-state"


def start_importer(volume: Volume, env: dict[str, str]) -> subprocess.Popen[bytes]:
    full = base_env()
    full.update(volume.env())
    full.update(env)
    return subprocess.Popen(
        importer_command(), env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=volume.root
    )


def state_of(volume: Volume, scratch: bool) -> dict[str, object] | None:
    path = (volume.scratch_dir if scratch else volume.data_dir) / STATE
    try:
        data: dict[str, object] = json.loads(path.read_text())
        return data
    except (FileNotFoundError, ValueError):
        return None


def checkpointed(volume: Volume, at_least: int, scratch: bool = False) -> Callable[[], bool]:
    def check() -> bool:
        state = state_of(volume, scratch)
        return state is not None and int(state["done_bytes"]) >= at_least  # type: ignore[call-overload]

    return check


@pytest.mark.parametrize(
    ("fmt", "mode"), [("raw", "fs"), ("qcow2", "fs"), ("xz", "fs"), ("vmdk", "fs"), ("raw", "block")]
)
def test_sigkill_half_way_then_resume(
    fmt: str, mode: str, big: Big, range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = {"raw": big.raw, "qcow2": big.qcow2, "xz": big.xz, "vmdk": big.vmdk_stream}[fmt]
    volume = make_volume(mode, scratch=mode == "block", block_size=128 << 20)
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{range_server.url}/{image.name}",
        "IMPORTER_IMAGE_SIZE": str(256 << 20),
    }
    if fmt != "xz":  # a checksum makes a resumed qcow2/xz fetch its prefix again (to hash it)
        env["IMPORTER_CHECKSUM"] = f"sha256:{image.file_sha256}"
    # the gate holds the second half; the last 64 KiB (an xz index) stay reachable
    range_server.close_gate(image.file_size // 2, image.file_size - (64 << 10))
    try:
        proc = start_importer(volume, env)
        try:
            wait_for(
                checkpointed(volume, int(image.file_size * 0.4), scratch=mode == "block"),
                60,
                message="a checkpoint past 40% of the image",
            )
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
    finally:
        range_server.open_gate()
    range_server.reset_counters()
    result = run_importer(volume, env)
    route = {"raw": "ranges", "qcow2": "qcow2-ranges", "xz": "xz-blocks", "vmdk": "vmdk-ranges"}[fmt]
    assert_imported(volume, image, result, route=route, sparse=False, usable=USABLE_BIG)
    if fmt != "xz":
        assert result.message["checksum"] == f"sha256:{image.file_sha256}"
    # the digest of the whole file, resumed prefix included (re-hashed from the target for raw, fetched again
    # for a qcow2/vmdk with a checksum); a resumed xz without a checksum records none (README "Extensions")
    assert result.message.get("sourceSha256") == (None if fmt == "xz" else image.file_sha256), result.message
    second = range_server.served(image.name)
    if fmt in ("raw", "xz"):  # a raw prefix is re-hashed from the target; a qcow2/vmdk one is fetched again
        assert second < image.file_size * 0.65, (
            f"the second attempt fetched {second} of {image.file_size} bytes"
        )
    assert "resuming" in result.stderr
    assert state_of(volume, mode == "block") is None


def test_sigterm_saves_a_checkpoint_and_resumes(
    big: Big, range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = big.raw
    volume = make_volume("fs")
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{range_server.url}/{image.name}",
        "IMPORTER_IMAGE_SIZE": str(256 << 20),
    }
    range_server.close_gate(image.file_size // 2)
    range_server.reset_counters()
    try:
        proc = start_importer(volume, env)
        wait_for(checkpointed(volume, int(image.file_size * 0.4)), 60, message="a checkpoint past 40% of the image")
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        range_server.open_gate()
    assert proc.returncode == 1
    message = read_message(volume)
    assert message["reason"] == "Terminated"
    assert message["retryable"] is True
    assert checkpointed(volume, int(image.file_size * 0.4))()  # never behind what was already durable
    range_server.reset_counters()
    result = run_importer(volume, env)
    assert_imported(volume, image, result, route="ranges", sparse=False, usable=USABLE_BIG)
    assert range_server.served(image.name) < image.file_size * 0.75
    assert result.message["sourceSha256"] == image.file_sha256  # the resumed prefix re-hashed from the target


def test_changed_source_starts_over(
    big: Big, range_server: FileServer, served_dir: Path, make_volume: Callable[..., Volume]
) -> None:
    """A checkpoint of another version of the object is ignored, never mixed into the new one."""
    copy = served_dir / "resume-changing.img"
    os.link(big.raw.path, copy) if not copy.exists() else None
    image = Image(copy.name, copy, "raw", "", big.raw.sha256, BIG, big.raw.file_sha256, BIG)
    volume = make_volume("fs")
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{range_server.url}/{copy.name}",
        "IMPORTER_IMAGE_SIZE": str(256 << 20),
    }
    range_server.close_gate(BIG // 2)
    try:
        proc = start_importer(volume, env)
        try:
            wait_for(checkpointed(volume, int(BIG * 0.4)), 60, message="a checkpoint past 40%")
        finally:
            proc.kill()
            proc.wait()
    finally:
        range_server.open_gate()
    os.utime(copy, (1_000_000_000, 1_000_000_000))  # a new Last-Modified / ETag
    range_server.reset_counters()
    result = run_importer(volume, env)
    assert_imported(volume, image, result, route="ranges", sparse=False, usable=USABLE_BIG)
    assert range_server.served(copy.name) >= BIG
    assert "not resuming" in result.stderr
    copy.unlink()


def test_no_resume_without_validators(big: Big, served_dir: Path, make_volume: Callable[..., Volume]) -> None:
    """Without ETag or Last-Modified a changed object could not be told apart: start over."""
    server = FileServer(served_dir, validators=False)
    image = big.raw
    volume = make_volume("fs")
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{server.url}/{image.name}",
        "IMPORTER_IMAGE_SIZE": str(256 << 20),
    }
    try:
        server.close_gate(image.file_size // 2)
        proc = start_importer(volume, env)
        try:
            wait_for(lambda: server.served(image.name) >= image.file_size // 3, 60, message="a third of the image")
        finally:
            proc.kill()
            proc.wait()
        assert state_of(volume, False) is None  # nothing to resume from was ever recorded
        server.open_gate()
        server.reset_counters()
        result = run_importer(volume, env)
        assert_imported(volume, image, result, route="ranges", sparse=False, usable=USABLE_BIG)
        assert server.served(image.name) >= image.file_size
        assert "will start over" in result.stderr
    finally:
        server.close()
