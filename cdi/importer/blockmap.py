"""What the block-map readers (vdi, vhd, vhdx) share: a list of allocated blocks checked and turned
into the extent map the qcow2 and vmdk routes already fetch and write.

These three formats are one table that maps each fixed-size block of the disk to an offset in the
file (or to nothing: zeros). qemu-img reading them through nbdkit-curl asked for one block at a
time, one request after the other; reading the table first and fetching the blocks in file order,
in spans of a few MiB by several workers, writes them in place like a qcow2 (no scratch, resumable).

Every offset comes from the image, so from whoever made it: a block must lie inside the file and
past the tables, two blocks must not share file bytes, and the table must fit the disk it
describes. Anything else ends the import as an invalid image before a data byte is fetched.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ImporterError, Reason
from .qcow2 import MAX_EXTENTS, NotNative, Qcow2Map

MAX_TABLE = 256 << 20  # bytes of block table held in memory (a 256 MiB vdi map is a 64 PiB disk)


@dataclass(frozen=True)
class BlockHeader:
    """What `Qcow2Map` and `ClusterWriter` ask of a header: the disk size and the block size."""

    size: int  # disk bytes
    cluster_size: int  # bytes per block
    compression_type: int = 0  # never compressed


def invalid(fmt: str, message: str) -> ImporterError:
    return ImporterError(Reason.INVALID_IMAGE, f"{fmt}: {message}")


def check_table(fmt: str, what: str, offset: int, length: int, file_size: int) -> None:
    if length > MAX_TABLE:
        raise NotNative(f"a {length}-byte {what} is more than the importer holds")
    if offset < 0 or length < 0 or offset + length > file_size:
        raise invalid(fmt, f"the {what} ({length} bytes at {offset}) lies beyond the end of the file")


def build_map(
    fmt: str,
    header: BlockHeader,
    blocks: list[tuple[int, int]],
    *,
    file_size: int,
    data_start: int,
    data_end: int | None = None,
    reserved: tuple[tuple[int, int], ...] = (),
    max_piece: int,
) -> Qcow2Map:
    """The extent map of `blocks`, (file offset, disk offset) of each allocated block.

    Each block holds `header.cluster_size` bytes (the last one is cut at the disk's end); it must
    lie in [data_start, data_end) of the file, share no byte with another block nor with a
    `reserved` (offset, length) range (the tables, a log, a footer). Blocks next to
    each other in the file and on the disk become one extent of at most `max_piece` bytes."""
    end_of_data = file_size if data_end is None else data_end
    size, block = header.size, header.cluster_size
    m = Qcow2Map(header, file_size)  # type: ignore[arg-type]  # BlockHeader has what the map reads
    blocks.sort()
    run_host = run_guest = run_len = -1
    previous_end = data_start
    for host, guest in blocks:
        if guest >= size:
            continue
        length = min(block, size - guest)
        if host < data_start or host + length > end_of_data:
            raise invalid(
                fmt,
                f"the block at disk offset {guest} lies outside the file's data area "
                f"({host} + {length} bytes, data area [{data_start}, {end_of_data}))",
            )
        if host < previous_end:
            raise invalid(fmt, f"the block at disk offset {guest} overlaps another block at file offset {host}")
        previous_end = host + length
        for start, n in reserved:
            if host < start + n and start < host + length:
                raise invalid(fmt, f"the block at disk offset {guest} overlaps the image's metadata at {start}")
        if run_len > 0 and host == run_host + run_len and guest == run_guest + run_len and run_len < max_piece:
            run_len += length
            continue
        if run_len > 0:
            _pieces(m, run_host, run_guest, run_len, max_piece)
        run_host, run_guest, run_len = host, guest, length
    if run_len > 0:
        _pieces(m, run_host, run_guest, run_len, max_piece)
    if len(m) > MAX_EXTENTS:
        raise NotNative(f"more than {MAX_EXTENTS} extents")
    return m


def _pieces(m: Qcow2Map, host: int, guest: int, length: int, max_piece: int) -> None:
    """Extents of at most `max_piece` bytes, so that spans (and their buffers) stay bounded."""
    while length > 0:
        n = min(length, max_piece)
        m.host.append(host)
        m.guest.append(guest)
        m.length.append(n)
        m.csize.append(0)
        host, guest, length = host + n, guest + n, length - n
