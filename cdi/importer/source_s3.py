"""S3 sources: boto3 checks the object and signs a URL; the HTTP range machinery moves the bytes.

boto3 does what it is good at (credentials, SigV4, endpoint and region rules, clear error codes
from HeadObject); the object itself is then read through a presigned GET URL by the same client
as HTTP sources, so S3 imports get parallel ranges, streaming qcow2, nbdkit for the other formats,
and resume (identity: endpoint, bucket/key, size, ETag, Last-Modified) with no second code path.

Endpoints: `s3://bucket/key` (AWS, or AWS_ENDPOINT_URL), path-style `https://endpoint/bucket/key`
(CDI's form, any S3-compatible store), and virtual-hosted `https://bucket.s3.<region>.amazonaws.com/key`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .config import ImporterConfig
from .errors import ImporterError, Reason
from .http_client import (
    HttpClient,
    HttpSettings,
    ca_bundle,
    ca_files,
    parse_header_lines,
)
from .qemu import SYSTEM_CA_BUNDLE
from .retry import transient
from .source import NbdSpec, Origin
from .source_http import HttpOrigin

PRESIGN_SECONDS = 24 * 3600
_AWS_HOST = re.compile(r"^(?:(?P<bucket>.+)\.)?s3[.-](?:(?P<region>[a-z0-9-]+)\.)?amazonaws\.com(?:\.cn)?$")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str
    endpoint_url: str | None  # None: boto3's default (AWS, or AWS_ENDPOINT_URL)
    region: str | None

    @property
    def name(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse_endpoint(endpoint: str) -> S3Location:
    parts = urlsplit(endpoint)
    scheme = parts.scheme.lower()
    path = unquote(parts.path).lstrip("/")
    if scheme == "s3":
        bucket, key = parts.netloc, path
        location = S3Location(bucket, key, None, None)
    elif scheme in ("http", "https"):
        host = (parts.hostname or "").lower()
        match = _AWS_HOST.match(host)
        region = match.group("region") if match else None
        if match and match.group("bucket"):
            bucket, key = match.group("bucket"), path
            endpoint_url = f"{scheme}://{host.split('.', 1)[1]}"
        else:
            bucket, _, key = path.partition("/")
            endpoint_url = f"{scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
        location = S3Location(bucket, key, endpoint_url, region)
    else:
        raise ImporterError(
            Reason.INVALID_CONFIGURATION,
            f"S3 endpoint {endpoint!r} must be s3://bucket/key or http(s)://endpoint/bucket/key",
        )
    if not location.bucket or not location.key:
        raise ImporterError(Reason.INVALID_CONFIGURATION, f"S3 endpoint {endpoint!r} names no bucket and key")
    return location


def _classify(exc: BaseException, location: S3Location) -> ImporterError:
    from botocore import exceptions as bexc

    name = location.name
    if isinstance(exc, bexc.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        detail = f"{code} {error.get('Message', '')}".strip()
        if status == 404 or code in ("404", "NoSuchKey", "NoSuchBucket", "NotFound"):
            return ImporterError(Reason.NOT_FOUND, f"{name} does not exist ({detail})")
        if status in (401, 403) or code in (
            "403",
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
        ):
            return ImporterError(
                Reason.UNAUTHORIZED,
                f"{name}: access refused ({detail}); check the accessKeyId and secretKey of the secret",
            )
        if (
            status >= 500
            or status in (408, 429)
            or code in ("SlowDown", "InternalError", "ServiceUnavailable")
        ):
            return transient(Reason.SERVER_ERROR, f"{name}: {detail or status}")
        return ImporterError(Reason.REQUEST_REJECTED, f"{name}: {detail or status}")
    if isinstance(exc, bexc.SSLError):
        return ImporterError(Reason.TLS_ERROR, f"TLS handshake with the S3 endpoint failed: {exc}")
    if isinstance(exc, bexc.NoCredentialsError | bexc.PartialCredentialsError):
        return ImporterError(Reason.UNAUTHORIZED, f"{name}: {exc}")
    if isinstance(exc, bexc.EndpointConnectionError | bexc.ConnectionError | bexc.HTTPClientError):
        return transient(Reason.CONNECTION_FAILED, f"cannot reach the S3 endpoint for {name}: {exc}")
    return ImporterError(Reason.INTERNAL_ERROR, f"{name}: {type(exc).__name__}: {exc}")


class S3Origin(HttpOrigin):
    """An HttpOrigin over a presigned URL, named and identified by its S3 location."""

    bundle_dir: Path | None = None

    def close(self) -> None:
        super().close()
        if self.bundle_dir is not None:
            shutil.rmtree(self.bundle_dir, ignore_errors=True)


def open_s3(config: ImporterConfig, stop: threading.Event) -> Origin:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    location = parse_endpoint(config.endpoint)
    custom_cas = ca_files(config.cert_dir) + ca_files(config.proxy_cert_dir)
    bundle_dir: Path | None = None
    verify: bool | str | None = None
    if config.insecure_tls:
        verify = False
    elif custom_cas:
        bundle_dir = ca_bundle(custom_cas, SYSTEM_CA_BUNDLE)
        verify = str(bundle_dir / "ca.pem")
    anonymous = not (config.access_key and config.secret_key)
    region = (
        location.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    )
    client: Any = boto3.session.Session().client(
        "s3",
        endpoint_url=location.endpoint_url,
        aws_access_key_id=None if anonymous else config.access_key,
        aws_secret_access_key=None if anonymous else config.secret_key,
        region_name=region,
        verify=verify,
        config=Config(
            signature_version=UNSIGNED if anonymous else "s3v4",
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
            connect_timeout=config.read_timeout,
            read_timeout=config.read_timeout,
        ),
    )

    def head() -> dict[str, Any]:
        try:
            result: dict[str, Any] = client.head_object(Bucket=location.bucket, Key=location.key)
            return result
        except (ClientError, BotoCoreError) as exc:
            raise _classify(exc, location) from exc

    try:
        meta = config.retry.run(head, f"HEAD {location.name}", stop)
        url: str = client.generate_presigned_url(
            "get_object", Params={"Bucket": location.bucket, "Key": location.key}, ExpiresIn=PRESIGN_SECONDS
        )
        settings = HttpSettings(
            cert_dir=config.cert_dir,
            insecure=config.insecure_tls,
            timeout=config.read_timeout,
            extra_headers=parse_header_lines(config.extra_headers),
            proxies=config.proxies,
            proxy_cert_dir=config.proxy_cert_dir,
        )
        identity = {
            "s3": f"{location.bucket}/{location.key}",
            "endpoint": location.endpoint_url or "aws",
            "etag": meta.get("ETag"),
            "lastModified": str(meta.get("LastModified")),
        }
        nbd = NbdSpec(url=url, cainfo=[str(p) for p in custom_cas], insecure=config.insecure_tls)
        origin = S3Origin(
            HttpClient(settings), url, config.retry, stop, name=location.name, identity=identity, nbd=nbd
        )
        origin.bundle_dir = bundle_dir
        return origin.open()
    except BaseException:
        if bundle_dir is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(bundle_dir)
        raise
