"""A pod's volumes on the host, and each container's mounts of them.

Secret, ConfigMap, downwardAPI and projected volumes are written as files under the pod's
directory (the kubelet's `pods/<uid>/volumes/...`), emptyDir is a directory there (0777, as the
kubelet makes it), and PersistentVolumeClaims are resolved through their bound PersistentVolume to
the bytes the local storage publishes (a directory, or a file a container sees as a block device).

Ownership as the kubelet manages it: with a pod `fsGroup`, every volume but hostPath and Block is
given to that group, its directories setgid and group-writable, its files group-readable (and
group-writable unless the volume is read-only), on every mount, or only when the volume's root does
not match with `fsGroupChangePolicy: OnRootMismatch`. A Block volume's file belongs to the user and
group of the container using it, as containerd's `device_ownership_from_security_context` gives a
device (what CDI asks of a node for its non-root worker pods)."""

from __future__ import annotations

import base64
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from cdi.embedded.node.environment import ConfigError, field_value, resource_value
from cdi.embedded.node.sandbox import Mount

Obj = dict[str, Any]
Getter = Callable[[str, str], Obj | None]


class VolumeError(Exception):
    """A volume cannot be set up yet (reason FailedMount); the kubelet tries again."""


READ_WRITE_MASK = 0o660
READ_ONLY_MASK = 0o440
DIRECTORY_MASK = stat.S_ISGID | 0o110


def _needs_ownership(root: Path, fs_group: int, read_only: bool) -> bool:
    """OnRootMismatch: whether the volume's root is not yet the group's, setgid, with the group's access."""
    try:
        info = root.stat()
    except OSError:
        return True
    mask = (READ_ONLY_MASK if read_only else READ_WRITE_MASK) | DIRECTORY_MASK
    return info.st_gid != fs_group or stat.S_IMODE(info.st_mode) & mask != mask


def set_volume_ownership(root: Path, fs_group: int, read_only: bool = False, on_root_mismatch: bool = False) -> None:
    """The kubelet's SetVolumeOwnership: everything under `root` to group `fs_group`, directories setgid."""
    if on_root_mismatch and not _needs_ownership(root, fs_group, read_only):
        return
    mask = READ_ONLY_MASK if read_only else READ_WRITE_MASK

    def change(path: str) -> None:
        info = os.lstat(path)
        if info.st_gid != fs_group:
            os.lchown(path, -1, fs_group)
        if stat.S_ISLNK(info.st_mode):
            return
        wanted = mask | DIRECTORY_MASK if stat.S_ISDIR(info.st_mode) else mask
        mode = stat.S_IMODE(info.st_mode)
        if mode | wanted != mode:
            os.chmod(path, mode | wanted)

    change(str(root))
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            change(os.path.join(dirpath, name))


def own_device(path: Path, uid: int, gid: int) -> None:
    """A Block volume's file to the container's user and group, readable and writable by them."""
    info = path.stat()
    if (info.st_uid, info.st_gid) != (uid, gid):
        os.chown(path, uid, gid)
    if stat.S_IMODE(info.st_mode) & 0o660 != 0o660:
        os.chmod(path, stat.S_IMODE(info.st_mode) | 0o660)


@dataclass(frozen=True)
class HostVolume:
    path: Path
    block: bool = False
    read_only: bool = False


@dataclass(frozen=True)
class Published:
    path: Path
    block: bool


# (claim namespace, claim name) -> where its bytes are; raises VolumeError while not ready
ClaimResolver = Callable[[str, str], Published]


def _safe_relative(path: str) -> str:
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise VolumeError(f"invalid path {path!r} in volume item")
    return str(rel)


def _write_files(target: Path, files: dict[str, tuple[bytes, int]]) -> None:
    """Replace the volume's content with `files` (relative path -> (content, mode))."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for rel, (content, mode) in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.chmod(path, mode)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    os.chmod(target, 0o755)


def _keyed_files(obj: Obj, kind: str, source: Obj, default_mode: int) -> dict[str, tuple[bytes, int]]:
    data: dict[str, bytes] = {}
    for key, value in (obj.get("data") or {}).items():
        data[key] = base64.b64decode(value) if kind == "Secret" else str(value).encode()
    for key, value in (obj.get("binaryData") or {}).items():
        data[key] = base64.b64decode(value)
    items = source.get("items")
    files: dict[str, tuple[bytes, int]] = {}
    if items:
        for item in items:
            key = item.get("key", "")
            if key not in data:
                if source.get("optional"):
                    continue
                raise VolumeError(f"configmap references non-existent config key: {key}" if kind == "ConfigMap"
                                  else f"references non-existent secret key: {key}")
            files[_safe_relative(item.get("path") or key)] = (data[key], int(item.get("mode", default_mode)))
    else:
        for key, value in data.items():
            files[_safe_relative(key)] = (value, default_mode)
    return files


class PodVolumes:
    def __init__(self, pod: Obj, pod_dir: Path, secrets: Getter, configmaps: Getter, claims: ClaimResolver) -> None:
        self.pod = pod
        self.dir = pod_dir / "volumes"
        self.secrets = secrets
        self.configmaps = configmaps
        self.claims = claims
        self.volumes: dict[str, HostVolume] = {}

    def prepare(self) -> dict[str, HostVolume]:
        """Set up every volume of the pod; raises VolumeError (with the kubelet's message) if one
        cannot be set up yet."""
        namespace = self.pod["metadata"]["namespace"]
        context = (self.pod.get("spec") or {}).get("securityContext") or {}
        fs_group = context.get("fsGroup")
        out: dict[str, HostVolume] = {}
        for volume in (self.pod.get("spec") or {}).get("volumes") or []:
            name = volume.get("name", "")
            out[name] = host = self._prepare(namespace, name, volume)
            if fs_group is not None and not host.block and "hostPath" not in volume:
                try:
                    set_volume_ownership(host.path, int(fs_group), host.read_only,
                                         context.get("fsGroupChangePolicy") == "OnRootMismatch")
                except OSError as exc:
                    raise VolumeError(f"volume {name}: setting its ownership to fsGroup {fs_group}: {exc}") from exc
        self.volumes = out
        return out

    def _prepare(self, namespace: str, name: str, volume: Obj) -> HostVolume:
        if "persistentVolumeClaim" in volume:
            source = volume["persistentVolumeClaim"] or {}
            published = self.claims(namespace, source.get("claimName", ""))
            return HostVolume(published.path, published.block, bool(source.get("readOnly")))
        if "emptyDir" in volume:
            path = self.dir / "empty-dir" / name
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, 0o777)
            return HostVolume(path)
        if "hostPath" in volume:
            source = volume["hostPath"] or {}
            path = Path(source.get("path", "/"))
            kind = source.get("type", "")
            if kind == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            elif kind == "FileOrCreate" and not path.exists():
                path.touch()
            elif not path.exists() and kind:
                raise VolumeError(f"hostPath type check failed: {path} does not exist")
            return HostVolume(path)
        if "secret" in volume:
            source = volume["secret"] or {}
            files = self._object_files("Secret", namespace, source.get("secretName", ""), source)
            return self._files(name, "secret", files)
        if "configMap" in volume:
            source = volume["configMap"] or {}
            files = self._object_files("ConfigMap", namespace, source.get("name", ""), source)
            return self._files(name, "configmap", files)
        if "downwardAPI" in volume:
            source = volume["downwardAPI"] or {}
            return self._files(name, "downward-api", self._downward(source.get("items") or [],
                                                                     int(source.get("defaultMode", 0o644))))
        if "projected" in volume:
            source = volume["projected"] or {}
            mode = int(source.get("defaultMode", 0o644))
            combined: dict[str, tuple[bytes, int]] = {}
            for part in source.get("sources") or []:
                if "secret" in part:
                    ref = part["secret"] or {}
                    combined.update(self._object_files("Secret", namespace, ref.get("name", ""), ref, mode))
                elif "configMap" in part:
                    ref = part["configMap"] or {}
                    combined.update(self._object_files("ConfigMap", namespace, ref.get("name", ""), ref, mode))
                elif "downwardAPI" in part:
                    combined.update(self._downward((part["downwardAPI"] or {}).get("items") or [], mode))
                elif "serviceAccountToken" in part:
                    path = (part["serviceAccountToken"] or {}).get("path", "token")
                    combined[_safe_relative(path)] = (b"", mode)  # no token issuer on the local node
            return self._files(name, "projected", combined)
        raise VolumeError(f"volume {name}: unsupported volume source "
                          f"{', '.join(k for k in volume if k != 'name') or '(none)'}")

    def _object_files(self, kind: str, namespace: str, obj_name: str, source: Obj,
                      default_mode: int | None = None) -> dict[str, tuple[bytes, int]]:
        getter = self.secrets if kind == "Secret" else self.configmaps
        obj = getter(namespace, obj_name)
        mode = int(source.get("defaultMode", default_mode if default_mode is not None else 0o644))
        if obj is None:
            if source.get("optional"):
                return {}
            raise VolumeError(f'{kind.lower()} "{obj_name}" not found')
        return _keyed_files(obj, kind, source, mode)

    def _downward(self, items: list[Obj], mode: int) -> dict[str, tuple[bytes, int]]:
        files: dict[str, tuple[bytes, int]] = {}
        containers = {c.get("name"): c for c in (self.pod.get("spec") or {}).get("containers") or []}
        for item in items:
            try:
                if "fieldRef" in item:
                    value = field_value(self.pod, (item["fieldRef"] or {}).get("fieldPath", ""))
                elif "resourceFieldRef" in item:
                    ref = item["resourceFieldRef"] or {}
                    value = resource_value(containers.get(ref.get("containerName")) or {}, ref)
                else:
                    continue
            except ConfigError as exc:
                raise VolumeError(str(exc)) from exc
            files[_safe_relative(item.get("path", ""))] = (value.encode(), int(item.get("mode", mode)))
        return files

    def _files(self, name: str, kind: str, files: dict[str, tuple[bytes, int]]) -> HostVolume:
        target = self.dir / kind / name
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_files(target, files)
        return HostVolume(target, read_only=True)

    def mounts(self, container: Obj) -> list[Mount]:
        """Bind mounts for one container's volumeMounts and volumeDevices."""
        out: list[Mount] = []
        for vm in container.get("volumeMounts") or []:
            volume = self.volumes.get(vm.get("name", ""))
            if volume is None:
                raise VolumeError(f'container {container.get("name")}: volume "{vm.get("name")}" not found')
            if volume.block:
                raise VolumeError(f'volume "{vm.get("name")}" has volumeMode Block, but is specified in '
                                  "volumeMounts")
            source = volume.path
            sub = vm.get("subPath")
            if sub:
                source = source / _safe_relative(sub)
                if not source.exists():
                    source.mkdir(parents=True, exist_ok=True)
            out.append(Mount(source, vm.get("mountPath", ""), read_only=bool(vm.get("readOnly")) or volume.read_only))
        for vd in container.get("volumeDevices") or []:
            volume = self.volumes.get(vd.get("name", ""))
            if volume is None:
                raise VolumeError(f'container {container.get("name")}: volume "{vd.get("name")}" not found')
            if not volume.block:
                raise VolumeError(f'volume "{vd.get("name")}" has volumeMode Filesystem, but is specified in '
                                  "volumeDevices")
            out.append(Mount(volume.path, vd.get("devicePath", ""), read_only=volume.read_only, device=True))
        return out

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
