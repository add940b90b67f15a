"""The bubblewrap command line that makes a container out of a process.

**The root file system** is a fresh tmpfs holding what an image holds and nothing else of the host:
the system directories programs run from (`/usr`, `/bin`, `/sbin`, `/lib*`) bound read-only, the
host's `/etc` read-only without what an unprivileged user could not read there (`shadow`, `gshadow`,
`sudoers`, private keys: every entry not readable by others is covered, a file by `/dev/null` which
a read-only bind makes unopenable, a directory by an empty tmpfs; where /etc has to be made entry by
entry for a mount point, such entries are left out), and empty `/root`, `/home`, `/opt`, `/srv`,
`/mnt`, `/media` and `/var`. Home directories, `/srv`, `/opt` and the
host's working trees are not there. What the "image" runs from beyond that (cdi's own Python, its
virtualenv and package, wherever they are) comes as read-only mounts from the kubelet. `/proc`
(of the pod's own PID namespace), `/dev` (a minimal one), `/tmp`, `/run` and `/dev/shm` are the
sandbox's own; `/sys` is the host's, read-only. With `readOnlyRootFilesystem` the root is remounted
read-only at the end and `/tmp` and `/run` are plain directories of it, as in a container whose
image is read-only: only volumes, `/dev/shm` and the termination-message file are writable.

Volumes are bound at their mount paths (parents first); a Block volume's backing file at its
`devicePath`, the container's termination-message file at `/dev/termination-log`. A read-only
bind of a host directory cannot get new entries: when a mount point is missing under one (say
/etc/tls), that directory is not bound whole but made a tmpfs directory whose entries are bound one
by one, down to where the mount point can be made. Only then: every bind costs bwrap a pass over the
mount table, so a hundred of them add a noticeable fraction of a second to a container's start.
bubblewrap makes the parents of a mount point 0700, which a non-root user cannot pass through, so
every parent is made first (0755).

**The process** runs as PID 2 of a new PID namespace (bwrap's reaper is PID 1, with an empty
environment), in a new session, with `--die-with-parent`: when bwrap dies every process of the
container dies with it, and when `cdi up` dies bwrap dies. It always has no-new-privs (bwrap sets it
unconditionally, so `allowPrivilegeEscalation: false` holds for every container and setuid programs
never elevate). Its identity comes from `security.Identity`: in the node's user namespace
(`userns.py`) bwrap keeps only the container's capabilities (and, for the moment of switching, the
ones to switch user with), and `setpriv` sets the user, group and supplementary groups, trims the
bounding set to the container's capabilities and clears the inheritable ones before it executes the
command. Where the kernel gave no user namespace, `cdi up` running as root, the same happens in the
host's, without `MKNOD` and `NET_RAW` (which would reach the host's devices and network there).
Where `cdi up` is not root, bwrap makes a user namespace mapping only the container's user to the
caller (the caller's is the only one it can map)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from cdi.embedded.node.security import Identity

SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")  # bound whole, read-only
CONFIG_DIR = "etc"  # bound entry by entry, without what others may not read
IMAGE_DIRS = ("home", "media", "mnt", "opt", "root", "srv", "var")  # empty, as in an image
HOST_ONLY_CAPABILITIES = frozenset({"MKNOD", "NET_RAW"})  # dropped where no user namespace contains them
SWITCH_CAPABILITIES = frozenset({"SETUID", "SETGID", "SETPCAP"})  # what setpriv needs to switch and trim


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
    hide: list[Path] = field(default_factory=list)  # host paths to cover with an empty tmpfs where visible
    info_fd: int | None = None
    identity: Identity = field(default_factory=Identity)
    userns_fd: int | None = None  # the node's user namespace (None: see the module's docstring)
    rootfs: Path | None = None  # a pulled image's root file system (None: the host's system directories)
    helpers: list[Mount] = field(default_factory=list)  # setpriv and its libraries, for a pulled image


def _parents(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _private(mode: int) -> bool:
    """Not for others to read: a file without o+r, a directory without o+rx, anything not a file."""
    if stat.S_ISDIR(mode):
        return mode & 0o005 != 0o005
    if stat.S_ISREG(mode):
        return not mode & 0o004
    return True


def system_path(path: str) -> bool:
    """Whether `path` lies in what the sandbox shows of the host (system directories, /etc)."""
    top = path.strip("/").split("/", 1)[0]
    return top in SYSTEM_DIRS or top == CONFIG_DIR


class _Root:
    """The arguments that build the root file system, and what they leave where."""

    def __init__(self, host_root: Path, image: bool = False) -> None:
        self.host = host_root
        self.image = image  # host_root is a pulled image's root: every entry of it is shown, read-only
        self.args: list[str] = []
        self.bound: list[str] = []  # sandbox paths that are mounts of something else (host, volume, procfs)
        self.made: set[str] = {"/"}  # directories known to exist
        self.expand: set[str] = set()  # host directories made entry by entry instead of bound whole
        self.private: dict[str, bool] = {}  # sandbox path -> is a directory

    def shown(self, top: str) -> bool:
        """Whether a top-level path comes from the root's source (else it lies on the sandbox's tmpfs)."""
        if self.image:
            return os.path.lexists(self.host_path(top))
        return system_path(top)

    def host_path(self, inner: str) -> Path:
        return self.host / inner.lstrip("/")

    def require(self, paths: Iterable[str]) -> None:
        """Leave every path creatable: where its missing part would lie in a read-only bind of a host
        directory, that directory and its ancestors are expanded."""
        for path in paths:
            chain = _parents(path)
            if not chain or not self.shown(chain[0]):
                continue  # on the sandbox's own tmpfs: creatable
            for depth, step in enumerate(chain):
                host = self.host_path(step)
                if host.is_symlink():
                    break  # resolved inside the sandbox; the target decides
                if not host.exists():
                    self.expand.update(chain[:depth])
                    break
                if not host.is_dir():
                    break  # an existing file: binding over it needs nothing new

    def find_private(self, top: str) -> None:
        """Everything under `top` others may not read (not below a private directory: that is enough)."""
        host_top = self.host_path(top)
        for dirpath, dirnames, filenames in os.walk(host_top):
            inner_dir = "/" + str(Path(dirpath).relative_to(self.host))
            for name in [*dirnames, *filenames]:
                try:
                    mode = os.lstat(os.path.join(dirpath, name)).st_mode
                except OSError:
                    continue
                if stat.S_ISLNK(mode) or not _private(mode):
                    continue
                inner = inner_dir.rstrip("/") + "/" + name
                self.private[inner] = stat.S_ISDIR(mode)
                if name in dirnames:
                    dirnames.remove(name)

    def directory(self, inner: str, perms: int | None = None) -> None:
        if perms is not None:
            self.args += ["--perms", f"{perms:04o}"]
        self.args += ["--dir", inner]
        self.made.add(inner)

    def host_entry(self, inner: str) -> None:
        """Reproduce the host's `inner`: a symlink as a symlink, a directory bound whole or expanded, a
        file bound; never what is private: left out of an expanded directory, covered in one bound whole
        (a file by /dev/null, which a read-only bind makes unopenable, a directory by an empty tmpfs)."""
        host = self.host_path(inner)
        if inner in self.private:
            return
        if host.is_symlink():
            self.args += ["--symlink", os.readlink(host), inner]
        elif host.is_dir():
            if inner in self.expand:
                self.directory(inner)
                try:
                    names = sorted(entry.name for entry in os.scandir(host))
                except OSError:
                    return
                for name in names:
                    self.host_entry(inner.rstrip("/") + "/" + name)
            else:
                self.bind("--ro-bind", host, inner)
                for path, is_dir in sorted(self.private.items()):
                    if path.startswith(inner + "/"):
                        cover = ["--perms", "0000", "--tmpfs"] if is_dir else ["--ro-bind", "/dev/null"]
                        self.args += [*cover, path]
        elif host.is_file():
            self.bind("--ro-bind", host, inner)

    def bind(self, flag: str, source: Path, inner: str) -> None:
        self.args += [flag, str(source), inner]
        self.bound.append(inner)

    def parents_of(self, inner: str) -> None:
        """Make every missing parent of `inner` (0755), so that any user can pass through."""
        for parent in _parents(inner)[:-1]:
            if parent not in self.made:
                self.directory(parent)

    def visible(self, inner: str) -> bool:
        return any(inner == b or inner.startswith(b.rstrip("/") + "/") for b in self.bound)


def layout(required: Iterable[str], host_root: Path = Path("/")) -> list[str]:
    """bwrap arguments for the image part of the root file system (system directories, /etc without
    its private entries, the empty directories of an image), leaving every path in `required`
    creatable."""
    root = _Root(host_root)
    root.require(required)
    root.find_private("/" + CONFIG_DIR)
    return _image(root)


def _image(root: _Root) -> list[str]:
    for name in (*SYSTEM_DIRS, CONFIG_DIR):
        if root.host_path("/" + name).is_symlink() or root.host_path("/" + name).exists():
            root.host_entry("/" + name)
    for name in IMAGE_DIRS:
        root.directory("/" + name)
    root.directory("/var/tmp", 0o1777)
    root.args += ["--symlink", "../run", "/var/run", "--symlink", "../run/lock", "/var/lock"]
    root.made.update({"/var/run", "/var/lock"})
    return root.args


def _pulled_image(root: _Root) -> list[str]:
    """A pulled image's root: each of its top-level entries as the host_entry of a system directory."""
    for name in sorted(os.listdir(root.host)):
        if name not in ("proc", "dev", "sys"):
            root.host_entry("/" + name)
    return root.args


HELPER_DIR = "/dev/.cdi-runtime"  # where a pulled image's container finds setpriv (the image may have none)


def helper_setpriv(helpers: list[Mount]) -> list[str]:
    """setpriv run by the host's dynamic loader with the host's libraries, bound in HELPER_DIR."""
    loader = next(m.target for m in helpers if Path(m.target).name.startswith("ld-"))
    return [loader, "--library-path", HELPER_DIR, f"{HELPER_DIR}/setpriv"]


def user_argv(identity: Identity, capabilities: Iterable[str], setpriv: str | list[str] = "setpriv") -> list[str]:
    """The `setpriv` prefix that turns the sandbox's root into the container's identity."""
    groups = ["--groups", ",".join(str(g) for g in identity.groups)] if identity.groups else ["--clear-groups"]
    bounding = ",".join(["-all", *(f"+{c.lower()}" for c in sorted(capabilities))])
    prefix = [setpriv] if isinstance(setpriv, str) else list(setpriv)
    return [*prefix, f"--reuid={identity.uid}", f"--regid={identity.gid}", *groups, f"--bounding-set={bounding}",
            "--inh-caps=-all", "--nnp", "--"]


def _capability_args(capabilities: Iterable[str]) -> list[str]:
    args = ["--cap-drop", "ALL"]
    for name in sorted(capabilities):
        args += ["--cap-add", f"CAP_{name}"]
    return args


def container_capabilities(identity: Identity, userns_fd: int | None) -> frozenset[str]:
    """What the container keeps: its capabilities, less those that would act on the host itself
    when no user namespace of ours contains them."""
    if userns_fd is None and os.geteuid() == 0:
        return identity.capabilities - HOST_ONLY_CAPABILITIES
    return identity.capabilities


def inside_image(rootfs: Path, path: str) -> str:
    """A mount point or working directory in a pulled image, its symlinks resolved inside the image (as
    a runtime's securejoin does): bwrap makes mount points before it enters the new root, so a path
    through an image's symlink (`/x -> /root`) would otherwise be followed on the host."""
    from cdi.embedded.node.oci import UnsafeLayer, resolve

    try:
        return "/" + str(resolve(rootfs, path).relative_to(rootfs)).removeprefix(".")
    except UnsafeLayer as exc:
        raise ValueError(f"{path}: {exc}") from exc


def bwrap_argv(spec: SandboxSpec, bwrap: str = "bwrap", host_root: Path = Path("/"),
               setpriv: str = "setpriv") -> list[str]:
    if spec.rootfs is not None:
        spec = replace(spec, working_dir=inside_image(spec.rootfs, spec.working_dir) if spec.working_dir else "",
                       mounts=[replace(m, target=inside_image(spec.rootfs, m.target)) for m in spec.mounts])
    identity = spec.identity
    caps = container_capabilities(identity, spec.userns_fd)
    mounts = sorted(spec.mounts, key=lambda m: len(_parents(m.target)))  # parents before what they contain
    argv = [bwrap]
    command = list(spec.argv)
    if spec.userns_fd is not None or os.geteuid() == 0:
        if spec.userns_fd is not None:
            argv += ["--userns", str(spec.userns_fd)]
        argv += _capability_args(caps | SWITCH_CAPABILITIES)
        switch: str | list[str] = helper_setpriv(spec.helpers) if spec.rootfs is not None else setpriv
        command = [*user_argv(identity, caps, switch), *command]
    else:
        argv += ["--unshare-user", "--disable-userns", "--uid", str(identity.uid), "--gid", str(identity.gid)]
        argv += _capability_args(caps if identity.root else ())
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session",
             "--tmpfs", "/"]
    root = _Root(spec.rootfs or host_root, image=spec.rootfs is not None)
    root.require([m.target for m in mounts] + ([spec.working_dir] if spec.working_dir else []))
    if spec.rootfs is not None:
        _pulled_image(root)
    else:
        root.find_private("/" + CONFIG_DIR)
        _image(root)
    if (host_root / "sys").is_dir():
        root.bind("--ro-bind", host_root / "sys", "/sys")
    root.args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
    root.bound.append("/proc")
    root.made.update({"/proc", "/dev", "/dev/shm"})
    if spec.rootfs is not None and spec.helpers:
        root.directory(HELPER_DIR)
        for helper in spec.helpers:
            root.bind("--ro-bind", helper.source, helper.target)
    if identity.read_only_root:
        root.directory("/tmp", 0o1777)
        root.directory("/run")
    else:
        root.args += ["--perms", "1777", "--tmpfs", "/tmp", "--tmpfs", "/run"]
        root.made.update({"/tmp", "/run"})
    root.directory("/run/lock", 0o1777)
    if spec.hostname:
        root.args += ["--hostname", spec.hostname[:63]]
    for mount in mounts:
        root.parents_of(mount.target)
        flag = "--ro-bind" if mount.read_only else ("--dev-bind" if mount.device else "--bind")
        root.bind(flag, mount.source, mount.target)
    for path in spec.hide:
        if root.visible(str(path)) and path.is_dir():
            root.args += ["--tmpfs", str(path)]
    if spec.working_dir:
        root.parents_of(spec.working_dir)
        if spec.working_dir not in root.made:
            root.args += ["--dir", spec.working_dir]
    if identity.read_only_root:
        root.args += ["--remount-ro", "/"]
    if spec.working_dir:
        root.args += ["--chdir", spec.working_dir]
    argv += [*root.args, "--clearenv"]
    for key, value in spec.env.items():
        argv += ["--setenv", key, value]
    if spec.info_fd is not None:
        argv += ["--info-fd", str(spec.info_fd)]
    argv += ["--", *command]
    return argv
