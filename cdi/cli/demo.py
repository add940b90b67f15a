"""`cdi demo`: the main job on one machine, as a newcomer's first command.

Starts the embedded control plane, applies an example DataVolume with the real kubectl and shows
what happens to it, then stops (or keeps running with --keep-running)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from cdi.embedded.cluster import ClusterConfig, EmbeddedCluster

EXAMPLE_DV = textwrap.dedent("""\
    apiVersion: cdi.kubevirt.io/v1beta1
    kind: DataVolume
    metadata:
      name: example
    spec:
      source:
        http:
          url: {url}
      storage:
        resources:
          requests:
            storage: 64Mi
    """)


def register(commands: Any) -> None:
    parser = commands.add_parser("demo", help="start the embedded control plane and import an example DataVolume")
    parser.add_argument("--data-dir", type=Path, default=Path(".demo"), help="state directory (default .demo)")
    parser.add_argument("--keep-running", action="store_true", help="leave the control plane up until Ctrl-C")
    parser.set_defaults(run=run)


class Demo:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.cluster = EmbeddedCluster(ClusterConfig(self.data_dir / "cluster"))
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise SystemExit("cdi demo needs kubectl on PATH (scripts/bootstrap installs it)")
        self.kubectl_path = kubectl

    def say(self, text: str) -> None:
        print(f"==> {text}", flush=True)

    async def kubectl(self, *args: str, input: str | None = None) -> str:
        cmd = [self.kubectl_path, "--kubeconfig", str(self.cluster.kubeconfig_path), *args]
        print("$ kubectl " + " ".join(args), flush=True)
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=subprocess.PIPE if input else None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={"KUBECACHEDIR": str(self.data_dir / "kubectl-cache"), "PATH": "/usr/bin:/bin",
                 "HOME": str(self.data_dir)})
        out, _ = await proc.communicate(input.encode() if input else None)
        text = out.decode()
        print(textwrap.indent(text.rstrip(), "    "), flush=True)
        if proc.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed")
        return text

    async def run(self, keep_running: bool) -> int:
        self.say(f"starting the embedded control plane in {self.data_dir}")
        await self.cluster.start()
        try:
            self.say(f"API server {self.cluster.url}; export KUBECONFIG={self.cluster.kubeconfig_path}")
            await self.kubectl("get", "namespaces")
            self.say("applying an example DataVolume")
            manifest = EXAMPLE_DV.format(url="http://127.0.0.1:1/example.qcow2")
            await self.kubectl("apply", "-f", "-", input=manifest)
            await self.kubectl("get", "datavolumes")
            self.say("the DataVolume stays Pending until the controller lands (issue #5)")
            if keep_running:
                self.say("control plane running; Ctrl-C to stop")
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, stop.set)
                await stop.wait()
            return 0
        finally:
            await self.cluster.stop()
            self.say("stopped")


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(Demo(args.data_dir).run(args.keep_running))
    sys.stdout.flush()
    return result
