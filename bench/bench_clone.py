"""Host-assisted clone benchmark (issue #17): a 4 GiB disk image with half its blocks allocated, cloned
by our data movers against CDI's mechanism done with the same tools, in the same run.

* ours: `cdi-cloner` (the clone source pod's program) reads the image, sends only its allocated
  extents (SEEK_DATA/SEEK_HOLE) over TLS with its client certificate to `cdi-uploadserver` (the target's
  program), which writes them in place into a sparse `disk.img` and fsyncs it; both run as the
  processes they are in pods, configured by the same env vars the controller gives them.
* CDI's: `tar -S` of the image through snappy (python-snappy's framing format, which CDI's cloner
  writes) POSTed with curl to an HTTP server that pipes the body through snappy's decompressor into
  `tar -x`, then fsyncs the file. Plain HTTP, no TLS: the baseline is spared the encryption ours pays.

Both results are checked against the source (sha256 of the whole image, and that the copy stays
sparse). Wall time from the first process started to the last finished; CPU seconds of every process.

With `--cluster`, also the time of a snapshot and a csi-clone DataVolume of a volume of the same size
and allocation through `cdi up` (the time until `Succeeded`).

Needs the `bench` extra (python-snappy): pip install -e .[bench]

Usage: python bench/bench_clone.py [--gib 4] [--runs 1] [--workdir DIR] [--cluster]"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cdi.common import pki  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
MIB = 1 << 20
BLOCK = 64 * MIB  # allocated and empty regions alternate in blocks of this size

SNAPPY_C = "import sys, snappy; snappy.stream_compress(sys.stdin.buffer, sys.stdout.buffer)"
SNAPPY_D = "import sys, snappy; snappy.stream_decompress(sys.stdin.buffer, sys.stdout.buffer)"
SINK = r'''
import asyncio, os, subprocess, sys
from aiohttp import web
OUT = sys.argv[2]
async def handle(request):
    untar = subprocess.Popen(f"{sys.executable} -c '{sys.argv[3]}' | tar -xSf - -C {OUT}", shell=True,
                             stdin=subprocess.PIPE)
    async for chunk, _ in request.content.iter_chunks():
        await asyncio.to_thread(untar.stdin.write, chunk)
    untar.stdin.close()
    await asyncio.to_thread(untar.wait)
    fd = os.open(os.path.join(OUT, "disk.img"), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return web.Response(text="ok")
app = web.Application(client_max_size=0)
app.router.add_post("/upload", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None,
            print=lambda *a: print("ready", flush=True))
'''


def make_image(path: Path, size: int) -> None:
    """Random data in every other BLOCK, holes between: half the blocks allocated."""
    with open(path, "wb") as f:
        f.truncate(size)
        for offset in range(0, size, 2 * BLOCK):
            f.seek(offset)
            for _ in range(BLOCK // (4 * MIB)):
                f.write(os.urandom(4 * MIB))
        f.flush()
        os.fsync(f.fileno())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MIB):
            h.update(chunk)
    return h.hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_ours(source: Path, work: Path) -> tuple[float, float, Path]:
    target = work / "ours"
    target.mkdir()
    tls = work / "tls"
    tls.mkdir(exist_ok=True)
    server_ca, client_ca = pki.make_ca("bench-server-ca"), pki.make_ca("bench-client-ca")
    server = pki.issue(server_ca, "cdi-upload-target.bench.svc", ["cdi-upload-target.bench.svc"])
    client_name = "bench/source-bench/target"
    client = pki.issue(client_ca, client_name, None, server=False, client=True)
    server.write(tls / "tls.crt", tls / "tls.key")
    (tls / "ca.crt").write_bytes(client_ca.cert_pem)
    port = free_port()
    size = source.stat().st_size
    server_env = {**ENV, "TLS_CERT_FILE": str(tls / "tls.crt"), "TLS_KEY_FILE": str(tls / "tls.key"),
                  "CLIENT_CERT_FILE": str(tls / "ca.crt"), "CLIENT_NAME": client_name,
                  "UPLOAD_IMAGE_SIZE": str(size), "FILESYSTEM_OVERHEAD": "0", "DESTINATION": str(target / "disk.img"),
                  "LISTEN_ADDRESS": "127.0.0.1", "LISTEN_PORT": str(port), "OWNER_UID": "bench",
                  "TERMINATION_LOG": str(work / "server-termination")}
    cloner_env = {**ENV, "UPLOAD_URL": f"https://127.0.0.1:{port}/v1beta1/upload",
                  "UPLOAD_SERVER_NAME": "cdi-upload-target.bench.svc", "CLIENT_CERT": client.cert_pem.decode(),
                  "CLIENT_KEY": client.key_pem.decode(), "SERVER_CA_CERT": server_ca.cert_pem.decode(),
                  "OWNER_UID": "bench", "VOLUME_MODE": "filesystem", "MOUNT_POINT": str(source.parent),
                  "TERMINATION_LOG": str(work / "cloner-termination")}
    cpu0, started = children_cpu(), time.monotonic()
    srv = subprocess.Popen([sys.executable, "-m", "cdi.uploadserver"], env=server_env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:  # until the server listens
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    subprocess.run([sys.executable, "-m", "cdi.cloner"], env=cloner_env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    if srv.wait(60) != 0:
        raise SystemExit("the upload server failed: " + (work / "server-termination").read_text())
    return time.monotonic() - started, children_cpu() - cpu0, target / "disk.img"


def run_cdi(source: Path, work: Path) -> tuple[float, float, Path]:
    target = work / "cdi"
    target.mkdir()
    port = free_port()
    sink = work / "sink.py"
    sink.write_text(SINK)
    cpu0, started = children_cpu(), time.monotonic()
    srv = subprocess.Popen([sys.executable, str(sink), str(port), str(target), SNAPPY_D], env=ENV,
                           stdout=subprocess.PIPE, text=True)
    assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
    pipeline = (f"tar -S -cf - -C {source.parent} {source.name} | {sys.executable} -c '{SNAPPY_C}' | "
                f"curl -sS --fail -X POST -H 'Content-Type: application/octet-stream' -H 'Expect:' "
                f"-T - http://127.0.0.1:{port}/upload -o /dev/null")
    try:
        subprocess.run(pipeline, shell=True, check=True, env=ENV, timeout=1800)
    finally:
        elapsed = time.monotonic() - started
        srv.terminate()
        srv.wait(30)
    return elapsed, children_cpu() - cpu0, target / source.name


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--cluster", action="store_true", help="also time snapshot and csi-clone through cdi up")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-clone-", dir=args.workdir))
    try:
        source_dir = base / "source"
        source_dir.mkdir()
        source = source_dir / "disk.img"
        size = int(args.gib * (1 << 30))
        make_image(source, size)
        digest = sha256(source)
        print(f"source: {size / (1 << 30):.1f} GiB, {allocated(source) / (1 << 30):.2f} GiB allocated", flush=True)
        for run in range(args.runs):
            results = {}
            for name, fn in (("cdi (tar -S | snappy | http | untar)", run_cdi), ("ours (extents over TLS)", run_ours)):
                work = base / f"run{run}-{name.split()[0]}"
                work.mkdir()
                elapsed, cpu, copy = fn(source, work)
                ok = sha256(copy) == digest
                results[name] = elapsed
                print(f"run {run + 1}: {name}: {elapsed:.2f} s, {cpu:.2f} CPU-s, copy allocated "
                      f"{allocated(copy) / (1 << 30):.2f} GiB, sha256 {'equal' if ok else 'DIFFERENT'}", flush=True)
                if not ok:
                    raise SystemExit("the copy differs from the source")
                shutil.rmtree(work)
            cdi_time, ours_time = results.values()
            print(f"run {run + 1}: ours is {cdi_time / ours_time:.2f}x faster (target >= 3x)", flush=True)
        if args.cluster:
            cluster_times(source, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def cluster_times(source: Path, base: Path) -> None:
    """Snapshot and csi-clone DataVolumes of a volume holding the same image, through `cdi up`."""
    from tests.support.cluster import CdiUp, Kubectl, wait_for

    up = CdiUp(base / "cdi")
    up.start(timeout=120)
    try:
        k = Kubectl(up.kubeconfig, base / "kubectl-cache")
        size = source.stat().st_size
        k.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "golden"},
                 "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                          "resources": {"requests": {"storage": str(size + 64 * MIB)}}}})
        wait_for(lambda: k.json("get", "pvc", "golden")["status"].get("phase") == "Bound", 60, 0.1)
        volume = k.json("get", "pvc", "golden")["spec"]["volumeName"]
        # the volume is a directory of the local storage: put the image there as a pod would
        directory = next((base / "cdi").rglob(volume))
        subprocess.run(["cp", "--sparse=always", str(source), str(directory / "disk.img")], check=True)
        for strategy in ("snapshot", "csi-clone"):
            k("patch", "storageprofile", "local", "--type=merge", "-p",
              json.dumps({"spec": {"cloneStrategy": strategy}}))
            wait_for(lambda s=strategy: k.json("get", "storageprofile", "local")["status"].get("cloneStrategy") == s,
                     30, 0.1)
            started = time.monotonic()
            k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": strategy},
                     "spec": {"source": {"pvc": {"namespace": "default", "name": "golden"}}, "storage": {}}})
            wait_for(lambda s=strategy: k.json("get", "dv", s).get("status", {}).get("phase") == "Succeeded",
                     600, 0.1)
            print(f"cdi up: {strategy} DataVolume of the {size / (1 << 30):.1f} GiB volume: "
                  f"{time.monotonic() - started:.2f} s to Succeeded", flush=True)
    finally:
        up.stop()


if __name__ == "__main__":
    main()
