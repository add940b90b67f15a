"""Upload benchmark (issue #6): a raw image through `cdi image-upload` -> upload proxy -> upload server
into a Block DataVolume of `cdi up`, against `curl` posting the same file to a plain aiohttp sink on
loopback, in the same run.

`cdi image-upload` sends with TLS end to end to the upload server (the proxy authorises the upload and
then splices TCP bytes, `cdi.api.upload`); `--classic` also measures it sending through the proxy's TLS
as virtctl does (`CDI_IMAGE_UPLOAD_END_TO_END=0`: the proxy decrypts and re-encrypts every byte).

Two sinks are measured, both plain HTTP on 127.0.0.1, both reading the body with `iter_chunks`:

* `file`: writes the body to a file next to the image and fdatasyncs it before answering: the same
  job as the upload server (the bytes durable on disk), without TLS, proxy or image handling;
* `discard`: throws the body away: the cost of moving the bytes over HTTP alone.

The ratio the issue asks for is ours against the `file` sink (same durability); the `discard` figure
is printed so the cost of writing is visible too. Our time runs from the first byte sent to the
DataVolume being `Succeeded` (the bytes fdatasync'ed by the upload server); the transfer part
alone (the POST, answered by the async endpoint once the data is written) is printed as well.
CPU seconds of every process involved are printed, because on a shared 2-core machine they say more
than wall time. The image is random-looking data everywhere (no zero blocks to skip).

`--checkpoints` measures instead what the upload server's checkpoints of the resume offset cost (a
flush and a small record every `UPLOAD_CHECKPOINT_BYTES` while the body arrives, so that a killed
server can be resumed): the upload-server program alone (`python -m cdi.uploadserver`, configured by
its environment as in a pod) receives the image from `curl` (mutual TLS, the sync endpoint, which answers
once the image is durable) into a Block volume file, with the checkpoints and with them off
(`UPLOAD_CHECKPOINT_BYTES=0`), alternating in the same run (the order swapped every run). Nothing else
is on the path, so any cost shows at its largest.

Usage: python bench/bench_upload.py [--gib 4] [--runs 1] [--workdir DIR] [--checkpoints [--every MIB]]"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SINK = r'''
import asyncio, os, sys
from aiohttp import web
MODE, OUT = sys.argv[2], sys.argv[3]
async def handle(request):
    n = 0
    fd = os.open(OUT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if MODE == "file" else None
    async for chunk, _ in request.content.iter_chunks():
        n += len(chunk)
        if fd is not None:
            os.write(fd, chunk)
    if fd is not None:
        os.fdatasync(fd)
        os.close(fd)
    return web.Response(text=str(n))
app = web.Application(client_max_size=0)
app.router.add_post("/upload", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=lambda *a: print("ready", flush=True))
'''


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_image(path: Path, size: int) -> None:
    """Random-looking data everywhere: 64 MiB of random bytes, each copy with a different first byte."""
    block = bytearray(os.urandom(64 << 20))
    with open(path, "wb") as f:
        for i in range(size // len(block)):
            block[0] = (i % 255) + 1
            f.write(block)
        f.truncate(size)
    subprocess.run(["sync"], check=False)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_sink(workdir: Path, image: Path, mode: str) -> tuple[float, float, float]:
    """(seconds, sink CPU seconds, curl CPU seconds) of curl posting the image to a plain aiohttp sink."""
    port = free_port()
    out = workdir / f"sink-{mode}.out"
    script = workdir / "sink.py"
    script.write_text(SINK)
    sink = subprocess.Popen([sys.executable, str(script), str(port), mode, str(out)], stdout=subprocess.PIPE,
                            text=True, env=ENV)
    try:
        assert sink.stdout is not None
        sink.stdout.readline()
        before = cpu_seconds(sink.pid)
        _children_cpu_delta()
        start = time.monotonic()
        curl = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-X", "POST", "-T", str(image),
                               "-w", "%{http_code}", f"http://127.0.0.1:{port}/upload"],
                              capture_output=True, text=True, check=True)
        seconds = time.monotonic() - start
        assert curl.stdout == "200", curl
        return seconds, cpu_seconds(sink.pid) - before, _children_cpu_delta()
    finally:
        sink.send_signal(signal.SIGINT)
        try:
            sink.wait(10)
        except subprocess.TimeoutExpired:
            sink.kill()
            sink.wait()
        _children_cpu_delta()  # the sink's own CPU is not curl's
        out.unlink(missing_ok=True)


_last_children = 0.0


def _children_cpu_delta() -> float:
    """CPU of finished child processes since the last call (curl, cdi image-upload)."""
    global _last_children
    usage = os.times()
    total = usage.children_user + usage.children_system
    delta, _last_children = total - _last_children, total
    return delta


class CdiUp:
    """A `cdi up` of the benchmark's own, in the work directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.log = data_dir.parent / "cdi-up.log"
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> CdiUp:
        self.proc = subprocess.Popen([sys.executable, "-m", "cdi.cli.main", "up", "--data-dir", str(self.data_dir)],
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT, text=True, env=ENV,
                                     start_new_session=True)
        deadline = time.time() + 180
        while "upload proxy" not in self.log.read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"cdi up did not start:\n{self.log.read_text()}")
            time.sleep(0.2)
        return self

    def __exit__(self, *_: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def upload_server_pid(ancestor: int) -> int | None:
    """The upload server started by our `cdi up` (other programs on the machine may run some too)."""
    out = subprocess.run(["pgrep", "-f", f"^{re.escape(sys.executable)} -m cdi.uploadserver"], capture_output=True,
                         text=True, check=False).stdout.split()
    for pid in map(int, reversed(out)):
        parent = pid
        while parent > 1:
            try:
                parent = int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, IndexError, ValueError):
                break
            if parent == ancestor:
                return pid
    return None


def run_ours(up: CdiUp, image: Path, size: int, name: str, *, end_to_end: bool = True) -> dict[str, float]:
    assert up.proc is not None
    kubeconfig = up.data_dir / "kubeconfig"
    before_up = cpu_seconds(up.proc.pid)
    _children_cpu_delta()
    cli = subprocess.Popen([sys.executable, "-m", "cdi.cli.main", "image-upload", "dv", name, "--size", str(size),
                            "--volume-mode", "block", "--image-path", str(image), "--kubeconfig", str(kubeconfig)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**ENV, "CDI_IMAGE_UPLOAD_END_TO_END": "1" if end_to_end else "0"})
    server_pid, server_cpu = None, 0.0
    while cli.poll() is None:
        server_pid = server_pid or upload_server_pid(up.proc.pid)
        if server_pid:
            server_cpu = max(server_cpu, cpu_seconds(server_pid))
        time.sleep(0.2)
    output = cli.stdout.read() if cli.stdout else ""
    if cli.returncode != 0:
        raise SystemExit(f"cdi image-upload failed:\n{output}")
    if ("TLS end to end with the upload server" in output) != end_to_end:
        raise SystemExit(f"cdi image-upload did not send the way asked (end to end: {end_to_end}):\n{output}")
    sent = re.search(r"sent .*?\((\d+) bytes\) in ([\d.]+)s", output)
    processing = re.search(r"processing ([\d.]+)s after", output)
    assert sent and processing, output
    transfer = float(sent.group(2))
    if shutil.which("kubectl"):  # its volume is not needed any more: 4 GiB of disk back for the next run
        subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "delete", "dv", name, "--wait=false"],
                       capture_output=True, check=False)
    return {"transfer": transfer, "total": transfer + float(processing.group(1)),
            "cdi_up_cpu": cpu_seconds(up.proc.pid) - before_up, "server_cpu": server_cpu,
            "cli_cpu": _children_cpu_delta()}


def run_checkpoints(workdir: Path, image: Path, size: int, runs: int, every: int) -> None:
    """Same-run A/B of the upload server with and without its checkpoints (see the module's docstring)."""
    from cdi.api import upload as names
    from cdi.api.env import UPLOAD_CHECKPOINT_BYTES
    from cdi.common import pki

    tls = workdir / "tls"
    tls.mkdir(exist_ok=True)
    server_ca, client_ca = pki.make_ca("bench-server-ca"), pki.make_ca("bench-client-ca")
    pki.issue(server_ca, "127.0.0.1", ["127.0.0.1"]).write(tls / "tls.crt", tls / "tls.key")
    pki.issue(client_ca, names.CLIENT_NAME, None, server=False, client=True).write(tls / "client.crt",
                                                                                   tls / "client.key")
    (tls / "ca.crt").write_bytes(server_ca.cert_pem)
    (tls / "client-ca.crt").write_bytes(client_ca.cert_pem)
    volume, state = workdir / "volume", workdir / "state"
    state.mkdir(exist_ok=True)
    gib = size / (1 << 30)
    results: dict[str, list[float]] = {"on": [], "off": []}
    for run in range(runs):
        for mode in (("on", "off") if run % 2 == 0 else ("off", "on")):
            volume.unlink(missing_ok=True)
            with open(volume, "wb") as f:
                f.truncate(size)
            for leftover in state.iterdir():
                leftover.unlink()
            port = free_port()
            _children_cpu_delta()
            env = {**ENV, "TLS_CERT_FILE": str(tls / "tls.crt"), "TLS_KEY_FILE": str(tls / "tls.key"),
                   "CLIENT_CERT_FILE": str(tls / "client-ca.crt"), "DESTINATION": str(volume),
                   "UPLOAD_IMAGE_SIZE": str(size), "LISTEN_ADDRESS": "127.0.0.1", "LISTEN_PORT": str(port),
                   "TERMINATION_LOG": str(workdir / "termination-log"), "UPLOAD_STATE_DIR": str(state),
                   "IMPORTER_SCRATCH_DIR": str(workdir / "no-scratch"),
                   UPLOAD_CHECKPOINT_BYTES: str(every if mode == "on" else 0)}
            log = workdir / f"uploadserver-{mode}.log"
            server = subprocess.Popen([sys.executable, "-m", "cdi.uploadserver"], env=env, stdout=log.open("w"),
                                      stderr=subprocess.STDOUT)
            try:
                deadline = time.time() + 60
                while "listening on" not in log.read_text():
                    if server.poll() is not None or time.time() > deadline:
                        raise SystemExit(f"the upload server did not start:\n{log.read_text()}")
                    time.sleep(0.1)
                start = time.monotonic()
                curl = subprocess.run(["curl", "-sS", "--cacert", str(tls / "ca.crt"), "--cert",
                                       str(tls / "client.crt"), "--key", str(tls / "client.key"), "-o", "/dev/null",
                                       "-w", "%{http_code}", "-X", "POST", "-T", str(image),
                                       f"https://127.0.0.1:{port}/v1beta1/upload"],
                                      capture_output=True, text=True, check=False)
                seconds = time.monotonic() - start
                server.wait(60)
            finally:
                if server.poll() is None:
                    server.kill()
                    server.wait()
            if curl.stdout != "200":
                raise SystemExit(f"the upload failed: {curl}\n{log.read_text()}")
            text = log.read_text()
            took = [float(ms) for ms in re.findall(r"kept \d+ bytes on the volume.*?\((\d+) ms\)", text)]
            waited = re.search(r"the pipeline waited ([\d.]+)s", text)
            results[mode].append(seconds)
            detail = f"{len(took)} checkpoints of {statistics.median(took):.0f} ms (median), max {max(took):.0f} ms; " \
                f"the pipeline waited {waited.group(1) if waited else 0}s for them; " if took else ""
            print(f"checkpoints {mode:3}: {seconds:.1f}s, {gib / seconds * 1024:.0f} MiB/s ({detail}CPU of "
                  f"the upload server and curl {_children_cpu_delta():.1f}s)", flush=True)
    paired = sorted(off / on for on, off in zip(results["on"], results["off"], strict=True))
    print()
    print(f"checkpoints every {every >> 20} MiB: median {gib / statistics.median(results['on']) * 1024:.0f} MiB/s, "
          f"without {gib / statistics.median(results['off']) * 1024:.0f} MiB/s; best "
          f"{gib / min(results['on']) * 1024:.0f} vs {gib / min(results['off']) * 1024:.0f} MiB/s")
    print(f"run by run (throughput with / without, same run): {', '.join(f'{r:.3f}' for r in paired)}; "
          f"median {statistics.median(paired):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=4.0, help="image size in GiB (default 4)")
    parser.add_argument("--runs", type=int, default=1, help="alternating runs of each (default 1)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the image and volumes go")
    parser.add_argument("--classic", action="store_true", help="also through the proxy's TLS, as virtctl sends")
    parser.add_argument("--checkpoints", action="store_true",
                        help="the upload server with and without its resume checkpoints, instead")
    parser.add_argument("--every", type=int, default=0, help="with --checkpoints: MiB between two (default: ours)")
    args = parser.parse_args()
    size = int(args.gib * (1 << 30)) // (1 << 20) * (1 << 20)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cdi-bench-upload-", dir="/var/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    image = workdir / "disk.raw"
    print(f"making a {size / (1 << 30):.1f} GiB raw image in {workdir} ...", flush=True)
    make_image(image, size)
    if args.checkpoints:
        from cdi.uploadserver.config import CHECKPOINT_BYTES
        try:
            run_checkpoints(workdir, image, size, args.runs, (args.every << 20) or CHECKPOINT_BYTES)
        finally:
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
        return
    gib = size / (1 << 30)
    results: dict[str, list[float]] = {"file": [], "discard": [], "ours": [], "ours_transfer": [], "classic": []}
    try:
        with CdiUp(workdir / "cdi") as up:
            for run in range(args.runs):
                for mode in ("file", "discard"):
                    seconds, sink_cpu, curl_cpu = run_sink(workdir, image, mode)
                    results[mode].append(seconds)
                    print(f"curl -> aiohttp sink ({mode}): {seconds:.1f}s, {gib / seconds * 1024:.0f} MiB/s "
                          f"(CPU: sink {sink_cpu:.1f}s, curl {curl_cpu:.1f}s)", flush=True)
                ours = run_ours(up, image, size, f"bench-{run}")
                results["ours"].append(ours["total"])
                results["ours_transfer"].append(ours["transfer"])
                _report("cdi image-upload -> proxy -> upload server", ours, gib)
                if args.classic:
                    classic = run_ours(up, image, size, f"classic-{run}", end_to_end=False)
                    results["classic"].append(classic["total"])
                    _report("  the same through the proxy's TLS (as virtctl)", classic, gib)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    best = {k: min(v) for k, v in results.items() if v}
    print()
    print(f"best of {args.runs}: file sink {gib / best['file'] * 1024:.0f} MiB/s, discard sink "
          f"{gib / best['discard'] * 1024:.0f} MiB/s, ours {gib / best['ours'] * 1024:.0f} MiB/s "
          f"(transfer {gib / best['ours_transfer'] * 1024:.0f} MiB/s)")
    print(f"ratio ours / file sink: {best['file'] / best['ours']:.2f} (target >= 0.70); "
          f"ours / discard sink: {best['discard'] / best['ours']:.2f}")
    paired = sorted(f / o for f, o in zip(results["file"], results["ours"], strict=True))
    print(f"run by run (file sink / ours, same run): {', '.join(f'{r:.2f}' for r in paired)}; "
          f"median {statistics.median(paired):.2f}")
    if "classic" in best:
        print(f"through the proxy's TLS: {gib / best['classic'] * 1024:.0f} MiB/s, ratio / file sink "
              f"{best['file'] / best['classic']:.2f}; end to end is {best['classic'] / best['ours']:.2f}x as fast")


def _report(what: str, ours: dict[str, float], gib: float) -> None:
    print(f"{what}: {ours['total']:.1f}s to Succeeded, {gib / ours['total'] * 1024:.0f} MiB/s (transfer alone "
          f"{ours['transfer']:.1f}s, {gib / ours['transfer'] * 1024:.0f} MiB/s; CPU: cdi up {ours['cdi_up_cpu']:.1f}s, "
          f"upload server {ours['server_cpu']:.1f}s, cdi image-upload {ours['cli_cpu']:.1f}s)", flush=True)


if __name__ == "__main__":
    main()
