"""The resumable prefix of a raw upload, recorded where a restarted upload server finds it.

A raw upload is written in place as it arrives, so after a break the first N bytes of the image are on
the volume and the client only needs to send the rest (`cdi.api.upload`). N used to live in the upload
server's memory and died with the pod. It is now written, after an fdatasync of the volume, to a small
file (`.cdi-upload-state`): next to `disk.img` on a Filesystem volume (it lives and dies with the
volume), and for a Block volume on scratch when it is mounted, else in the directory `UPLOAD_STATE_DIR`
names (our controller mounts an emptyDir there: it survives a restart of the container, not the
deletion of the pod).

The record is never taken on trust. It holds the sha256 of a few regions of the kept bytes, as read
back from the volume after the flush: the first 64 KiB, six 64 KiB samples spread over the prefix and
its last MiB. A restarted server reads those regions from the volume again and uses the record only
when all of them match and the volume is long enough; a stale record (the volume was written since, or
a different upload started), a forged one or an unreadable one is removed and the upload starts over.
The same digests go to the client with the offset (`Upload-Kept-Sha256`), which resumes only when
they match its own file, so a second upload of a different image never continues the first one. The
record is removed when an upload starts over and when the upload completes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cdi.importer.target import write_file_atomic

log = logging.getLogger(__name__)

FILE_NAME = ".cdi-upload-state"
VERSION = 1
SAMPLE = 64 << 10  # bytes per sampled region
SAMPLES = 6  # between the head and the tail
TAIL = 1 << 20  # the last bytes written, where a torn or stale write would show first


@dataclass(frozen=True)
class Region:
    start: int
    length: int
    sha256: str

    def header(self) -> str:
        return f"{self.start}+{self.length}={self.sha256}"


@dataclass(frozen=True)
class Kept:
    offset: int
    regions: tuple[Region, ...]

    def header(self) -> str:
        """The value of `Upload-Kept-Sha256`."""
        return ", ".join(r.header() for r in self.regions)


def regions_of(offset: int) -> list[tuple[int, int]]:
    """(start, length) of the regions checked for a prefix of `offset` bytes, in order, without overlap."""
    if offset <= 0:
        return []
    spans = {(0, min(SAMPLE, offset))}
    for i in range(1, SAMPLES + 1):
        start = (offset * i // (SAMPLES + 1)) // 4096 * 4096
        spans.add((start, min(SAMPLE, offset - start)))
    tail = max(0, offset - TAIL)
    spans.add((tail, offset - tail))
    out: list[tuple[int, int]] = []
    for start, length in sorted(spans):
        if out and start <= out[-1][0] + out[-1][1]:  # overlapping: one region
            first, size = out[-1]
            out[-1] = (first, max(first + size, start + length) - first)
        elif length:
            out.append((start, length))
    return out


def digest_regions(fd: int, spans: list[tuple[int, int]]) -> list[Region] | None:
    """The regions' sha256 as read from `fd`; None when it ends before one of them."""
    out = []
    for start, length in spans:
        data = os.pread(fd, length, start)
        if len(data) != length:
            return None
        out.append(Region(start, length, hashlib.sha256(data).hexdigest()))
    return out


def record(destination: Path, offset: int) -> Kept:
    """Read the kept prefix's regions back from the volume (already flushed) and describe them."""
    fd = os.open(destination, os.O_RDONLY)
    try:
        regions = digest_regions(fd, regions_of(offset))
    finally:
        os.close(fd)
    if regions is None:
        raise OSError(f"{destination} is shorter than the {offset} bytes to keep")
    return Kept(offset, tuple(regions))


def save(path: Path, kept: Kept) -> None:
    body = {"version": VERSION, "offset": kept.offset,
            "regions": [[r.start, r.length, r.sha256] for r in kept.regions]}
    write_file_atomic(path, json.dumps(body).encode())


def remove(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def load(path: Path | None, destination: Path) -> Kept | None:
    """The record at `path`, when the volume still holds what it describes; otherwise it is removed."""
    if path is None:
        return None
    try:
        body = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring the unreadable resume record %s: %s", path, exc)
        remove(path)
        return None
    why = _invalid(body, destination)
    if why:
        log.warning("not resuming from %s: %s", path, why)
        remove(path)
        return None
    kept = Kept(int(body["offset"]), tuple(Region(int(s), int(n), str(d)) for s, n, d in body["regions"]))
    log.info("%d bytes of an earlier upload are on the volume, verified; an upload can continue there", kept.offset)
    return kept


def _invalid(body: object, destination: Path) -> str:
    """Why the record cannot be trusted ("" when it can)."""
    if not isinstance(body, dict) or body.get("version") != VERSION:
        return "unknown format"
    offset = body.get("offset")
    regions = body.get("regions")
    if not isinstance(offset, int) or offset <= 0 or not isinstance(regions, list):
        return "unknown format"
    try:
        recorded = [(int(s), int(n), str(d)) for s, n, d in regions]
    except (TypeError, ValueError):
        return "unknown format"
    expected = regions_of(offset)
    if [(s, n) for s, n, _ in recorded] != expected:
        return "its regions do not cover its offset"  # a record this code would never write
    try:
        fd = os.open(destination, os.O_RDONLY)
    except OSError as exc:
        return f"cannot read the volume: {exc}"
    try:
        if os.lseek(fd, 0, os.SEEK_END) < offset:
            return f"the volume holds fewer than its {offset} bytes"
        actual = digest_regions(fd, expected)
    except OSError as exc:
        return f"cannot read the volume: {exc}"
    finally:
        os.close(fd)
    if actual is None or [r.sha256 for r in actual] != [d for _, _, d in recorded]:
        return "the volume no longer holds the bytes it describes"
    return ""
