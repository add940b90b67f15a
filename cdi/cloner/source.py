"""The clone source pod (`cdi-cloner`, container `cdi-clone-source`): reads the source volume
read-only and sends only its allocated extents (`cdi.common.clonestream`) over TLS, authenticated by
its client certificate as this clone's source (CDI's `uploadClientName`), to the target's upload
server. Progress as `kubevirt_cdi_clone_progress_total{ownerUID}` on https://$POD_IP:8443/metrics, with the bytes,
rate and time left of its phase (`Progress`).

Its environment is `cdi.api.clonesourcerequest.CloneSourceRequest`'s (CDI's names: where to send, the
client certificate and the server's CA, the source's volume mode and mount point, its owner), read by
that request's `from_environ`, the reader the controller's pod builder is tested against."""

from __future__ import annotations

import http.client
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cdi.api.clonesourcerequest import CloneSourceRequest
from cdi.api.envvalues import EnvError
from cdi.common import clonestream, pki
from cdi.importer import progress as importer_progress

log = logging.getLogger(__name__)
CHUNK = 4 << 20
METRICS_PORT = 8443
TRANSFER = "Transfer"  # the progress phase of the data bytes sent


class CloneError(Exception):
    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class SourceConfig:
    upload_url: str
    server_name: str
    client_cert: str
    client_key: str
    server_ca: str
    owner_uid: str
    block: bool
    mount_point: Path
    pod_ip: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SourceConfig:
        try:
            request = CloneSourceRequest.from_environ(os.environ if env is None else env)
        except EnvError as exc:
            raise CloneError(str(exc), retryable=False) from None
        return cls(request.upload_url, request.server_name, request.client_cert, request.client_key,
                   request.server_ca, request.volume.owner_uid, request.volume.block, Path(request.mount_point),
                   request.pod_ip)

    @property
    def source_path(self) -> Path:
        return self.mount_point if self.block else self.mount_point / "disk.img"


class Progress(importer_progress.Progress):
    """The importer's progress under the clone source's names: CDI's `kubevirt_cdi_clone_progress_total`
    (percent), and `cdi_cloner_phase*` as the importer's `cdi_importer_phase*` (bytes, rate, time left)
    for its two phases: `Transfer` (the source's data bytes sent) and `Sync` (the stream sent, the target
    makes it durable before it answers)."""

    COUNTER = "kubevirt_cdi_clone_progress"
    COUNTER_HELP = "The clone progress in percentage"
    PREFIX = "cdi_cloner"
    NAME = "cdi-clone-source"

    def __init__(self, owner_uid: str, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(owner_uid, clock)
        self.plan([(TRANSFER, 99), (importer_progress.SYNC, 1)])
        self.total = 0
        self.done = 0

    def start(self, total: int) -> None:
        """`total` data bytes to send."""
        self.total = total
        self.begin(TRANSFER, total)

    def add(self, n: int) -> None:
        self.done += n  # only the sending thread counts
        self.update(self.done)

    def extra_metrics(self, now: importer_progress.Snapshot) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        sent = CounterMetricFamily("cdi_cloner_bytes_sent", "Data bytes sent to the target", labels=["ownerUID"])
        sent.add_metric([self.owner_uid], self.done)
        yield sent


def tls_context(config: SourceConfig) -> ssl.SSLContext:
    return pki.client_context(config.server_ca,
                              identity=pki.KeyPair(config.client_cert.encode(), config.client_key.encode()))


def send(config: SourceConfig, progress: Progress) -> int:
    """Send the source's extents; returns the data bytes sent. Raises CloneError. A Filesystem
    source without `disk.img` (never filled) is an empty image."""
    path = config.source_path if config.block or config.source_path.exists() else Path("/dev/null")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.lseek(fd, 0, os.SEEK_END) if path != Path("/dev/null") else 0
        spans = list(clonestream.extents(fd, size))
        progress.start(sum(length for _, length in spans))
        log.info("source %s: %d bytes, %d allocated in %d extents", config.source_path, size, progress.total,
                 len(spans))
        url = urlsplit(config.upload_url)
        host, port = url.hostname or "", url.port or 443
        raw = socket.create_connection((host, port), timeout=60)
        sock = tls_context(config).wrap_socket(raw, server_hostname=config.server_name or host)
        conn = http.client.HTTPSConnection(host, port)
        conn.sock = sock
        conn.putrequest("POST", url.path or "/")
        conn.putheader("x-cdi-content-type", clonestream.BLOCKDEVICE_CLONE if config.block
                       else clonestream.FILESYSTEM_CLONE)
        conn.putheader("Content-Type", "application/octet-stream")
        conn.putheader("Content-Length", str(clonestream.stream_length(spans)))
        conn.endheaders()
        sock.sendall(clonestream.MAGIC + clonestream.HEADER.pack(size))
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        for offset, length in spans:
            sock.sendall(clonestream.EXTENT.pack(offset, length))
            done = 0
            while done < length:
                n = os.preadv(fd, [view[:min(CHUNK, length - done)]], offset + done)
                if n <= 0:
                    raise CloneError(f"the source ended at {offset + done}, inside an extent")
                sock.sendall(view[:n])
                # the pages read are clean and never read again here: dropped at once, they are not charged
                # to this pod's memory cgroup (4 GiB read through the cache held it at CDI's 600M limit)
                os.posix_fadvise(fd, offset + done, n, os.POSIX_FADV_DONTNEED)
                done += n
                progress.add(n)
        sock.sendall(clonestream.EXTENT.pack(clonestream.END_OFFSET, 0))
        progress.begin(importer_progress.SYNC)  # the target flushes before it answers
        response = conn.getresponse()
        body = response.read().decode(errors="replace")
        conn.close()
        if response.status != 200:
            raise CloneError(f"the target refused the clone: {response.status} {body.strip()}",
                             retryable=response.status >= 500 or response.status == 503)
        progress.complete()
        return progress.total
    except OSError as exc:
        raise CloneError(f"clone stream failed: {exc}") from exc
    finally:
        os.close(fd)
