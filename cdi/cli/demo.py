"""`cdi demo`: the main job on one machine, as a newcomer's first command.

Starts the embedded control plane with CDI on it, builds a small qcow2 disk image, serves it over
loopback HTTP, applies a DataVolume with the real kubectl, shows its phase and progress until it
is Succeeded, and reads the imported disk back through a pod to show the bytes are the image's.
Then it stops (or keeps running with --keep-running)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from cdi.cli.service import stop_on_signals
from cdi.cli.stack import CdiStack
from cdi.embedded.cluster import ClusterConfig, EmbeddedCluster

IMAGE_SIZE = 64 << 20
EXAMPLE_DV = textwrap.dedent("""\
    apiVersion: cdi.kubevirt.io/v1beta1
    kind: DataVolume
    metadata:
      name: example
    spec:
      source:
        http:
          url: {url}
          checksum: sha256:{checksum}
      storage:
        resources:
          requests:
            storage: 64Mi
    """)
READER_POD = textwrap.dedent("""\
    apiVersion: v1
    kind: Pod
    metadata:
      name: example-reader
    spec:
      restartPolicy: Never
      containers:
      - name: reader
        image: reader
        command: ["sh", "-c", "head -c {size} /data/disk.img | sha256sum"]
        volumeMounts:
        - {{name: disk, mountPath: /data}}
      volumes:
      - {{name: disk, persistentVolumeClaim: {{claimName: example}}}}
    """)


def register(commands: Any) -> None:
    parser = commands.add_parser("demo", help="start the embedded control plane and import an example DataVolume")
    parser.add_argument("--data-dir", type=Path, default=Path(".demo"), help="state directory (default .demo)")
    parser.add_argument("--keep-running", action="store_true", help="leave the control plane up until Ctrl-C")
    parser.set_defaults(run=run)


def build_image(directory: Path) -> tuple[Path, str, str]:
    """A 64 MiB disk, a quarter of it data, as qcow2: (path, sha256 of the qcow2 file, sha256 of the disk)."""
    directory.mkdir(parents=True, exist_ok=True)
    raw, qcow2 = directory / "example.raw", directory / "example.qcow2"
    with open(raw, "wb") as f:
        f.truncate(IMAGE_SIZE)
        for offset in range(0, IMAGE_SIZE, 4 << 20):
            f.seek(offset)
            f.write(os.urandom(1 << 20))
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)], check=True)
    disk_sum = hashlib.sha256(raw.read_bytes()).hexdigest()
    raw.unlink()
    return qcow2, hashlib.sha256(qcow2.read_bytes()).hexdigest(), disk_sum


class Demo:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        self.cluster = EmbeddedCluster(ClusterConfig(self.data_dir / "cluster"))
        self.stack = CdiStack(self.cluster.kubeconfig_path, self.data_dir / "cluster")
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise SystemExit("cdi demo needs kubectl on PATH (scripts/bootstrap installs it)")
        self.kubectl_path = kubectl

    def say(self, text: str) -> None:
        print(f"==> {text}", flush=True)

    async def kubectl(self, *args: str, input: str | None = None, quiet: bool = False) -> str:
        cmd = [self.kubectl_path, "--kubeconfig", str(self.cluster.kubeconfig_path), *args]
        if not quiet:
            print("$ kubectl " + " ".join(args), flush=True)
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=subprocess.PIPE if input else None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={"KUBECACHEDIR": str(self.data_dir / "kubectl-cache"), "PATH": os.environ.get("PATH", "/usr/bin"),
                 "HOME": str(self.data_dir)})
        out, _ = await proc.communicate(input.encode() if input else None)
        text = out.decode()
        if not quiet:
            print(textwrap.indent(text.rstrip(), "    "), flush=True)
        if proc.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed:\n{text}")
        return text

    async def wait_phase(self, deadline: float) -> str:
        last = ""
        while time.monotonic() < deadline:
            line = (await self.kubectl("get", "dv", "example", "--no-headers", quiet=True)).strip()
            if line != last:
                print(f"    {line}", flush=True)
                last = line
            phase = line.split()[1] if len(line.split()) > 1 else ""
            if phase in ("Succeeded", "Failed"):
                return phase
            await asyncio.sleep(0.5)
        return "timed out"

    async def run(self, keep_running: bool) -> int:
        self.say(f"starting the embedded control plane (API server, node, storage) and CDI in {self.data_dir}")
        await self.cluster.start()
        image_server: web.AppRunner | None = None
        try:
            await self.stack.start()
            self.stack.follow_tls_profile(self.cluster.apiserver.set_tls_policy)  # as `cdi up`
            self.say(f"API server {self.cluster.url}; export KUBECONFIG={self.cluster.kubeconfig_path}")
            image, file_sum, disk_sum = build_image(self.data_dir / "images")
            app = web.Application()
            app.router.add_static("/", image.parent)
            image_server = web.AppRunner(app, access_log=None)
            await image_server.setup()
            site = web.TCPSite(image_server, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            url = f"http://127.0.0.1:{port}/{image.name}"
            self.say(f"serving a 64 MiB qcow2 disk image at {url}")
            await self.kubectl("get", "storageclass")
            self.say("applying a DataVolume that imports it (with its sha256 checksum)")
            await self.kubectl("apply", "-f", "-", input=EXAMPLE_DV.format(url=url, checksum=file_sum))
            self.say("kubectl get dv example, until it is done:")
            phase = await self.wait_phase(time.monotonic() + 300)
            await self.kubectl("describe", "dv", "example")
            if phase != "Succeeded":
                self.say(f"the import did not succeed ({phase})")
                return 1
            self.say("reading the volume back through a pod")
            await self.kubectl("apply", "-f", "-", input=READER_POD.format(size=IMAGE_SIZE))
            await self.kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/example-reader",
                               "--timeout=60s")
            read = (await self.kubectl("logs", "example-reader")).split()[0]
            same = read == disk_sum
            self.say(f"disk sha256 {read} {'matches' if same else 'DIFFERS FROM'} the image's {disk_sum}")
            if keep_running:
                self.say("control plane running; Ctrl-C to stop")
                await stop_on_signals().wait()
            return 0 if same else 1
        finally:
            if image_server is not None:
                await image_server.cleanup()
            await self.stack.stop()
            await self.cluster.stop()
            self.say("stopped")


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(Demo(args.data_dir).run(args.keep_running))
    sys.stdout.flush()
    return result
