"""Container logs as the kubelet keeps them: one file per container start
(`pods/<uid>/containers/<name>/<restart>.log`), each line in the CRI format
`<RFC3339Nano> <stdout|stderr> <F|P> <text>` (P: the line had no newline), so that `kubectl logs`
can ask for timestamps, the last N lines, the previous start, or to follow a running container.

When a pod is removed, its log files move to `terminated/<namespace>_<name>_<uid>/` on the node (the
newest `KEEP_TERMINATED` pods only): a worker pod is deleted as soon as its DataVolume is done, and
what it said is often the one clue left when something went wrong; a real kubelet has the container
runtime's and the node's logs for that."""

from __future__ import annotations

import asyncio
import datetime
import os
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from cdi.embedded.kubeapi import errors

TERMINATED = "terminated"
KEEP_TERMINATED = 50  # pods whose logs are kept after their removal


def _stamp() -> str:
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond * 1000:09d}Z"


class LogWriter:
    """Appends one container start's output; readers following it are woken on each write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: a container may print anything, secrets included (as the node's own data directory is private)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._file = open(fd, "ab", buffering=0)  # noqa: SIM115 - lives as long as the container
        self._changed = asyncio.Event()
        self.closed = False
        self._partial: dict[str, bytes] = {}

    def write(self, stream: str, data: bytes) -> None:
        """Raw bytes from a pipe: complete lines are logged now, the rest when it completes."""
        buffer = self._partial.get(stream, b"") + data
        lines = buffer.split(b"\n")
        self._partial[stream] = lines.pop()
        if len(self._partial[stream]) > 16 * 1024:
            lines.append(self._partial[stream])
            self._partial[stream] = b""
            out = [self._line(stream, line, True) for line in lines[:-1]] + [self._line(stream, lines[-1], False)]
        else:
            out = [self._line(stream, line, True) for line in lines]
        if out:
            self._file.write(b"".join(out))
            self._wake()

    def _line(self, stream: str, text: bytes, full: bool) -> bytes:
        return f"{_stamp()} {stream} {'F' if full else 'P'} ".encode() + text + b"\n"

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        await self._changed.wait()

    def close(self) -> None:
        if self.closed:
            return
        for stream, rest in self._partial.items():
            if rest:
                self._file.write(self._line(stream, rest, False))
        self._partial.clear()
        self._file.close()
        self.closed = True
        self._wake()


@dataclass
class LogLine:
    stamp: str
    text: bytes  # with its newline if it had one

    @classmethod
    def parse(cls, raw: bytes) -> LogLine:
        parts = raw.rstrip(b"\n").split(b" ", 3)
        if len(parts) < 4:
            return cls("", raw)
        return cls(parts[0].decode(), parts[3] + (b"\n" if parts[2] == b"F" else b""))


def tail_text(path: Path, max_bytes: int = 2048, max_lines: int = 80) -> str:
    """The end of a container's log (a termination message of policy FallbackToLogsOnError)."""
    try:
        lines = [LogLine.parse(raw).text for raw in path.read_bytes().splitlines(keepends=True)]
    except OSError:
        return ""
    text = b"".join(lines[-max_lines:])[-max_bytes:]
    return text.decode(errors="replace")


@dataclass
class ContainerLogs:
    """Where a container's logs are and whether its current start is still writing."""

    directory: Path
    waiting_reason: Callable[[], str | None]  # why it has not started (no log yet), or None

    def path(self, restart: int) -> Path:
        return self.directory / f"{restart}.log"

    def starts(self) -> list[int]:
        try:
            return sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        except OSError:
            return []


class NodeLogs:
    """The `pods/log` source the API server's handlers call (`ApiHandlers.log_source`)."""

    def __init__(self) -> None:
        self._containers: dict[tuple[str, str], dict[str, ContainerLogs]] = {}
        self._writers: dict[Path, LogWriter] = {}

    def register(self, namespace: str, pod: str, containers: dict[str, ContainerLogs]) -> None:
        self._containers[(namespace, pod)] = containers

    def unregister(self, namespace: str, pod: str) -> None:
        self._containers.pop((namespace, pod), None)

    def open(self, path: Path) -> LogWriter:
        writer = LogWriter(path)
        self._writers[path] = writer
        return writer

    def closed(self, writer: LogWriter) -> None:
        writer.close()
        self._writers.pop(writer.path, None)

    def stream(self, namespace: str, pod: str, container: str | None, *, follow: bool, previous: bool,
               tail_lines: int | None, timestamps: bool, limit_bytes: int | None) -> AsyncIterator[bytes]:
        containers = self._containers.get((namespace, pod))
        if containers is None:
            raise errors.bad_request(f'pod "{pod}" is not running on this node: no logs available')
        if container is None:
            if len(containers) != 1:
                names = " ".join(containers)
                raise errors.bad_request(f"a container name must be specified for pod {pod}, choose one of: "
                                         f"[{names}]")
            container = next(iter(containers))
        logs = containers.get(container)
        if logs is None:
            raise errors.bad_request(f'container {container} is not valid for pod {pod}')
        starts = logs.starts()
        if previous:
            if len(starts) < 2:
                raise errors.bad_request(f'previous terminated container "{container}" in pod "{pod}" not found')
            path = logs.path(starts[-2])
            follow = False
        else:
            if not starts:
                reason = logs.waiting_reason() or "ContainerCreating"
                raise errors.bad_request(f'container "{container}" in pod "{pod}" is waiting to start: {reason}')
            path = logs.path(starts[-1])
        writer = self._writers.get(path) if follow else None
        return self._read(path, writer, tail_lines, timestamps, limit_bytes)

    async def _read(self, path: Path, writer: LogWriter | None, tail_lines: int | None, timestamps: bool,
                    limit_bytes: int | None) -> AsyncIterator[bytes]:
        sent = 0
        with open(path, "rb") as f:  # noqa: ASYNC230 - a local file read in small pieces
            lines = f.read().splitlines(keepends=True)
            pending = b""
            if lines and not lines[-1].endswith(b"\n"):
                pending = lines.pop()
            if tail_lines is not None:
                lines = lines[-tail_lines:] if tail_lines > 0 else []
            while True:
                out = []
                for raw in lines:
                    line = LogLine.parse(raw)
                    out.append((line.stamp.encode() + b" " if timestamps else b"") + line.text)
                chunk = b"".join(out)
                if limit_bytes is not None:
                    chunk = chunk[:max(0, limit_bytes - sent)]
                if chunk:
                    sent += len(chunk)
                    yield chunk
                if limit_bytes is not None and sent >= limit_bytes:
                    return
                if writer is None:
                    return
                if writer.closed:
                    rest = pending + f.read()
                    lines = rest.splitlines(keepends=True)
                    pending = b""
                    writer = None
                    continue
                waiter = asyncio.ensure_future(writer.changed())
                try:
                    await asyncio.wait_for(asyncio.shield(waiter), 1.0)
                except TimeoutError:
                    pass
                finally:
                    waiter.cancel()
                data = pending + f.read()
                lines = data.splitlines(keepends=True)
                pending = b""
                if lines and not lines[-1].endswith(b"\n"):
                    pending = lines.pop()


def keep_terminated(containers: Path, into: Path, pod: str, keep: int = KEEP_TERMINATED) -> None:
    """Move the log files of a pod being removed (`containers/<name>/<restart>.log`) to `into/pod/`
    as `<name>-<restart>.log`, and drop the kept logs of all but the newest `keep` pods."""
    files = sorted(containers.glob("*/*.log"))
    if not files:
        return
    target = into / pod
    target.mkdir(parents=True, exist_ok=True)
    for path in files:
        path.replace(target / f"{path.parent.name}-{path.name}")
    kept = sorted((d for d in into.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime_ns)
    for old in kept[:-keep] if keep else kept:
        shutil.rmtree(old, ignore_errors=True)
