"""The upload server's configuration: environment variables only, with CDI's names (the pod contract of
`cdi/controller/datavolume/uploads.py`), so a pod made by CDI's controller runs this program unchanged.

`DESTINATION` decides the target: a path named `disk.img` (`/data/disk.img`, the default) is the image
file of the Filesystem volume it is in; anything else (`/dev/cdi-block-volume`) is a Block volume
written in place, whether the node binds it as a device or, like the embedded node, as a file.
Scratch is `/scratch` when it is mounted (`IMPORTER_SCRATCH_DIR` overrides the path, as for the
importer, and `TERMINATION_LOG` the termination log, for running outside a pod). The resume record of a
raw upload (`kept.py`) is kept next to `disk.img`, or for a Block volume on scratch, else in
`UPLOAD_STATE_DIR` when that directory exists (none: the offset lives in memory only)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cdi.api import env as envnames
from cdi.api import tlsprofile
from cdi.api import upload as names
from cdi.api.quantity import QuantityError, parse_bytes
from cdi.api.sizing import overhead_fraction
from cdi.api.tlsprofile import TLSProfileSpec
from cdi.importer import BlockTarget, FileTarget, ImporterError, Reason, Target
from cdi.importer.config import parse_bool, positive_float

IDLE_TIMEOUT = "UPLOAD_IDLE_TIMEOUT"  # ours: seconds without body data before an upload counts as cut off
CHECKPOINT_BYTES = 64 << 20  # bytes of a raw upload written between two checkpoints of its resume record
CHECKPOINT_BYTES_ENV = "UPLOAD_CHECKPOINT_BYTES"  # ours: overrides it; 0 turns the checkpoints off (to measure them)


class ConfigError(ImporterError):
    def __init__(self, message: str) -> None:
        super().__init__(Reason.INVALID_CONFIGURATION, message)


@dataclass(frozen=True)
class UploadServerConfig:
    listen_host: str
    listen_port: int
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None
    client_name: str
    destination: Path
    image_size: int | None
    filesystem_overhead: str
    preallocation: bool
    content_type: str
    owner_uid: str
    scratch_dir: Path | None
    termination_log: Path
    idle_timeout: float = 120.0  # seconds a request body may stay silent before it counts as cut off
    state_dir: Path | None = None  # where the resume record is kept (`kept.py`); None: in memory only
    tls_profile: TLSProfileSpec = tlsprofile.DEFAULT  # TLS_CIPHERS, TLS_MIN_VERSION: CDIConfig's, at creation
    # bytes of a raw upload written between two checkpoints of the resume record (`session._Checkpoints`); 0: none
    # while the body arrives (what `bench/bench_upload.py --checkpoints` compares against)
    checkpoint_bytes: int = CHECKPOINT_BYTES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> UploadServerConfig:
        env = dict(os.environ if environ is None else environ)
        cert, key = env.get(names.ENV_TLS_CERT_FILE, ""), env.get(names.ENV_TLS_KEY_FILE, "")
        if not cert or not key:
            raise ConfigError(f"{names.ENV_TLS_CERT_FILE} and {names.ENV_TLS_KEY_FILE} are required: the upload "
                              "server only speaks HTTPS")
        size_text = env.get(envnames.UPLOAD_IMAGE_SIZE, "").strip()
        try:
            image_size = parse_bytes(size_text) if size_text else None
        except QuantityError as exc:
            raise ConfigError(f"{envnames.UPLOAD_IMAGE_SIZE}: {exc}") from None
        overhead = env.get(envnames.FILESYSTEM_OVERHEAD, "").strip() or "0"
        try:
            overhead_fraction(overhead)
        except ValueError as exc:
            raise ConfigError(f"{envnames.FILESYSTEM_OVERHEAD}={overhead!r}: {exc}") from None
        content_type = env.get(names.ENV_CONTENT_TYPE, "").strip() or envnames.CONTENT_KUBEVIRT
        if content_type not in (envnames.CONTENT_KUBEVIRT, envnames.CONTENT_ARCHIVE):
            raise ConfigError(f"unknown {names.ENV_CONTENT_TYPE} {content_type!r}: expected kubevirt or archive")
        destination = env.get(names.ENV_DESTINATION, "").strip() or \
            f"{envnames.DATA_DIR_DEFAULT}/{envnames.DISK_IMAGE_NAME}"
        scratch = Path(env.get(envnames.SCRATCH_DIR) or envnames.SCRATCH_DIR_DEFAULT)
        state_dir: Path | None = Path(destination).parent
        if Path(destination).name != envnames.DISK_IMAGE_NAME:  # a Block volume: scratch, else UPLOAD_STATE_DIR
            given = Path(env.get(names.ENV_STATE_DIR) or names.STATE_DIR_DEFAULT)
            state_dir = scratch if scratch.is_dir() else given if given.is_dir() else None
        client_ca = env.get(names.ENV_CLIENT_CERT_FILE, "")
        checkpoint_text = env.get(CHECKPOINT_BYTES_ENV, "").strip() or str(CHECKPOINT_BYTES)
        try:
            checkpoint_bytes = int(checkpoint_text)
        except ValueError:
            checkpoint_bytes = -1
        if checkpoint_bytes < 0:
            raise ConfigError(f"{CHECKPOINT_BYTES_ENV}={checkpoint_text!r} is not a number of bytes")
        port_text = env.get(names.ENV_LISTEN_PORT, "") or str(names.UPLOAD_PORT)
        try:
            port = int(port_text)
        except ValueError:
            raise ConfigError(f"{names.ENV_LISTEN_PORT}={port_text!r} is not a port number") from None
        return cls(
            listen_host=env.get(names.ENV_LISTEN_ADDRESS, "") or env.get(envnames.POD_IP, "") or "0.0.0.0",
            listen_port=port,
            cert_file=Path(cert), key_file=Path(key),
            client_ca_file=Path(client_ca) if client_ca else None,
            client_name=env.get(names.ENV_CLIENT_NAME, "") or names.CLIENT_NAME,
            destination=Path(destination),
            image_size=image_size,
            filesystem_overhead=overhead,
            preallocation=parse_bool(envnames.PREALLOCATION, env.get(envnames.PREALLOCATION), False, strict=False),
            content_type=content_type,
            owner_uid=env.get(envnames.OWNER_UID, ""),
            scratch_dir=scratch if scratch.is_dir() else None,
            termination_log=Path(env.get(envnames.TERMINATION_LOG) or envnames.TERMINATION_LOG_DEFAULT),
            idle_timeout=positive_float(env, IDLE_TIMEOUT, 120.0),
            state_dir=state_dir,
            tls_profile=TLSProfileSpec.from_environ(env),
            checkpoint_bytes=checkpoint_bytes,
        )

    @property
    def is_block(self) -> bool:
        return self.destination.name != envnames.DISK_IMAGE_NAME

    def target(self) -> Target:
        if self.is_block:
            return BlockTarget(self.destination)
        directory = self.destination.parent
        if not directory.is_dir():
            raise ConfigError(f"no target volume: {directory} does not exist")
        return FileTarget(directory)
