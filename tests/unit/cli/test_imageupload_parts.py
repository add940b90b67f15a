"""The pure parts of `cdi image-upload`: progress output, argument rules, image inspection and the
fit check (with the controller's sizing)."""

from __future__ import annotations

import argparse
import io
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from cdi.cli.imageupload import transfer
from cdi.cli.imageupload.command import UsageError, parse, register
from cdi.cli.imageupload.preflight import PreflightError, capacity, check_fits, inspect
from cdi.cli.imageupload.progress import Progress


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["image-upload", *argv])


def test_a_terminal_gets_a_bar_with_rate_and_eta() -> None:
    out = io.StringIO()
    progress = Progress(100 << 20, out=out, tty=True, interval=0.0)
    progress.add(25 << 20)
    text = out.getvalue()
    assert text.startswith("\r[") and "25.0% 25.0 MiB / 100.0 MiB, " in text and "B/s, ETA " in text
    progress.restart_at(10 << 20, "resuming at 10.0 MiB")
    progress.finish()
    assert "\nresuming at 10.0 MiB\n" in out.getvalue() and out.getvalue().endswith("\n")


def test_a_log_gets_plain_lines() -> None:
    out = io.StringIO()
    progress = Progress(4 << 20, out=out, tty=False, interval=0.0)
    progress.add(1 << 20)
    progress.add(3 << 20)
    progress.finish()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("uploaded  25.0% 1.0 MiB / 4.0 MiB, ") and "\r" not in out.getvalue()
    assert lines[-1].startswith("uploaded 100.0% 4.0 MiB / 4.0 MiB")


def test_virtctls_argument_rules() -> None:
    assert parse(args("dv", "x", "--image-path", "f", "--block-volume")) == ("dv", "x", "", False, "block")
    assert parse(args("--pvc-name", "old", "--pvc-size", "1Gi", "--image-path", "f")) == (
        "pvc", "old", "1Gi", False, "")
    for argv, message in [
        (("dv", "x"), "either image-path or archive-path"),
        (("dv", "x", "--image-path", "a", "--archive-path", "b"), "provide only one"),
        (("dv", "x", "--archive-path", "b", "--volume-mode", "block"), "should always be filesystem"),
        (("vm", "x", "--image-path", "a"), "invalid resource type vm"),
        (("dv", "x", "--image-path", "a", "--volume-mode", "disk"), "Invalid volume mode 'disk'"),
        (("dv", "x", "--image-path", "a", "--size", "1Gi", "--pvc-size", "2Gi"), "can not be specified"),
    ]:
        with pytest.raises(UsageError, match=message):
            parse(args(*argv))


def test_inspect_reads_format_and_virtual_size(tmp_path: Path) -> None:
    image = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-f", "qcow2", str(image), "20M"], check=True, capture_output=True)
    facts = inspect(image)
    assert (facts.format, facts.compression, facts.virtual_size, facts.annotation) == (
        "qcow2", None, 20 << 20, "qcow2")
    subprocess.run(["gzip", "-k", str(image)], check=True)
    gz = inspect(tmp_path / "disk.qcow2.gz")
    assert (gz.format, gz.compression, gz.virtual_size, gz.annotation) == ("qcow2", "gz", 20 << 20, "qcow2+gz")
    empty = tmp_path / "empty.img"
    empty.touch()
    with pytest.raises(PreflightError, match="is empty"):
        inspect(empty)


def test_fit_check_uses_the_volume_the_controller_will_make(tmp_path: Path) -> None:
    image = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-f", "qcow2", str(image), "100M"], check=True, capture_output=True)
    facts = inspect(image)
    check_fits(facts, capacity(100 << 20, "Block", "0"), "100Mi", datavolume_storage_api=False)
    with pytest.raises(PreflightError, match=r"use --size 106Mi or more"):
        check_fits(facts, capacity(100 << 20, "Filesystem", "0.055"), "100Mi", datavolume_storage_api=False)
    with pytest.raises(PreflightError, match=r"use --size 100Mi or more"):
        check_fits(facts, capacity(99 << 20, "Block", "0"), "99Mi", datavolume_storage_api=True)


def test_a_peer_that_stops_reading_is_a_dropped_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of sending (through the proxy's TLS, and end to end over a socket that the TLS switch
    left blocking without a timeout) give up on a connection that takes no bytes for `SEND_TIMEOUT`,
    so the upload is resumed instead of hanging."""
    image = tmp_path / "disk.raw"
    image.write_bytes(bytes(64 << 20))
    monkeypatch.setattr(transfer, "SEND_TIMEOUT", 0.5)
    upload = transfer.Transfer("https://127.0.0.1:1", ssl.create_default_context(), transfer.TokenSource(lambda: "t"),
                               "default/disk", str(image), Progress(64 << 20, out=io.StringIO(), tty=False))
    ours, silent = socket.socketpair()
    with ours, silent:
        ours.settimeout(None)
        attempt = transfer.Attempt(offset=0)
        with pytest.raises(TimeoutError):
            upload._send_body(ours, 0, attempt)
        assert attempt.sent < 64 << 20
