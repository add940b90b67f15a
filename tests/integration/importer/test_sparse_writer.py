"""The importer's writer on a real file: O_DIRECT around the page cache where the filesystem takes it,
the unaligned ends through it, zero blocks kept sparse, and the same bytes whichever way they went."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from cdi.importer.sparse_writer import DIRECT_ALIGN, GRANULARITY, SparseWriter, WriteBehind, open_direct


def _cached_bytes(path: Path) -> int:
    """Bytes of the file in the page cache, as util-linux's fincore reports them."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "disk.img"
    path.touch()
    fd = os.open(path, os.O_RDWR)
    try:
        direct = open_direct(fd)
    finally:
        os.close(fd)
    if direct is None:
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT")
    os.close(direct)
    return path


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_writes_at_any_offset_land_byte_for_byte(target: Path, direct: bool) -> None:
    """Writes of every alignment (inside one block, across blocks, whole MiBs), with zero runs inside
    them, read back as the model says, from several threads at once as the range workers write."""
    rng = random.Random(6)
    size = 24 << 20
    model = bytearray(size)
    writes = []
    for i in range(size // (1 << 20)):
        base = i << 20
        length = rng.choice([1, 100, DIRECT_ALIGN - 1, DIRECT_ALIGN, DIRECT_ALIGN + 3, 3 * GRANULARITY + 17,
                             (1 << 20) - base % 4096])
        offset = base + rng.randrange(0, (1 << 20) - length + 1)
        data = bytearray(rng.randbytes(length))
        if length > 2 * GRANULARITY:
            data[GRANULARITY:2 * GRANULARITY] = bytes(GRANULARITY)  # a zero run inside a write
        model[offset:offset + length] = data
        writes.append((offset, data))
    fd = os.open(target, os.O_RDWR)
    try:
        writer = SparseWriter(fd, known_zero=True, direct=direct)
        assert writer.direct is direct
        behind = [WriteBehind(writer) for _ in range(3)]
        for n, (offset, data) in enumerate(writes):
            behind[n % 3].write(offset, data)
        for b in behind:
            b.close()
        os.ftruncate(fd, size)
        writer.sync()
        writer.close()
    finally:
        os.close(fd)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == hashlib.sha256(model).hexdigest()


@pytest.mark.skipif(shutil.which("fincore") is None, reason="fincore (util-linux) is not installed")
def test_a_large_direct_write_leaves_the_page_cache_empty_and_holes_sparse(target: Path) -> None:
    """64 MiB of data and 64 MiB of zeros: the data goes to disk without passing through the page cache
    (the pod's memory does not grow with the image), the zeros are a hole."""
    chunk = bytearray(random.Random(7).randbytes(1 << 20))
    fd = os.open(target, os.O_RDWR)
    try:
        writer = SparseWriter(fd, known_zero=True)
        assert writer.direct
        for i in range(64):
            writer.write_at(i << 20, chunk)
        writer.write_at(64 << 20, bytes(64 << 20))
        os.ftruncate(fd, 128 << 20)
        assert _cached_bytes(target) < 1 << 20  # before any flush: nothing was ever in the cache
        writer.sync()
        writer.close()
    finally:
        os.close(fd)
    assert os.stat(target).st_blocks * 512 <= (64 << 20) + (1 << 20)
    with target.open("rb") as f:
        assert f.read(1 << 20) == chunk
        f.seek(127 << 20)
        assert f.read() == bytes(1 << 20)


def test_where_o_direct_is_refused_writes_go_through_the_page_cache(
        target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused when opening (a filesystem without O_DIRECT, simulated) or when writing (here for real: the
    kernel's EINVAL for a buffer that is not aligned): the same bytes land, through the page cache."""
    import mmap

    from cdi.importer import sparse_writer

    data = random.Random(8).randbytes(3 << 20)
    fd = os.open(target, os.O_RDWR)
    try:
        monkeypatch.setattr(sparse_writer, "open_direct", lambda fd: None)
        writer = SparseWriter(fd, known_zero=True)
        assert not writer.direct
        writer.write_at(0, data, 0, 1 << 20)
        monkeypatch.undo()
        writer = SparseWriter(fd, known_zero=True)
        assert writer.direct
        area = mmap.mmap(-1, 2 << 20)
        unaligned = memoryview(area)[1:(1 << 20) + 1], sparse_writer._address(area) + 1
        monkeypatch.setattr(writer, "_bounce", lambda: unaligned)
        writer.write_at(1 << 20, data, 1 << 20, 3 << 20)
        assert not writer.direct
        writer.sync()
        writer.close()
    finally:
        os.close(fd)
    assert target.read_bytes() == data


def test_close_releases_the_second_descriptor(target: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    fd = os.open(target, os.O_RDWR)
    try:
        writer = SparseWriter(fd, known_zero=True)
        assert writer.direct and len(os.listdir("/proc/self/fd")) == before + 2
        writer.close()
        writer.close()
        assert len(os.listdir("/proc/self/fd")) == before + 1
        writer.write_at(0, b"after close")  # buffered from now on
    finally:
        os.close(fd)
    assert target.read_bytes() == b"after close"


@pytest.mark.parametrize("data_type", [bytes, bytearray])
def test_blocks_that_start_with_zeros_are_data_and_zero_blocks_stay_holes(target: Path, data_type: type) -> None:
    """A chunk whose blocks all start with a non-zero byte is written in one go; one where some block
    starts with zeros is looked at block by block: zeros at the start of a block are still data, a
    whole block of zeros (not at a block boundary of the chunk: the write starts mid-block) a hole."""
    rng = random.Random(9)
    plain = rng.randbytes(1 << 20).replace(b"\0", b"\1")
    mixed = bytearray(rng.randbytes(1 << 20))
    for block in range(0, len(mixed), GRANULARITY):
        mixed[block:block + 100] = bytes(100)  # every block of the chunk starts with zeros, and holds data
    shift = GRANULARITY // 2  # the chunk's blocks straddle the target's
    mixed[shift + 4 * GRANULARITY:shift + 8 * GRANULARITY] = bytes(4 * GRANULARITY)  # 3 whole target blocks
    fd = os.open(target, os.O_RDWR)
    try:
        writer = SparseWriter(fd, known_zero=True)
        writer.write_at(0, data_type(plain))
        writer.write_at((1 << 20) + shift, data_type(mixed), shift, len(mixed))
        os.ftruncate(fd, 2 << 20)
        writer.sync()
        writer.close()
    finally:
        os.close(fd)
    expected = plain + bytes(shift) + bytes(mixed[shift:])
    assert target.read_bytes() == expected
    holes = (1 << 20) + 5 * GRANULARITY
    with target.open("rb") as f:
        assert os.lseek(f.fileno(), 1 << 20, os.SEEK_HOLE) == (1 << 20)  # before `shift`: never written
        assert os.lseek(f.fileno(), holes, os.SEEK_HOLE) == holes  # the zero blocks were skipped


def test_write_behind_of_depth_0_writes_in_the_callers_thread(target: Path) -> None:
    """No thread, no queue: the write is on the target when `write` returns, and its error raised there."""
    fd = os.open(target, os.O_RDWR)
    try:
        writer = SparseWriter(fd, known_zero=True)
        inline = WriteBehind(writer, depth=0)
        assert inline.thread is None
        inline.write(0, b"x" * DIRECT_ALIGN)
        assert writer.bytes_written == DIRECT_ALIGN
        with pytest.raises(ValueError, match=r"bytes 0\.\.9 of a buffer of 8"):
            writer.write_at(1 << 20, bytearray(8), 0, 9)
        inline.close()
        writer.sync()
        writer.close()
    finally:
        os.close(fd)
    assert target.read_bytes() == b"x" * DIRECT_ALIGN
