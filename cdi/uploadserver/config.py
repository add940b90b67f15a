"""The upload server's configuration: environment variables only, with CDI's names, read by
`cdi.api.uploadrequest.UploadServerRequest.from_environ` (the reader the upload reconciler's pod builder
is tested against), so a pod made by CDI's controller runs this program unchanged.

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
from cdi.api.envvalues import EnvError
from cdi.api.tlsprofile import TLSProfileSpec
from cdi.api.uploadrequest import UploadServerRequest
from cdi.importer import BlockTarget, Checksum, FileTarget, ImporterError, Reason, Target
from cdi.importer.checksum import expected_checksum

IDLE_TIMEOUT = 120.0  # seconds without body data before an upload counts as cut off (UPLOAD_IDLE_TIMEOUT)
CHECKPOINT_BYTES = 64 << 20  # bytes of a raw upload written between two checkpoints of its resume record
# (UPLOAD_CHECKPOINT_BYTES; 0 turns the checkpoints off, to measure them)


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
    idle_timeout: float = IDLE_TIMEOUT  # seconds a request body may stay silent before it counts as cut off
    state_dir: Path | None = None  # where the resume record is kept (`kept.py`); None: in memory only
    tls_profile: TLSProfileSpec = tlsprofile.DEFAULT  # TLS_CIPHERS, TLS_MIN_VERSION: CDIConfig's, at creation
    # bytes of a raw upload written between two checkpoints of the resume record (`session._Checkpoints`); 0: none
    # while the body arrives (what `bench/bench_upload.py --checkpoints` compares against)
    checkpoint_bytes: int = CHECKPOINT_BYTES
    checksum: Checksum | None = None  # UPLOAD_CHECKSUM: what the received bytes must hash to

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> UploadServerConfig:
        env = dict(os.environ if environ is None else environ)
        try:
            request = UploadServerRequest.from_environ(env)
        except EnvError as exc:
            raise ConfigError(str(exc)) from None
        destination = Path(request.volume.path)
        scratch = Path(env.get(envnames.SCRATCH_DIR) or envnames.SCRATCH_DIR_DEFAULT)
        state_dir: Path | None = destination.parent
        if request.volume.block:  # a Block volume: scratch, else UPLOAD_STATE_DIR
            given = Path(request.state_dir or envnames.UPLOAD_STATE_DIR_DEFAULT)
            state_dir = scratch if scratch.is_dir() else given if given.is_dir() else None
        return cls(
            listen_host=request.listen_address or request.pod_ip or "0.0.0.0",
            listen_port=request.listen_port,
            cert_file=Path(request.cert_file), key_file=Path(request.key_file),
            client_ca_file=Path(request.client_ca_file) if request.client_ca_file else None,
            client_name=request.client_name,
            destination=destination,
            image_size=request.volume.size_bytes,
            filesystem_overhead=request.volume.filesystem_overhead,
            preallocation=request.volume.preallocation,
            content_type=request.content_type,
            owner_uid=request.volume.owner_uid,
            scratch_dir=scratch if scratch.is_dir() else None,
            termination_log=Path(env.get(envnames.TERMINATION_LOG) or envnames.TERMINATION_LOG_DEFAULT),
            idle_timeout=request.idle_timeout or IDLE_TIMEOUT,
            state_dir=state_dir,
            tls_profile=request.tls_profile,
            checkpoint_bytes=CHECKPOINT_BYTES if request.checkpoint_bytes is None else request.checkpoint_bytes,
            checksum=expected_checksum(request.checksum),
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
