"""The volume a worker pod works on, as its program sees it: where the image is (the file `disk.img`
of a Filesystem volume, or a Block device), how large the claim is, the filesystem overhead to leave
free, whether to preallocate, and whose progress it is (the owner's uid, the label of the progress
metric). The importer and the upload server fill one and take all of it; the clone source reads one and
takes its path and owner only.

The environment holds these under CDI's names, and `to_env` / `from_environ` are their one writer and
one reader: IMPORTER_IMAGE_SIZE (the importer) or UPLOAD_IMAGE_SIZE (the upload server),
FILESYSTEM_OVERHEAD, PREALLOCATION (read strictly: a value that is not a boolean is the pod's
misconfiguration, never a silent "no") and OWNER_UID. The path is each program's own contract: the
importer finds its volume by which of `/data` and `/dev/cdi-block-volume` exists, the upload server is
told DESTINATION, the clone source VOLUME_MODE and MOUNT_POINT; their requests write it.

`spec.preallocation`'s default rule lives here too (`preallocation_wanted`), for the DataVolume, the
volume populators' sources and the claims alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from cdi.api import annotations as ann
from cdi.api import env
from cdi.api.envvalues import bool_of, env_value, format_bool, overhead, parse_bool, quantity
from cdi.api.quantity import parse_bytes

Obj = dict[str, Any]

FILESYSTEM_IMAGE = f"{env.DATA_DIR_DEFAULT}/{env.DISK_IMAGE_NAME}"


def default_path(block: bool) -> str:
    """Where a pod finds its volume's image: `/dev/cdi-block-volume`, or `/data/disk.img`."""
    return env.BLOCK_PATH_DEFAULT if block else FILESYSTEM_IMAGE


@dataclass(frozen=True)
class TargetVolume:
    """`path` is the image: a file named `disk.img` on a Filesystem volume, anything else a Block device.
    `size` is the claim's requested storage as the claim writes it ("" when unknown)."""

    path: str = FILESYSTEM_IMAGE
    size: str = ""
    filesystem_overhead: str = "0"
    preallocation: bool = False
    owner_uid: str = ""

    @property
    def block(self) -> bool:
        return PurePosixPath(self.path).name != env.DISK_IMAGE_NAME

    @property
    def size_bytes(self) -> int | None:
        return parse_bytes(self.size) if self.size else None

    def to_env(self, *, size_var: str) -> list[Obj]:
        """The pod's variables for this volume, `size_var` naming the size (each program has its own)."""
        return [env_value(size_var, self.size), env_value(env.FILESYSTEM_OVERHEAD, self.filesystem_overhead),
                env_value(env.PREALLOCATION, format_bool(self.preallocation)),
                env_value(env.OWNER_UID, self.owner_uid)]

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, size_var: str, path: str) -> TargetVolume:
        """What `to_env` wrote, checked (raises `EnvError`); `path` as the program found it."""
        return cls(path=path, size=quantity(environ, size_var),
                   filesystem_overhead=overhead(environ, env.FILESYSTEM_OVERHEAD),
                   preallocation=parse_bool(environ, env.PREALLOCATION),
                   owner_uid=environ.get(env.OWNER_UID, ""))


def requested_preallocation(annotations: Mapping[str, str]) -> bool | None:
    """What a claim's `storage.preallocation.requested` asks (None: it does not say). As CDI reads it
    (strconv.ParseBool), a value that is no boolean asks for none."""
    value = annotations.get(ann.PREALLOCATION_REQUESTED)
    if value is None:
        return None
    return bool(bool_of(value))


def preallocation_wanted(requested: object, config_status: Mapping[str, Any]) -> bool:
    """CDI's GetPreallocation: what the DataVolume, volume source or claim asks (`spec.preallocation`,
    `requested_preallocation`) when it says, else CDIConfig's `status.preallocation` (false without one)."""
    if requested is not None:
        return bool(requested)
    return bool(config_status.get("preallocation"))
