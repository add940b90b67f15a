"""What a host-assisted clone's source pod (`cdi-cloner`, container `cdi-clone-source`) is asked, typed:
the one writer of its environment (`to_env`, for the clone reconciler's pod builder) and its one reader
(`from_environ`, which `cdi.cloner.source` runs), round-tripped by `tests/unit/api/test_workerrequests.py`.

The names are CDI's: UPLOAD_URL (the upload server that fills the target), CLIENT_CERT / CLIENT_KEY (its
client certificate, from a Secret), SERVER_CA_CERT (PEM text), OWNER_UID, VOLUME_MODE (`block` or
`filesystem`), MOUNT_POINT (the device, or the directory holding `disk.img`), POD_IP (from the downward
API); ours: UPLOAD_SERVER_NAME (the name the server's certificate carries, since UPLOAD_URL names the
Service's cluster IP, not a DNS name)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Final

from cdi.api import env
from cdi.api.envvalues import EnvError, env_value, pod_ip_from_status
from cdi.api.targetvolume import TargetVolume

Obj = dict[str, Any]

FILESYSTEM_SOURCE: Final = f"{env.CLONE_SOURCE_MOUNT_DEFAULT}/{env.DISK_IMAGE_NAME}"
CERT_KEY: Final = "tls.crt"  # the keys of the client certificate's Secret
KEY_KEY: Final = "tls.key"


def source_path(block: bool) -> str:
    """Where the clone source finds the image it reads: the device, or `disk.img` in its mount point."""
    return env.BLOCK_PATH_DEFAULT if block else FILESYSTEM_SOURCE


@dataclass(frozen=True)
class CloneSourceRequest:
    """`volume` is the source volume: its path (a Block device, or `disk.img` under the mount point) and
    the clone's owner uid; the rest of a volume's fields do not apply to a reader. The client certificate
    is a Secret's name on the controller's side (`client_secret`) and its PEM text in the pod
    (`client_cert`, `client_key`); `pod_ip` is known only in the pod."""

    upload_url: str
    server_ca: str
    server_name: str = ""
    client_secret: str = ""
    client_cert: str = ""
    client_key: str = ""
    volume: TargetVolume = field(default_factory=lambda: TargetVolume(path=FILESYSTEM_SOURCE))
    pod_ip: str = ""

    @property
    def mount_point(self) -> str:
        """Where the pod mounts the source: the device itself, or the directory holding `disk.img`."""
        path = PurePosixPath(self.volume.path)
        return str(path if self.volume.block else path.parent)

    def to_env(self) -> list[Obj]:
        """The clone-source container's `env`."""
        def from_secret(name: str, key: str) -> Obj:
            return {"name": name, "valueFrom": {"secretKeyRef": {"name": self.client_secret, "key": key}}}

        return [
            from_secret(env.CLIENT_KEY, KEY_KEY), from_secret(env.CLIENT_CERT, CERT_KEY),
            env_value(env.SERVER_CA_CERT, self.server_ca), env_value(env.UPLOAD_URL, self.upload_url),
            env_value(env.UPLOAD_SERVER_NAME, self.server_name), env_value(env.OWNER_UID, self.volume.owner_uid),
            env_value(env.VOLUME_MODE, env.VOLUME_MODE_BLOCK if self.volume.block else env.VOLUME_MODE_FILESYSTEM),
            env_value(env.MOUNT_POINT, self.mount_point),
            pod_ip_from_status(),
        ]

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CloneSourceRequest:
        """What `to_env` wrote, as the pod sees it (the Secret's contents in place of its name); raises
        `EnvError` when a variable the clone cannot go without is missing."""
        missing = [n for n in (env.UPLOAD_URL, env.CLIENT_CERT, env.CLIENT_KEY, env.SERVER_CA_CERT)
                   if not environ.get(n)]
        if missing:
            raise EnvError(f"missing {', '.join(missing)}")
        block = environ.get(env.VOLUME_MODE, env.VOLUME_MODE_FILESYSTEM).lower() == env.VOLUME_MODE_BLOCK
        mount = environ.get(env.MOUNT_POINT) or (env.BLOCK_PATH_DEFAULT if block else env.CLONE_SOURCE_MOUNT_DEFAULT)
        path = mount if block else f"{mount.rstrip('/')}/{env.DISK_IMAGE_NAME}"
        return cls(upload_url=environ[env.UPLOAD_URL], server_ca=environ[env.SERVER_CA_CERT],
                   server_name=environ.get(env.UPLOAD_SERVER_NAME, ""), client_cert=environ[env.CLIENT_CERT],
                   client_key=environ[env.CLIENT_KEY],
                   volume=TargetVolume(path=path, owner_uid=environ.get(env.OWNER_UID, "")),
                   pod_ip=environ.get(env.POD_IP, ""))
