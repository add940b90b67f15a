"""Benchmark of the embedded API server (issue #2 targets).

Runs `cdi up` in a subprocess and measures, from separate client processes over HTTPS with the
bearer token, as any client would:
  - creates per second of DataVolumes from 8 concurrent clients          (target >= 1,000/s)
  - latency of listing 10,000 DataVolumes                                 (target < 1 s)
  - watch event delivery latency p50/p99 with 10 concurrent watchers      (target p99 < 50 ms)
  - resident memory of the server holding 10,000 DataVolumes              (target < 300 MiB)

The baseline for ratios is the target itself (there is no other API server on this machine);
ratios > 1 mean better than target. Usage: python bench/bench_apiserver.py [--objects 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
DV_PATH = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes"


def _dv(name: str) -> dict:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name, "labels": {"bench": "yes", "app": "disk"}},
        "spec": {"source": {"http": {"url": f"http://images.example.com/{name}.qcow2"}},
                 "storage": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
    }


class Conn:
    def __init__(self, kubeconfig: Path) -> None:
        cfg = yaml.safe_load(kubeconfig.read_text())
        self.url = cfg["clusters"][0]["cluster"]["server"]
        ca = Path(tempfile.mkstemp(suffix=".crt")[1])
        import base64
        ca.write_bytes(base64.b64decode(cfg["clusters"][0]["cluster"]["certificate-authority-data"]))
        self.ssl = ssl.create_default_context(cafile=str(ca))
        self.headers = {"Authorization": f"Bearer {cfg['users'][0]['user']['token']}",
                        "Content-Type": "application/json"}

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers=self.headers, connector=aiohttp.TCPConnector(ssl=self.ssl, limit=0))


def _creator(kubeconfig: str, start: int, count: int, out: multiprocessing.Queue) -> None:
    async def run() -> None:
        conn = Conn(Path(kubeconfig))
        async with conn.session() as session:
            begin = time.perf_counter()
            for i in range(start, start + count):
                async with session.post(conn.url + DV_PATH, json=_dv(f"dv-{i:06d}")) as resp:
                    if resp.status != 201:
                        raise RuntimeError(await resp.text())
                    await resp.read()
            out.put(time.perf_counter() - begin)
    asyncio.run(run())


def _watcher(kubeconfig: str, rv: str, expected: int, out: multiprocessing.Queue, ready: multiprocessing.Event) -> None:
    async def run() -> None:
        conn = Conn(Path(kubeconfig))
        latencies = []
        timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
        async with conn.session() as session:
            url = f"{conn.url}{DV_PATH}?watch=true&resourceVersion={rv}&labelSelector=probe%3Dyes"
            async with session.get(url, timeout=timeout) as resp:
                ready.set()
                async for line in resp.content:
                    now = time.time()
                    event = json.loads(line)
                    sent = float(event["object"]["metadata"]["annotations"]["sent"])
                    latencies.append(now - sent)
                    if len(latencies) >= expected:
                        break
        out.put(latencies)
    asyncio.run(run())


def rss_mib(pid: int) -> float:
    total = 0
    pids = [pid]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total / 1024


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--watchers", type=int, default=10)
    parser.add_argument("--events", type=int, default=200)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-apiserver-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (workdir / "cdi-up.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "cdi.cli.main", "up", "--data-dir", str(workdir / "cdi")],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + 60
        while "ready" not in (workdir / "cdi-up.log").read_text():
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit("cdi up did not start")
            time.sleep(0.1)
        kubeconfig = workdir / "cdi" / "kubeconfig"
        conn = Conn(kubeconfig)
        rss_idle = rss_mib(proc.pid)

        # creates/s from N concurrent client processes
        per = args.objects // args.clients
        out: multiprocessing.Queue = multiprocessing.Queue()
        begin = time.perf_counter()
        workers = [multiprocessing.Process(target=_creator, args=(str(kubeconfig), i * per, per, out))
                   for i in range(args.clients)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - begin
        created = per * args.clients
        creates_per_s = created / elapsed

        rss_full = rss_mib(proc.pid)

        async def list_latency() -> tuple[list[float], int]:
            async with conn.session() as session:
                samples, count = [], 0
                for _ in range(5):
                    start = time.perf_counter()
                    async with session.get(conn.url + DV_PATH) as resp:
                        body = await resp.read()
                    samples.append(time.perf_counter() - start)
                    count = len(json.loads(body)["items"])
                return samples, count

        samples, listed = asyncio.run(list_latency())
        list_s = statistics.median(samples)

        # watch delivery latency
        async def current_rv() -> str:
            async with conn.session() as session, session.get(conn.url + DV_PATH + "?limit=1") as resp:
                return str((await resp.json())["metadata"]["resourceVersion"])
        rv = asyncio.run(current_rv())
        wout: multiprocessing.Queue = multiprocessing.Queue()
        readies = [multiprocessing.Event() for _ in range(args.watchers)]
        watchers = [multiprocessing.Process(target=_watcher, args=(str(kubeconfig), rv, args.events, wout, r))
                    for r in readies]
        for w in watchers:
            w.start()
        for r in readies:
            r.wait(30)

        async def produce() -> None:
            async with conn.session() as session:
                for i in range(args.events):
                    body = _dv(f"probe-{i:05d}")
                    body["metadata"]["labels"]["probe"] = "yes"
                    body["metadata"]["annotations"] = {"sent": repr(time.time())}
                    async with session.post(conn.url + DV_PATH, json=body) as resp:
                        await resp.read()
                    await asyncio.sleep(0.01)
        asyncio.run(produce())
        latencies = []
        for _ in watchers:
            latencies.extend(wout.get(timeout=60))
        for w in watchers:
            w.join()
        latencies.sort()
        p50 = latencies[len(latencies) // 2] * 1000
        p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000

        rows = [
            ("creates/s (8 clients)", f"{creates_per_s:,.0f}", ">= 1,000", creates_per_s / 1000),
            (f"list {listed:,} DataVolumes", f"{list_s * 1000:,.0f} ms", "< 1,000 ms", 1.0 / list_s),
            (f"watch p50 ({args.watchers} watchers)", f"{p50:.1f} ms", "", 0),
            (f"watch p99 ({args.watchers} watchers)", f"{p99:.1f} ms", "< 50 ms", 50 / p99),
            (f"RSS holding {created:,} DVs", f"{rss_full:.0f} MiB (idle {rss_idle:.0f})", "< 300 MiB",
             300 / rss_full),
        ]
        print(f"{'measure':32} {'result':>24} {'target':>12} {'target/result':>14}")
        for name, value, target, ratio in rows:
            print(f"{name:32} {value:>24} {target:>12} {(f'{ratio:.2f}x' if ratio else ''):>14}")
        return 0
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
