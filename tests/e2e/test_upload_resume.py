"""Resumable uploads end to end: a TCP relay between `cdi image-upload` and the upload proxy drops the
upload's connection half way through (deterministically, after a byte count); the CLI asks the upload
server where to continue, sends only the rest, and the volume holds exactly the image. The same when
the upload server is killed in the middle (its restart finds the offset kept on the volume), and when
the client is killed and run again."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.importing import read_back, wait_phase
from tests.e2e.uploading import image_upload, proxy_url
from tests.support.cluster import ROOT, CdiUp, Kubectl, wait_for

SIZE = 96 << 20


class CuttingRelay:
    """Forwards TCP connections to `target`; the first connection that carries more than `cut_after`
    bytes from the client is aborted (RST both ways) right there. Later connections pass untouched.
    `stall`: that connection first stops carrying anything (`stalled` is set) until `release` is set."""

    def __init__(self, target: tuple[str, int], cut_after: int, *, stall: bool = False) -> None:
        self.target = target
        self.cut_after = cut_after
        self.stall = stall
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, counting: bool) -> None:
        carried = 0
        try:
            while data := source.recv(1 << 16):
                if counting:
                    carried += len(data)
                    with self._lock:
                        cut = self.cuts == 0 and carried > self.cut_after
                        if cut:
                            self.cuts += 1
                    if cut:
                        if self.stall:
                            self.stalled.set()
                            self.release.wait()
                        self._abort(source, sink)
                        return
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            for s in (source, sink):
                s.close()

    @staticmethod
    def _abort(*sockets: socket.socket) -> None:
        """RST both ways. Shutdown, not just close: the other direction's thread is blocked in recv on these
        sockets, and a close alone would neither wake it nor tell the peers; each on its own (the client's may
        be gone already, when it was killed)."""
        for s in sockets:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.release.set()
        self.listener.close()


class AnswerHoldingRelay(CuttingRelay):
    """Forwards TCP connections to `target`, except the answer to an upload: the first bytes coming back
    after the client sent `after` bytes are held (the upload server answers only once it has the whole
    body, and sends nothing after the TLS handshakes before that); `held` is set then, and once `release`
    is set the connection is aborted (RST both ways) without them. Later connections pass untouched."""

    def __init__(self, target: tuple[str, int], after: int) -> None:
        super().__init__(target, cut_after=after)
        self.held = threading.Event()
        self._sent: dict[socket.socket, int] = {}

    def _pipe(self, source: socket.socket, sink: socket.socket, counting: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                with self._lock:
                    if counting:
                        self._sent[source] = self._sent.get(source, 0) + len(data)
                    hold = not counting and self.cuts == 0 and self._sent.get(sink, 0) >= self.cut_after
                    if hold:
                        self.cuts += 1
                if hold:
                    self.held.set()
                    self.release.wait()
                    self._abort(source, sink)
                    return
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            for s in (source, sink):
                s.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp]:
    up = CdiUp(tmp_path_factory.mktemp("resume") / "cdi")
    up.start()
    yield up
    up.stop()


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    """96 MiB of data everywhere (with a zero run), so every byte counts and nothing is sparse."""
    rng = random.Random(5)
    path = tmp_path / "disk.raw"
    block = bytearray(rng.randbytes(8 << 20))
    with open(path, "wb") as f:
        for i in range(SIZE // len(block)):
            block[:8] = i.to_bytes(8, "big")
            f.write(block if i != 5 else bytes(len(block)))
    return path


@pytest.mark.parametrize("end_to_end", [True, False], ids=["end-to-end-tls", "through-the-proxy-tls"])
def test_a_dropped_upload_resumes_and_sends_only_the_rest(cluster: CdiUp, tmp_path: Path, disk: Path,
                                                          end_to_end: bool) -> None:
    """Both ways of sending: TLS with the upload server (the default), and TLS with the proxy as virtctl's."""
    k = Kubectl(cluster.kubeconfig, tmp_path / "kc")
    proxy = urlsplit(proxy_url(k))
    relay = CuttingRelay((str(proxy.hostname), int(proxy.port or 443)), cut_after=SIZE // 2)
    name = f"resumed-{int(end_to_end)}"
    try:
        result = image_upload(cluster, "dv", name, "--size", "128Mi", "--volume-mode", "block",
                              "--image-path", str(disk), "--uploadproxy-url", f"https://127.0.0.1:{relay.port}",
                              env={"CDI_IMAGE_UPLOAD_END_TO_END": "1" if end_to_end else "0"})
    finally:
        relay.close()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert relay.cuts == 1
    assert ("(TLS end to end with the upload server)" in output) == end_to_end
    assert "asking the upload server where to resume" in output
    assert "2 attempts" in output
    resumed = re.search(r"resumed    at .*?\((\d+) bytes\); the last attempt sent .*?\((\d+) bytes\)", output)
    assert resumed, output
    offset, last = int(resumed.group(1)), int(resumed.group(2))
    assert offset + last == SIZE
    # the durable offset is close to the cut: what was in flight (socket buffers, the upload server's
    # queue) is all that is sent twice
    assert SIZE // 2 - (48 << 20) < offset <= SIZE // 2
    assert last < SIZE * 0.6
    assert f"result     DataVolume default/{name} Succeeded" in output
    assert read_back(k, name, SIZE, block=True) == hashlib.sha256(disk.read_bytes()).hexdigest()


def start_image_upload(cluster: CdiUp, *args: str) -> subprocess.Popen[str]:
    """`cdi image-upload` as `image_upload` runs it, in the background (to be killed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("KUBECONFIG", None)
    return subprocess.Popen([sys.executable, "-m", "cdi.cli.main", "image-upload", *args, "--kubeconfig",
                             str(cluster.kubeconfig)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)


def kept_offsets(k: Kubectl, pod: str) -> list[int]:
    """The offsets the upload server said it kept on the volume (its log)."""
    log = k("logs", pod, check=False).stdout
    return [int(n) for n in re.findall(r"kept (\d+) bytes on the volume", log)]


@pytest.mark.parametrize("mode", ["filesystem", "block"])
def test_a_killed_upload_server_restarts_and_the_upload_resumes_from_the_volume(
        cluster: CdiUp, tmp_path: Path, disk: Path, mode: str) -> None:
    """The upload server is SIGKILLed in the middle of the upload; the node restarts it, it finds the
    offset it recorded (next to disk.img; for a Block volume in the pod's emptyDir), and the client, after
    502/503 while the pod restarts, continues there."""
    k = Kubectl(cluster.kubeconfig, tmp_path / "kc")
    proxy = urlsplit(proxy_url(k))
    relay = CuttingRelay((str(proxy.hostname), int(proxy.port or 443)), cut_after=SIZE // 2, stall=True)
    name = f"server-killed-{mode}"
    client = start_image_upload(cluster, "dv", name, "--size", "128Mi", "--volume-mode", mode,
                                "--image-path", str(disk), "--uploadproxy-url", f"https://127.0.0.1:{relay.port}")
    try:
        wait_for(relay.stalled.is_set, 120, message="half the image on its way")
        # the upload server is named after the claim that takes the upload: the populator's prime claim
        prime = k.get("pvc", name)["metadata"].get("annotations", {}).get("cdi.kubevirt.io/storage.populator.pvcPrime")
        pod = f"cdi-upload-{prime or name}"
        kept = wait_for(lambda: kept_offsets(k, pod), 60, interval=0.5, message="the upload server's checkpoint")
        container = k.json("get", "pod", pod)["status"]["containerStatuses"][0]
        os.killpg(int(container["containerID"].removeprefix("bwrap://")), signal.SIGKILL)
        wait_for(lambda: k.json("get", "pod", pod)["status"]["containerStatuses"][0]["restartCount"] >= 1, 120,
                 interval=0.5, message="the node to restart the upload server")
        relay.release.set()  # the client's connection breaks (as it does once the proxy notices)
        output, _ = client.communicate(timeout=300)
    finally:
        client.kill()
        relay.close()
    assert client.returncode == 0, output
    resumed = re.search(r"resumed    at .*?\((\d+) bytes\); the last attempt sent .*?\((\d+) bytes\)", output)
    assert resumed, output
    offset, last = int(resumed.group(1)), int(resumed.group(2))
    assert offset + last == SIZE
    assert offset >= max(kept) > 0  # from the record the killed server left, not from 0
    assert f"result     DataVolume default/{name} Succeeded" in output
    assert read_back(k, name, SIZE, block=mode == "block") == hashlib.sha256(disk.read_bytes()).hexdigest()


BIG = 384 << 20
KILLED_AT = 288 << 20  # bytes the client sent when the upload server is killed: > 120 MiB + 2 * CHECKPOINT_BYTES


@pytest.fixture
def big_disk(tmp_path: Path) -> Path:
    """384 MiB of data everywhere: several of the upload server's checkpoints (`config.CHECKPOINT_BYTES`) long."""
    rng = random.Random(7)
    path = tmp_path / "big.raw"
    block = bytearray(rng.randbytes(8 << 20))
    with open(path, "wb") as f:
        for i in range(BIG // len(block)):
            block[:8] = i.to_bytes(8, "big")
            f.write(block)
    return path


def test_an_upload_server_killed_seconds_into_the_upload_keeps_what_it_had_written(
        cluster: CdiUp, tmp_path: Path, big_disk: Path) -> None:
    """The upload server is SIGKILLed the moment the client has sent 288 MiB (typically a second or two into
    the upload), and the client is killed too. Run again, `cdi image-upload` skips what the killed server
    had flushed: it checkpoints every 64 MiB it writes, at most one checkpoint behind, so whatever the
    timing it had at least 288 MiB - the bytes in flight (socket buffers and its queue, ~120 MiB at most) -
    two checkpoints kept. (It used to checkpoint only every 5 seconds, and kept nothing of an upload killed
    sooner.)"""
    k = Kubectl(cluster.kubeconfig, tmp_path / "kc")
    proxy = urlsplit(proxy_url(k))
    relay = CuttingRelay((str(proxy.hostname), int(proxy.port or 443)), cut_after=KILLED_AT, stall=True)
    name = "server-killed-early"
    args = ("dv", name, "--size", "512Mi", "--volume-mode", "block", "--image-path", str(big_disk))
    first = start_image_upload(cluster, *args, "--uploadproxy-url", f"https://127.0.0.1:{relay.port}")
    try:
        wait_for(relay.stalled.is_set, 120, message=f"{KILLED_AT} bytes on their way")
        prime = k.get("pvc", name)["metadata"].get("annotations", {}).get("cdi.kubevirt.io/storage.populator.pvcPrime")
        pod = f"cdi-upload-{prime or name}"
        container = k.json("get", "pod", pod)["status"]["containerStatuses"][0]
        os.killpg(int(container["containerID"].removeprefix("bwrap://")), signal.SIGKILL)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        relay.release.set()
        wait_for(lambda: k.json("get", "pod", pod)["status"]["containerStatuses"][0]["restartCount"] >= 1, 120,
                 interval=0.5, message="the node to restart the upload server")
        result = image_upload(cluster, *args, timeout=300)
    finally:
        first.kill()
        relay.close()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    skipped = re.search(r"skipped    .*?\((\d+) bytes\) already on the volume", output)
    assert skipped, output
    offset = int(skipped.group(1))
    assert 0 < offset <= KILLED_AT
    sent = re.search(r"sent       .*?\((\d+) bytes\)", output)
    assert sent and int(sent.group(1)) == BIG - offset, output
    assert f"result     DataVolume default/{name} Succeeded" in output
    assert read_back(k, name, BIG, block=True) == hashlib.sha256(big_disk.read_bytes()).hexdigest()


@pytest.mark.parametrize("same", [True, False], ids=["same-image", "another-image"])
def test_a_second_image_upload_after_a_killed_one_resumes(cluster: CdiUp, tmp_path: Path, disk: Path,
                                                          same: bool) -> None:
    """`cdi image-upload` is SIGKILLed in the middle; run again for the same DataVolume, it sends only what
    the volume does not hold yet and says how much it skipped. Run with another image, it starts over."""
    k = Kubectl(cluster.kubeconfig, tmp_path / "kc")
    proxy = urlsplit(proxy_url(k))
    relay = CuttingRelay((str(proxy.hostname), int(proxy.port or 443)), cut_after=SIZE // 2, stall=True)
    name = f"client-killed-{int(same)}"
    args = ("dv", name, "--size", "128Mi", "--volume-mode", "block", "--uploadproxy-url",
            f"https://127.0.0.1:{relay.port}")
    second = disk
    if not same:  # the same size and the same first MiBs, different from the middle on
        second = tmp_path / "other.raw"
        data = bytearray(disk.read_bytes())
        data[SIZE // 4:] = random.Random(9).randbytes(SIZE - SIZE // 4)
        second.write_bytes(data)
    first = start_image_upload(cluster, *args, "--image-path", str(disk))
    try:
        wait_for(relay.stalled.is_set, 120, message="half the image on its way")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        relay.release.set()  # its connection goes, as a dead client's does
        result = image_upload(cluster, *args, "--image-path", str(second), timeout=300)
    finally:
        first.kill()
        relay.close()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"Using existing PVC default/{name}" in output
    if not same:
        assert "of a different image; starting over" in output and "skipped" not in output
        assert re.search(rf"sent       .*?\({SIZE} bytes\)", output), output
        assert read_back(k, name, SIZE, block=True) == hashlib.sha256(second.read_bytes()).hexdigest()
        return
    skipped = re.search(r"skipped    .*?\((\d+) bytes\) already on the volume", output)
    assert skipped, output
    offset = int(skipped.group(1))
    assert SIZE // 2 - (48 << 20) < offset <= SIZE // 2
    sent = re.search(r"sent       .*?\((\d+) bytes\)", output)
    assert sent and int(sent.group(1)) == SIZE - offset, output
    assert "1 attempt," in output
    assert f"result     DataVolume default/{name} Succeeded" in output
    assert read_back(k, name, SIZE, block=True) == hashlib.sha256(disk.read_bytes()).hexdigest()


def test_a_datavolume_deleted_during_the_upload_ends_it_within_seconds(cluster: CdiUp, tmp_path: Path,
                                                                       disk: Path) -> None:
    """The DataVolume is deleted in the middle of the upload: its upload server goes with it, and nothing will
    ever say where to resume. The client says so as soon as its connection breaks, instead of asking the proxy
    for 3 minutes and ending with its 503."""
    k = Kubectl(cluster.kubeconfig, tmp_path / "kc")
    proxy = urlsplit(proxy_url(k))
    relay = CuttingRelay((str(proxy.hostname), int(proxy.port or 443)), cut_after=SIZE // 2, stall=True)
    name = "deleted-midway"
    client = start_image_upload(cluster, "dv", name, "--size", "128Mi", "--volume-mode", "block",
                                "--image-path", str(disk), "--uploadproxy-url", f"https://127.0.0.1:{relay.port}")
    try:
        wait_for(relay.stalled.is_set, 120, message="half the image on its way")
        k("delete", "dv", name)  # returns once the DataVolume is gone
        relay.release.set()  # the client's connection breaks, as it does once the upload server is gone
        try:
            output, _ = client.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            client.kill()
            output, _ = client.communicate()
            pytest.fail(f"cdi image-upload still running 10s after the DataVolume was deleted:\n{output}")
    finally:
        client.kill()
        relay.close()
    assert client.returncode == 1, output
    assert f"error: DataVolume default/{name} was deleted during the upload" in output
    assert "503" not in output


def test_an_upload_whose_answer_was_lost_ends_as_done(cluster: CdiUp, tmp_path: Path, disk: Path) -> None:
    """The whole image arrived, but the connection broke before its answer reached the client; by the time
    the client asks where to resume, the upload is done and the proxy answers CDI's 503 "already finished
    uploading" (`Upload-State: done` on the answer to the client's HEAD). The client ends as a success
    instead of retrying the 503 for minutes."""
    k = Kubectl(cluster.kubeconfig, tmp_path / "kc")
    proxy = urlsplit(proxy_url(k))
    relay = AnswerHoldingRelay((str(proxy.hostname), int(proxy.port or 443)), after=SIZE)
    name = "answer-lost"
    client = start_image_upload(cluster, "dv", name, "--size", "128Mi", "--volume-mode", "block",
                                "--image-path", str(disk), "--uploadproxy-url", f"https://127.0.0.1:{relay.port}")
    try:
        wait_for(relay.held.is_set, 120, message="the upload server's answer")
        wait_phase(k, name, "Succeeded", 60)
        relay.release.set()
        output, _ = client.communicate(timeout=60)
    finally:
        client.kill()
        relay.close()
    assert client.returncode == 0, output
    assert "asking the upload server where to resume" in output
    assert f"result     DataVolume default/{name} Succeeded" in output
    assert read_back(k, name, SIZE, block=True) == hashlib.sha256(disk.read_bytes()).hexdigest()
