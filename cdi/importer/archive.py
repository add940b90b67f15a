"""Tar, read as a stream: the registry's image layers and the `archive` content type.

The reader parses headers itself (with tarfile's header decoder, plus pax and GNU long names) and
hands each member's contents out as a bounded sub-stream of the one underlying stream, so a
multi-GiB disk inside a layer is never copied or staged.

Extraction for `archive` content refuses, before writing each member, absolute paths, `..`
components, symlinks and hard links whose target leaves the volume, and writes through no
symlink that resolves outside it (CDI relies on a lexical join only). Device nodes and FIFOs are
skipped. When a member is refused, everything extracted so far is removed again, so the next
attempt starts from an empty volume."""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import shutil
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import ImporterError, Reason
from .sparse_writer import SparseWriter
from .streams import LimitedStream, Stream, as_bytes, read_exact, skip

log = logging.getLogger(__name__)

BLOCK = 512


@dataclass
class Member:
    name: str
    type: bytes
    size: int
    linkname: str
    mode: int

    @property
    def is_file(self) -> bool:
        return self.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)

    @property
    def is_dir(self) -> bool:
        return self.type == tarfile.DIRTYPE

    @property
    def is_symlink(self) -> bool:
        return self.type == tarfile.SYMTYPE

    @property
    def is_hardlink(self) -> bool:
        return self.type == tarfile.LNKTYPE


def _bad(message: str) -> ImporterError:
    return ImporterError(Reason.INVALID_IMAGE, f"tar: {message}")


class TarReader:
    """Iterate the members of a tar stream; `contents()` streams the current member's data."""

    def __init__(self, stream: Stream, what: str = "archive") -> None:
        self.stream = stream
        self.what = what
        self._current: LimitedStream | None = None
        self._padding = 0

    def _finish_current(self) -> None:
        if self._current is not None:
            skip(self._current, self._current.remaining)
            self._current = None
        if self._padding:
            if skip(self.stream, self._padding) != self._padding:
                raise _bad(f"{self.what} ends inside a member's padding")
            self._padding = 0

    def _read_data(self, size: int) -> bytes:
        data = read_exact(self.stream, size)
        if len(data) != size:
            raise _bad(f"{self.what} ends inside a header")
        pad = -size % BLOCK
        if pad:
            skip(self.stream, pad)
        return data

    def __iter__(self) -> Iterator[Member]:
        long_name: str | None = None
        long_link: str | None = None
        pax: dict[str, str] = {}
        while True:
            self._finish_current()
            block = read_exact(self.stream, BLOCK)
            if not block or block == bytes(BLOCK):
                return  # end of archive (two zero blocks, or a missing end marker)
            if len(block) < BLOCK:
                raise _bad(f"{self.what} ends inside a header")
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                raise _bad(f"bad header in {self.what}: {exc}") from exc
            if info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
                pax.update(_parse_pax(self._read_data(info.size)))
                continue
            if info.type == tarfile.XGLTYPE:
                self._read_data(info.size)
                continue
            if info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = self._read_data(info.size).split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
                continue
            if info.type == tarfile.GNUTYPE_LONGLINK:
                long_link = self._read_data(info.size).split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
                continue
            if info.type == tarfile.GNUTYPE_SPARSE or any(k.startswith("GNU.sparse.") for k in pax):
                raise ImporterError(
                    Reason.UNSUPPORTED_FORMAT, f"GNU sparse tar members are not supported ({info.name})"
                )
            name = pax.get("path", long_name or info.name)
            linkname = pax.get("linkpath", long_link or info.linkname)
            size = int(pax["size"]) if "size" in pax else info.size
            long_name = long_link = None
            pax = {}
            member = Member(name, info.type, size, linkname, info.mode)
            has_data = info.type not in (
                tarfile.SYMTYPE,
                tarfile.LNKTYPE,
                tarfile.DIRTYPE,
                tarfile.CHRTYPE,
                tarfile.BLKTYPE,
                tarfile.FIFOTYPE,
            )
            data_size = size if has_data else 0
            self._current = LimitedStream(self.stream, data_size, f"member {name} of {self.what}")
            self._padding = -data_size % BLOCK
            yield member

    def contents(self) -> Stream:
        """The data of the member just yielded (readable until the iteration moves on)."""
        assert self._current is not None
        return self._current

    def drain(self) -> None:
        """Read whatever follows the end of the archive (so a layer digest covers every byte)."""
        self._finish_current()
        while self.stream.read(4 << 20):
            pass


def _parse_pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError as exc:
            raise _bad("bad pax header") from exc
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


# -- safe extraction -----------------------------------------------------------------------------
def _unsafe(name: str, why: str) -> ImporterError:
    return ImporterError(Reason.UNSAFE_ARCHIVE, f"archive member {name!r} {why}; nothing was extracted")


def safe_relative(name: str) -> str:
    """The member's path relative to the volume, or UnsafeArchive."""
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(name, "has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _unsafe(name, "has a '..' path component")
    return "/".join(parts)


def clear_directory(root: Path) -> None:
    """Empty the volume (keeping lost+found), so an archive lands on a clean volume."""
    for entry in root.iterdir():
        if entry.name == "lost+found":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def extract(reader: TarReader, root: Path, limit: int, on_bytes: Callable[[int], None] | None = None) -> int:
    """Extract every member under `root`; returns the bytes of file data written."""
    root_real = os.path.realpath(root)
    written = 0
    try:
        for member in reader:
            rel = safe_relative(member.name)
            if not rel:
                continue
            dest = os.path.join(root_real, rel)
            parent = os.path.realpath(os.path.dirname(dest))
            if parent != root_real and not parent.startswith(root_real + os.sep):
                raise _unsafe(member.name, "is below a link that leaves the volume")
            if member.is_dir:
                os.makedirs(dest, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if member.is_symlink:
                if member.linkname.startswith("/"):
                    raise _unsafe(member.name, f"is a symlink to an absolute path ({member.linkname})")
                resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), member.linkname))
                if resolved == ".." or resolved.startswith("../"):
                    raise _unsafe(member.name, f"is a symlink that leaves the volume ({member.linkname})")
                _replace(dest)
                os.symlink(member.linkname, dest)
                continue
            if member.is_hardlink:
                target_rel = safe_relative(member.linkname)
                source = os.path.realpath(os.path.join(root_real, target_rel))
                if not source.startswith(root_real + os.sep):
                    raise _unsafe(member.name, f"is a hard link that leaves the volume ({member.linkname})")
                _replace(dest)
                os.link(source, dest, follow_symlinks=False)
                continue
            if not member.is_file:
                log.info("skipping special archive member %s (type %r)", member.name, member.type)
                continue
            if written + member.size > limit:
                raise ImporterError(
                    Reason.IMAGE_TOO_LARGE,
                    f"archive contents exceed the usable space of the volume ({limit} bytes)",
                )
            written += _write_member(reader.contents(), dest, member, on_bytes)
    except ImporterError:
        with contextlib.suppress(OSError):
            clear_directory(root)
        raise
    return written


def _replace(dest: str) -> None:
    if os.path.lexists(dest) and not os.path.isdir(dest):
        os.unlink(dest)


def _write_member(contents: Stream, dest: str, member: Member, on_bytes: Callable[[int], None] | None) -> int:
    _replace(dest)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        writer = SparseWriter(fd, known_zero=True, what=dest)
        pos = 0
        while True:
            chunk = contents.read(4 << 20)
            if not chunk:
                break
            writer.write_at(pos, as_bytes(chunk))
            pos += len(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
        os.ftruncate(fd, pos)
        os.fchmod(fd, member.mode & 0o777)
    finally:
        os.close(fd)
    return pos
