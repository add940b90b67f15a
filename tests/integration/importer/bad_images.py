"""Images the importer must refuse, made with qemu-img or by patching a header byte or two."""

from __future__ import annotations

import gzip
import io
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

from tests.support.images import Image, file_name


def _qemu(*args: str) -> None:
    for _ in range(5):  # a LUKS key's PBKDF2 iteration count comes from timing a trial run, see below
        result = subprocess.run(["qemu-img", *args], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            return
        if _UNTIMED not in result.stderr:
            break
    raise RuntimeError(f"qemu-img {' '.join(args)}: {result.stderr}")


# qemu refuses to create a LUKS key when its trial PBKDF2 run shows no CPU time for its thread, which happens
# now and then on a busy shared VM (seen once in a full test run: every test using these images errored).
_UNTIMED = "Unable to get accurate CPU usage"


def _patch(src: Path, dst: Path, offset: int, data: bytes) -> None:
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _tar(dst: Path, members: list[tarfile.TarInfo], contents: dict[str, bytes] | None = None) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
        for info in members:
            data = (contents or {}).get(info.name)
            if data is not None:
                info.size = len(data)
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    dst.write_bytes(out.getvalue())


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    return info


def build_bad_images(directory: Path, images: dict[str, Image]) -> None:
    d = directory
    qcow2 = images[file_name("qcow2")].path
    _qemu("create", "-f", "qcow2", str(d / "bad-base.qcow2"), "12M")
    _qemu("create", "-f", "qcow2", "-b", "bad-base.qcow2", "-F", "qcow2", str(d / "backing.qcow2"))
    _qemu("create", "-f", "qcow2", "-o", f"data_file={d / 'datafile.raw'}", str(d / "datafile.qcow2"), "12M")
    _qemu(
        "create",
        "-f",
        "qcow2",
        "--object",
        "secret,id=s0,data=secret",
        "-o",
        "encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=100",
        str(d / "encrypted.qcow2"),
        "12M",
    )
    _qemu("create", "-f", "vmdk", "-o", "subformat=twoGbMaxExtentSparse", str(d / "split.vmdk"), "12M")
    _qemu("create", "-f", "qed", str(d / "image.qed"), "12M")
    _qemu(
        "create",
        "-f",
        "luks",
        "--object",
        "secret,id=s0,data=secret",
        "-o",
        "key-secret=s0,iter-time=100",
        str(d / "image.luks"),
        "12M",
    )
    _qemu("create", "-f", "qcow2", str(d / "big.qcow2"), "1G")
    with open(d / "big.img", "wb") as f:  # a 40 MiB raw image, too large for every test volume
        f.write(b"x" * 4096)
        f.truncate(40 << 20)
    # a vmdk whose embedded descriptor lists extents in other files
    vmdk = images[file_name("vmdk")].path
    header = vmdk.read_bytes()[:512]
    desc_offset, desc_size = struct.unpack_from("<QQ", header, 28)
    descriptor = (
        b'# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType="monolithicSparse"\n'
        b'RW 12288 SPARSE "extents.vmdk"\nRW 12288 FLAT "/etc/shadow" 0\n'
    )
    _patch(vmdk, d / "extents.vmdk", desc_offset * 512, descriptor.ljust(desc_size * 512, b"\x00"))
    _patch(images[file_name("vhd")].path, d / "diff.vhd", 60, struct.pack(">I", 4))
    _patch(images[file_name("vdi")].path, d / "diff.vdi", 0x4C, struct.pack("<I", 4))
    _patch(qcow2, d / "unknown-feature.qcow2", 72, struct.pack(">Q", 1 << 40))
    (d / "v1.qcow").write_bytes(b"QFI\xfb" + struct.pack(">I", 1) + bytes(4088))
    data = qcow2.read_bytes()
    (d / "truncated.qcow2").write_bytes(data[: len(data) // 2])
    gz = images[file_name("raw", "gz")].path.read_bytes()
    (d / "truncated.img.gz").write_bytes(gz[: len(gz) // 2])
    (d / "empty.img").write_bytes(b"")
    (d / "bomb.img.gz").write_bytes(gzip.compress(bytes(64 << 20), 1))
    # archives
    _tar(
        d / "absolute.tar",
        [_member("ok.txt"), _member("/etc/cdi-evil")],
        {"ok.txt": b"ok", "/etc/cdi-evil": b"x"},
    )
    _tar(
        d / "dotdot.tar",
        [_member("ok.txt"), _member("sub/../../cdi-evil")],
        {"ok.txt": b"ok", "sub/../../cdi-evil": b"x"},
    )
    _tar(
        d / "symlink.tar",
        [_member("ok.txt"), _member("escape", tarfile.SYMTYPE, "../../etc")],
        {"ok.txt": b"ok"},
    )
    _tar(
        d / "abs-symlink.tar", [_member("ok.txt"), _member("etc", tarfile.SYMTYPE, "/etc")], {"ok.txt": b"ok"}
    )
    _tar(
        d / "hardlink.tar",
        [_member("ok.txt"), _member("passwd", tarfile.LNKTYPE, "../../../etc/passwd")],
        {"ok.txt": b"ok"},
    )
    _tar(d / "big.tar", [_member("big.bin")], {"big.bin": b"\x01" * (40 << 20)})
