"""Poll mode (IMPORTER_POLL=true): report the source's current version instead of importing it.

A DataImportCron needs to know whether its source changed. The controller must not reach user URLs
itself (the URL, its proxy, CA bundle and credentials are the import's, and only a pod with the import's
network identity should use them), so it runs this program in a short pod with the same environment as
the import and reads the answer from the termination message (`sourceDigest`):

* registry: the digest of the tag's manifest (or index), as the registry names it, so the import can
  pull exactly that (`repo@sha256:...`), as CDI does;
* http: a checksum file published next to the image (`<image>.sha256`, or `SHA256SUMS` in its
  directory, GNU or BSD style) names the version by its content: the digest is the image's sha256;
* http without one, s3, gcs: `sha256:` of the object's validators (ETag, Last-Modified; S3's ETag), read
  from the first range request the import itself would make; a source with neither is refused, since
  nothing could tell a new version from the old one.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading

from cdi.api import env as envnames

from .config import ImporterConfig
from .errors import ImporterError, Reason
from .origins import http_client, open_origin


def registry_digest(config: ImporterConfig, stop: threading.Event) -> str:
    """The digest of the tag's manifest, once the answer is one: a body that is not an image manifest or
    index (garbage, an HTML page, another artifact) is refused, so it never becomes a new version."""
    from .source_registry import _ACCEPT, ImageRef, RegistryClient, checked_manifest

    ref = ImageRef.parse(config.endpoint)
    if ref.is_digest:
        return ref.reference
    client = RegistryClient(ref, config, stop)
    body, content_type = client.json_blob(f"/manifests/{ref.reference}", None, _ACCEPT)
    checked_manifest(body, content_type, f"{ref.registry}/{ref.repository}:{ref.reference}")
    return "sha256:" + hashlib.sha256(body).hexdigest()


_GNU = re.compile(r"^([0-9a-fA-F]{64})(?:\s+\*?(?:\./)?(\S.*))?$")
_BSD = re.compile(r"^SHA256\s*\((?:\./)?(.+)\)\s*=\s*([0-9a-fA-F]{64})$")


def sha256_in(text: str, name: str) -> str | None:
    """The sha256 a checksum file gives for `name` (a lone digest counts for the file it sits beside)."""
    for line in text.splitlines():
        line = line.strip()
        gnu, bsd = _GNU.match(line), _BSD.match(line)
        if gnu and (gnu.group(2) is None or gnu.group(2).strip() == name):
            return gnu.group(1).lower()
        if bsd and bsd.group(1).strip() == name:
            return bsd.group(2).lower()
    return None


def checksum_file_digest(config: ImporterConfig) -> str | None:
    """`sha256:<hex>` from a checksum file next to an HTTP image, or None when there is none."""
    client = http_client(config, config.endpoint)
    directory, _, name = config.endpoint.split("?", 1)[0].rpartition("/")
    try:
        for url in (f"{directory}/{name}.sha256", f"{directory}/SHA256SUMS"):
            try:
                resp = client.request("GET", url)
            except ImporterError:
                return None
            try:
                if resp.status != 200:
                    continue
                found = sha256_in(resp.read_all(1 << 20).decode(errors="replace"), name)
            finally:
                resp.close()
            if found:
                return f"sha256:{found}"
        return None
    finally:
        client.close()


def object_digest(config: ImporterConfig, stop: threading.Event) -> str:
    origin = open_origin(config, stop)
    try:
        validators = {k.lower(): v for k, v in (getattr(origin, "validators", None) or {}).items()}
        identity = {**(origin.identity or {}), **validators}
        if not validators:
            raise ImporterError(
                Reason.INVALID_CONFIGURATION,
                f"{config.endpoint} sends neither ETag nor Last-Modified: a new version could not be told "
                "from the old one",
            )
        text = json.dumps(identity, sort_keys=True, default=str)
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    finally:
        origin.close()


def current_digest(config: ImporterConfig, stop: threading.Event) -> str:
    if config.source == envnames.SOURCE_REGISTRY:
        return registry_digest(config, stop)
    if config.source == envnames.SOURCE_HTTP:
        published = checksum_file_digest(config)
        if published:
            return published
    return object_digest(config, stop)
