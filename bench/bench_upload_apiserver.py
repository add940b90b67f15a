"""Uploads through the Kubernetes API server against uploads to the upload proxy's own URL (issue 30 point 3):
the same raw image sent by `cdi image-upload` into a new DataVolume each time, the paths alternating in one run
(A B, then B A, ...) so that a drift of the machine's speed falls on both alike, and the ratio taken run by run.

Paths (`--paths`, default all three):

* `proxy`: to the proxy's URL, the image in TLS end to end with the upload server (our default; the proxy only
  splices bytes);
* `classic`: to the proxy's URL through the proxy's TLS, as virtctl sends (`CDI_IMAGE_UPLOAD_END_TO_END=0`:
  the proxy decrypts and encrypts every byte);
* `apiserver`: through the API server's aggregation layer (`--through-apiserver`): client -> API server ->
  the proxy's aggregation listener -> upload server, each hop TLS; what a user with only a kubeconfig gets.

The figure is the transfer (from the first request to the answer of the async endpoint, which comes once the
upload server has the bytes: `cdi image-upload`'s summary), and the time to `Succeeded` besides. The CPU of
`cdi image-upload` is printed; on `cdi up` also that of the `cdi up` process (its API server, the aggregator
and the proxy: where the extra hop costs).

Any cluster where cdi is installed (`--kubeconfig`; the proxy's URL from CDIConfig, else its Service's cluster
IP, which this machine must reach, as the e2e suite assumes), or a `cdi up` of its own (the default):

    python bench/bench_upload_apiserver.py [--kubeconfig K] [--gib 1] [--runs 3] [--storage-class C]
        [--volume-mode filesystem|block] [--namespace default] [--paths proxy,classic,apiserver]"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_upload import CdiUp, make_image  # noqa: E402  (a `cdi up` of its own; the image)

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("KUBECONFIG", None)
PATHS = ("proxy", "classic", "apiserver")
MIB = 1 << 20


def kubectl(kubeconfig: Path, *args: str, check: bool = True) -> str:
    result = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                            check=False)
    if check and result.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proxy_url(kubeconfig: Path) -> str:
    """CDIConfig's (what virtctl uses), else the proxy Service's cluster IP."""
    url = kubectl(kubeconfig, "get", "cdiconfig", "config", "-o", "jsonpath={.status.uploadProxyURL}").strip()
    if url:
        return url if "://" in url else f"https://{url}"
    services = json.loads(kubectl(kubeconfig, "get", "services", "-A", "--field-selector",
                                  "metadata.name=cdi-uploadproxy", "-o", "json"))["items"]
    if not services:
        raise SystemExit("no cdi-uploadproxy Service: is cdi installed?")
    return f"https://{services[0]['spec']['clusterIP']}:443"


def upload(kubeconfig: Path, path: str, image: Path, size: int, name: str, args: argparse.Namespace, url: str,
           server_pid: int | None) -> dict[str, float]:
    """One `cdi image-upload` into a new DataVolume; its figures. The DataVolume is deleted afterwards."""
    flags = ["--through-apiserver"] if path == "apiserver" else ["--uploadproxy-url", url]
    if args.storage_class:
        flags += ["--storage-class", args.storage_class]
    claim = size if args.volume_mode == "block" else int(size * 1.12) + 64 * MIB  # the filesystem's overhead
    env = {**ENV, "CDI_IMAGE_UPLOAD_END_TO_END": "0" if path == "classic" else "1"}
    before_server = cpu_seconds(server_pid) if server_pid else 0.0
    before = os.times()
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "cdi.cli.main", "image-upload", "dv", name, "-n", args.namespace,
                             "--size", f"{claim // MIB}Mi", "--volume-mode", args.volume_mode, "--image-path",
                             str(image), "--kubeconfig", str(kubeconfig), *flags],
                            capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - started
    after = os.times()
    output = result.stdout + result.stderr
    kubectl(kubeconfig, "delete", "dv", name, "-n", args.namespace, "--wait=false", check=False)
    if result.returncode != 0:
        raise SystemExit(f"cdi image-upload ({path}) failed:\n{output}")
    through = "through the Kubernetes API server" in output
    end_to_end = "TLS end to end with the upload server" in output
    if through != (path == "apiserver") or end_to_end != (path == "proxy"):
        raise SystemExit(f"cdi image-upload did not send the {path} way:\n{output}")
    sent = re.search(r"sent .*?\((\d+) bytes\) in ([\d.]+)s", output)
    processing = re.search(r"processing ([\d.]+)s after", output)
    if not sent or not processing or int(sent.group(1)) != size:
        raise SystemExit(f"cdi image-upload's summary is not what was expected:\n{output}")
    transfer = float(sent.group(2))
    return {"transfer": transfer, "succeeded": transfer + float(processing.group(1)), "wall": wall,
            "cli_cpu": (after.children_user + after.children_system) - (before.children_user + before.children_system),
            "server_cpu": cpu_seconds(server_pid) - before_server if server_pid else float("nan")}


def spread(values: list[float]) -> str:
    return f"min {min(values):.0f}, median {statistics.median(values):.0f}, max {max(values):.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="a cluster where cdi is installed (default: a cdi up of its own)")
    parser.add_argument("--gib", type=float, default=1.0, help="image size in GiB (default 1)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each path, alternating (default 3)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"which of {', '.join(PATHS)} (default all)")
    parser.add_argument("--storage-class", default="", help="the DataVolumes' class (default: the cluster's)")
    parser.add_argument("--volume-mode", default="filesystem", choices=("filesystem", "block"))
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--workdir", type=Path, default=None, help="where the image (and cdi up) go")
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or set(paths) - set(PATHS):
        raise SystemExit(f"--paths: some of {', '.join(PATHS)}")
    size = int(args.gib * (1 << 30)) // MIB * MIB
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cdi-bench-apiserver-", dir="/var/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    image = workdir / "disk.raw"
    print(f"making a {size / (1 << 30):.2f} GiB raw image in {workdir} ...", flush=True)
    make_image(image, size)
    results: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
    try:
        if args.kubeconfig is None:
            with CdiUp(workdir / "cdi") as up:
                assert up.proc is not None
                run_all(up.data_dir / "kubeconfig", image, size, args, paths, results, up.proc.pid)
        else:
            run_all(args.kubeconfig, image, size, args, paths, results, None)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    report(results, paths, size)


def run_all(kubeconfig: Path, image: Path, size: int, args: argparse.Namespace, paths: list[str],
            results: dict[str, list[dict[str, float]]], server_pid: int | None) -> None:
    url = proxy_url(kubeconfig)
    server = kubectl(kubeconfig, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
    print(f"proxy URL {url}; API server {server}; {args.volume_mode} volumes; paths {', '.join(paths)}", flush=True)
    mib = size / MIB
    for run in range(args.runs):
        order = paths if run % 2 == 0 else list(reversed(paths))
        for path in order:
            figures = upload(kubeconfig, path, image, size, f"bench-{path}-{run}-{os.getpid()}", args, url,
                             server_pid)
            results[path].append(figures)
            server_cpu = "" if server_pid is None else f", cdi up {figures['server_cpu']:.1f}s"
            print(f"run {run + 1} {path:9}: transfer {figures['transfer']:.1f}s {mib / figures['transfer']:.0f} MiB/s, "
                  f"Succeeded after {figures['succeeded']:.1f}s (CPU: cdi image-upload {figures['cli_cpu']:.1f}s"
                  f"{server_cpu})", flush=True)


def report(results: dict[str, list[dict[str, float]]], paths: list[str], size: int) -> None:
    mib = size / MIB
    print()
    for path in paths:
        runs = results[path]
        rates = [mib / r["transfer"] for r in runs]
        cpu = statistics.median(r["cli_cpu"] for r in runs)
        server = [r["server_cpu"] for r in runs if r["server_cpu"] == r["server_cpu"]]
        extra = f", cdi up {statistics.median(server):.1f}s" if server else ""
        print(f"{path:9}: transfer MiB/s {spread(rates)}; to Succeeded {spread([mib / r['succeeded'] for r in runs])} "
              f"MiB/s; CPU (median) cdi image-upload {cpu:.1f}s{extra}")
    if "apiserver" not in paths:
        return
    for baseline in (p for p in paths if p != "apiserver"):
        paired = sorted(b["transfer"] / a["transfer"] for a, b in zip(results["apiserver"], results[baseline],
                                                                      strict=True))
        print(f"throughput apiserver / {baseline}, run by run: {', '.join(f'{r:.2f}' for r in paired)}; "
              f"median {statistics.median(paired):.2f}")


if __name__ == "__main__":
    main()
