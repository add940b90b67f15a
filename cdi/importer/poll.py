"""Poll mode (IMPORTER_POLL=true): report the source's current version instead of importing it.

A DataImportCron needs to know whether its source changed. The controller must not reach user URLs
itself (the URL, its proxy, CA bundle and credentials are the import's, and only a pod with the import's
network identity should use them), so it runs this program in a short pod with the same environment as
the import and reads the answer from the termination message (`sourceDigest`):

* registry: the digest of the tag's manifest (or index), as the registry names it, so the import can
  pull exactly that (`repo@sha256:...`), as CDI does;
* http, s3, gcs: `sha256:` of the object's validators (ETag, Last-Modified; S3's ETag), read from the
  first range request the import itself would make; a source with neither is refused, since nothing
  could tell a new version from the old one.
"""

from __future__ import annotations

import hashlib
import json
import threading

from cdi.api import env as envnames

from .config import ImporterConfig
from .errors import ImporterError, Reason


def registry_digest(config: ImporterConfig, stop: threading.Event) -> str:
    from .source_registry import _ACCEPT, ImageRef, RegistryClient

    ref = ImageRef.parse(config.endpoint)
    if ref.is_digest:
        return ref.reference
    client = RegistryClient(ref, config, stop)
    body, _ = client.json_blob(f"/manifests/{ref.reference}", None, _ACCEPT)
    return "sha256:" + hashlib.sha256(body).hexdigest()


def object_digest(config: ImporterConfig, stop: threading.Event) -> str:
    from .main import open_origin

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
    return object_digest(config, stop)
