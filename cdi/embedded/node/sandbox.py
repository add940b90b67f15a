"""The bubblewrap command line that makes a container out of a process.

The sandbox root is a fresh tmpfs. The host's top-level directories (/usr, /etc, /work, ...) are
bound read-only into it, so the interpreter, the virtualenv and system tools are there as in an
image; /proc, /dev (a minimal devtmpfs), /tmp and /run are the sandbox's own. Volumes are bound
at their mount paths on top; a Block volume's backing file is bound at its `devicePath`, and the
container's termination-message file at `/dev/termination-log`.

Mount points have to be created, and a read-only bind of a host directory cannot get new
entries. When a mount point is missing under such a directory (say /var/run/secrets/x), that
directory is not bound whole: it becomes a tmpfs whose entries are bound one by one, down to the
level where the mount point can be made (`layout`).

The container's command runs as PID 2 of a new PID namespace (bwrap's reaper is PID 1), in a new
session, with `--die-with-parent`: when bwrap dies every process of the container dies with it,
and when `cdi up` dies bwrap dies. Outside root, a user namespace maps the caller to root."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_OWN = {"proc", "dev", "sys", "tmp", "run", "lost+found"}


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False
    device: bool = False  # a Block volume's file, bound where a device would be


@dataclass
class SandboxSpec:
    argv: list[str]
    env: dict[str, str]
    mounts: list[Mount] = field(default_factory=list)
    working_dir: str = ""
    hostname: str = ""
    hide: list[Path] = field(default_factory=list)  # host paths to cover with an empty tmpfs
    info_fd: int | None = None


def _parents(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def layout(required: Iterable[str], host_root: Path = Path("/")) -> list[str]:
    """bwrap arguments that reproduce the host's top level read-only while leaving every path in
    `required` creatable (its missing part lies on a tmpfs)."""
    needed: set[str] = set()
    for path in required:
        chain = _parents(path)
        for depth, step in enumerate(chain):
            host = host_root / step.lstrip("/")
            if host.is_symlink():
                break  # resolved inside the sandbox; the target decides
            if not host.exists():
                needed.update(chain[:depth])  # every ancestor becomes a tmpfs with its entries bound
                break
            if not host.is_dir():
                break  # an existing file: binding over it needs nothing new
    args: list[str] = []

    def walk(directory: str) -> None:
        host_dir = host_root / directory.lstrip("/")
        try:
            entries = sorted(os.scandir(host_dir), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if directory == "/" and entry.name in _OWN:
                continue
            inner = (directory.rstrip("/") + "/" + entry.name) if directory != "/" else "/" + entry.name
            if entry.is_symlink():
                args.extend(["--symlink", os.readlink(entry.path), inner])
            elif entry.is_dir(follow_symlinks=False):
                if inner in needed:
                    args.extend(["--dir", inner])
                    walk(inner)
                else:
                    args.extend(["--ro-bind", entry.path, inner])
            elif entry.is_file(follow_symlinks=False) and directory != "/":
                args.extend(["--ro-bind", entry.path, inner])

    walk("/")
    return args


def bwrap_argv(spec: SandboxSpec, bwrap: str = "bwrap", host_root: Path = Path("/")) -> list[str]:
    required = [m.target for m in spec.mounts] + ([spec.working_dir] if spec.working_dir else []) + \
        [str(p) for p in spec.hide]
    argv = [bwrap]
    if os.geteuid() != 0:
        argv += ["--unshare-user", "--uid", "0", "--gid", "0"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session",
             "--tmpfs", "/"]
    argv += layout(required, host_root)
    if (host_root / "sys").is_dir():
        argv += ["--ro-bind", str(host_root / "sys"), "/sys"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run", "--dir", "/run/lock"]
    if spec.hostname:
        argv += ["--hostname", spec.hostname[:63]]
    for path in spec.hide:
        argv += ["--tmpfs", str(path)]
    for mount in spec.mounts:
        flag = "--ro-bind" if mount.read_only else ("--dev-bind" if mount.device else "--bind")
        argv += [flag, str(mount.source), mount.target]
    if spec.working_dir:
        argv += ["--chdir", spec.working_dir]
    argv += ["--clearenv"]
    for key, value in spec.env.items():
        argv += ["--setenv", key, value]
    if spec.info_fd is not None:
        argv += ["--info-fd", str(spec.info_fd)]
    argv += ["--", *spec.argv]
    return argv
