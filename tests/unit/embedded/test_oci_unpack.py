"""Unpacking pulled image layers on the local node as an attacker would write them: nothing lands
outside the root file system, whiteouts remove what lower layers left, and a runtime's rules pick
the command and the user."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

import pytest

from cdi.embedded.node.images import is_oci_image, oci_argv
from cdi.embedded.node.oci import UnsafeLayer, apply_layer, auth_file, loopback, registry_host, resolve
from cdi.embedded.node.sandbox import Mount, SandboxSpec, bwrap_argv, inside_image
from cdi.embedded.node.security import ImageUsers, identity


def layer(*entries: tuple[str, str, str | bytes]) -> io.BytesIO:
    """A tar of (kind, name, content-or-link) entries: kind is file, dir, sym or link."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for kind, name, content in entries:
            info = tarfile.TarInfo(name)
            info.mode = 0o755 if kind == "dir" else 0o644
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(content)
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.LNKTYPE, str(content)
                tar.addfile(info)
            else:
                data = content.encode() if isinstance(content, str) else content
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


@pytest.fixture
def root(tmp_path: Path) -> Path:
    rootfs = tmp_path / "image" / "rootfs"
    rootfs.mkdir(parents=True)
    return rootfs


def test_layers_stack_and_whiteouts_remove(root: Path) -> None:
    apply_layer(root, layer(("dir", "etc", ""), ("file", "etc/a", "1"), ("file", "etc/b", "2"),
                            ("dir", "var/cache", ""), ("file", "var/cache/x", "x"), ("file", "disk/d.img", "d")))
    apply_layer(root, layer(("file", "etc/.wh.a", ""), ("file", "var/cache/.wh..wh..opq", ""),
                            ("file", "var/cache/new", "n"), ("file", "./etc/b", "3")))
    assert not (root / "etc/a").exists() and (root / "etc/b").read_text() == "3"
    assert sorted(p.name for p in (root / "var/cache").iterdir()) == ["new"]
    assert (root / "disk/d.img").read_text() == "d"


@pytest.mark.parametrize("entries", [
    [("file", "../escaped", "x")],
    [("file", "a/../../escaped", "x")],
    [("file", "etc/.wh...", "")],
])
def test_entries_that_climb_out_are_refused(root: Path, entries: list[tuple[str, str, str]]) -> None:
    with pytest.raises(UnsafeLayer):
        apply_layer(root, layer(*entries))
    assert not (root.parent / "escaped").exists() and not (root.parent.parent / "escaped").exists()


def test_writes_through_planted_symlinks_stay_inside(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("host")
    apply_layer(root, layer(("sym", "abs", str(outside)), ("sym", "rel", "../../outside"),
                            ("sym", "file", str(outside / "victim"))))
    apply_layer(root, layer(("file", "abs/victim", "owned"), ("file", "rel/victim", "owned"),
                            ("file", "file", "replaced")))
    assert (outside / "victim").read_text() == "host"
    assert (root / outside.relative_to("/") / "victim").read_text() == "owned"  # the image's own path
    assert (root / "outside/victim").read_text() == "owned"  # .. stops at the image's root
    assert not (root / "file").is_symlink() and (root / "file").read_text() == "replaced"


def test_hard_links_must_name_a_file_of_the_image(root: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("host")
    apply_layer(root, layer(("file", "ok", "image"), ("link", "ok2", "ok")))
    assert (root / "ok2").read_text() == "image"
    with pytest.raises(UnsafeLayer):
        apply_layer(root, layer(("sym", "s", str(tmp_path / "secret")), ("link", "stolen", "s")))
    with pytest.raises(UnsafeLayer):
        apply_layer(root, layer(("link", "stolen", "../secret")))
    assert not (root / "stolen").exists()


def test_resolve_keeps_symlink_loops_and_dotdot_inside(root: Path) -> None:
    (root / "loop").symlink_to("loop")
    with pytest.raises(UnsafeLayer):
        resolve(root, "loop/x")
    assert resolve(root, "../../../etc/passwd") == root / "etc/passwd"


def test_setuid_bits_and_devices_are_not_created(root: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("suid")
        info.mode, info.size = 0o4755, 1
        tar.addfile(info, io.BytesIO(b"x"))
        device = tarfile.TarInfo("dev")
        device.type, device.devmajor, device.devminor = tarfile.CHRTYPE, 1, 3
        tar.addfile(device)
    out.seek(0)
    apply_layer(root, out)
    assert (root / "suid").stat().st_mode & 0o7777 == 0o755
    assert not (root / "dev").exists()


def test_which_images_are_pulled_and_what_they_run() -> None:
    assert is_oci_image("127.0.0.1:5000/e2e/disk:v1", ["/shared/server"])
    assert is_oci_image("docker.io/library/busybox:1.36", None)
    assert not is_oci_image("debian", ["sh"]) and not is_oci_image("quay.io/kubevirt/cdi-importer:v1", None)
    assert oci_argv(None, None, ["/ep"], ["cmd"]) == ["/ep", "cmd"]
    assert oci_argv(None, ["a"], ["/ep"], ["cmd"]) == ["/ep", "a"]
    assert oci_argv(["/c"], None, ["/ep"], ["cmd"]) == ["/c"]


def test_registry_hosts_auth_and_image_users() -> None:
    assert registry_host("127.0.0.1:5000/a/b:v1") == "127.0.0.1:5000" and registry_host("busybox") == "docker.io"
    assert loopback("127.0.0.1:5000") and loopback("localhost:5000") and not loopback("quay.io")
    config = base64.b64encode(json.dumps({"auths": {"https://r.example:5000": {
        "username": "u", "password": "p"}}}).encode()).decode()
    auths = auth_file([{"data": {".dockerconfigjson": config}}])
    assert auths == {"auths": {"r.example:5000": {"auth": base64.b64encode(b"u:p").decode()}}}
    users = ImageUsers("app", (("app", "x", "1000", "1000", "", "/home/app", "/bin/sh"),),
                       (("wheel", "x", "10", "app"),))
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u"}, "spec": {}}
    who = identity(pod, {"name": "c"}, users)
    assert (who.uid, who.gid, who.groups, who.home) == (1000, 1000, (10,), "/home/app")
    forced = identity({**pod, "spec": {"securityContext": {"fsGroup": 107}}}, {"name": "c", "securityContext": {
        "runAsUser": 107}}, ImageUsers())
    assert (forced.uid, forced.gid, forced.groups) == (107, 0, (107,))


def test_mount_points_through_an_image_symlink_stay_in_the_image(root: Path) -> None:
    """bwrap makes mount points before it enters the new root: an image's `x -> /root` must not make
    it create /root/y on the host."""
    apply_layer(root, layer(("sym", "x", "/root"), ("sym", "loop", "loop"), ("dir", "disk", "")))
    spec = SandboxSpec(argv=["/bin/true"], env={}, rootfs=root, working_dir="/x/work",
                       mounts=[Mount(root / "disk", "/x/y"), Mount(root / "disk", "/shared")],
                       helpers=[Mount(Path("/lib64/ld-linux-x86-64.so.2"), "/dev/.cdi-runtime/ld-linux-x86-64.so.2")])
    argv = bwrap_argv(spec)
    assert "/x/y" not in argv and "/root/y" in argv and "/shared" in argv
    assert argv[argv.index("--chdir") + 1] == "/root/work"
    assert inside_image(root, "/") == "/"
    with pytest.raises(ValueError, match="symbolic links"):
        inside_image(root, "/loop/y")
