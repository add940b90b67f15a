"""The importer's configuration, read from the environment only (the worker-pod contract, DESIGN §3.1)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cdi.api import env as envnames
from cdi.api.quantity import QuantityError, parse_bytes
from cdi.api.sizing import overhead_fraction

from .checksum import Checksum
from .errors import ImporterError, Reason
from .retry import DEFAULT_BUDGET, RetryPolicy
from .target import Paths

SECRET_EXTRA_HEADERS_DIR = Path("/extraheaders")
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _bad(message: str) -> ImporterError:
    return ImporterError(Reason.INVALID_CONFIGURATION, message)


def parse_bool(name: str, value: str | None, default: bool, strict: bool) -> bool:
    """Go's strconv.ParseBool, as CDI reads these variables."""
    if value is None or value == "":
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    if strict:
        raise _bad(f'{name}={value!r} is not a boolean; should be "true" or "false"')
    return default


def positive_float(environ: Mapping[str, str], name: str, default: float) -> float:
    value = environ.get(name, "")
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        raise _bad(f"{name}={value!r} is not a number") from None
    if number <= 0:
        raise _bad(f"{name}={value!r} must be positive")
    return number


@dataclass
class ImporterConfig:
    source: str
    endpoint: str
    content_type: str
    image_size: int | None
    access_key: str
    secret_key: str
    cert_dir: Path | None
    insecure_tls: bool
    extra_headers: list[str]
    checksum: Checksum | None
    registry_arch: str
    filesystem_overhead: str
    preallocation: bool
    owner_uid: str
    pod_ip: str
    paths: Paths
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    read_timeout: float = 60.0  # see default_read_timeout
    poll: bool = False  # IMPORTER_POLL: report the source's current version, import nothing (poll.py)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ImporterConfig:
        env = dict(os.environ if environ is None else environ)
        paths = Paths.from_env(env)
        source = env.get(envnames.SOURCE, "").strip().lower()
        if source == envnames.SOURCE_NONE:
            source = envnames.SOURCE_BLANK
        if source not in (
            envnames.SOURCE_HTTP,
            envnames.SOURCE_S3,
            envnames.SOURCE_GCS,
            envnames.SOURCE_REGISTRY,
            envnames.SOURCE_BLANK,
        ):
            raise _bad(f"unknown {envnames.SOURCE} {source!r}: expected http, s3, gcs, registry or blank")
        endpoint = env.get(envnames.ENDPOINT, "").strip()
        if source != envnames.SOURCE_BLANK and not endpoint:
            raise _bad(f"{envnames.ENDPOINT} is missing")
        content_type = env.get(envnames.CONTENT_TYPE, "").strip() or envnames.CONTENT_KUBEVIRT
        if content_type not in (envnames.CONTENT_KUBEVIRT, envnames.CONTENT_ARCHIVE):
            raise _bad(f"unknown {envnames.CONTENT_TYPE} {content_type!r}: expected kubevirt or archive")
        if content_type == envnames.CONTENT_ARCHIVE and source in (
            envnames.SOURCE_REGISTRY,
            envnames.SOURCE_BLANK,
        ):
            raise _bad(f"content type archive is not supported for source {source}")
        size_text = env.get(envnames.IMAGE_SIZE, "").strip()
        try:
            image_size = parse_bytes(size_text) if size_text else None
        except QuantityError as exc:
            raise _bad(f"{envnames.IMAGE_SIZE}: {exc}") from None
        overhead = env.get(envnames.FILESYSTEM_OVERHEAD, "").strip() or "0"
        try:
            overhead_fraction(overhead)
        except ValueError as exc:
            raise _bad(f"{envnames.FILESYSTEM_OVERHEAD}={overhead!r}: {exc}") from None
        cert_dir_text = env.get(envnames.CERT_DIR, "").strip()
        budget = positive_float(env, envnames.RETRY_BUDGET, DEFAULT_BUDGET)
        return cls(
            source=source,
            endpoint=endpoint,
            content_type=content_type,
            image_size=image_size,
            access_key=env.get(envnames.ACCESS_KEY_ID, "").strip(),
            secret_key=env.get(envnames.SECRET_KEY, "").strip(),
            cert_dir=Path(cert_dir_text) if cert_dir_text else None,
            insecure_tls=parse_bool(
                envnames.INSECURE_TLS, env.get(envnames.INSECURE_TLS), False, strict=False
            ),
            extra_headers=extra_headers(env),
            checksum=Checksum.parse(env.get(envnames.CHECKSUM, "")),
            registry_arch=env.get(envnames.REGISTRY_ARCHITECTURE, "").strip(),
            filesystem_overhead=overhead,
            preallocation=parse_bool(
                envnames.PREALLOCATION, env.get(envnames.PREALLOCATION), False, strict=True
            ),
            owner_uid=env.get(envnames.OWNER_UID, ""),
            pod_ip=env.get(envnames.POD_IP, "").strip(),
            paths=paths,
            retry=RetryPolicy(budget=budget),
            read_timeout=positive_float(env, envnames.READ_TIMEOUT, default_read_timeout(budget)),
            poll=parse_bool(envnames.POLL, env.get(envnames.POLL), False, strict=True),
        )


def default_read_timeout(budget: float) -> float:
    """A minute without a byte is a stalled read, but never more than a third of the retry budget:
    against a server that accepts and never answers, each attempt costs a whole timeout, and the
    import should still fail close to the budget, after a few attempts, not after the first."""
    return min(60.0, max(1.0, budget / 3))


def extra_headers(env: Mapping[str, str]) -> list[str]:
    """IMPORTER_EXTRA_HEADER_<n> in numeric order, then the files of mounted header secrets."""
    numbered = []
    for name, value in env.items():
        match = re.fullmatch(re.escape(envnames.EXTRA_HEADER_PREFIX) + r"(\d+)", name)
        if match:
            numbered.append((int(match.group(1)), value))
    headers = [value for _, value in sorted(numbered)]
    root = Path(env.get("IMPORTER_SECRET_EXTRA_HEADERS_DIR", str(SECRET_EXTRA_HEADERS_DIR)))
    if root.is_dir():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for filename in sorted(filenames):
                if not filename.startswith("."):
                    headers.append((Path(dirpath) / filename).read_text().strip())
    return headers
