"""Resumable uploads end to end: a TCP relay between `cdi image-upload` and the upload proxy drops the
upload's connection half way through (deterministically, after a byte count); the CLI asks the upload
server where to continue, sends only the rest, and the volume holds exactly the image."""

from __future__ import annotations

import hashlib
import random
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.importing import read_back
from tests.e2e.uploading import image_upload, proxy_url
from tests.support.cluster import CdiUp, Kubectl

SIZE = 96 << 20


class CuttingRelay:
    """Forwards TCP connections to `target`; the first connection that carries more than `cut_after`
    bytes from the client is aborted (RST both ways) right there. Later connections pass untouched."""

    def __init__(self, target: tuple[str, int], cut_after: int) -> None:
        self.target = target
        self.cut_after = cut_after
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
                        for s in (source, sink):
                            # shutdown, not just close: the other direction's thread is blocked in recv on
                            # these sockets, and a close alone would neither wake it nor tell the peers
                            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                            s.shutdown(socket.SHUT_RDWR)
                            s.close()
                        return
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            for s in (source, sink):
                s.close()

    def close(self) -> None:
        self.listener.close()


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
