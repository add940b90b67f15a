"""The importer's configuration, read from the environment only (the worker-pod contract, DESIGN §3.1):
the import request, the target volume and the importer's options (proxy, retry budget, poll) through
their typed readers in `cdi.api` (the ones the controller's pod builder is tested against), plus what
only the pod has (credentials, pod IP, paths)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cdi.api import env as envnames
from cdi.api.envvalues import EnvError
from cdi.api.importrequest import ImporterOptions, ImportRequest
from cdi.api.targetvolume import TargetVolume

from .checksum import Checksum, expected_checksum
from .errors import ImporterError, Reason
from .retry import DEFAULT_BUDGET, RetryPolicy
from .target import Paths


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
    proxies: dict[str, str] = field(default_factory=dict)  # by urllib's keys: http, https, no
    proxy_cert_dir: Path | None = None  # the proxy's CA bundle (trustedCAProxy), trusted when it is there

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ImporterConfig:
        env = dict(os.environ if environ is None else environ)
        try:
            return cls._from_environ(env)
        except EnvError as exc:
            raise ImporterError(Reason.INVALID_CONFIGURATION, str(exc)) from None

    @classmethod
    def _from_environ(cls, env: dict[str, str]) -> ImporterConfig:
        paths = Paths.from_env(env)
        request = ImportRequest.from_environ(env)
        # no path in the environment: the importer takes `disk.img` in the data directory, or the block path,
        # whichever exists (`target.detect_target`)
        volume = TargetVolume.from_environ(env, size_var=envnames.IMAGE_SIZE,
                                           path=str(paths.data_dir / envnames.DISK_IMAGE_NAME))
        options = ImporterOptions.from_environ(env)
        cert_dir_text = env.get(envnames.CERT_DIR, "").strip()
        budget = options.retry_budget or DEFAULT_BUDGET
        return cls(
            source=request.source,
            endpoint=request.endpoint,
            content_type=request.content_type,
            image_size=volume.size_bytes,
            access_key=env.get(envnames.ACCESS_KEY_ID, "").strip(),
            secret_key=env.get(envnames.SECRET_KEY, "").strip(),
            cert_dir=Path(cert_dir_text) if cert_dir_text else None,
            insecure_tls=request.insecure_skip_verify,
            extra_headers=[*request.extra_headers, *secret_extra_headers(env)],
            checksum=expected_checksum(request.checksum),
            registry_arch=request.registry_arch,
            filesystem_overhead=volume.filesystem_overhead,
            preallocation=volume.preallocation,
            owner_uid=volume.owner_uid,
            pod_ip=env.get(envnames.POD_IP, "").strip(),
            paths=paths,
            retry=RetryPolicy(budget=budget),
            read_timeout=options.read_timeout or default_read_timeout(budget),
            poll=options.poll,
            proxies=options.proxies,
            proxy_cert_dir=Path(options.proxy_cert_dir or envnames.PROXY_CERT_DIR_DEFAULT),
        )


def default_read_timeout(budget: float) -> float:
    """A minute without a byte is a stalled read, but never more than a third of the retry budget:
    against a server that accepts and never answers, each attempt costs a whole timeout, and the
    import should still fail close to the budget, after a few attempts, not after the first."""
    return min(60.0, max(1.0, budget / 3))


def secret_extra_headers(env: Mapping[str, str]) -> list[str]:
    """The header lines of the mounted header secrets (after IMPORTER_EXTRA_HEADER_<n>, which the request
    holds), one per file, in path order."""
    headers = []
    root = Path(env.get(envnames.SECRET_EXTRA_HEADERS_DIR) or envnames.SECRET_EXTRA_HEADERS_DIR_DEFAULT)
    if root.is_dir():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for filename in sorted(filenames):
                if not filename.startswith("."):
                    headers.append((Path(dirpath) / filename).read_text().strip())
    return headers
