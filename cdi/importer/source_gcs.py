"""Google Cloud Storage sources: google-cloud-storage reads the object; the shared pipeline does the rest.

CDI's GCS source (`IMPORTER_SOURCE=gcs`) takes `gs://bucket/object`, or
`http(s)://host/bucket/object` where the host is the storage API endpoint to talk to. With a
`secretRef`, the controller mounts the secret at /google and sets `GOOGLE_APPLICATION_CREDENTIALS`
to /google/credentials.json (CDI's names), so the secret holds a `credentials.json` key: a service
account key, or any other credentials file google-auth understands. Without it the client is
anonymous, which reads public objects.

The library does what it is good at (credentials and token refresh, the JSON API, its error
types); the object is pinned to the generation found when it was opened and read with ranged
downloads, so imports get parallel ranges, streaming qcow2, every format the pipeline knows,
retries that continue where they stopped and resume (identity: bucket/object, generation, size).
`STORAGE_EMULATOR_HOST` is honoured by the library itself (tests point it at an emulator);
nothing here treats an emulator differently.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from cdi.api import env as envnames

from .config import ImporterConfig
from .errors import ImporterError, Reason
from .formats import HEAD_SIZE
from .http_client import ca_bundle, ca_files
from .qemu import SYSTEM_CA_BUNDLE
from .ranges import PrefetchStream
from .retry import transient
from .source import Origin
from .streams import ChainStream, Stream

log = logging.getLogger(__name__)

READ_ONLY_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
# hosts that name Google's own service: the library's default endpoint is the API behind them
_GOOGLE_HOSTS = ("storage.cloud.google.com", "storage.googleapis.com", "www.googleapis.com")


@dataclass(frozen=True)
class GcsLocation:
    bucket: str
    name: str  # the object's name within the bucket
    api_endpoint: str | None  # None: the library's default (Google, or STORAGE_EMULATOR_HOST)

    @property
    def url(self) -> str:
        return f"gs://{self.bucket}/{self.name}"


def parse_endpoint(endpoint: str) -> GcsLocation:
    """`gs://bucket/object`, or CDI's `http(s)://host/bucket/object` with `host` as the API endpoint."""
    parts = urlsplit(endpoint)
    scheme = parts.scheme.lower()
    path = unquote(parts.path).lstrip("/")
    if scheme == "gs":
        location = GcsLocation(parts.netloc, path, None)
    elif scheme in ("http", "https"):
        bucket, _, name = path.partition("/")
        host = (parts.hostname or "").lower()
        api = None if host in _GOOGLE_HOSTS else f"{scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
        location = GcsLocation(bucket, name, api)
    else:
        raise ImporterError(
            Reason.INVALID_CONFIGURATION,
            f"GCS endpoint {endpoint!r} must be gs://bucket/object or https://host/bucket/object",
        )
    if not location.bucket or not location.name:
        raise ImporterError(Reason.INVALID_CONFIGURATION, f"GCS endpoint {endpoint!r} names no bucket and object")
    return location


def _classify(exc: BaseException, location: GcsLocation) -> ImporterError:
    import requests
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    name = location.url
    if isinstance(exc, ImporterError):
        return exc
    if isinstance(exc, gexc.NotFound):
        return ImporterError(Reason.NOT_FOUND, f"{name} does not exist ({exc.message})")
    if isinstance(exc, gexc.Unauthorized | gexc.Forbidden):
        return ImporterError(
            Reason.UNAUTHORIZED,
            f"{name}: access refused ({exc.message}); check the credentials.json key of the secret",
        )
    if isinstance(exc, gexc.TooManyRequests | gexc.ServerError):
        return transient(Reason.SERVER_ERROR, f"{name}: {exc.message}")
    if isinstance(exc, gexc.GoogleAPICallError):
        return ImporterError(Reason.REQUEST_REJECTED, f"{name}: {exc.message}")
    if isinstance(exc, aexc.TransportError):
        return transient(Reason.CONNECTION_FAILED, f"cannot reach the token endpoint for {name}: {exc}")
    if isinstance(exc, aexc.GoogleAuthError):
        return ImporterError(Reason.UNAUTHORIZED, f"{name}: the credentials were refused: {exc}")
    if isinstance(exc, requests.exceptions.SSLError):
        return ImporterError(Reason.TLS_ERROR, f"TLS handshake with the GCS endpoint failed: {exc}")
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return transient(Reason.CONNECTION_FAILED, f"cannot reach the GCS endpoint for {name}: {exc}")
    if isinstance(exc, OSError | ValueError):  # an unreadable credentials file
        return ImporterError(Reason.INVALID_CONFIGURATION, f"{name}: {type(exc).__name__}: {exc}")
    return ImporterError(Reason.INTERNAL_ERROR, f"{name}: {type(exc).__name__}: {exc}")


class GcsClients:
    """One storage client per thread (the library's clients are not meant to be shared by threads),
    all built from the same credentials."""

    def __init__(self, location: GcsLocation, credentials_file: str | None, verify: bool | str = True) -> None:
        self.location = location
        self.verify = verify
        self.credentials: Any = None
        self.project: str | None = None
        if credentials_file:
            import google.auth

            self.credentials, self.project = google.auth.load_credentials_from_file(  # type: ignore[no-untyped-call]
                credentials_file, scopes=[READ_ONLY_SCOPE]
            )
        self._local = threading.local()

    def client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials
            from google.auth.transport.requests import AuthorizedSession
            from google.cloud import storage

            options = ClientOptions(api_endpoint=self.location.api_endpoint) if self.location.api_endpoint else None
            credentials = self.credentials if self.credentials is not None else AnonymousCredentials()  # type: ignore[no-untyped-call]
            session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
            session.verify = self.verify  # the proxy's CA (trustedCAProxy), or off for insecureSkipVerify
            # an anonymous client needs no project; "<none>" is what the library's own anonymous client uses
            client = storage.Client(project=self.project or "<none>", credentials=credentials,
                                    client_options=options, _http=session)
            self._local.client = client
        return client


class GcsRangeReader:
    """Ranged downloads of the pinned generation, each retried from where it stopped."""

    def __init__(self, origin: GcsOrigin, size: int) -> None:
        self.origin = origin
        self.size = size

    def read_into(self, offset: int, view: memoryview) -> None:
        origin = self.origin
        if offset + len(view) > self.size:
            raise ImporterError(
                Reason.INVALID_IMAGE, f"read beyond the end of {origin.name} ({offset + len(view)} > {self.size})"
            )
        filled = 0

        def attempt() -> None:
            nonlocal filled
            start, end = offset + filled, offset + len(view) - 1
            data = origin.download(start, end)
            if len(data) > end - start + 1:
                raise ImporterError(Reason.REQUEST_REJECTED, f"{origin.name}: the storage endpoint answered a "
                                                             "ranged download with more than the range")
            view[filled : filled + len(data)] = data
            filled += len(data)
            origin.meter.add(len(data))
            if filled < len(view):
                raise transient(Reason.CONNECTION_FAILED, f"range read of {origin.name} ended early")

        if view:
            origin.retry.run(attempt, f"GET {origin.name} bytes {offset}-{offset + len(view) - 1}", origin.stop)


class GcsOrigin(Origin):
    def __init__(self, config: ImporterConfig, stop: threading.Event, location: GcsLocation,
                 clients: GcsClients, *, workers: int = 4) -> None:
        super().__init__()
        self.location = location
        self.name = location.url
        self.clients = clients
        self.retry = config.retry
        self.stop = stop
        self.timeout = config.read_timeout
        self.workers = workers
        self.generation: int | None = None
        self.bundle_dir: Path | None = None
        self._stream_used = False

    def _blob(self) -> Any:
        bucket = self.clients.client().bucket(self.location.bucket)
        return bucket.blob(self.location.name, generation=self.generation)

    def open(self) -> GcsOrigin:
        def metadata() -> Any:
            blob = self._blob()
            try:
                blob.reload(timeout=self.timeout, retry=None)
            except Exception as exc:
                raise _classify(exc, self.location) from exc
            return blob

        blob = self.retry.run(metadata, f"GET metadata of {self.name}", self.stop)
        self.size = int(blob.size or 0)
        self.generation = int(blob.generation) if blob.generation is not None else None
        if self.size:
            self.ranges = GcsRangeReader(self, self.size)
            head = bytearray(min(HEAD_SIZE, self.size))
            self.ranges.read_into(0, memoryview(head))
            self.head = bytes(head)
        self.identity = {"gcs": f"{self.location.bucket}/{self.location.name}",
                         "endpoint": self.location.api_endpoint or "google",
                         "generation": self.generation, "size": self.size}
        log.info("%s: %d bytes, generation %s", self.name, self.size, self.generation)
        return self

    def download(self, start: int, end: int) -> bytes:
        """Bytes [start, end] of the pinned generation, raw (no decompressive transcoding)."""
        try:
            data: bytes = self._blob().download_as_bytes(
                start=start, end=end, raw_download=True, checksum=None, timeout=self.timeout, retry=None
            )
        except Exception as exc:
            error = _classify(exc, self.location)
            if error.reason == Reason.NOT_FOUND and self.generation is not None:
                raise ImporterError(Reason.SOURCE_CHANGED, f"{self.name} was replaced or deleted during the "
                                                           f"import (generation {self.generation} is gone)",
                                    retryable=True) from exc
            raise error from exc
        return data

    def stream(self) -> Stream:
        if self._stream_used:
            raise RuntimeError("the stream of an origin can be read once")
        self._stream_used = True
        if self.ranges is None or self.size is None:
            return ChainStream(self.head, None)
        reader, size, head = self.ranges, self.size, self.head
        return ChainStream(head, lambda: PrefetchStream(reader, len(head), size, workers=self.workers,
                                                        stop=self.stop))

    def close(self) -> None:
        if self.bundle_dir is not None:
            shutil.rmtree(self.bundle_dir, ignore_errors=True)


def credentials_file(environ: dict[str, str] | None = None) -> str | None:
    """The key file the controller mounted (CDI: GOOGLE_APPLICATION_CREDENTIALS); None for anonymous."""
    env = os.environ if environ is None else environ
    path = env.get(envnames.GOOGLE_CREDENTIALS, "").strip()
    return path or None


def open_gcs(config: ImporterConfig, stop: threading.Event) -> Origin:
    location = parse_endpoint(config.endpoint)
    path = credentials_file()
    custom_cas = ca_files(config.cert_dir) + ca_files(config.proxy_cert_dir)
    bundle_dir = ca_bundle(custom_cas, SYSTEM_CA_BUNDLE) if custom_cas and not config.insecure_tls else None
    verify: bool | str = False if config.insecure_tls else str(bundle_dir / "ca.pem") if bundle_dir else True
    try:
        try:
            clients = GcsClients(location, path, verify)
        except Exception as exc:
            raise ImporterError(Reason.INVALID_CONFIGURATION, f"cannot read the GCS credentials in {path}: "
                                                              f"{type(exc).__name__}: {exc}") from exc
        origin = GcsOrigin(config, stop, location, clients)
        origin.bundle_dir = bundle_dir
        return origin.open()
    except BaseException:
        if bundle_dir is not None:
            shutil.rmtree(bundle_dir, ignore_errors=True)
        raise
