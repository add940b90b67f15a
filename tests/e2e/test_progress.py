"""Progress that tells the truth (issue 30.2), as a user sees it with kubectl: while a DataVolume is filled, its
Running condition names the step it is in, with the bytes done of the total, the rate and the time left
("Transfer: 5.0 MiB of 12 MiB, 1.0 MiB/s, about 7 s left"), says "stalled" when nothing moves, and its
`status.progress` moves for uploads and host-assisted clones too (CDI shows "N/A" for both until the end).

Each transfer is held part way on purpose, so what is looked at is there however fast the machine: an import
from a file server whose gate holds the last quarter of the image (and which sends the rest slowly), an
upload whose client sends half the body and waits, a host-assisted copy whose target's upload server is
frozen part way."""

from __future__ import annotations

import http.client
import os
import re
import signal
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.importing import condition, datavolume, wait_phase
from tests.e2e.target import External
from tests.e2e.test_clone import LARGE_WRITE, clone_dv, stop_mid_copy, wait_dv_phase
from tests.e2e.uploading import proxy_ca, proxy_url, token, upload_dv, wait_ready
from tests.e2e.workloads import get, new_namespace, pod, pvc, run_to_completion
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer

MIB = 1 << 20
SIZE = r"\d+(?:\.\d)? (?:B|KiB|MiB|GiB|TiB)"
# "<Step>: <done> of <total>[, <rate>/s[, about <time> left] | , stalled]"
MESSAGE = re.compile(rf"^(?P<step>Transfer|Convert|Resize|Preallocate|Sync): (?P<done>{SIZE}) of (?P<total>{SIZE})"
                     rf"(?:, (?P<rate>{SIZE}/s|stalled))?(?:, about (?P<left>\d+ (?:s|min|h)(?: \d+ min)?) left)?$")


def running(dv: dict[str, Any]) -> tuple[str, str]:
    found = condition(dv, "Running")
    return found["status"], found.get("message", "")


def percent(dv: dict[str, Any]) -> float | None:
    """`status.progress` as a number; None while it is "N/A"."""
    value = str((dv.get("status") or {}).get("progress") or "N/A")
    return None if value == "N/A" else float(value.rstrip("%"))


def said(k: Kubectl, name: str, wanted: re.Pattern[str], namespace: str = "default",
         timeout: float = 90.0) -> tuple[re.Match[str], dict[str, Any]]:
    """The DataVolume's Running message once it matches `wanted` while Running, with the DataVolume then."""
    def check() -> tuple[re.Match[str], dict[str, Any]] | None:
        dv: dict[str, Any] = k.get("dv", name, namespace)
        status, message = running(dv) if (dv.get("status") or {}).get("conditions") else ("", "")
        match = wanted.match(message) if status == "True" else None
        return (match, dv) if match else None

    result: tuple[re.Match[str], dict[str, Any]] = wait_for(check, timeout, 0.2,
                                                            message=f"{name}'s Running message matching {wanted}")
    return result


# a step that moves: a rate, and so an estimate of the time left
MOVING = re.compile(rf"^(?P<step>Transfer|Convert): (?P<done>{SIZE}) of (?P<total>{SIZE}), (?P<rate>{SIZE})/s, "
                    r"about (?P<left>\d+ (?:s|min|h)(?: \d+ min)?) left$")


@pytest.mark.anycluster
def test_an_import_says_its_step_bytes_rate_and_time_left(k: Kubectl, gated_server: FileServer,
                                                          images: dict[str, Image]) -> None:
    image = images["raw.img"]  # 12 MiB
    name = "progress-import"
    gated_server.throttle = 1 << 20  # bytes per second and response: a transfer of a few seconds
    gated_server.close_gate(image.file_size * 3 // 4)  # and held before its end, whatever the machine's speed
    try:
        k.apply(datavolume(name, {"http": {"url": f"{gated_server.url}/{image.name}"}}, "64Mi"))
        match, dv = said(k, name, MOVING)
        assert match["step"] == "Transfer" and match["total"] == "12 MiB", match[0]
        moving = percent(dv)
        assert moving is not None and 0 < moving < 100, dv["status"]
        # held at the gate: once nothing moved for the rate's window the message says so, not the old rate
        match, dv = said(k, name, re.compile(r"^Transfer: .+ of 12 MiB, stalled$"), timeout=60)
        held = percent(dv)
        assert held is not None and moving <= held < 100, dv["status"]
    finally:
        gated_server.throttle = None
        gated_server.open_gate()
    dv = wait_phase(k, name, "Succeeded")
    assert dv["status"]["progress"] == "100.0%"
    assert running(dv)[0] == "False"


def _post_half(cluster: CdiUp | External, k: Kubectl, name: str, data: bytes) -> http.client.HTTPSConnection:
    """An upload through the upload proxy, as any HTTP client makes it, that sends the first half of its body
    and then waits (the connection is returned to send the rest)."""
    url = urlsplit(proxy_url(k, cluster))
    context = ssl.create_default_context(cafile=str(proxy_ca(cluster)))
    conn = http.client.HTTPSConnection(url.hostname or "", url.port or 443, context=context, timeout=120)
    conn.putrequest("POST", "/v1beta1/upload")
    conn.putheader("Authorization", f"Bearer {token(k, name)}")
    conn.putheader("Content-Type", "application/octet-stream")
    conn.putheader("Content-Length", str(len(data)))
    conn.endheaders()
    conn.send(data[:len(data) // 2])
    return conn


@pytest.mark.anycluster
def test_an_upload_shows_its_progress_while_the_client_holds_it(cluster: CdiUp | External, k: Kubectl,
                                                                images: dict[str, Image]) -> None:
    image = images["raw.img"]
    data = image.path.read_bytes()  # 12 MiB
    name = "progress-upload"
    k.apply(upload_dv(name, "64Mi"))
    wait_ready(k, name)
    assert percent(k.get("dv", name)) is None  # N/A before anything was sent
    conn = _post_half(cluster, k, name, data)
    try:
        # the server has the first half: the step, its bytes of the declared length, then "stalled"
        match, dv = said(k, name, MESSAGE)
        assert match["step"] == "Transfer" and match["total"] == "12 MiB", match[0]
        assert dv["status"]["phase"] == "UploadReady"
        match, dv = said(k, name, re.compile(r"^Transfer: 6\.0 MiB of 12 MiB(, .+)?$"))
        half = percent(dv)
        assert half is not None and 0 < half < 100, dv["status"]  # CDI: N/A
        conn.send(data[len(data) // 2:])
        response = conn.getresponse()
        assert response.status == 200, response.read()
    finally:
        conn.close()
    dv = wait_phase(k, name, "Succeeded")
    assert dv["status"]["progress"] == "100.0%"


def program(module: str, env: str) -> int | None:
    """The pid of the node's process running `python -m <module>` with `env` in its environment."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"python" in argv[0] and module.encode() in argv and \
                    env.encode() in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    return None


def test_a_host_assisted_clone_shows_the_copys_progress(shared_kubectl: Kubectl) -> None:
    """The copy's target (its upload server) frozen part way: the clone source, blocked, still says where it
    is; the DataVolume shows it while CloneInProgress, and ends at 100%. `cdi up` only: the test freezes the
    node's processes."""
    k = shared_kubectl
    ns = new_namespace(k, "progress")
    k.apply(pvc("golden", "320Mi", storage_class="local-nosnap"), "-n", ns)
    run_to_completion(k, ns, pod("fill", LARGE_WRITE, "golden", python=True), timeout=120)
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class="local-nosnap"), "-n", ns)
    uid = wait_for(lambda: (get(k, "datavolume", "copy", ns) or {}).get("metadata", {}).get("uid"), 30, 0.05,
                   message="the DataVolume")
    source = stop_mid_copy(uid, 32 * MIB)  # the clone source, stopped once it sent 32 MiB
    target_uid = get(k, "pvc", "copy", ns)["metadata"]["uid"]
    [temp] = k.json("get", "pvc", "-n", ns, "-l", f"cdi.kubevirt.io/OwnedByUID={target_uid}")["items"]
    server = get(k, "pod", f"cdi-upload-{temp['metadata']['name']}", ns)["status"]["podIP"]
    upload = wait_for(lambda: program("cdi.uploadserver", f"POD_IP={server}"), 30, 0.05, message="the upload server")
    os.kill(upload, signal.SIGSTOP)  # the target stops reading: the source blocks, its metrics still answer
    os.killpg(os.getpgid(source), signal.SIGCONT)
    try:
        match, dv = said(k, "copy", MESSAGE, namespace=ns)
        # of the source's allocated bytes (what the copy sends): its 256 MiB of data, as the file system holds them
        total, unit = match["total"].split()
        assert match["step"] == "Transfer" and unit == "MiB" and 250 <= float(total) <= 260, match[0]
        assert dv["status"]["phase"] == "CloneInProgress"
        held = percent(dv)
        assert held is not None and 0 < held < 100, dv["status"]  # CDI: N/A
        match, dv = said(k, "copy", re.compile(r"^Transfer: .+, stalled$"), namespace=ns, timeout=60)
    finally:
        os.kill(upload, signal.SIGCONT)
    dv = wait_dv_phase(k, ns, "copy", "Succeeded", timeout=300)
    assert dv["status"]["progress"] == "100.0%"
