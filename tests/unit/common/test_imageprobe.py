"""The scratch rule and the head sniffing the controller decides it from."""

from __future__ import annotations

import gzip
import os

import pytest
import zstandard

from cdi.common import imageprobe as ip


def qcow2_header(version: int = 3, incompatible: int = 0) -> bytes:
    head = bytearray(512)
    head[0:4] = b"QFI\xfb"
    head[4:8] = version.to_bytes(4, "big")
    head[72:80] = incompatible.to_bytes(8, "big")
    return bytes(head)


@pytest.mark.parametrize(
    ("fmt", "compression", "access", "expected"),
    [
        (ip.RAW, "gz", ip.ACCESS_STREAM, False),  # raw streams, however it arrives
        (ip.ISO, None, ip.ACCESS_STREAM, False),
        (ip.QCOW2, None, ip.ACCESS_STREAM, False),  # one-pass conversion
        (ip.QCOW2, "xz", ip.ACCESS_NBD, False),
        (ip.VMDK, None, ip.ACCESS_NBD, False),  # qemu-img reads it in place through nbdkit
        (ip.VMDK, None, ip.ACCESS_STREAM, True),
        (ip.VHDX, "gz", ip.ACCESS_NBD, True),  # qemu-img cannot seek in a compressed file
        (ip.VDI, None, ip.ACCESS_RANGES, True),
    ],
)
def test_scratch_only_where_qemu_img_must_seek(fmt: str, compression: str | None, access: str, expected: bool) -> None:
    assert ip.needs_scratch(fmt, compression, access) is expected


def test_qcow2_with_extended_l2_goes_to_qemu_img() -> None:
    extended = qcow2_header(incompatible=1 << 4)
    assert ip.qcow2_extended_l2(extended) and not ip.qcow2_extended_l2(qcow2_header())
    assert not ip.qcow2_extended_l2(qcow2_header(version=2, incompatible=1 << 4))  # v2 has no such field
    assert ip.needs_scratch(ip.QCOW2, "gz", ip.ACCESS_STREAM, extended_l2=True)


def test_sniff_sees_through_compression() -> None:
    assert ip.sniff(gzip.compress(qcow2_header() + bytes(4096))) == (ip.GZIP, ip.QCOW2)


def test_zstd_head_whose_first_block_exceeds_64_kib() -> None:
    """Incompressible data makes zstd blocks of ~128 KiB: the head must hold a whole one."""
    data = qcow2_header() + os.urandom(1 << 20)
    compressed = zstandard.ZstdCompressor().compress(data)
    assert ip.sniff(compressed[: ip.HEAD_BYTES]) == (ip.ZSTD, ip.QCOW2)


def test_zstd_bomb_decompresses_to_a_bounded_head() -> None:
    bomb = zstandard.ZstdCompressor().compress(bytes(1 << 30))
    assert len(bomb) < ip.HEAD_BYTES
    assert len(ip.decompress_head(bomb, ip.ZSTD)) == ip.HEAD_BYTES


def test_the_importer_recognises_formats_by_the_same_table() -> None:
    """One magic table (`ip.MAGICS`): what the controller reads from a head is what the
    importer detects (or refuses by name), so the two cannot drift apart."""
    from cdi.importer import formats
    from cdi.importer.errors import ImporterError

    for offset, magic, kind in ip.MAGICS:
        head = bytearray(1 << 20)
        head[offset : offset + len(magic)] = magic
        expected = ip.detect_format(bytes(head))
        if kind in (ip.COWD, ip.QED, ip.LUKS, ip.PARALLELS,
                    ip.VMDK_DESCRIPTOR):
            with pytest.raises(ImporterError):
                formats.probe(bytes(head), len(head))
            continue
        message = ""
        try:
            info = formats.probe(bytes(head), len(head))
        except ImporterError as exc:  # a header of zeros is refused as invalid, after being recognised
            message = exc.message
        if message:
            assert expected in message, (kind, message)
        else:
            assert info.format == expected, kind
