"""The upload server's HTTPS endpoints (CDI's paths and status codes, `cdi.api.upload`).

| request | answer |
|---|---|
| `GET /healthz` | 200 `OK` (readiness; no client certificate needed) |
| `GET /metrics` | the upload's progress as the importer's metrics (Prometheus text; no client certificate needed) |
| `POST` sync paths (`/v1beta1/upload`, form, archive) | 200 once the image is converted, resized and flushed |
| `POST` async paths (`/v1beta1/upload-async`, form-async) | 200 once the body is received and validated |
| `HEAD` any upload path | 200 with `Upload-Offset` / `Upload-State` (async paths: CDI's capability probe) |
| any other method | 404, as CDI |
| without the proxy's client certificate (CN `CLIENT_NAME`) | 401 |
| while another upload is received or processed | 503 |
| after the upload completed | 409 |
| image larger than the volume | 400 `effective image size is larger than the reported available storage: ...` |
| image the importer refuses (corrupt, unsupported, backing file) | 400 `Saving stream failed: <reason>: ...` |
| unexpected failure | 500 `Saving stream failed: ...` |

End-to-end TLS (`cdi.api.upload`): a raw upload `POST` from the proxy (authorised by its certificate)
with `Upgrade: cdi-upload-tls/1` and a nonce is answered 101; the client then opens a TLS session
with this server through the proxy and sends the upload with that nonce, served as above.

TLS: the server's certificate from `TLS_CERT_FILE`/`TLS_KEY_FILE`, the versions and suites of CDIConfig's
TLS profile when the pod was made (`TLS_CIPHERS`, `TLS_MIN_VERSION`, as CDI's); client certificates are optional
at the TLS layer (the kubelet's readiness probe has none) and, when presented, must chain to
`CLIENT_CERT_FILE`; upload requests then require one whose CN is `CLIENT_NAME` (CDI's
`VerifyClientCertIfGiven` plus its CN check).

Every request is read and answered by the threaded front (`cdi.uploadserver.front`), the server's only
HTTP stack, in a thread per connection; this class answers what the front asks (`front.Server`) in that
thread, under its lock or the session's: nothing runs on an event loop.
Form uploads read the multipart body part by part as it arrives and stream the part named `file`;
nothing is buffered whole. A `POST` with `x-cdi-content-type: filesystem-clone` or
`blockdevice-clone` is a host-assisted clone stream (`cdi.uploadserver.clonesink`) from the clone
source pod (with a Content-Length), whose client certificate must carry `CLIENT_NAME`; 200 once its
bytes are durable, and the server then exits as after an upload; 500 when the stream is cut short."""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from cdi.common import pki, tlsfront
from cdi.uploadserver import clonesink
from cdi.uploadserver.config import UploadServerConfig
from cdi.uploadserver.feed import Chunk
from cdi.uploadserver.front import Front
from cdi.uploadserver.session import Outcome, Upload, UploadSession

log = logging.getLogger(__name__)


def server_tls(config: UploadServerConfig) -> tlsfront.ServerTLS:
    spec = config.tls_profile
    policy = pki.TLSPolicy.of(spec.ciphers, spec.min_tls_version)
    return tlsfront.ServerTLS(Path(config.cert_file), Path(config.key_file), policy,
                              None if config.client_ca_file is None else Path(config.client_ca_file))


def end_to_end_tls(config: UploadServerConfig) -> tlsfront.ServerTLS:
    """The server side of end-to-end TLS with a client the proxy switched over (`cdi.api.upload`): the same
    certificate, no client certificate (the client is authorised by the nonce the proxy gave), TLS 1.3 only
    (a channel between cdi's own programs, stricter than any profile)."""
    tls = server_tls(replace(config, client_ca_file=None))
    return replace(tls, policy=tls.policy.at_least(ssl.TLSVersion.TLSv1_3))


class UploadServer:
    """The program's server: the front, the one upload session, and the host-assisted clone it may
    receive instead of an upload. `ended` says when it is time to exit."""

    def __init__(self, config: UploadServerConfig) -> None:
        self.config = config
        # time to exit: the upload is done, or failed after it was answered, or a clone completed
        self.ended = threading.Event()
        self.session = UploadSession(config, finished=self.ended)
        self._lock = threading.Condition()  # the requests in flight, the clone's state
        self.in_flight = 0
        self._front: Front | None = None
        self.port = 0
        self.clone_result: clonesink.CloneResult | None = None
        self.clone_done = threading.Event()
        self._cloning = False

    def start(self) -> None:
        self._front = Front(server_tls(self.config), self, end_to_end_tls(self.config))
        self.port = self._front.start(self.config.listen_host, self.config.listen_port)
        log.info("upload server listening on https://%s:%d (TLS bodies read %s)", self.config.listen_host, self.port,
                 tlsfront.how())

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no request is being answered (so the last answer goes out before the server exits)."""
        with self._lock:
            if not self._lock.wait_for(lambda: not self.in_flight, timeout):
                log.warning("requests still in flight after %.0fs; exiting anyway", timeout)

    def stop(self) -> None:
        """Stop serving (callers wait until no request is in flight first: `wait_idle`); an import still
        running is told to stop first, so that no connection thread waits for it."""
        self.session.stop()
        if self._front is not None:
            self._front.close()

    # -- what the front asks (`front.Server`), in a connection's thread -----------------------------------
    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        with self._lock:
            self.in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self.in_flight -= 1
                self._lock.notify_all()

    def describe(self) -> dict[str, str]:
        return self.session.describe()

    def metrics(self) -> str:
        return self.session.metrics()

    def admit(self, offset: int) -> Outcome | None:
        return self.session.admit(offset)

    def receive(self, *, archive: bool, wait_for_durable: bool, offset: int, length: int | None,
                recycle: Callable[[Chunk], None] | None) -> Upload:
        return self.session.receive(archive=archive, wait_for_durable=wait_for_durable, offset=offset, length=length,
                                    recycle=recycle)

    def abandon(self) -> None:
        self.session.abandon()

    def admit_clone(self) -> Outcome | None:
        """One clone stream at a time; a failed one may be sent again from the start."""
        with self._lock:
            if self.clone_result is not None:
                return Outcome(409, "the clone already completed")
            if self._cloning:
                return Outcome(503, "a clone stream is being received")
            self._cloning = True
            return None

    def clone_finished(self, result: clonesink.CloneResult | BaseException) -> Outcome:
        """A complete clone ends the server."""
        with self._lock:
            self._cloning = False
            if isinstance(result, clonesink.CloneResult):
                self.clone_result = result
        if isinstance(result, clonesink.CloneRefused):
            log.warning("refused a clone stream: %s", result)
            return Outcome(400, f"Saving stream failed: {result}")
        if isinstance(result, BaseException):  # cut, or the target failed: the source pod sends it again
            log.error("clone stream failed: %s", result)
            return Outcome(500, f"Saving stream failed: {result}")
        log.info("clone complete: %d bytes virtual, %d bytes of data", result.virtual_size, result.data_bytes)
        self.clone_done.set()
        self.ended.set()
        return Outcome(200, "Clone Complete")
