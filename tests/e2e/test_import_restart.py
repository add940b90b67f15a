"""Restarting `cdi up` in the middle of an import loses nothing and never runs two importers for one
volume at the same time; the import ends Succeeded."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.e2e.importing import datavolume, read_back, wait_phase
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer


def test_restart_during_an_import(tmp_path: Path, gated_server: FileServer, images: dict[str, Image]) -> None:
    up = CdiUp(tmp_path / "cdi", "--retry-backoff", "0.5")
    up.start()
    k = Kubectl(up.kubeconfig, tmp_path / "kc")
    image = images["raw.img"]
    gated_server.close_gate(4 << 20)  # the import stalls a third of the way in
    seen_running: list[int] = []
    stop = threading.Event()

    def importers_running() -> int:
        result = k("get", "pods", "-l", "cdi.kubevirt.io=importer", "-o",
                   "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}", check=False)
        return sum(1 for p in result.stdout.split() if p in ("Pending", "Running"))

    def watch_pods() -> None:
        while not stop.is_set():
            if up.proc is not None and up.proc.poll() is None:
                seen_running.append(importers_running())
            stop.wait(0.2)

    try:
        k.apply(datavolume("survivor", {"http": {"url": f"{gated_server.url}/{image.name}"}}, "64Mi"))
        wait_phase(k, "survivor", "ImportInProgress")
        wait_for(lambda: gated_server.served(image.name) > 0, 30, message="import under way")
        watcher = threading.Thread(target=watch_pods, daemon=True)
        watcher.start()
        up.restart()
        assert k.exists("dv", "survivor")
        gated_server.open_gate()
        dv = wait_phase(k, "survivor", "Succeeded")
        stop.set()
        watcher.join(10)
        assert max(seen_running, default=0) <= 1, seen_running
        assert dv["status"]["progress"] == "100.0%"
        assert read_back(k, "survivor", image.virtual_size) == image.sha256
    finally:
        stop.set()
        gated_server.open_gate()
        up.stop()
