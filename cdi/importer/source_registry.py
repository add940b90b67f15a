"""Container registry sources (`docker://host/repo:tag` or `@digest`), the containerDisk layout.

Speaks the registry API directly (no containers/image, no skopeo at run time):

* auth: anonymous, Basic, or the WWW-Authenticate Bearer token flow (credentials from the secret
  sent to the token realm), renewed if it expires during a long layer;
* manifests: Docker v2 schema 2 and OCI, image indexes / manifest lists resolved by architecture
  (IMPORTER_REGISTRY_IMAGE_ARCHITECTURE, default: this machine's, as containers/image does);
  digests of manifests, config and layers verified;
* layers read lowest first, each as one stream (fetched by parallel ranges when the registry
  serves them), decompressed (gzip/zstd) and walked as tar; the first regular file under `disk/`
  or `./disk/` is the image, handed to the pipeline without touching scratch when it is raw
  (compressed or not) - CDI always stages it on scratch;
* image config env `*KUBEVIRT_IO_*` reported as labels, exactly as CDI maps them;
* plain-HTTP registries when INSECURE_TLS is set and the registry does not speak TLS.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import re
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from . import compression
from .archive import TarReader
from .config import ImporterConfig
from .errors import ImporterError, Reason
from .formats import HEAD_SIZE
from .http_client import (
    HttpClient,
    HttpSettings,
    Response,
    parse_header_lines,
    status_error,
)
from .retry import RetryPolicy
from .source import Origin
from .source_http import HttpOrigin
from .streams import PeekStream, Stream, TapStream

log = logging.getLogger(__name__)

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_INDEXES = (OCI_INDEX, DOCKER_LIST)
_MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
_GENERIC_JSON = ("", "application/json", "application/octet-stream", "text/plain")
_ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
DISK_DIR = "disk/"
_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "armv7l": "arm",
    "riscv64": "riscv64",
}


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str
    reference: str  # a tag or a digest

    @property
    def is_digest(self) -> bool:
        return ":" in self.reference

    @classmethod
    def parse(cls, endpoint: str) -> ImageRef:
        if not endpoint.startswith("docker://"):
            raise ImporterError(
                Reason.INVALID_CONFIGURATION, f"registry endpoint {endpoint!r} must start with docker://"
            )
        name = endpoint[len("docker://") :]
        first, sep, rest = name.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
        else:
            registry, path = "registry-1.docker.io", name
            if "/" not in path.split("@")[0].split(":")[0]:
                path = "library/" + path
        if registry == "docker.io":
            registry = "registry-1.docker.io"
        if "@" in path:
            repository, reference = path.split("@", 1)
        else:
            last = path.rsplit("/", 1)[-1]
            if ":" in last:
                repository, reference = path.rsplit(":", 1)
            else:
                repository, reference = path, "latest"
        if not repository or not re.fullmatch(r"[a-z0-9]+(?:[._/-][a-z0-9]+|__)*", repository):
            raise ImporterError(Reason.INVALID_CONFIGURATION, f"invalid repository in {endpoint!r}")
        return cls(registry, repository, reference)


def env_to_label(name: str) -> str:
    """CDI's mapping of an env name to a label name.

    INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE -> instancetype.kubevirt.io/default-preference"""
    before, _, after = name.partition("KUBEVIRT_IO_")
    if before.endswith("_"):
        before = before[:-1]
    label = ""
    elems = before.split("_")
    if elems and elems[0]:
        label += ".".join(elems) + "."
    label += "kubevirt.io/" + "-".join(after.split("_"))
    return label.lower()


def env_labels(env: list[str]) -> dict[str, str]:
    labels = {}
    for entry in env:
        key, sep, value = entry.partition("=")
        if sep and "KUBEVIRT_IO_" in key:
            labels[env_to_label(key)] = value
    return labels


def machine_architecture() -> str:
    return _ARCH.get(platform.machine().lower(), "amd64")


def is_disk_entry(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return (name.startswith(DISK_DIR) or name.startswith("./" + DISK_DIR)) and not base.startswith(".wh.")


class RegistryClient:
    """Requests to one repository of one registry, with the auth dance done once and renewed."""

    def __init__(self, ref: ImageRef, config: ImporterConfig, stop: threading.Event) -> None:
        self.ref = ref
        self.config = config
        self.stop = stop
        self.retry: RetryPolicy = config.retry
        settings = HttpSettings(
            cert_dir=config.cert_dir,
            insecure=config.insecure_tls,
            timeout=config.read_timeout,
            extra_headers=parse_header_lines(config.extra_headers),
            proxies=config.proxies,
            proxy_cert_dir=config.proxy_cert_dir,
        )
        self.http = HttpClient(settings)
        self.scheme = "https"
        self.auth: dict[str, str] = {}
        self._challenge: str | None = None

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.ref.registry}/v2/{self.ref.repository}"

    def _send(self, url: str, accept: str | None = None) -> Response:
        headers = dict(self.auth)
        if accept:
            headers["Accept"] = accept
        try:
            return self.http.request("GET", url, headers)
        except ImporterError as exc:
            if exc.reason == Reason.TLS_ERROR and self.config.insecure_tls and self.scheme == "https":
                log.info("%s does not speak TLS; INSECURE_TLS is set, so using plain HTTP", self.ref.registry)
                self.scheme = "http"
                return self.http.request("GET", url.replace("https://", "http://", 1), headers)
            raise

    def get(self, path: str, accept: str | None = None) -> Response:
        """GET base+path, answering one auth challenge."""

        def attempt() -> Response:
            resp = self._send(f"{self.base}{path}", accept)
            if resp.status == 401 and not self.auth:
                challenge = resp.header("WWW-Authenticate") or ""
                resp.read_all(64 * 1024)
                self.authenticate(challenge)
                resp = self._send(f"{self.base}{path}", accept)
            if resp.status >= 300:
                detail = _registry_error(resp)
                raise status_error(resp.status, resp.url, detail)
            return resp

        return self.retry.run(attempt, f"GET {self.ref.registry}/{self.ref.repository}{path}", self.stop)

    def authenticate(self, challenge: str) -> dict[str, str]:
        self._challenge = challenge
        scheme, _, params_text = challenge.partition(" ")
        params = dict(re.findall(r'(\w+)="([^"]*)"', params_text))
        user, password = self.config.access_key, self.config.secret_key
        if scheme.lower() == "basic":
            if not (user and password):
                raise ImporterError(
                    Reason.UNAUTHORIZED, f"{self.ref.registry} requires credentials and the import has none"
                )
            import base64

            self.auth = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
            return self.auth
        if scheme.lower() != "bearer" or "realm" not in params:
            raise ImporterError(
                Reason.UNAUTHORIZED, f"{self.ref.registry} asks for unsupported auth {challenge!r}"
            )
        query = {"scope": f"repository:{self.ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urlencode(query)
        headers = {}
        if user and password:
            import base64

            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

        def fetch() -> dict[str, Any]:
            resp = self.http.request("GET", url, headers)
            if resp.status != 200:
                raise status_error(resp.status, url, _registry_error(resp))
            data: dict[str, Any] = json.loads(resp.read_all(1 << 20))
            return data

        token = self.retry.run(fetch, "registry token", self.stop)
        value = token.get("token") or token.get("access_token")
        if not value:
            raise ImporterError(
                Reason.UNAUTHORIZED, f"the token service of {self.ref.registry} returned no token"
            )
        self.auth = {"Authorization": f"Bearer {value}"}
        return self.auth

    def renew(self) -> dict[str, str]:
        self.auth = {}
        return self.authenticate(self._challenge) if self._challenge else {}

    def json_blob(
        self, path: str, digest: str | None, accept: str | None = None, limit: int = 8 << 20
    ) -> tuple[bytes, str]:
        resp = self.get(path, accept)
        body = resp.read(limit + 1)
        resp.close()
        if len(body) > limit:
            raise ImporterError(Reason.INVALID_IMAGE, f"{path} is larger than {limit} bytes")
        if digest is not None:
            verify_digest(body, digest, path)
        return body, resp.header("Content-Type") or ""


def _registry_error(resp: Response) -> str:
    try:
        data = json.loads(resp.read_all(16 * 1024) or b"{}")
        errors = data.get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
    except (ValueError, ImporterError, AttributeError):
        return ""


def verify_digest(body: bytes, digest: str, what: str) -> None:
    algorithm, _, expected = digest.partition(":")
    if algorithm not in ("sha256", "sha512"):
        raise ImporterError(Reason.UNSUPPORTED_FORMAT, f"digest algorithm {algorithm!r} of {what}")
    if hashlib.new(algorithm, body).hexdigest() != expected:
        raise ImporterError(Reason.CHECKSUM_MISMATCH, f"{what} does not match its digest {digest}")


class _LayerStream:
    """A layer blob, hashed as it arrives, decompressed, as a tar stream; verified at the end."""

    def __init__(self, client: RegistryClient, layer: dict[str, Any], origin: RegistryOrigin) -> None:
        self.digest = str(layer["digest"])
        self.size = int(layer.get("size") or 0)
        algorithm = self.digest.partition(":")[0]
        if algorithm not in ("sha256", "sha512"):
            raise ImporterError(Reason.UNSUPPORTED_FORMAT, f"layer digest algorithm {algorithm!r}")
        self.hash = hashlib.new(algorithm)
        self.count = 0
        blob = HttpOrigin(
            client.http,
            f"{client.base}/blobs/{self.digest}",
            client.retry,
            client.stop,
            name=f"layer {self.digest[:19]}",
            request_headers=dict(client.auth),
            refresh_auth=client.renew,
        )
        blob.meter = origin.meter
        self.blob = blob.open()
        self.wire: Stream = TapStream(self.blob.stream(), self._tap)
        kind = compression.detect(self.blob.head)
        self.tar: Stream = compression.open_stream(self.wire, kind) if kind else self.wire

    def _tap(self, chunk: Any) -> None:
        self.hash.update(chunk)
        self.count += len(chunk)

    def verify(self) -> None:
        while self.wire.read(4 << 20):
            pass
        if self.size and self.count != self.size:
            raise ImporterError(
                Reason.CHECKSUM_MISMATCH,
                f"layer {self.digest} has {self.count} bytes, the manifest says {self.size}",
            )
        if self.hash.hexdigest() != self.digest.partition(":")[2]:
            raise ImporterError(Reason.CHECKSUM_MISMATCH, f"layer {self.digest} does not match its digest")


class RegistryOrigin(Origin):
    """The disk file inside an image layer, as a stream."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self._stream: PeekStream | None = None
        self._layer: _LayerStream | None = None
        self._reader: TarReader | None = None
        self._wire_size = 0

    @property
    def wire_size(self) -> int | None:
        return self._wire_size or None

    def stream(self) -> Stream:
        assert self._stream is not None
        return self._stream

    def finish(self) -> None:
        assert self._reader is not None
        assert self._layer is not None
        self._reader.drain()
        self._layer.verify()


def open_registry(config: ImporterConfig, stop: threading.Event) -> Origin:
    ref = ImageRef.parse(config.endpoint)
    client = RegistryClient(ref, config, stop)
    name = f"{ref.registry}/{ref.repository}{'@' if ref.is_digest else ':'}{ref.reference}"
    origin = RegistryOrigin(name)
    manifest = resolve_manifest(client, ref, config.registry_arch)
    config_desc = manifest.get("config") or {}
    if not config_desc.get("digest"):
        raise ImporterError(Reason.INVALID_IMAGE, f"{name}: the manifest has no config")
    body, _ = client.json_blob(f"/blobs/{config_desc['digest']}", str(config_desc["digest"]))
    image_config = json.loads(body)
    inner = image_config.get("config") or {}
    labels = inner.get("Labels") or {}
    if labels.get("containers.bootc") == "1" or labels.get("ostree.bootable") == "1":
        raise ImporterError(
            Reason.UNSUPPORTED_FORMAT,
            f"{name} is a bootc/ostree bootable container image, not a containerDisk",
        )
    if (
        config.registry_arch
        and not manifest.get("_from_index")
        and image_config.get("architecture")
        and image_config["architecture"] != config.registry_arch
    ):
        raise ImporterError(
            Reason.NOT_FOUND,
            f"{name} is for architecture {image_config['architecture']}, "
            f"not the requested {config.registry_arch}",
        )
    origin.labels = env_labels(inner.get("Env") or [])
    layers = manifest.get("layers") or []
    for layer in layers:
        stream = _LayerStream(client, layer, origin)
        origin._wire_size += stream.size
        reader = TarReader(stream.tar, f"layer {stream.digest}")
        for member in reader:
            if member.is_file and is_disk_entry(member.name):
                log.info(
                    "found the disk image %s in layer %s (%d bytes)", member.name, stream.digest, member.size
                )
                origin._layer, origin._reader = stream, reader
                origin.size = member.size
                origin._stream = PeekStream(reader.contents())
                origin.head = origin._stream.peek(HEAD_SIZE)
                return origin
        reader.drain()
        stream.verify()
    raise ImporterError(
        Reason.DISK_NOT_FOUND_IN_IMAGE,
        f"{name} has no disk image: no regular file under disk/ in any of its {len(layers)} layers",
    )


def _digest_entries(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(e, dict) and isinstance(e.get("digest"), str) for e in value)


def checked_manifest(body: bytes, content_type: str, what: str) -> tuple[dict[str, Any], bool]:
    """`body` as an image manifest or index, and whether it is an index; anything else is refused with
    what is wrong. A registry (or a proxy before it) that answers a manifest request with an HTML page,
    an error document or another artifact's JSON must not count as a version of the image: a DataImportCron
    would take every such answer for a new digest and import it, and an import would fail later on a
    missing key instead of saying the manifest is not one."""
    try:
        manifest = json.loads(body)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        start = body[:40].decode(errors="replace")
        raise ImporterError(Reason.INVALID_IMAGE, f"{what} is not an image manifest: not a JSON object ({start!r}...)")
    media_type = str(manifest.get("mediaType") or content_type.split(";", maxsplit=1)[0].strip())
    if manifest.get("schemaVersion") == 1 or "docker.distribution.manifest.v1" in media_type:
        raise ImporterError(Reason.UNSUPPORTED_FORMAT, "docker schema 1 manifests are not supported")
    if media_type in _GENERIC_JSON and manifest.get("schemaVersion") == 2:
        media_type = ""  # a registry that labels every manifest plain JSON: its shape says which it is
    if media_type and media_type not in (*_INDEXES, *_MANIFESTS):
        raise ImporterError(Reason.INVALID_IMAGE, f"{what} is not an image manifest: media type {media_type!r}")
    index = media_type in _INDEXES or (not media_type and "manifests" in manifest)
    if index:
        if not _digest_entries(manifest.get("manifests")):
            raise ImporterError(Reason.INVALID_IMAGE, f"{what} is an index without a list of manifests")
    elif not (isinstance(manifest.get("config"), dict) and isinstance(manifest["config"].get("digest"), str)
              and _digest_entries(manifest.get("layers"))):
        raise ImporterError(Reason.INVALID_IMAGE, f"{what} is not an image manifest: it needs a config and layers")
    return manifest, index


def resolve_manifest(client: RegistryClient, ref: ImageRef, arch: str) -> dict[str, Any]:
    digest = ref.reference if ref.is_digest else None
    body, content_type = client.json_blob(f"/manifests/{ref.reference}", digest, _ACCEPT)
    manifest, index = checked_manifest(body, content_type, f"{ref.registry}/{ref.repository}:{ref.reference}")
    if index:
        wanted = arch or machine_architecture()
        choices = manifest.get("manifests") or []
        platforms = [(m.get("platform") or {}) for m in choices]
        matching = [m for m, p in zip(choices, platforms, strict=True) if p.get("architecture") == wanted]
        matching.sort(key=lambda m: (m.get("platform") or {}).get("os") != "linux")
        if not matching:
            available = ", ".join(sorted({f"{p.get('os')}/{p.get('architecture')}" for p in platforms}))
            raise ImporterError(
                Reason.NOT_FOUND,
                f"{ref.registry}/{ref.repository}:{ref.reference} has no image "
                f"for architecture {wanted} (available: {available})",
            )
        chosen = matching[0]
        body, content_type = client.json_blob(f"/manifests/{chosen['digest']}", str(chosen["digest"]), _ACCEPT)
        manifest, index = checked_manifest(body, content_type, f"{ref.registry}/{ref.repository}@{chosen['digest']}")
        if index:
            raise ImporterError(Reason.INVALID_IMAGE, f"{ref.registry}/{ref.repository}@{chosen['digest']} is an "
                                "index inside an index")
        manifest["_from_index"] = True
    return manifest
