"""The `Origin` an importer configuration names (http, s3, gcs or registry), and the HTTP client it reads
with.

Both the import (`main`) and poll mode (`poll`) open the configured source the same way; this module
is what they share, so neither imports the other.
"""

from __future__ import annotations

import threading

from cdi.api import env as envnames

from .config import ImporterConfig
from .errors import ImporterError, Reason
from .http_client import HttpClient, HttpSettings, ca_files, origin_of, parse_header_lines
from .source import NbdSpec, Origin
from .source_http import HttpOrigin


def http_client(config: ImporterConfig, auth_url: str | None) -> HttpClient:
    """The client for the configured endpoint: its CA bundle, TLS and headers, and the access key pair
    as basic auth, sent only to `auth_url`'s origin when one is given (a redirect elsewhere never sees it)."""
    auth = (config.access_key, config.secret_key) if config.access_key and config.secret_key else None
    settings = HttpSettings(
        cert_dir=config.cert_dir,
        insecure=config.insecure_tls,
        timeout=config.read_timeout,
        extra_headers=parse_header_lines(config.extra_headers),
        basic_auth=auth,
        auth_origin=origin_of(auth_url) if auth_url else None,
        proxies=config.proxies,
        proxy_cert_dir=config.proxy_cert_dir,
    )
    return HttpClient(settings)


def open_origin(config: ImporterConfig, stop: threading.Event) -> Origin:
    """The configured source, opened (its first bytes read); s3, gcs and registry modules are imported
    only when named, since each import is a new process and a plain http import should not pay for them."""
    if config.source == envnames.SOURCE_HTTP:
        endpoint = config.endpoint
        if origin_of(endpoint)[0] not in ("http", "https"):
            raise ImporterError(
                Reason.INVALID_CONFIGURATION,
                f"{envnames.ENDPOINT} must be an http or https URL, not {endpoint!r}",
            )
        nbd = NbdSpec(
            url=endpoint,
            headers=parse_header_lines(config.extra_headers),
            user=config.access_key or None,
            password=config.secret_key or None,
            cainfo=[str(p) for p in ca_files(config.cert_dir)],
            insecure=config.insecure_tls,
        )
        return HttpOrigin(http_client(config, endpoint), endpoint, config.retry, stop, nbd=nbd).open()
    if config.source == envnames.SOURCE_S3:
        from .source_s3 import open_s3

        return open_s3(config, stop)
    if config.source == envnames.SOURCE_GCS:
        from .source_gcs import open_gcs

        return open_gcs(config, stop)
    if config.source == envnames.SOURCE_REGISTRY:
        from .source_registry import open_registry

        return open_registry(config, stop)
    raise ImporterError(Reason.INVALID_CONFIGURATION, f"unknown source {config.source!r}")
