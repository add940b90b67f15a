"""Controller scale benchmark (issue 5, issue 29 item 5): N DataVolumes created at once, half blank and half
small HTTP imports (a qcow2 served by this script), followed until every one has Succeeded
(`bench/scale.py` runs the scenario and checks each got exactly one worker pod). Measured per DataVolume:
the controller's CPU seconds and memory, the API requests the run cost (the API server's
`apiserver_request_total`, before and after), and the time until the last one Succeeded.

Two clusters, one scenario:

- `cdi up` (default): the embedded control plane with `--no-cdi` and the controller as its own
  `cdi controller` process, so its CPU and memory are its own (read from /proc; the node, the storage and
  the importer pods are elsewhere). The node talks to the API server in-process, so the requests counted
  are the controller's.
- `--kubeconfig PATH`: any cluster where cdi is installed (the realk8s tier). The controller is the
  `cdi-deployment` pod holding the Lease `cdi-controller-leader-election-helper` in `--cdi-namespace`; its
  CPU and memory come from that pod's own /metrics (`process_cpu_seconds_total`,
  `process_resident_memory_bytes`, sampled through the API server's pod proxy), the requests from
  kube-apiserver's /metrics, where the kubelet's, the scheduler's and the other controllers' count too.
  Pods must reach the file server: `--serve-host` is an address of this machine they can connect to.

Baseline for the ratio: the time the creates alone took (the API server's cost of the writes).

Usage: python bench/bench_controller.py [--count 500] [--blank-only] [--json OUT]
       python bench/bench_controller.py --kubeconfig KUBECONFIG --serve-host 10.244.0.1 [--count 500]"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import scale  # noqa: E402
from cdi.api.groups import GVR  # noqa: E402
from cdi.kube import KubeClient  # noqa: E402
from cdi.kube.errors import ApiError  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
LEASES = GVR("coordination.k8s.io", "v1", "leases", "Lease", True)
PODS = GVR("", "v1", "pods", "Pod", True)
LEASE_NAME = "cdi-controller-leader-election-helper"
CONTROLLER_LABEL = "cdi.kubevirt.io=cdi-deployment"


# -- the file server the importer pods read the image from --------------------------------------------


@contextlib.asynccontextmanager
async def file_server(directory: Path, host: str) -> AsyncIterator[str]:
    """Serves `directory` over plain HTTP (GET, HEAD and ranges, as aiohttp's static files do); yields its URL."""
    app = web.Application()
    app.router.add_static("/", directory)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    await web.TCPSite(runner, host, port).start()
    try:
        yield f"http://{f'[{host}]' if ':' in host else host}:{port}"
    finally:
        await runner.cleanup()


# -- how the controller's cost is read --------------------------------------------------------------------


@dataclass
class Usage:
    cpu_seconds: float
    rss_bytes: int


NO_PROCESS_METRICS = ("the controller's /metrics has no process_cpu_seconds_total / process_resident_memory_bytes "
                      "(an image from before they were exported): its CPU and memory are not measured")


class ControllerProbe(Protocol):
    async def read(self) -> Usage | None: ...

    def describe(self) -> str: ...


class ProcessProbe:
    """A local controller process: /proc's CPU ticks and resident set."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    async def read(self) -> Usage | None:
        return self.stat()

    def stat(self) -> Usage:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return Usage(cpu, int(fields[21]) * os.sysconf("SC_PAGE_SIZE"))

    def peak_rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def describe(self) -> str:
        return f"process {self.pid} (/proc)"


class LeaderPodProbe:
    """The leading controller pod's own /metrics, through the API server's pod proxy (as `kubectl get --raw
    /api/v1/namespaces/NS/pods/POD:PORT/proxy/metrics`)."""

    def __init__(self, client: KubeClient, namespace: str, port: str) -> None:
        self.client, self.namespace, self.port = client, namespace, port
        self.pod = ""

    async def find_leader(self) -> str:
        lease = await self.client.get(LEASES, LEASE_NAME, self.namespace)
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        pods = await self.client.list(PODS, self.namespace, label_selector=CONTROLLER_LABEL)
        # the holder is `<pod>_<uuid>` (ours, as controller-runtime's; `<pod>-<pid>` before): the longest pod name
        # it starts with
        names = sorted((p["metadata"]["name"] for p in pods.items if holder.startswith(p["metadata"]["name"])),
                       key=len)
        if not names:
            raise SystemExit(f"no pod labelled {CONTROLLER_LABEL} in {self.namespace} holds lease {LEASE_NAME} "
                             f"(holder {holder!r})")
        self.pod = names[-1]
        return self.pod

    async def read(self) -> Usage | None:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}:{self.port}/proxy/metrics"
        text = (await self.client.request("GET", path, accept="text/plain")).text
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in ("process_cpu_seconds_total", "process_resident_memory_bytes"):
                    values[sample.name] = sample.value
        if len(values) < 2:
            return None
        return Usage(values["process_cpu_seconds_total"], int(values["process_resident_memory_bytes"]))

    def describe(self) -> str:
        return f"leader pod {self.namespace}/{self.pod} (its /metrics, sampled)"


class Sampler:
    """Reads the probe every `interval` seconds while the run goes on: the peak memory a pod's metrics show
    only at the moment they are read."""

    def __init__(self, probe: ControllerProbe, interval: float) -> None:
        self.probe, self.interval = probe, interval
        self.first: Usage | None = None
        self.last: Usage | None = None
        self.peak_rss = 0
        self.reads = 0

    async def sample(self) -> None:
        usage = await self.probe.read()
        if usage is None:
            return
        self.reads += 1
        self.first = self.first or usage
        self.last = usage
        self.peak_rss = max(self.peak_rss, usage.rss_bytes)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            with contextlib.suppress(ApiError, OSError):
                await self.sample()


# -- report -----------------------------------------------------------------------------------------------


def report(outcome: scale.Outcome, sampler: Sampler, peak_rss: int, where: str, controller: str) -> dict[str, Any]:
    n = outcome.count
    first, last_usage = sampler.first, sampler.last
    cpu = last_usage.cpu_seconds - first.cpu_seconds if first and last_usage else None
    requests = outcome.api_requests_total()
    last = outcome.last_succeeded_seconds
    rows: list[tuple[str, str]] = [
        ("cluster", where),
        ("controller", controller),
        ("DataVolumes (blank + HTTP qcow2)", f"{n} ({sum(not outcome.workload.imported(x) for x in outcome.timelines)}"
                                             f" + {sum(outcome.workload.imported(x) for x in outcome.timelines)})"),
        ("Succeeded", f"{outcome.succeeded()} of {n}"),
        ("worker pods per DataVolume (pods: DataVolumes)",
         ", ".join(f"{k}: {v}" for k, v in sorted(outcome.pods_per_datavolume().items()))),
        ("creates alone (API writes, 16 in flight)", f"{outcome.creates_seconds:.1f} s"),
        ("time to the last Succeeded", f"{last:.1f} s" if last is not None else "not reached"),
        ("ratio to the creates alone", f"{last / outcome.creates_seconds:.1f}x" if last else "-"),
        ("create -> Succeeded, median / p95",
         f"{outcome.latency(0.5) or 0:.1f} s / {outcome.latency(0.95) or 0:.1f} s"),
        ("controller CPU per DataVolume", f"{1000 * cpu / n:.1f} ms ({cpu:.1f} s in all)" if cpu is not None
         else "n/a"),
        ("controller memory: start, peak", f"{first.rss_bytes / 2**20:.0f} MiB, {peak_rss / 2**20:.0f} MiB" if first
         else "n/a"),
        ("controller memory per DataVolume (peak - start)",
         f"{(peak_rss - first.rss_bytes) / n / 1024:.0f} KiB" if first else "n/a"),
        ("API requests per DataVolume", f"{requests / n:.1f} ({requests} in all, the benchmark's own "
                                        f"{outcome.own_requests} taken out)"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'measure':{width}}  result")
    for key, value in rows:
        print(f"{key:{width}}  {value}")
    print("\nAPI requests per DataVolume, by verb, resource and code (the largest):")
    for (verb, resource, code), count in outcome.api_requests.most_common(16):
        print(f"  {verb:8} {resource or '(non-resource)':36} {code:4} {count / n:6.2f}")
    print("\nmedian seconds of each step:")
    for step, seconds in outcome.step_medians().items():
        print(f"  {step:28} {seconds:6.2f}")
    problems = outcome.problems()
    if first is None:
        print(f"\nNOTE: {NO_PROCESS_METRICS}")
    if problems:
        print("\nPROBLEMS:\n  " + "\n  ".join(problems))
    return {"rows": dict(rows), "cpu_seconds": cpu, "peak_rss_bytes": peak_rss, "api_requests": requests,
            "api_by_kind": {f"{v} {r} {c}": k for (v, r, c), k in outcome.api_requests.items()},
            "steps": outcome.step_medians(), "problems": problems, "last_succeeded_seconds": last,
            "timelines": {name: vars(t) for name, t in outcome.timelines.items()},
            "count": n}


# -- the two clusters ---------------------------------------------------------------------------------------


def wait_ready(log: Path, proc: subprocess.Popen[str], word: str) -> None:
    deadline = time.time() + 60
    while word not in log.read_text():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"process did not start:\n{log.read_text()}")
        time.sleep(0.1)


@contextlib.contextmanager
def embedded(work: Path) -> Iterator[tuple[Path, int, int]]:
    """`cdi up --no-cdi` and a `cdi controller` process of its own against it: (kubeconfig, controller pid,
    cdi up's pid)."""
    up_log, ctl_log = work / "up.log", work / "controller.log"
    up = subprocess.Popen([sys.executable, "-m", "cdi.cli.main", "up", "--data-dir", str(work / "cdi"), "--no-cdi"],
                          stdout=up_log.open("w"), stderr=subprocess.STDOUT, env=ENV, text=True)
    controller = None
    try:
        wait_ready(up_log, up, "ready")
        kubeconfig = work / "cdi" / "kubeconfig"
        subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "create", "namespace", "cdi"], check=True,
                       capture_output=True, env={**ENV, "KUBECACHEDIR": str(work / "kc")})
        controller = subprocess.Popen(
            [sys.executable, "-m", "cdi.cli.main", "controller", "--kubeconfig", str(kubeconfig),
             "--metrics-listen", "127.0.0.1:0", "--no-leader-election"],
            stdout=ctl_log.open("w"), stderr=subprocess.STDOUT, env=ENV, text=True)
        wait_ready(ctl_log, controller, "running")
        print(f"controller pid {controller.pid}", flush=True)
        yield kubeconfig, controller.pid, up.pid
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(30)
        up.terminate()
        up.wait(60)


async def measure(client: KubeClient, workload: scale.Workload, probe: ControllerProbe, interval: float,
                  where: str, timeout: float) -> tuple[scale.Outcome, dict[str, Any]]:
    sampler = Sampler(probe, interval)
    await sampler.sample()
    task = asyncio.create_task(sampler.run())
    try:
        outcome = await scale.run(client, workload, timeout=timeout, on_progress=lambda m: print(m, flush=True))
        await sampler.sample()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    peak = probe.peak_rss() if isinstance(probe, ProcessProbe) else sampler.peak_rss
    # the probe's reads through the pod proxy are the benchmark's, not the workload's
    outcome.api_requests = Counter({k: v for k, v in outcome.api_requests.items() if k[1] != "pods/proxy"})
    return outcome, report(outcome, sampler, peak, where, probe.describe())


async def on_cdi_up(args: argparse.Namespace, kubeconfig: Path, pid: int, up_pid: int, url: str | None
                    ) -> dict[str, Any]:
    async with await KubeClient.connect(kubeconfig) as client:
        workload = scale.Workload(args.count, "scale", url, args.storage_class)
        up = ProcessProbe(up_pid)
        before = up.stat().cpu_seconds
        _, result = await measure(client, workload, ProcessProbe(pid), 1.0,
                                  "cdi up --no-cdi, controller as its own process", args.timeout)
        up_cpu = up.stat().cpu_seconds - before
        print(f"\ncdi up's own process (API server, node, storage; not the pods): {up_cpu:.1f} CPU-s, "
              f"{1000 * up_cpu / args.count:.1f} ms per DataVolume", flush=True)
        result["cdi_up_cpu_seconds"] = up_cpu
        return result


async def on_cluster(args: argparse.Namespace, url: str | None) -> dict[str, Any]:
    async with await KubeClient.connect(args.kubeconfig) as client:
        probe = LeaderPodProbe(client, args.cdi_namespace, args.metrics_port)
        leader = await probe.find_leader()
        namespace = f"cdi-scale-{os.getpid()}"
        workload = scale.Workload(args.count, namespace, url, args.storage_class)
        try:
            _, result = await measure(client, workload, probe, 2.0, f"{client.host} (--kubeconfig)", args.timeout)
            if await probe.find_leader() != leader:
                print(f"NOTE: the leader changed during the run ({leader} -> {probe.pod}): CPU and memory are not "
                      "one process's", flush=True)
                result["problems"].append("leader changed")
            return result
        finally:
            if not args.keep:
                await scale.delete_namespace(client, namespace)


async def serving(args: argparse.Namespace, served: Path | None, embedded_at: tuple[Path, int, int] | None
                  ) -> dict[str, Any]:
    """The run, with the file server up for its imports (none with --blank-only)."""

    async def on(url: str | None) -> dict[str, Any]:
        return await (on_cluster(args, url) if embedded_at is None else on_cdi_up(args, *embedded_at, url))

    if served is None:
        return await on(None)
    async with file_server(served, args.serve_host) as base:
        return await on(f"{base}/{scale.IMAGE_NAME}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=500, help="DataVolumes (default 500)")
    parser.add_argument("--blank-only", action="store_true", help="no HTTP imports (the benchmark of issue 5)")
    parser.add_argument("--kubeconfig", type=Path, help="run on this cluster (cdi installed) instead of cdi up")
    parser.add_argument("--serve-host", default="127.0.0.1",
                        help="address the file server binds, which pods reach (cdi up: 127.0.0.1; the realk8s kit: "
                             "10.244.0.1)")
    parser.add_argument("--storage-class", help="the DataVolumes' class (default: the cluster's default)")
    parser.add_argument("--cdi-namespace", default="cdi", help="where cdi-deployment runs (with --kubeconfig)")
    parser.add_argument("--metrics-port", default="8080", help="the controller pods' metrics port (with --kubeconfig)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for all to end")
    parser.add_argument("--keep", action="store_true", help="leave the benchmark's namespace (with --kubeconfig)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-controller-"))
    served = None
    if not args.blank_only:
        served = work / "served"
        served.mkdir()
        scale.make_image(served)
    if args.kubeconfig:
        result = asyncio.run(serving(args, served, None))
    else:
        with embedded(work) as at:
            result = asyncio.run(serving(args, served, at))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
