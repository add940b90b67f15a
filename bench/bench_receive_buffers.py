"""Receive buffers (issue #14 point 10): what the upload server's reading thread pays per GiB for its 1 MiB
buffers, with the importer handing each written chunk back (`FedStream.give_back` -> `ReceiveBuffers`),
against a fresh buffer per chunk (what a route that does not hand chunks back gets), and against the
reference-count scan this replaced (`sys.getrefcount(buffer) == 3`, re-created here as the baseline).

A producing thread fills each buffer as the socket read would (a copy of 1 MiB into it) and puts it into
a `FedStream`; a consuming thread reads each chunk, copies it out (as the write to the volume does) and
hands it back. The producer's CPU time (`time.thread_time`) is the figure: it is the busiest thread of
an upload.

Usage: python bench/bench_receive_buffers.py [--gib 4] [--runs 5]"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable

from cdi.uploadserver.feed import FedStream
from cdi.uploadserver.front import ReceiveBuffers

CHUNK = 1 << 20


class RefcountBuffers:
    """The replaced pool: a buffer counts as free when only the pool's list refers to it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: list[bytearray] = []
        self.fresh = 0

    def get(self, size: int) -> bytearray:
        for buffer in self._kept:
            if sys.getrefcount(buffer) == 3:
                return buffer
        self.fresh += 1
        buffer = bytearray(size)
        if len(self._kept) < 16:
            self._kept.append(buffer)
        return buffer

    def give_back(self, chunk: object) -> None:
        pass


class FreshBuffers(ReceiveBuffers):
    def give_back(self, chunk: object) -> None:
        pass


def run(pool_factory: Callable[[], ReceiveBuffers | RefcountBuffers], chunks: int) -> tuple[float, float, int]:
    pool = pool_factory()
    queue = FedStream(32 << 20)
    queue.recycle_with(pool.give_back)
    source = bytes(range(256)) * (CHUNK // 256)
    produced: list[float] = []

    def produce() -> None:
        started = time.thread_time()
        stopped = threading.Event()
        for _ in range(chunks):
            buffer = pool.get(CHUNK)
            buffer[:] = source  # the socket read
            queue.put(buffer, stopped)
            del buffer
        queue.finish()
        produced.append(time.thread_time() - started)

    sink = bytearray(CHUNK)
    wall = time.perf_counter()
    producer = threading.Thread(target=produce)
    producer.start()
    while chunk := queue.read(CHUNK):
        sink[:len(chunk)] = chunk  # the write to the volume
        queue.give_back(chunk)
        del chunk
    producer.join()
    return produced[0], time.perf_counter() - wall, pool.fresh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    chunks = int(args.gib * 1024)
    pools: dict[str, Callable[[], ReceiveBuffers | RefcountBuffers]] = {
        "given back (now)": lambda: ReceiveBuffers(CHUNK),
        "refcount scan (before)": lambda: RefcountBuffers(CHUNK),
        "fresh per chunk": lambda: FreshBuffers(CHUNK),
    }
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in pools}
    for _ in range(args.runs):
        for name, factory in pools.items():  # interleaved, so that the machine's load hits all alike
            results[name].append(run(factory, chunks))
    base = statistics.median(r[0] for r in results["refcount scan (before)"])
    print(f"{args.gib:g} GiB in 1 MiB chunks, median of {args.runs} runs, Python {sys.version.split()[0]}")
    print(f"{'buffers':<24} {'producer CPU s/GiB':>19} {'vs before':>10} {'wall s/GiB':>11} {'fresh buffers':>14}")
    for name, runs in results.items():
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        fresh = max(r[2] for r in runs)
        print(f"{name:<24} {cpu / args.gib:>19.3f} {cpu / base:>9.2f}x {wall / args.gib:>11.3f} {fresh:>14}")


if __name__ == "__main__":
    main()
