"""One start of one container: a bwrap process in its own process group, its output piped into the
log, and the two ways it ends early — SIGTERM to the container's main process (PID 2 in its PID
namespace; bwrap's reaper ignores it), then SIGKILL to the whole bwrap process group, which takes
the PID namespace and everything in it down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path

from cdi.embedded.node.logs import LogWriter
from cdi.embedded.node.sandbox import SandboxSpec, bwrap_argv

log = logging.getLogger(__name__)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


class ContainerProcess:
    def __init__(self, spec: SandboxSpec, log_writer: LogWriter, bwrap: str = "bwrap",
                 setpriv: str = "setpriv") -> None:
        self.spec = spec
        self.log = log_writer
        self.bwrap = bwrap
        self.setpriv = setpriv
        self.proc: asyncio.subprocess.Process | None = None
        self.sandbox_pid: int | None = None  # PID 1 of the container, as the host sees it
        self._pumps: list[asyncio.Task[None]] = []
        self.exit_code: int | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def main_pid(self) -> int | None:
        """The host PID of the container's command (the reaper's only direct child)."""
        if self.sandbox_pid is None:
            return None
        kids = _children(self.sandbox_pid)
        return kids[0] if kids else None

    async def start(self) -> None:
        read_fd, write_fd = os.pipe()
        self.spec.info_fd = write_fd
        userns = () if self.spec.userns_fd is None else (self.spec.userns_fd,)
        try:
            argv = bwrap_argv(self.spec, self.bwrap, setpriv=self.setpriv)
            # an empty environment: bwrap's reaper, the sandbox's PID 1, keeps the one it started with
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, pass_fds=(write_fd, *userns), env={})
        except BaseException:
            os.close(read_fd)  # nothing will read the sandbox's info
            raise
        finally:
            os.close(write_fd)
        self._pumps = [asyncio.create_task(self._pump(self.proc.stdout, "stdout")),
                       asyncio.create_task(self._pump(self.proc.stderr, "stderr"))]
        info = await asyncio.get_running_loop().run_in_executor(None, _read_all, read_fd)
        try:
            self.sandbox_pid = int(json.loads(info)["child-pid"])
        except (ValueError, KeyError, TypeError):
            self.sandbox_pid = None  # bwrap failed before starting the container; wait() reports it
        else:
            await self._until_forked()

    async def _until_forked(self, timeout: float = 30.0) -> None:
        """Wait until the sandbox is set up and the container's command forked (or bwrap gave up): a
        runtime reports a container started once its process exists, and only then can a stop be the
        SIGTERM its command may handle rather than a SIGKILL of a sandbox still being built."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.main_pid() is None and self.proc is not None and self.proc.returncode is None \
                and loop.time() < deadline:
            await asyncio.sleep(0.005)

    async def _pump(self, stream: asyncio.StreamReader | None, name: str) -> None:
        if stream is None:
            return
        while True:
            data = await stream.read(65536)
            if not data:
                return
            self.log.write(name, data)

    async def wait(self) -> int:
        assert self.proc is not None
        code = await self.proc.wait()
        for pump in self._pumps:
            with contextlib.suppress(Exception):
                await pump
        self.exit_code = 128 - code if code < 0 else code
        return self.exit_code

    def terminate(self) -> None:
        """SIGTERM to the container's main process, as a runtime's StopContainer does."""
        pid = self.main_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        elif self.proc is not None and self.proc.returncode is None:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the sandbox's init (which takes every process of its PID namespace with it) and bwrap.

        The sandbox runs in a session of its own, so killing bwrap's process group does not reach it,
        and `--die-with-parent` does not either when bwrap dies before the sandbox has armed it (a
        kill right after the start): its command would then run on, holding the log pipes open."""
        if self.proc is None or self.proc.returncode is not None:
            return
        if self.sandbox_pid is not None:  # still bwrap's child while bwrap runs: not a reused pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.sandbox_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def stop(self, grace: float) -> int:
        """Terminate, wait up to `grace` seconds, then kill; the exit code."""
        if self.proc is None:
            return 0
        if self.proc.returncode is None:
            self.terminate()
            try:
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), max(grace, 0.0))
            except TimeoutError:
                self.kill()
        return await self.wait()


def _read_all(fd: int) -> bytes:
    chunks = []
    try:
        while True:
            data = os.read(fd, 4096)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(fd)
    return b"".join(chunks)
