"""Where local volumes and snapshots keep their bytes, and what each one is.

Layout under the storage directory (`DIR/storage` of `cdi up`):

    volumes/<handle>.json   what the volume is: kind, size, when it was made
    volumes/<handle>/       a Filesystem volume: a plain directory (kind "dir"), or the mount point of
                            its ext4 image (kind "ext4")
    volumes/<handle>.img    a Block volume (kind "block", a sparse file of the claimed size), or the
                            ext4 image of an "ext4" volume
    snapshots/<handle>...   the same for snapshots (a frozen copy of the volume)

A Block volume is a regular sparse file bound at the pod's `devicePath`; programs must find its
size with `lseek(SEEK_END)` (or `os.stat`), not with the BLKGETSIZE64 ioctl, and write it at
offsets as they would a disk. An "ext4" volume is a real ext4 filesystem of the claimed size on a
loop device (root only), so "no space left on device" and filesystem overhead happen as on real
storage; a "dir" volume is a directory on the host's filesystem with no size limit of its own.

The JSON record is what lets a restart of `cdi up` know which volumes exist and re-mount the ext4
ones; it is written last on create and removed first on delete, so a crash leaves at worst
unreferenced bytes, never a record without bytes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cdi.embedded.storage.copy import copy_file, copy_tree

log = logging.getLogger(__name__)

DIR, BLOCK, EXT4 = "dir", "block", "ext4"


class StorageError(Exception):
    """A volume operation that cannot succeed as asked (reported on the claim as an event)."""


@dataclass
class VolumeRecord:
    handle: str
    kind: str
    size: int
    created: float = 0.0
    source: str = ""  # the volume a snapshot was taken of

    @property
    def block(self) -> bool:
        return self.kind == BLOCK


def ext4_supported() -> str | None:
    """None when this machine can make loop-mounted ext4 volumes, else why not."""
    if os.geteuid() != 0:
        return "ext4 volumes need root (loop devices and mount)"
    for tool in ("mkfs.ext4", "mount", "umount", "losetup", "resize2fs", "fsfreeze"):
        if shutil.which(tool) is None:
            return f"ext4 volumes need {tool} (Debian packages e2fsprogs and util-linux)"
    if not Path("/dev/loop-control").exists():
        return "ext4 volumes need loop devices (/dev/loop-control is missing)"
    return None


def _run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StorageError(f"{' '.join(argv)} failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def _mounted(path: Path) -> bool:
    target = str(path)
    try:
        with open("/proc/self/mountinfo") as mounts:
            return any(line.split()[4] == target for line in mounts)
    except OSError:
        return False


def _used_in_other_namespaces(mountpoint: Path) -> bool:
    """Whether a filesystem mounted at `mountpoint` is also mounted in another mount namespace (a
    pod's sandbox): unmounting it here would not release it, so it must not be changed offline."""
    try:
        dev = os.stat(mountpoint).st_dev
        own = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return False
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "mnt") == own:
                continue
            with open(entry / "mountinfo") as mounts:
                if any(line.split()[2] == wanted for line in mounts):
                    return True
        except OSError:
            continue
    return False


def _loop_device(image: Path) -> str | None:
    out = subprocess.run(["losetup", "-j", str(image), "-n", "-O", "NAME"], capture_output=True, text=True,
                         check=False).stdout.split()
    return out[0] if out else None


class _Area:
    """One directory of records and their bytes (volumes or snapshots)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def record_path(self, handle: str) -> Path:
        return self.root / f"{handle}.json"

    def data_dir(self, handle: str) -> Path:
        return self.root / handle

    def image(self, handle: str) -> Path:
        return self.root / f"{handle}.img"

    def read(self, handle: str) -> VolumeRecord | None:
        try:
            return VolumeRecord(**json.loads(self.record_path(handle).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self, record: VolumeRecord) -> None:
        path = self.record_path(record.handle)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(record)))
        os.replace(tmp, path)

    def records(self) -> list[VolumeRecord]:
        out = []
        for path in sorted(self.root.glob("*.json")):
            record = self.read(path.stem)
            if record is not None:
                out.append(record)
        return out

    def forget(self, handle: str) -> None:
        self.record_path(handle).unlink(missing_ok=True)


class LocalVolumes:
    """Creates, copies, grows and deletes volumes and snapshots on this machine."""

    def __init__(self, root: Path, ext4: bool = False) -> None:
        self.root = root
        self.ext4 = ext4
        self.volumes = _Area(root / "volumes")
        self.snapshots = _Area(root / "snapshots")

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Mount what earlier runs left unmounted (ext4 volumes), drop half-made leftovers."""
        if self.ext4:
            why = ext4_supported()
            if why:
                raise StorageError(why)
        for record in self.volumes.records():
            if record.kind == EXT4:
                self._mount(record.handle)

    def stop(self) -> None:
        for record in self.volumes.records():
            if record.kind == EXT4:
                self._unmount(record.handle)

    # -- queries -----------------------------------------------------------------------------------

    def get(self, handle: str) -> VolumeRecord | None:
        return self.volumes.read(handle)

    def snapshot(self, handle: str) -> VolumeRecord | None:
        return self.snapshots.read(handle)

    def path(self, handle: str) -> Path:
        """Where a pod binds the volume: its directory (Filesystem) or its file (Block)."""
        record = self.volumes.read(handle)
        if record is None:
            raise StorageError(f"volume {handle} does not exist")
        if record.kind == BLOCK:
            return self.volumes.image(handle)
        if record.kind == EXT4 and not _mounted(self.volumes.data_dir(handle)):
            self._mount(handle)
        return self.volumes.data_dir(handle)

    def handles(self) -> list[str]:
        return [r.handle for r in self.volumes.records()]

    # -- create ------------------------------------------------------------------------------------

    def create(self, handle: str, size: int, block: bool) -> VolumeRecord:
        """An empty volume: a directory, an ext4 filesystem of `size`, or a sparse file of `size`."""
        existing = self.volumes.read(handle)
        if existing is not None:
            return existing
        kind = BLOCK if block else (EXT4 if self.ext4 else DIR)
        self._discard(self.volumes, handle)
        if kind == BLOCK:
            with open(self.volumes.image(handle), "wb") as f:
                f.truncate(size)
        elif kind == EXT4:
            image = self.volumes.image(handle)
            with open(image, "wb") as f:
                f.truncate(size)
            _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
                 str(image))
        else:
            # a fresh file system's root: the pod's fsGroup, applied by the kubelet, lets non-root users in
            self.volumes.data_dir(handle).mkdir(mode=0o755)
            os.chmod(self.volumes.data_dir(handle), 0o755)
        record = VolumeRecord(handle, kind, size, time.time())
        if kind == EXT4:
            self._mount(handle)
        self.volumes.write(record)
        return record

    def clone(self, handle: str, source: str, size: int) -> VolumeRecord:
        """A new volume with the bytes of volume `source`, grown to `size` if that is larger."""
        src = self.volumes.read(source)
        if src is None:
            raise StorageError(f"source volume {source} does not exist")
        return self._copy_into(handle, self.volumes, src, size)

    def restore(self, handle: str, snapshot: str, size: int) -> VolumeRecord:
        src = self.snapshots.read(snapshot)
        if src is None:
            raise StorageError(f"snapshot {snapshot} does not exist")
        return self._copy_into(handle, self.snapshots, src, size)

    def _copy_into(self, handle: str, area: _Area, src: VolumeRecord, size: int) -> VolumeRecord:
        existing = self.volumes.read(handle)
        if existing is not None:
            return self.expand(handle, size) if existing.size < size else existing
        if size < src.size:
            raise StorageError(f"requested volume size {size} is less than the size {src.size} of the source")
        self._discard(self.volumes, handle)
        self._copy_bytes(area, src, self.volumes, handle)
        record = VolumeRecord(handle, src.kind, src.size, time.time())
        if src.kind == EXT4:
            self._mount(handle)
        self.volumes.write(record)
        if size > src.size:
            record = self.expand(handle, size)
        return record

    def take_snapshot(self, handle: str, volume: str) -> VolumeRecord:
        """A point-in-time copy of a volume (ext4 volumes are frozen while their image is copied)."""
        existing = self.snapshots.read(handle)
        if existing is not None:
            return existing
        src = self.volumes.read(volume)
        if src is None:
            raise StorageError(f"volume {volume} does not exist")
        self._discard(self.snapshots, handle)
        self._copy_bytes(self.volumes, src, self.snapshots, handle)
        record = VolumeRecord(handle, src.kind, src.size, time.time(), source=volume)
        self.snapshots.write(record)
        return record

    def _copy_bytes(self, area: _Area, src: VolumeRecord, dest: _Area, handle: str) -> None:
        if src.kind == DIR:
            copy_tree(area.data_dir(src.handle), dest.data_dir(handle))
            return
        frozen = None
        if src.kind == EXT4 and area is self.volumes and _mounted(area.data_dir(src.handle)):
            frozen = area.data_dir(src.handle)
            _run("fsfreeze", "-f", str(frozen))
        try:
            copy_file(area.image(src.handle), dest.image(handle))
        finally:
            if frozen is not None:
                _run("fsfreeze", "-u", str(frozen))

    # -- expand ------------------------------------------------------------------------------------

    def expand(self, handle: str, size: int) -> VolumeRecord:
        """Grow a volume to `size` bytes (never shrinks); ext4 is grown online."""
        record = self.volumes.read(handle)
        if record is None:
            raise StorageError(f"volume {handle} does not exist")
        if size <= record.size:
            return record
        if record.kind in (BLOCK, EXT4):
            with open(self.volumes.image(handle), "r+b") as f:
                f.truncate(size)
        if record.kind == EXT4:
            self._grow_ext4(handle)
        record.size = size
        self.volumes.write(record)
        return record

    def _grow_ext4(self, handle: str) -> None:
        """Grow the filesystem to its (already grown) image: online where the kernel lets us
        (CAP_SYS_RESOURCE), else offline, which waits until no pod has the volume."""
        target, image = self.volumes.data_dir(handle), self.volumes.image(handle)
        if not _mounted(target):
            self._mount(handle)
        device = _loop_device(image)
        if device is None:
            raise StorageError(f"no loop device for volume {handle}")
        _run("losetup", "-c", device)
        try:
            _run("resize2fs", device)
            return
        except StorageError as online:
            if _used_in_other_namespaces(target):
                raise StorageError(f"online expansion failed ({online}); the volume is in use, it will be expanded "
                                   "offline once no pod uses it") from online
        self._unmount(handle)
        result = subprocess.run(["e2fsck", "-f", "-y", str(image)], capture_output=True, text=True, check=False)
        if result.returncode not in (0, 1):
            self._mount(handle)
            raise StorageError(f"e2fsck {image} failed: {result.stdout.strip()} {result.stderr.strip()}")
        try:
            _run("resize2fs", str(image))
        finally:
            self._mount(handle)

    # -- delete ------------------------------------------------------------------------------------

    def delete(self, handle: str) -> None:
        self.volumes.forget(handle)
        self._discard(self.volumes, handle)

    def delete_snapshot(self, handle: str) -> None:
        self.snapshots.forget(handle)
        self._discard(self.snapshots, handle)

    def _discard(self, area: _Area, handle: str) -> None:
        data = area.data_dir(handle)
        if area is self.volumes:
            self._unmount(handle)
        if data.is_dir():
            shutil.rmtree(data, ignore_errors=True)
        area.image(handle).unlink(missing_ok=True)

    # -- ext4 --------------------------------------------------------------------------------------

    def _mount(self, handle: str) -> None:
        target = self.volumes.data_dir(handle)
        target.mkdir(exist_ok=True)
        if _mounted(target):
            return
        _run("mount", "-o", "loop", str(self.volumes.image(handle)), str(target))

    def _unmount(self, handle: str) -> None:
        target = self.volumes.data_dir(handle)
        if _mounted(target):
            result = subprocess.run(["umount", str(target)], capture_output=True, text=True, check=False)
            if result.returncode != 0:
                log.warning("umount %s: %s; detaching lazily", target, result.stderr.strip())
                subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)
