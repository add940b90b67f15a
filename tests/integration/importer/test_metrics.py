"""Progress metrics: Prometheus text over HTTPS on $POD_IP:8443 while an import runs, per phase."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from cdi.controller.progress import Retry, parse_retry
from cdi.importer.progress import COMPLETE, CONVERT, RESIZE, SYNC, TRANSFER_DATA_FILE, Progress
from tests.support.servers import FileServer, MuteServer, wait_for
from tests.support.sourceservers import Big

from .harness import Volume, base_env, importer_command, metric, pod_ip, read_message, scrape

OWNER = "0b1d6e1c-4f1e-4d5e-9a57-1f3c0f2b7e11"


def test_metrics_while_importing(
    big: Big, range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    image = big.raw
    volume = make_volume("fs")
    ip = pod_ip()
    env = base_env()
    env.update(volume.env())
    env.update(
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"{range_server.url}/{image.name}",
            "IMPORTER_IMAGE_SIZE": str(256 << 20),
            "POD_IP": ip,
            "OWNER_UID": OWNER,
        }
    )
    range_server.close_gate(image.file_size // 2)
    proc = subprocess.Popen(importer_command(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen: dict[str, str] = {}

        def half_way() -> bool:
            text = scrape(ip)
            if text is None:
                return False
            seen["text"] = text
            done = metric(text, "cdi_importer_phase_bytes_done", ownerUID=OWNER, phase=TRANSFER_DATA_FILE)
            return done is not None and done >= image.file_size * 0.4

        wait_for(half_way, 60, message="metrics showing the import half way")
        text = seen["text"]
        progress = metric(text, "kubevirt_cdi_import_progress_total", ownerUID=OWNER)
        assert progress is not None
        assert 30 < progress < 60
        assert metric(text, "cdi_importer_phase", ownerUID=OWNER, phase=TRANSFER_DATA_FILE) == 1
        assert (
            metric(text, "cdi_importer_phase_bytes_total", ownerUID=OWNER, phase=TRANSFER_DATA_FILE)
            == image.file_size
        )
        transferred = metric(text, "cdi_importer_bytes_transferred_total", ownerUID=OWNER)
        assert transferred is not None
        assert transferred >= image.file_size * 0.4
        assert "# TYPE kubevirt_cdi_import_progress_total counter" in text
        assert "_created" not in text
    finally:
        range_server.open_gate()
    assert proc.wait(60) == 0
    assert read_message(volume)["reason"] == "Complete"


def test_no_metrics_without_pod_ip(
    big: Big, range_server: FileServer, make_volume: Callable[..., Volume]
) -> None:
    """Outside a pod (no POD_IP) nothing listens on 8443."""
    ip = pod_ip()
    volume = make_volume("fs")
    env = base_env()
    env.update(volume.env())
    env.update(
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"{range_server.url}/{big.raw.name}",
            "IMPORTER_IMAGE_SIZE": str(256 << 20),
        }
    )
    range_server.close_gate(big.raw.file_size // 2)
    proc = subprocess.Popen(importer_command(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: range_server.served(big.raw.name) > 0, 60, message="the import to start")
        assert scrape(ip) is None
    finally:
        range_server.open_gate()
    assert proc.wait(60) == 0


def test_progress_is_per_phase_and_reaches_100_only_when_complete() -> None:
    progress = Progress("uid")
    progress.plan([(TRANSFER_DATA_FILE, 48), (CONVERT, 48), (RESIZE, 1), (SYNC, 3)])
    progress.begin(TRANSFER_DATA_FILE, 1000)
    progress.update(500)
    assert progress.percent == 24
    progress.begin(CONVERT, 100)
    assert progress.percent == 48
    progress.advance_fraction(1.0)
    assert progress.percent == 96
    progress.begin(RESIZE)
    progress.begin(SYNC)
    assert progress.percent < 100
    progress.update(0)
    progress.complete()
    assert progress.percent == 100
    from prometheus_client import generate_latest

    text = generate_latest(progress.registry).decode()
    assert metric(text, "kubevirt_cdi_import_progress_total", ownerUID="uid") == 100
    assert metric(text, "cdi_importer_phase", ownerUID="uid", phase=COMPLETE) == 1
    assert metric(text, "cdi_importer_phase", ownerUID="uid", phase=CONVERT) == 0
    assert metric(text, "cdi_importer_phase_bytes_done", ownerUID="uid", phase=TRANSFER_DATA_FILE) == 1000
    assert "_created" not in text


def test_the_retry_under_way_is_on_the_metrics_endpoint(make_volume: Callable[..., Volume]) -> None:
    """While a request keeps failing, /metrics says which failure is retried and how often, in a form the
    controller reads back exactly (the message names the URL, here with quotes and a backslash)."""
    server = MuteServer(cut=True)
    ip = pod_ip()
    volume = make_volume("fs")
    env = base_env()
    env.update(volume.env())
    path = '/say-"hi"\\there.img'
    env.update(
        {
            "IMPORTER_SOURCE": "http",
            "IMPORTER_ENDPOINT": f"{server.url}{path}",
            "IMPORTER_RETRY_BUDGET": "60",
            "POD_IP": ip,
            "OWNER_UID": OWNER,
        }
    )
    proc = subprocess.Popen(importer_command(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def retrying() -> Retry | None:
            text = scrape(ip)
            retry = parse_retry(text, OWNER) if text else None
            return retry if retry is not None and retry.attempt >= 2 else None

        retry = wait_for(retrying, 60, message="the retry on /metrics")
    finally:
        proc.terminate()
        proc.wait(30)
        server.close()
    assert retry.reason == "ConnectionFailed"
    assert retry.message == (
        f"connection to {server.url}{path} failed: Remote end closed connection without response"
    )
    assert retry.describe().startswith("retrying: connection to ") and retry.describe().endswith(
        f"(attempt {retry.attempt})"
    )
