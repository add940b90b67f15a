#!/usr/bin/env python3
"""Importer benchmark: cdi's importer against CDI's pipeline and against plain curl, in one run.

    python bench/bench_import.py [--size 4G] [--cases raw,raw.gz,...] [--repeat N] [--record]

It builds its own images (cached under bench/out/): a virtual disk of --size, about half of it data
(random blocks, text-like blocks, structured binary records) and half zero regions, as raw,
raw.gz, raw.xz, qcow2, compressed qcow2 (`qemu-img convert -c`), vmdk (monolithicSparse and
streamOptimized), vhd (dynamic and fixed), vhdx, vdi and iso (the raw disk with an ISO 9660
signature). They are served over loopback by a range-capable aiohttp static server (sendfile) in
its own process. Each case is imported three ways, into a fresh target directory each time:

* ours:  `python -m cdi.importer`, configured as an importer pod, with a scratch dir available
         (its use is measured);
* cdi:   CDI's HTTP pipeline done with the same tools: download to scratch (`curl | [pigz -dc | xz
         -dc] | dd conv=sparse`, CDI writes scratch sparse), `qemu-img convert -t writeback -O raw`
         scratch -> disk.img, `qemu-img resize` to the usable size, fsync;
* curl:  the floor, `curl -o` of the same URL (no decompression, no conversion, no fsync).

The table gives wall times, cdi/ours (speed-up) and ours/curl, the scratch bytes each used, and the
peak RSS of the importer's process tree (sampled from /proc every 20 ms, summed over the importer
and its children such as qemu-img and nbdkit). With --record the table goes into bench/RESULTS.md
under "## Import (bench/bench_import.py)".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cdi.api.quantity import parse_bytes  # noqa: E402
from cdi.api.sizing import required_space, usable_space  # noqa: E402

OUT = REPO / "bench" / "out"
RESULTS = REPO / "bench" / "RESULTS.md"
SECTION = "## Import (bench/bench_import.py)"
OVERHEAD = "0.055"
CHUNK = 4 << 20
CASES = [
    "raw", "raw.gz", "raw.xz", "qcow2", "qcow2-compressed",
    "vmdk", "vmdk-stream", "vhd", "vhd-fixed", "vhdx", "vdi", "iso",
]
FILES = {
    "raw": "disk.raw",
    "raw.gz": "disk.raw.gz",
    "raw.xz": "disk.raw.xz",
    "qcow2": "disk.qcow2",
    "qcow2-compressed": "disk.compressed.qcow2",
    "vmdk": "disk.vmdk",
    "vmdk-stream": "disk.stream.vmdk",
    "vhd": "disk.vhd",
    "vhd-fixed": "disk.fixed.vhd",
    "vhdx": "disk.vhdx",
    "vdi": "disk.vdi",
    "iso": "disk.iso",
}


# -- images -----------------------------------------------------------------------------------------
def write_disk(path: Path, size: int, seed: int = 2026) -> None:
    """About half data in 4 MiB chunks: random (incompressible), text-like, structured records; the
    rest zeros, in runs, with the end of the disk emptier than the start, as on a real disk."""
    rng = random.Random(seed)
    words = [
        bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 11)))
        for _ in range(8000)
    ]
    pool = b" ".join(rng.choice(words) + (b"\n" if rng.random() < 0.12 else b"") for _ in range(4_000_000))
    records = bytearray()
    while len(records) < 2 * CHUNK:
        records += (
            rng.randrange(1 << 32).to_bytes(4, "little")
            + b"\x00\x00\x00\x01"
            + rng.randrange(1 << 16).to_bytes(2, "little")
            + bytes(6)
        )
    with open(path, "wb") as f:
        f.truncate(size)
        chunks = size // CHUNK
        for i in range(chunks):
            p_data = 0.62 if i < chunks * 0.6 else 0.32
            r = rng.random()
            if r >= p_data:
                continue
            f.seek(i * CHUNK)
            kind = r / p_data
            if kind < 0.34:
                f.write(os.urandom(CHUNK))
            elif kind < 0.67:
                o = rng.randrange(len(pool) - CHUNK)
                f.write(pool[o : o + CHUNK])
            else:
                o = rng.randrange(CHUNK)
                f.write(bytes(records[o : o + CHUNK]))


def write_iso(raw: Path, out: Path) -> None:
    """The disk with an ISO 9660 primary volume descriptor at 32 KiB: detected as iso, imported as raw."""
    sh(f"cp --sparse=always {raw} {out}")
    with open(out, "r+b") as f:
        f.seek(0x8000)
        f.write(b"\x01CD001\x01")


def build_images(size: int, cases: list[str]) -> Path:
    """Build the images of `cases` once (each step is skipped when its file exists), in bench/out/."""
    directory = OUT / f"import-{size}"
    stamp = directory / "ready.json"
    if stamp.exists() and all((directory / FILES[c]).exists() for c in cases):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    raw = directory / FILES["raw"]
    steps: list[tuple[str, Callable[[Path], None]]] = [
        ("raw", lambda out: write_disk(out, size)),
        ("raw.gz", lambda out: sh(f"pigz -p 2 -6 -c {raw} > {out}")),
        ("raw.xz", lambda out: sh(f"xz -T2 -1 -c {raw} > {out}")),  # -T: blocks, as xz >= 5.4 makes them
        ("qcow2", lambda out: sh(f"qemu-img convert -f raw -O qcow2 {raw} {out}")),
        ("qcow2-compressed", lambda out: sh(f"qemu-img convert -f raw -c -O qcow2 {raw} {out}")),
        ("vmdk", lambda out: sh(f"qemu-img convert -f raw -O vmdk {raw} {out}")),  # monolithicSparse
        ("vmdk-stream", lambda out: sh(f"qemu-img convert -f raw -O vmdk -o subformat=streamOptimized {raw} {out}")),
        ("vhd", lambda out: sh(f"qemu-img convert -f raw -O vpc -o force_size=on {raw} {out}")),  # dynamic
        ("vhd-fixed", lambda out: sh(f"qemu-img convert -f raw -O vpc -o subformat=fixed,force_size=on {raw} {out}")),
        ("vhdx", lambda out: sh(f"qemu-img convert -f raw -O vhdx {raw} {out}")),
        ("vdi", lambda out: sh(f"qemu-img convert -f raw -O vdi {raw} {out}")),
        ("iso", lambda out: write_iso(raw, out)),
    ]
    for name, step in steps:
        final = directory / FILES[name]
        if final.exists() or (name != "raw" and name not in cases):
            continue
        started = time.monotonic()
        print(f"building {name} ...", end=" ", flush=True)
        partial = final.with_name(final.name + ".partial")
        step(partial)
        partial.rename(final)
        print(f"{time.monotonic() - started:.0f}s", flush=True)
    sha = subprocess.run(["sha256sum", str(raw)], capture_output=True, text=True, check=True).stdout.split()[
        0
    ]
    stamp.write_text(json.dumps({"size": size, "sha256": sha}))
    return directory


def sh(command: str) -> None:
    subprocess.run(command, shell=True, check=True)  # fixed commands built here


# -- measuring --------------------------------------------------------------------------------------
def tree_rss(root: int) -> int:
    """Sum of VmRSS (bytes) of `root` and all its descendants."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss[int(entry)] = int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def dir_allocated(directory: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(directory):
        for name in filenames:
            with contextlib.suppress(OSError):  # a file the importer just removed
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


@dataclass
class Measure:
    seconds: float
    peak_rss: int = 0
    scratch: int = 0
    ok: bool = True
    note: str = ""


def run_sampled(
    cmd: list[str] | str, env: dict[str, str] | None = None, scratch: Path | None = None, shell: bool = False
) -> Measure:
    peak = {"rss": 0, "scratch": 0}
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=env,
        shell=shell,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak["rss"] = max(peak["rss"], tree_rss(proc.pid))
            if scratch is not None:
                peak["scratch"] = max(peak["scratch"], dir_allocated(scratch))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    elapsed = time.monotonic() - started
    done.set()
    sampler.join()
    ok = proc.returncode == 0
    return Measure(
        elapsed, peak["rss"], peak["scratch"], ok, "" if ok else err.decode(errors="replace")[-500:]
    )


def median(measures: list[Measure]) -> Measure:
    """The run in the middle by wall time (the lower middle for an even count): on a shared machine
    the median says more than the best."""
    return sorted(measures, key=lambda m: m.seconds)[(len(measures) - 1) // 2]


def fresh(directory: Path) -> Path:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def settle() -> None:
    """Start every measurement from the same state: no dirty pages from the previous one."""
    os.sync()


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


# -- the three contenders ---------------------------------------------------------------------------
def ours(url: str, work: Path, requested: int) -> Measure:
    data, scratch = fresh(work / "data"), fresh(work / "scratch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTER_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": url,
            "IMPORTER_IMAGE_SIZE": str(requested),
            "FILESYSTEM_OVERHEAD": OVERHEAD,
            "IMPORTER_DATA_DIR": str(data),
            "IMPORTER_SCRATCH_DIR": str(scratch),
            "IMPORTER_BLOCK_PATH": str(work / "no-block-device"),
            "TERMINATION_LOG": str(work / "termination"),
        }
    )
    m = run_sampled([sys.executable, "-m", "cdi.importer"], env=env, scratch=scratch)
    if m.ok:
        message = json.loads((work / "termination").read_text())
        m.note = message.get("route", "")
    return m


def cdi_pipeline(url: str, work: Path, case: str, usable: int) -> Measure:
    data, scratch = fresh(work / "data"), fresh(work / "scratch")
    tmp, disk = scratch / "tmpimage", data / "disk.img"
    # pigz for gzip (a little faster than CDI's pgzip reader); xz single-threaded, as CDI's Go decoder
    decompress = {"raw.gz": "pigz -dc | ", "raw.xz": "xz -dc | "}.get(case, "")
    script = (
        f"set -e -o pipefail; curl -sf {url} | {decompress}dd of={tmp} bs=1M conv=sparse iflag=fullblock "
        f"status=none; du -B1 {tmp} | cut -f1 > {work / 'scratch-bytes'}; "
        f"qemu-img convert -t writeback -O raw {tmp} {disk}; rm -f {tmp}; "
        f"qemu-img resize -f raw {disk} {usable} > /dev/null; sync {disk}"
    )
    m = run_sampled(["bash", "-c", script])
    if m.ok:
        m.scratch = int((work / "scratch-bytes").read_text())
    return m


def curl_floor(url: str, work: Path) -> Measure:
    target = fresh(work / "curl") / "download"
    return run_sampled(["curl", "-sf", "-o", str(target), url])


# -- server -----------------------------------------------------------------------------------------
SERVER = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_static('/', sys.argv[1])
web.run_app(app, host='127.0.0.1', port=int(sys.argv[2]), print=None, access_log=None)
"""


def serve(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(directory), str(port)])
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if time.monotonic() > deadline:
            raise RuntimeError("the file server did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


# -- report -----------------------------------------------------------------------------------------
def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@dataclass
class Row:
    case: str
    file_size: int
    ours: Measure
    cdi: Measure
    curl: Measure


def table(rows: list[Row]) -> str:
    head = (
        "| case | source file | ours (route) | CDI pipeline | curl -o | CDI / ours | ours / curl "
        "| scratch ours | scratch CDI | peak RSS ours (tree) | peak RSS CDI (tree) |"
    )
    lines = [head, "|" + "|".join(["---"] * 11) + "|"]
    for r in rows:
        o, c, f = r.ours, r.cdi, r.curl
        cells = [
            r.case,
            human(r.file_size),
            f"{o.seconds:.1f} s ({o.note})",
            f"{c.seconds:.1f} s",
            f"{f.seconds:.1f} s",
            f"**{c.seconds / o.seconds:.2f}x**",
            f"{o.seconds / f.seconds:.2f}",
            human(o.scratch),
            human(c.scratch),
            human(o.peak_rss),
            human(c.peak_rss),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(rows: list[Row]) -> str:
    """The importer's acceptance targets, checked against this run."""
    by_case = {r.case: r for r in rows}
    checks = [("every case faster than CDI's pipeline", all(r.cdi.seconds > r.ours.seconds for r in rows))]
    below = [r.case for r in rows if r.cdi.seconds / r.ours.seconds < 2.0]
    checks.append(("every case at least 2x faster" + (f" (not: {', '.join(below)})" if below else ""), not below))
    for case in ("vmdk", "vmdk-stream"):
        if case in by_case:
            r = by_case[case]
            checks.append((f"{case} at least 2x faster", r.cdi.seconds / r.ours.seconds >= 2.0))
    for case in ("raw", "raw.gz"):
        if case in by_case:
            r = by_case[case]
            checks.append((f"{case} at least 1.5x faster", r.cdi.seconds / r.ours.seconds >= 1.5))
    checks.append(("no scratch for any case", all(r.ours.scratch == 0 for r in rows)))
    checks.append(("peak RSS under 256 MiB", all(r.ours.peak_rss < 256 << 20 for r in rows)))
    return "Targets: " + "; ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in checks) + "."


def record(text: str) -> None:
    existing = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if SECTION in existing:
        before, _, rest = existing.partition(SECTION)
        after = rest.split("\n## ", 1)
        tail = ("\n## " + after[1]) if len(after) > 1 else ""
        existing = before.rstrip() + "\n\n" + text.rstrip() + "\n" + tail
    else:
        existing = existing.rstrip() + "\n\n" + text.rstrip() + "\n"
    RESULTS.write_text(existing)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="4G", help="virtual size of the test disk (default 4G = 4 GiB)")
    parser.add_argument(
        "--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES)
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per case and contender, alternating; the median counts"
    )
    parser.add_argument("--record", action="store_true", help="write the table into bench/RESULTS.md")
    parser.add_argument("--work", default=str(OUT / "work"), help="where targets and scratch are written")
    parser.add_argument(
        "--date", default=datetime.date.today().isoformat(), help="date written with the results"
    )
    args = parser.parse_args()
    size_text = args.size if args.size[-1:] != "G" else args.size + "i"
    size = parse_bytes(size_text)
    cases = [c for c in args.cases.split(",") if c]
    for tool in ("curl", "qemu-img", "pigz", "xz", "dd"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is required")
    images = build_images(size, cases)
    requested = required_space(OVERHEAD, size)
    usable = usable_space(OVERHEAD, requested)
    work = Path(args.work)
    load_before = f"{os.getloadavg()[0]:.1f}"
    server, base = serve(images)
    rows: list[Row] = []
    try:
        for case in cases:
            path = images / FILES[case]
            url = f"{base}/{path.name}"
            runs: dict[str, list[Measure]] = {"ours": [], "cdi": [], "curl": []}
            for _ in range(args.repeat):
                for name in ("ours", "cdi", "curl"):
                    warm(path)
                    settle()
                    if name == "ours":
                        m = ours(url, work, requested)
                    elif name == "cdi":
                        # CDI's qemu-img sees a fixed vhd as raw, footer included: a volume 512 bytes
                        # larger than the disk is what it needs (a smaller one fails its size check)
                        fits = max(usable, path.stat().st_size) if case == "vhd-fixed" else usable
                        m = cdi_pipeline(url, work, case, fits)
                    else:
                        m = curl_floor(url, work)
                    if not m.ok:
                        raise SystemExit(f"{name} failed on {case}: {m.note}")
                    runs[name].append(m)
                    print(
                        f"  {case:18} {name:5} {m.seconds:7.2f} s  rss {human(m.peak_rss):>10}  "
                        f"scratch {human(m.scratch)}  {m.note.strip()[:80]}",
                        flush=True,
                    )
            best = {name: median(measures) for name, measures in runs.items()}
            rows.append(Row(case, path.stat().st_size, best["ours"], best["cdi"], best["curl"]))
            shutil.rmtree(work, ignore_errors=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait()
    cpu = os.cpu_count()
    text = (
        f"{SECTION}\n\n"
        f"{datetime.date.today().isoformat()}, {platform.node() or 'this machine'}: {cpu} cores, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}. "
        f"Disk: {human(size)} virtual, about half data (random, text-like and structured blocks) and half "
        f"zeros; served over loopback HTTP with Range support (aiohttp static, sendfile). "
        f"Targets: a Filesystem volume on the same local disk, each run fsynced; source files hot in the "
        f"page cache. Median of {args.repeat} run(s) each, the contenders alternating; load average "
        f"{load_before} before the run, {os.getloadavg()[0]:.1f} after. "
        f"`python bench/bench_import.py --size {args.size} --repeat {args.repeat}`.\n\n"
        f"{table(rows)}\n\n{targets(rows)}\n\n"
        "CDI pipeline = download to scratch (sparse), `qemu-img convert -t writeback -O raw`, `qemu-img "
        "resize`, fsync - what CDI runs for every HTTP import of every format (its `http-datasource.go` "
        "uses nbdkit only to check the size first, then stages on scratch), without the second pod "
        "start that asking for scratch costs it on a cluster. curl -o = download only (the floor). Peak RSS "
        "is summed over the process tree (the importer plus qemu-img/nbdkit children), sampled every 20 ms.\n"
    )
    print()
    print(text)
    if args.record:
        record(text)
        print(f"recorded in {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
