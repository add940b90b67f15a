"""Who a container of the local node runs as (`security.py`), how the sandbox's command line turns
that into bwrap and setpriv arguments in each of the three situations (the node's user namespace,
root without one, not root), and the kubelet's volume ownership for an fsGroup."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cdi.embedded.node import sandbox
from cdi.embedded.node.environment import ConfigError
from cdi.embedded.node.sandbox import SandboxSpec, bwrap_argv
from cdi.embedded.node.security import DEFAULT_CAPABILITIES, Identity, RuntimeRefused, capabilities, identity
from cdi.embedded.node.volumes import set_volume_ownership


def _pod(context: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": {"securityContext": context or {}}}


def test_capabilities_follow_containerd() -> None:
    assert capabilities({}) == DEFAULT_CAPABILITIES
    assert capabilities({"capabilities": {"drop": ["ALL"]}}) == frozenset()
    assert capabilities({"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}) == {"NET_BIND_SERVICE"}
    assert capabilities({"capabilities": {"add": ["CAP_SYS_ADMIN"], "drop": ["kill"]}}) == \
        (DEFAULT_CAPABILITIES | {"SYS_ADMIN"}) - {"KILL"}
    assert {"SYS_ADMIN", "SYS_MODULE"} <= capabilities({"capabilities": {"add": ["ALL"]}})
    assert {"SYS_ADMIN", "SYS_MODULE"} <= capabilities({"privileged": True, "capabilities": {"drop": ["ALL"]}})
    with pytest.raises(RuntimeRefused, match="SUPERPOWER"):
        capabilities({"capabilities": {"add": ["SUPERPOWER"]}})


def test_identity_from_the_pod_and_the_container() -> None:
    assert identity(_pod(), {"name": "c"}) == Identity(home="/root")  # the image's user: root
    user = identity(_pod({"runAsUser": 5000, "runAsGroup": 6000, "fsGroup": 7000, "supplementalGroups": [8000]}),
                    {"name": "c", "securityContext": {"runAsUser": 5001, "readOnlyRootFilesystem": True}})
    assert (user.uid, user.gid, user.groups, user.read_only_root, user.home) == (5001, 6000, (7000, 8000), True, "/")
    assert identity(_pod({"fsGroup": 107}), {"name": "c", "securityContext": {"runAsUser": 107}}).gid == 0


def test_run_as_non_root_refuses_root_as_the_kubelet_does() -> None:
    with pytest.raises(ConfigError, match=r'^container has runAsNonRoot and image will run as root '
                                          r'\(pod: "p_ns\(u-1\)", container: c\)$'):
        identity(_pod({"runAsNonRoot": True}), {"name": "c"})
    with pytest.raises(ConfigError, match="container's runAsUser breaks non-root policy"):
        identity(_pod(), {"name": "c", "securityContext": {"runAsNonRoot": True, "runAsUser": 0}})
    assert identity(_pod({"runAsNonRoot": True}), {"name": "c", "securityContext": {"runAsUser": 107}}).uid == 107


def _command(argv: list[str]) -> list[str]:
    return argv[argv.index("--") + 1:]


UNPRIVILEGED = Identity(uid=107, gid=0, groups=(107,), capabilities=frozenset(), read_only_root=True, home="/")


def test_in_the_node_user_namespace_setpriv_switches_user_and_trims_capabilities() -> None:
    argv = bwrap_argv(SandboxSpec(["prog"], {}, identity=UNPRIVILEGED, userns_fd=7), setpriv="/usr/bin/setpriv")
    assert argv[1:3] == ["--userns", "7"]
    assert "--unshare-user" not in argv
    added = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--cap-add"}
    assert added == {"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"}  # only to switch; setpriv lets them go
    command = _command(argv)
    assert command == ["/usr/bin/setpriv", "--reuid=107", "--regid=0", "--groups", "107", "--bounding-set=-all",
                       "--inh-caps=-all", "--nnp", "--", "prog"]
    assert argv.index("--remount-ro") > max(i for i, arg in enumerate(argv) if arg in ("--bind", "--ro-bind", "--dir"))
    assert "/tmp" not in [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"]  # part of the read-only root


def test_root_without_a_user_namespace_loses_what_would_reach_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    argv = bwrap_argv(SandboxSpec(["prog"], {}, identity=Identity()))
    assert "--userns" not in argv and "--unshare-user" not in argv
    command = _command(argv)
    bounding = next(arg for arg in command if arg.startswith("--bounding-set="))
    assert "+mknod" not in bounding and "+net_raw" not in bounding and "+chown" in bounding
    assert "--clear-groups" in command


def test_not_root_bwrap_maps_the_container_user_to_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    argv = bwrap_argv(SandboxSpec(["prog"], {}, identity=UNPRIVILEGED))
    assert argv[1:7] == ["--unshare-user", "--disable-userns", "--uid", "107", "--gid", "0"]
    assert _command(argv) == ["prog"]


def test_the_image_shows_no_home_no_working_tree_and_no_private_file(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "etc" / "ssl" / "private").mkdir(parents=True)
    (tmp_path / "etc" / "ssl" / "private").chmod(0o700)
    (tmp_path / "etc" / "shadow").write_text("root:hash")
    (tmp_path / "etc" / "shadow").chmod(0o640)
    (tmp_path / "etc" / "hosts").write_text("x")
    for private in ("root", "home/alice", "srv/data", "opt/tool", "work/tree"):
        (tmp_path / private).mkdir(parents=True)
    argv = bwrap_argv(SandboxSpec(["prog"], {}), host_root=tmp_path)
    sources = {argv[i + 1] for i, arg in enumerate(argv) if arg in ("--ro-bind", "--bind")}
    assert sources == {str(tmp_path / "usr"), str(tmp_path / "etc"), "/dev/null"}
    shadow, private = argv.index("/etc/shadow"), argv.index("/etc/ssl/private")
    assert argv[shadow - 2:shadow] == ["--ro-bind", "/dev/null"]  # unopenable: a device on a nodev mount
    assert argv[private - 3:private] == ["--perms", "0000", "--tmpfs"]
    assert shadow > argv.index(str(tmp_path / "etc")) and private > argv.index(str(tmp_path / "etc"))
    # where /etc must hold a mount point, it is made entry by entry and its private entries are left out
    argv = bwrap_argv(SandboxSpec(["prog"], {}, mounts=[sandbox.Mount(Path("/v"), "/etc/tls")]), host_root=tmp_path)
    assert str(tmp_path / "etc" / "hosts") in argv and str(tmp_path / "etc" / "ssl") in argv
    assert "/etc/shadow" not in argv
    private = argv.index("/etc/ssl/private")  # still covered in /etc/ssl, bound whole
    assert argv[private - 3:private] == ["--perms", "0000", "--tmpfs"]


def test_volume_ownership_for_an_fs_group(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir(mode=0o755)
    (tmp_path / "sub" / "disk.img").write_bytes(b"x")
    (tmp_path / "sub" / "disk.img").chmod(0o600)
    tmp_path.chmod(0o755)
    set_volume_ownership(tmp_path, 4242)
    for path, mode in ((tmp_path, 0o2775), (tmp_path / "sub", 0o2775), (tmp_path / "sub" / "disk.img", 0o660)):
        info = os.stat(path)
        assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (4242, mode), path
    os.chmod(tmp_path / "sub" / "disk.img", 0o600)
    set_volume_ownership(tmp_path, 4242, on_root_mismatch=True)  # the root matches: nothing walked
    assert stat.S_IMODE(os.stat(tmp_path / "sub" / "disk.img").st_mode) == 0o600
    set_volume_ownership(tmp_path, 4242, read_only=True)
    assert stat.S_IMODE(os.stat(tmp_path / "sub" / "disk.img").st_mode) == 0o640
