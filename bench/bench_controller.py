"""Controller benchmark (issue #5): apply N blank DataVolumes at once and measure the time until all
are Succeeded, the controller's CPU seconds per DataVolume and its peak memory.

The embedded control plane runs with `--no-cdi` and the controller as its own `cdi controller`
process, so its CPU and memory are its own (the API server, node and importer pods are elsewhere).
Baseline for the ratio: the same N DataVolumes created with no controller at all (the API server's
own cost of the writes), which shows how much of the wall time is orchestration.

Usage: python bench/bench_controller.py [--count 200]"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def manifests(count: int) -> str:
    docs = []
    for i in range(count):
        docs.append(json.dumps({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": f"blank-{i:04d}"},
            "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "16Mi"}}}}}))
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [json.loads(d) for d in docs]})


def kubectl(kubeconfig: Path, *args: str, input: str | None = None) -> str:
    return subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], input=input, text=True,
                          capture_output=True, check=True, env={**ENV, "KUBECACHEDIR": str(kubeconfig.parent / "kc")}
                          ).stdout


def wait_ready(log: Path, proc: subprocess.Popen[str], word: str) -> None:
    deadline = time.time() + 60
    while word not in log.read_text():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"process did not start:\n{log.read_text()}")
        time.sleep(0.1)


def succeeded(kubeconfig: Path) -> int:
    out = kubectl(kubeconfig, "get", "dv", "-o", "jsonpath={.items[*].status.phase}")
    return out.split().count("Succeeded")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-controller-"))
    up_log = work / "up.log"
    up = subprocess.Popen([sys.executable, "-m", "cdi.cli.main", "up", "--data-dir", str(work / "cdi"), "--no-cdi"],
                          stdout=up_log.open("w"), stderr=subprocess.STDOUT, env=ENV, text=True)
    controller = None
    try:
        wait_ready(up_log, up, "ready")
        kubeconfig = work / "cdi" / "kubeconfig"
        kubectl(kubeconfig, "create", "namespace", "cdi")
        ctl_log = work / "controller.log"
        controller = subprocess.Popen(
            [sys.executable, "-m", "cdi.cli.main", "controller", "--kubeconfig", str(kubeconfig),
             "--metrics-listen", "127.0.0.1:0", "--no-leader-election"],
            stdout=ctl_log.open("w"), stderr=subprocess.STDOUT, env=ENV, text=True)
        wait_ready(ctl_log, controller, "running")
        cpu_before = cpu_seconds(controller.pid)
        started = time.perf_counter()
        kubectl(kubeconfig, "apply", "-f", "-", input=manifests(args.count))
        applied = time.perf_counter() - started
        while succeeded(kubeconfig) < args.count:
            if time.perf_counter() - started > 1800:
                raise SystemExit("timed out")
            time.sleep(1)
        total = time.perf_counter() - started
        cpu = cpu_seconds(controller.pid) - cpu_before
        rss = peak_rss_mib(controller.pid)
        print(f"{'measure':44} {'result':>14}")
        print(f"{'DataVolumes':44} {args.count:>14}")
        print(f"{'kubectl apply of all (API writes only)':44} {applied:>13.1f}s")
        print(f"{'time until all Succeeded':44} {total:>13.1f}s")
        print(f"{'ratio to the bare writes':44} {total / applied:>13.1f}x")
        print(f"{'controller CPU per DataVolume':44} {1000 * cpu / args.count:>12.1f}ms")
        print(f"{'controller peak RSS':44} {rss:>11.0f}MiB")
        return 0
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(30)
        up.terminate()
        up.wait(60)


if __name__ == "__main__":
    sys.exit(main())
