"""What an upload-server pod is asked, typed: the one writer of its environment (`to_env`, for the
upload reconciler's pod builder) and its one reader (`from_environ`, which the upload server runs), so
that `tests/unit/api/test_workerrequests.py` round-trips what the server really parses.

The names are CDI's (`pkg/controller/upload-controller.go`): TLS_CERT_FILE / TLS_KEY_FILE (its
certificate), CLIENT_CERT_FILE (the CA of the client certificates it accepts), CLIENT_NAME (the name such a
certificate must carry: the upload proxy's, or a host-assisted clone's source), DESTINATION
(`/data/disk.img` or the block device), CONTENT_TYPE, POD_IP (from the downward API), TLS_CIPHERS /
TLS_MIN_VERSION (CDIConfig's TLS profile when the pod was made), and the target volume's
(`targetvolume`: UPLOAD_IMAGE_SIZE, FILESYSTEM_OVERHEAD, PREALLOCATION, OWNER_UID). Ours: UPLOAD_STATE_DIR
(where a Block volume's server keeps its resume record when no scratch is mounted), and, never set by
the controller, LISTEN_ADDRESS / LISTEN_PORT (CDI's upload server has them as flags),
UPLOAD_IDLE_TIMEOUT and UPLOAD_CHECKPOINT_BYTES (for tests and benchmarks), and UPLOAD_CHECKSUM (the
`algorithm:hex` of the claim's `extensions.cdi.dev/upload.checksum`: the bytes received must hash to it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdi.api import env, tlsprofile, upload
from cdi.api.checksum import ChecksumSyntaxError, parse_checksum
from cdi.api.envvalues import EnvError, byte_count, env_value, pod_ip_from_status, port, positive_float
from cdi.api.targetvolume import FILESYSTEM_IMAGE, TargetVolume
from cdi.api.tlsprofile import TLSProfileSpec

Obj = dict[str, Any]



@dataclass(frozen=True)
class UploadServerRequest:
    """`volume.path` is DESTINATION. `pod_ip` is the pod's address, known only in the pod (the pod spec
    asks the downward API for it). `state_dir` "" and the tuning left None are not set: the server's
    defaults apply (`cdi.uploadserver.config`)."""

    volume: TargetVolume = field(default_factory=TargetVolume)
    content_type: str = env.CONTENT_KUBEVIRT
    client_name: str = upload.CLIENT_NAME
    cert_file: str = f"{env.TLS_DIR_DEFAULT}/tls.crt"
    key_file: str = f"{env.TLS_DIR_DEFAULT}/tls.key"
    client_ca_file: str = f"{env.TLS_DIR_DEFAULT}/ca.crt"  # "": no client certificate is asked for
    tls_profile: TLSProfileSpec = tlsprofile.DEFAULT
    state_dir: str = ""
    pod_ip: str = ""
    listen_address: str = ""
    listen_port: int = upload.UPLOAD_PORT
    idle_timeout: float | None = None  # seconds a request body may stay silent before the upload counts as cut off
    checkpoint_bytes: int | None = None  # of a raw upload between two checkpoints of its resume record; 0: none
    checksum: str = ""  # `algorithm:hex` the received bytes must hash to; "": none expected

    def to_env(self) -> list[Obj]:
        """The upload-server container's `env`. What the controller never sets stays out when it is the
        default, so a pod is what CDI's controller would make."""
        out: list[Obj] = [
            env_value(env.TLS_KEY_FILE, self.key_file), env_value(env.TLS_CERT_FILE, self.cert_file),
            env_value(env.CLIENT_CERT_FILE, self.client_ca_file), env_value(env.CLIENT_NAME, self.client_name),
            *self.volume.to_env(size_var=env.UPLOAD_IMAGE_SIZE),
            env_value(env.DESTINATION, self.volume.path), env_value(env.UPLOAD_CONTENT_TYPE, self.content_type),
            pod_ip_from_status(), *self.tls_profile.to_env(),
        ]
        tuning = ((env.UPLOAD_STATE_DIR, self.state_dir or None), (env.LISTEN_ADDRESS, self.listen_address or None),
                  (env.LISTEN_PORT, None if self.listen_port == upload.UPLOAD_PORT else self.listen_port),
                  (env.UPLOAD_IDLE_TIMEOUT, self.idle_timeout), (env.UPLOAD_CHECKPOINT_BYTES, self.checkpoint_bytes),
                  (env.UPLOAD_CHECKSUM, self.checksum or None))
        out.extend(env_value(name, f"{value:g}" if isinstance(value, float) else str(value))
                   for name, value in tuning if value is not None)
        return out

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> UploadServerRequest:
        """What `to_env` wrote, as the pod sees it; raises `EnvError` for what the server cannot run with."""
        cert, key = environ.get(env.TLS_CERT_FILE, ""), environ.get(env.TLS_KEY_FILE, "")
        if not cert or not key:
            raise EnvError(f"{env.TLS_CERT_FILE} and {env.TLS_KEY_FILE} are required: the upload server only "
                           "speaks HTTPS")
        volume = TargetVolume.from_environ(environ, size_var=env.UPLOAD_IMAGE_SIZE,
                                           path=environ.get(env.DESTINATION, "").strip() or FILESYSTEM_IMAGE)
        content_type = environ.get(env.UPLOAD_CONTENT_TYPE, "").strip() or env.CONTENT_KUBEVIRT
        if content_type not in (env.CONTENT_KUBEVIRT, env.CONTENT_ARCHIVE):
            raise EnvError(f"unknown {env.UPLOAD_CONTENT_TYPE} {content_type!r}: expected kubevirt or archive")
        checksum = environ.get(env.UPLOAD_CHECKSUM, "").strip()
        if checksum:
            try:
                algorithm, digest = parse_checksum(checksum)
            except ChecksumSyntaxError as exc:
                raise EnvError(f"{env.UPLOAD_CHECKSUM}: {exc}") from exc
            checksum = f"{algorithm}:{digest}"
        return cls(
            volume=volume, content_type=content_type,
            client_name=environ.get(env.CLIENT_NAME, "") or upload.CLIENT_NAME,
            cert_file=cert, key_file=key, client_ca_file=environ.get(env.CLIENT_CERT_FILE, ""),
            tls_profile=TLSProfileSpec.from_environ(environ),
            state_dir=environ.get(env.UPLOAD_STATE_DIR, ""),
            pod_ip=environ.get(env.POD_IP, ""),
            listen_address=environ.get(env.LISTEN_ADDRESS, ""),
            listen_port=port(environ, env.LISTEN_PORT, upload.UPLOAD_PORT),
            idle_timeout=positive_float(environ, env.UPLOAD_IDLE_TIMEOUT),
            checkpoint_bytes=byte_count(environ, env.UPLOAD_CHECKPOINT_BYTES),
            checksum=checksum,
        )
