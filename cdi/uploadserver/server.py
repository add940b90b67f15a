"""The upload server's HTTPS endpoints (CDI's paths and status codes, `cdi.api.upload`).

| request | answer |
|---|---|
| `GET /healthz` | 200 `OK` (readiness; no client certificate needed) |
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
HTTP stack; this class holds what it asks on the event loop (admission, the session, the answers).
Form uploads read the multipart body part by part as it arrives and stream the part named `file`;
nothing is buffered whole. A `POST` with `x-cdi-content-type: filesystem-clone` or
`blockdevice-clone` is a host-assisted clone stream (`cdi.uploadserver.clonesink`) from the clone
source pod (with a Content-Length), whose client certificate must carry `CLIENT_NAME`; 200 once its
bytes are durable, and the server then exits as after an upload; 500 when the stream is cut short."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from cdi.api import upload as names
from cdi.common import pki, tlsfront
from cdi.uploadserver import clonesink
from cdi.uploadserver.config import UploadServerConfig
from cdi.uploadserver.front import BodyBridge, Front
from cdi.uploadserver.session import Outcome, Refusal, UploadSession

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
    def __init__(self, config: UploadServerConfig, session: UploadSession | None = None) -> None:
        self.config = config
        self.session = session or UploadSession(config)
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._front: Front | None = None
        self.port = 0
        self.clone_result: clonesink.CloneResult | None = None
        self.clone_done = asyncio.Event()
        self._cloning = False

    def _request_started(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def request_done(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no request is being answered (so the last answer goes out before the server exits)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("requests still in flight after %.0fs; exiting anyway", timeout)

    async def start(self) -> None:
        self._front = Front(asyncio.get_running_loop(), server_tls(self.config), self, end_to_end_tls(self.config))
        self.port = self._front.start(self.config.listen_host, self.config.listen_port)
        log.info("upload server listening on https://%s:%d (TLS bodies read %s)", self.config.listen_host, self.port,
                 tlsfront.how())

    async def stop(self) -> None:
        """Stop serving (callers wait until no request is in flight first: `wait_idle`)."""
        if self._front is not None:
            await self._front.closed()

    # -- what the front asks (on the event loop) --------------------------------------------------------
    def describe(self) -> dict[str, str]:
        """The answer's headers to the `HEAD` probe of an upload path (`Upload-Offset`, `Upload-State`)."""
        return self.session.describe()

    def upload_abandoned(self) -> None:
        """An admitted upload whose body turned out unusable (a form without its part): the session is
        free again."""
        if self.session.state == "uploading":
            self.session.state = "idle"

    def authorized_peer(self, peer: Mapping[str, Any] | None) -> bool:
        if not peer:
            return False
        subject = dict(item[0] for item in peer.get("subject", ()))
        return bool(subject.get("commonName") == self.config.client_name)

    def admit_clone(self, authorized: bool) -> Outcome | None:
        """Whether the front may read a host-assisted clone stream (None), or its refusal: one at a time;
        a failed one may be sent again from the start. The request counts as in flight until the front
        calls `request_done`. Called on the event loop."""
        self._request_started()
        if not authorized:
            log.warning("refused a clone stream without the clone source's client certificate")
            return Outcome(401, f"a client certificate for {self.config.client_name} is required")
        if self.clone_result is not None:
            return Outcome(409, "the clone already completed")
        if self._cloning:
            return Outcome(503, "a clone stream is being received")
        self._cloning = True
        return None

    def clone_finished(self, result: clonesink.CloneResult | BaseException) -> Outcome:
        """The answer to a clone stream the front read; a complete one ends the server. On the event loop."""
        self._cloning = False
        if isinstance(result, clonesink.CloneRefused):
            log.warning("refused a clone stream: %s", result)
            return Outcome(400, f"Saving stream failed: {result}")
        if isinstance(result, BaseException):  # cut, or the target failed: the source pod sends it again
            log.error("clone stream failed: %s", result)
            return Outcome(500, f"Saving stream failed: {result}")
        log.info("clone complete: %d bytes virtual, %d bytes of data", result.virtual_size, result.data_bytes)
        self.clone_result = result
        self.clone_done.set()
        return Outcome(200, "Clone Complete")

    def _admit(self, authorized: bool, headers: Mapping[str, str], *, form: bool, archive: bool) -> Outcome | int:
        """The refusal of an upload request, or its offset once the session took it (state `uploading`)."""
        if not authorized:
            log.warning("refused an upload without the proxy's client certificate")
            return Outcome(401, f"a client certificate for {self.config.client_name} is required")
        if headers.get(names.CONTENT_TYPE_HEADER):
            return Outcome(400, f"{names.CONTENT_TYPE_HEADER} {headers[names.CONTENT_TYPE_HEADER]!r} (a clone "
                                "stream) is not supported by this upload server")
        try:
            offset = int(headers.get(names.OFFSET_HEADER) or 0)
        except ValueError:
            return Outcome(400, f"{names.OFFSET_HEADER} must be a number of bytes")
        if offset < 0 or (offset and (form or archive)):
            return Outcome(400, f"{names.OFFSET_HEADER} {offset} cannot be used here: only raw uploads to the "
                                "upload and upload-async paths resume")
        try:
            self.session.admit(offset)
        except Refusal as refusal:
            log.warning("refused an upload request: %s", refusal.message)
            return Outcome(refusal.status, refusal.message, refusal.headers)
        return offset

    # -- the front's uploads (called on the event loop; the answer is written by the front) --------------
    def admit(self, authorized: bool, headers: Mapping[str, str], *, form: bool, archive: bool) -> Outcome | int:
        """As `_admit`; the request counts as in flight until the front calls `request_done`."""
        self._request_started()
        lowered = {k.lower(): v for k, v in headers.items()}
        return self._admit(authorized, _Lower(lowered), form=form, archive=archive)

    async def receive_raw(self, chunks: BodyBridge, *, archive: bool, wait_for_durable: bool, offset: int,
                          length: int | None) -> Outcome:
        try:
            return await self.session.receive(chunks, archive=archive, wait_for_durable=wait_for_durable,
                                              offset=offset, length=length)
        except BaseException:
            if self.session.state == "uploading":
                self.session.state = "idle"
            raise
        finally:
            chunks.close()


class _Lower(dict[str, str]):
    """Headers looked up without regard to case (as aiohttp's)."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())
