"""A real `cdi up` in a subprocess, and the real kubectl pointed at it.

Tests drive the embedded control plane the way a user does; nothing here reaches into the
server's internals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.waiting import wait_for

__all__ = ["ROOT", "CdiUp", "Kubectl", "wait_for"]  # wait_for: where the e2e tests have always found it

ROOT = Path(__file__).resolve().parents[2]


class CdiUp:
    """`cdi up --data-dir DIR` in the foreground of a subprocess."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.extra = list(extra)
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.output = ""

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "kubeconfig"

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cdi.cli.main", "up", "--data-dir", str(self.data_dir), *self.extra],
            stdout=log, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
        )
        wait_for(self._ready, timeout, message=f"cdi up ready (log {self.log_path})")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"cdi up exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
        text = self.log_path.read_text() if self.log_path.exists() else ""
        return text.count("ready") > self.output.count("ready")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.output = self.log_path.read_text()
        return self.proc.returncode

    def restart(self) -> None:
        self.stop()
        self.start()

    def recent_logs(self, files: int = 6, lines: int = 40) -> str:
        """The tails of the container logs written last on the node (pods running or removed), and of
        `cdi up`'s own log: what a failing end-to-end test prints, since worker pods are gone by then."""
        node = self.data_dir / "node"
        found = [*node.glob("pods/*/containers/*/*.log"), *node.glob("terminated/*/*.log")]
        found.sort(key=lambda path: path.stat().st_mtime_ns)
        parts = []
        for path in [*found[-files:], self.log_path]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.relative_to(self.data_dir.parent)}\n" + "\n".join(tail))
        return "\n".join(parts)


def kubectl_binary() -> str:
    found = shutil.which("kubectl")
    assert found, "kubectl is not installed (scripts/bootstrap installs Debian's kubernetes-client)"
    return found


class Kubectl:
    """The real kubectl with only `--kubeconfig` pointing at the cluster."""

    def __init__(self, kubeconfig: Path, cache_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.env = {**os.environ, "KUBECACHEDIR": str(cache_dir), "HOME": str(cache_dir)}
        self.env.pop("KUBECONFIG", None)

    def __call__(self, *args: str, input: str | None = None, check: bool = True,
                 timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        cmd = [kubectl_binary(), "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, env=self.env, timeout=timeout,
                                check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([kubectl_binary(), "--kubeconfig", str(self.kubeconfig), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)

    def apply(self, manifest: dict[str, Any] | str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        return self("apply", "-f", "-", *args, input=text, check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json").stdout)

    def get(self, kind: str, name: str, namespace: str = "default") -> Any:
        return self.json("get", kind, name, "-n", namespace)

    def exists(self, kind: str, name: str, namespace: str = "default") -> bool:
        return self("get", kind, name, "-n", namespace, check=False).returncode == 0


async def async_wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
                         message: str = "condition") -> Any:
    """`wait_for` for coroutines: `predicate` may be sync or return an awaitable."""
    import asyncio
    import inspect
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while loop.time() < deadline:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {last!r})")
