"""qemu-img and nbdkit, for the formats Python should not parse (vmdk, vhd, vhdx, vdi, odd qcow2s).

Compared with CDI's invocation (`qemu-img convert -t writeback -p -O raw`, no `-f`), the convert
here passes the probed format explicitly (`-f`: no re-probing, no raw/qcow2 confusion), writes
out of order with 8 coroutines (`-W -m 8`), writes into the existing target (`-n`), tells qemu-img
when the target is already zero (`--target-is-zero`: zero areas are skipped instead of written),
and parses progress with a pattern that also accepts 100.00.

nbdkit's curl plugin exposes an HTTP(S) object as an NBD socket, so qemu-img converts a vmdk/vhd/
vhdx/vdi while reading it through Range requests, without a scratch copy.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from .errors import ImporterError, Reason
from .retry import Terminated
from .source import NbdSpec

log = logging.getLogger(__name__)

_PROGRESS = re.compile(rb"\((\d{1,3}\.\d\d)/100%\)")
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def info(location: str, fmt: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
    cmd = ["qemu-img", "info", "--output=json"]
    if fmt:
        cmd += ["-f", fmt]
    cmd.append(location)
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ImporterError(
            Reason.CONVERSION_FAILED, f"qemu-img info timed out on {location}", retryable=True
        ) from exc
    if proc.returncode != 0:
        raise _qemu_error("qemu-img info", proc.stderr)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _qemu_error(what: str, stderr: bytes) -> ImporterError:
    text = " ".join(stderr.decode(errors="replace").split())[-1500:]
    if "No space left on device" in text or "Disk quota exceeded" in text:
        return ImporterError(Reason.NO_SPACE_LEFT, f"{what}: {text}")
    if "nbd" in text.lower() and ("connection" in text.lower() or "server" in text.lower()):
        return ImporterError(Reason.CONNECTION_FAILED, f"{what}: {text}", retryable=True)
    return ImporterError(Reason.CONVERSION_FAILED, f"{what} failed: {text}")


def convert(
    source: str,
    source_format: str,
    target: Path,
    *,
    target_is_zero: bool,
    write_zeros: bool,
    on_progress: Callable[[float], None] | None = None,
    stop: threading.Event | None = None,
    extra_error: Callable[[], str] | None = None,
) -> None:
    """qemu-img convert to raw into the existing `target` (file already sized, or a device)."""
    cmd = [
        "qemu-img",
        "convert",
        "-p",
        "-W",
        "-m",
        "8",
        "-n",
        "-t",
        "writeback",
        "-f",
        source_format,
        "-O",
        "raw",
    ]
    if target_is_zero:
        cmd.append("--target-is-zero")
    if write_zeros:
        cmd += ["-S", "0"]  # preallocated block target: write zeros instead of discarding
    cmd += [source, str(target)]
    log.info("running %s", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr_chunks: list[bytes] = []
    drain = threading.Thread(
        target=lambda: stderr_chunks.append(proc.stderr.read() if proc.stderr else b""), daemon=True
    )
    drain.start()
    assert proc.stdout is not None
    stdout = cast(io.BufferedReader, proc.stdout)
    try:
        buf = b""
        while True:
            if stop is not None and stop.is_set():
                raise Terminated()
            chunk = stdout.read1(4096)
            if not chunk:
                break
            buf = (buf + chunk)[-256:]
            matches = _PROGRESS.findall(buf)
            if matches and on_progress is not None:
                on_progress(float(matches[-1]) / 100.0)
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    drain.join()
    if code != 0:
        err = _qemu_error("qemu-img convert", b"".join(stderr_chunks))
        if extra_error is not None:
            err.message += extra_error()
        raise err


class Nbdkit:
    """nbdkit serving an HTTP(S) object over a unix socket, read-only, until closed."""

    def __init__(self, spec: NbdSpec) -> None:
        self.spec = spec
        self.dir = Path(tempfile.mkdtemp(prefix="cdi-nbdkit-"))
        self.socket = self.dir / "nbd.sock"
        self.log_path = self.dir / "nbdkit.log"
        self.requests_path = self.dir / "requests.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.bytes_read = 0  # what the curl plugin fetched, known once closed

    @property
    def uri(self) -> str:
        return f"nbd+unix:///?socket={self.socket}"

    def start(self, timeout: float = 30.0) -> None:
        spec = self.spec
        pidfile = self.dir / "nbdkit.pid"
        args = [
            "nbdkit",
            "--foreground",
            "--exit-with-parent",
            "--readonly",
            "-U",
            str(self.socket),
            "--pidfile",
            str(pidfile),
            "--filter=retry",
            "--filter=log",  # next to the plugin: every read it served, to count the bytes fetched
            "curl",
            f"logfile={self.requests_path}",
            "retries=5",
            "retry-delay=1",
            "timeout=60",
            "header=User-Agent: cdi-importer",
        ]
        for name, value in spec.headers:
            args.append(f"header={name}: {value}")
        if spec.insecure:
            args.append("sslverify=false")
        elif spec.cainfo:
            bundle = self.dir / "ca.pem"
            parts = [SYSTEM_CA_BUNDLE.read_bytes()] if SYSTEM_CA_BUNDLE.exists() else []
            parts += [Path(p).read_bytes() for p in spec.cainfo]
            bundle.write_bytes(b"\n".join(parts))
            args.append(f"cainfo={bundle}")
        if spec.user is not None:
            pw = self.dir / "password"
            fd = os.open(pw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(spec.password or "")
            args += [f"user={spec.user}", f"password=+{pw}"]
        args.append(f"url={spec.url}")
        log_file = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log_file.close()
        deadline = time.monotonic() + timeout
        while not (pidfile.exists() and self.socket.exists()):
            if self.proc.poll() is not None:
                raise ImporterError(
                    Reason.CONVERSION_FAILED, f"nbdkit exited at start: {self.log()}", retryable=True
                )
            if time.monotonic() > deadline:
                raise ImporterError(Reason.CONVERSION_FAILED, "nbdkit did not start in time", retryable=True)
            time.sleep(0.02)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return " ".join(self.log_path.read_text(errors="replace").split())[-800:]
        return ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError):
            self.bytes_read = read_bytes(self.requests_path)
        with contextlib.suppress(OSError):
            for p in self.dir.iterdir():
                p.unlink()
            self.dir.rmdir()


_READ = re.compile(r"connection=(\d+) Read id=(\d+) offset=0x[0-9a-f]+ count=0x([0-9a-f]+) ")
_READ_DONE = re.compile(r"connection=(\d+) \.\.\.Read id=(\d+) return=0")


def read_bytes(log_path: Path) -> int:
    """Bytes of the reads the curl plugin answered, from nbdkit's log filter (bytesTransferred)."""
    pending: dict[tuple[str, str], int] = {}
    total = 0
    with open(log_path, errors="replace") as f:
        for line in f:
            if (m := _READ.search(line)) is not None:
                pending[(m[1], m[2])] = int(m[3], 16)
            elif (m := _READ_DONE.search(line)) is not None:
                total += pending.pop((m[1], m[2]), 0)
    return total


@contextlib.contextmanager
def nbdkit(spec: NbdSpec) -> Iterator[Nbdkit]:
    server = Nbdkit(spec)
    try:
        server.start()
        yield server
    finally:
        server.close()
