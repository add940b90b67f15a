"""Who a container runs as, as the kubelet and containerd decide it from the pod's and the
container's `securityContext`: the user and group (`runAsUser`, `runAsGroup`; the image runs as root
when neither says otherwise), the supplementary groups (the user's groups in the image's
`/etc/group`, then `fsGroup`, then `supplementalGroups`), the capabilities (containerd's default
set, `capabilities.add`/`drop` with `ALL`, everything when `privileged`), `readOnlyRootFilesystem`,
and the `runAsNonRoot` check the kubelet makes before it creates the container.

The image of every container on the local node is the host's system directories, so the host's
`/etc/passwd` and `/etc/group` are the image's."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdi.embedded.node.environment import ConfigError

Obj = dict[str, Any]

# the kernel's capabilities, by number
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
)

# containerd's default set, what every container of a kubelet gets unless its securityContext says otherwise
DEFAULT_CAPABILITIES = frozenset({
    "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP", "SETPCAP",
    "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE",
})


class RuntimeRefused(Exception):
    """The runtime cannot create the container as asked (reason CreateContainerError)."""


def known_capabilities() -> tuple[str, ...]:
    """The capabilities this kernel has (what `ALL` means)."""
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = len(CAPABILITIES) - 1
    return CAPABILITIES[:last + 1]


@dataclass(frozen=True)
class Identity:
    uid: int = 0
    gid: int = 0
    groups: tuple[int, ...] = ()
    capabilities: frozenset[str] = DEFAULT_CAPABILITIES
    read_only_root: bool = False
    home: str = "/root"

    @property
    def root(self) -> bool:
        return self.uid == 0


def _name(cap: str) -> str:
    name = str(cap).upper()
    return name[4:] if name.startswith("CAP_") else name


def capabilities(context: Obj) -> frozenset[str]:
    """containerd's rule: `add: [ALL]` grants everything, `drop: [ALL]` starts from nothing, then the
    named additions, then the named drops; `privileged` has every capability."""
    known = known_capabilities()
    if context.get("privileged"):
        return frozenset(known)
    spec = context.get("capabilities") or {}
    add = [_name(c) for c in spec.get("add") or []]
    drop = [_name(c) for c in spec.get("drop") or []]
    for name in (*add, *drop):
        if name != "ALL" and name not in CAPABILITIES:
            raise RuntimeRefused(f"unknown capability {name!r}")
    caps = set(DEFAULT_CAPABILITIES)
    if "ALL" in add:
        caps = set(known)
    if "ALL" in drop:
        caps = set()
    caps |= {name for name in add if name != "ALL"}
    caps -= set(drop)
    return frozenset(name for name in caps if name in known)


def _pod_name(pod: Obj) -> str:
    meta = pod["metadata"]
    return f"{meta.get('name', '')}_{meta.get('namespace', '')}({meta.get('uid', '')})"


def _image_user(uid: int) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        return None


@dataclass(frozen=True)
class ImageUsers:
    """Who is who in a pulled image: the user its config names, its /etc/passwd and /etc/group."""

    user: str = ""
    passwd: tuple[tuple[str, ...], ...] = ()
    group: tuple[tuple[str, ...], ...] = ()

    def _entry(self, key: str) -> tuple[str, ...] | None:
        index = 2 if key.isdigit() else 0
        return next((e for e in self.passwd if len(e) >= 7 and e[index] == key), None)

    def default(self) -> tuple[int | None, int | None]:
        """(uid, gid) of the config's `User` ("name", "uid", "uid:gid", "name:group"); None: unset."""
        if not self.user:
            return None, None
        name, _, group = self.user.partition(":")
        entry = self._entry(name)
        if name.isdigit():
            uid: int | None = int(name)
        elif entry is not None and entry[2].isdigit():
            uid = int(entry[2])
        else:
            raise RuntimeRefused(f"unable to find user {name}: no matching entries in passwd file")
        gid: int | None = None
        if group:
            if group.isdigit():
                gid = int(group)
            else:
                match = next((g for g in self.group if len(g) >= 3 and g[0] == group and g[2].isdigit()), None)
                if match is None:
                    raise RuntimeRefused(f"unable to find group {group}: no matching entries in group file")
                gid = int(match[2])
        return uid, gid

    def account(self, uid: int) -> tuple[int | None, str, tuple[int, ...]]:
        """(primary gid, home, supplementary groups) of `uid` in the image; (None, "/", ()) if unknown."""
        entry = self._entry(str(uid))
        if entry is None or not entry[3].isdigit():
            return None, "/", ()
        groups = tuple(int(g[2]) for g in self.group
                       if len(g) >= 4 and g[2].isdigit() and entry[0] in g[3].split(","))
        return int(entry[3]), entry[5] or "/", groups


def identity(pod: Obj, container: Obj, image: ImageUsers | None = None) -> Identity:
    """The identity the container's process gets; ConfigError when `runAsNonRoot` forbids it
    (CreateContainerConfigError, with the kubelet's message). Without `image` the image is the
    host's system directories, with the host's users; with it, a pulled image with its own."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    context = container.get("securityContext") or {}

    def setting(key: str) -> Any:
        value = context.get(key)
        return pod_context.get(key) if value is None else value

    run_as_user, run_as_group, non_root = setting("runAsUser"), setting("runAsGroup"), setting("runAsNonRoot")
    image_uid, image_gid = image.default() if image is not None else (None, None)
    if run_as_user is None and image_uid is not None:
        run_as_user = image_uid
        if run_as_group is None:
            run_as_group = image_gid
    uid = int(run_as_user) if run_as_user is not None else 0  # the image's user: root
    if non_root:
        if run_as_user is not None and uid == 0:
            raise ConfigError(f"container's runAsUser breaks non-root policy (pod: \"{_pod_name(pod)}\", "
                              f"container: {container.get('name', '')})")
        if uid == 0:
            raise ConfigError(f"container has runAsNonRoot and image will run as root (pod: \"{_pod_name(pod)}\", "
                              f"container: {container.get('name', '')})")
    groups: list[int] = []
    if image is not None:
        primary, home, member_of = image.account(uid)
        gid = int(run_as_group) if run_as_group is not None else (primary if primary is not None else 0)
        groups += [g for g in member_of if g != gid]
    else:
        user = _image_user(uid)
        gid = int(run_as_group) if run_as_group is not None else (user.pw_gid if user is not None else 0)
        home = user.pw_dir if user is not None else "/"
        if user is not None:
            groups += [g for g in os.getgrouplist(user.pw_name, gid) if g != gid]
    fs_group = pod_context.get("fsGroup")
    if fs_group is not None:
        groups.append(int(fs_group))
    groups += [int(g) for g in pod_context.get("supplementalGroups") or []]
    unique = tuple(dict.fromkeys(groups))
    return Identity(uid=uid, gid=gid, groups=unique, capabilities=capabilities(context),
                    read_only_root=bool(context.get("readOnlyRootFilesystem")), home=home)
