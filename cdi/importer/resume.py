"""The resume checkpoint: which spans of an import are durably on the target.

CDI starts every attempt from byte 0 (CDI#2110: 64% -> 4% after a restart; CDI#2694: a clone
restarted at 97%, 99 times). Range-read imports (raw and qcow2 over HTTP/S3) process spans in a
fixed order; after each fdatasync the number of leading spans that are complete is recorded here,
next to disk.img (`/data/.cdi-import-state`) or, for Block volumes, on scratch if mounted. A new
attempt whose source still has the same identity (URL or bucket/key, size, ETag, Last-Modified) and
whose plan is the same continues from there; anything else starts over. The file is removed when
the import completes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .checksum import Hasher
from .errors import ImporterError, Reason
from .sparse_writer import SparseWriter
from .target import write_file_atomic

log = logging.getLogger(__name__)
VERSION = 1


@dataclass
class ImportState:
    identity: dict[str, Any]
    plan: dict[str, Any]  # route, span size, target size ... whatever fixes the span order
    done_spans: int
    done_bytes: int
    version: int = VERSION

    def matches(self, identity: dict[str, Any] | None, plan: dict[str, Any]) -> bool:
        return (
            identity is not None
            and self.version == VERSION
            and self.identity == identity
            and self.plan == plan
        )


def load(path: Path | None) -> ImportState | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        return ImportState(**data)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        log.warning("ignoring unreadable resume state %s: %s", path, exc)
        return None


def save(path: Path | None, state: ImportState) -> None:
    if path is not None:
        write_file_atomic(path, json.dumps(asdict(state), sort_keys=True).encode())


def remove(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class Checkpointer:
    """fdatasync + resume state every `every_bytes` or `every_seconds` (also while the fetch is stalled,
    and once more when the importer is stopped), so a new attempt resumes close to where this one was.
    `path` None disables it (no state location, or a source without a stable identity)."""

    def __init__(
        self,
        writer: SparseWriter,
        path: Path | None,
        identity: dict[str, Any],
        plan: dict[str, Any],
        *,
        spans: int,
        done: int,
        every_bytes: int,
        every_seconds: float,
    ) -> None:
        self.writer = writer
        self.path = path
        self.identity = identity
        self.plan = plan
        self.every_bytes = every_bytes
        self.every_seconds = every_seconds
        self.spans = self.saved_spans = spans
        self.done_bytes = self.saved_bytes = done
        self.last_time = time.monotonic()

    def done(self, spans: int, done_bytes: int) -> None:
        """The first `spans` spans (`done_bytes` bytes) are written."""
        self.spans, self.done_bytes = spans, done_bytes
        if done_bytes - self.saved_bytes >= self.every_bytes or self._due():
            self.save()

    def idle(self) -> None:
        if self._due():
            self.save()

    def _due(self) -> bool:
        return self.spans > self.saved_spans and time.monotonic() - self.last_time >= self.every_seconds

    def save(self) -> None:
        if self.path is None or self.spans <= self.saved_spans:
            return
        self.writer.sync()
        save(self.path, ImportState(self.identity, self.plan, self.spans, self.done_bytes))
        self.saved_spans, self.saved_bytes, self.last_time = self.spans, self.done_bytes, time.monotonic()
        log.info("checkpoint: %d bytes durably written", self.done_bytes)


def rehash_prefix(fd: int, end: int, hasher: Hasher) -> None:
    """Hash the first `end` bytes of the target again: for a resumed raw import they are the
    source's bytes, so a checksum covers the whole image without fetching the prefix again."""
    zeros = bytes(1 << 20)
    offset = 0
    while offset < end:
        try:
            data_at = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:
            data_at = end
        hole = min(data_at, end) - offset
        while hole > 0:
            n = min(hole, len(zeros))
            hasher.update(memoryview(zeros)[:n])
            hole -= n
        offset = min(data_at, end)
        if offset >= end:
            break
        try:
            hole_at = min(os.lseek(fd, offset, os.SEEK_HOLE), end)
        except OSError:
            hole_at = end
        while offset < hole_at:
            chunk = os.pread(fd, min(4 << 20, hole_at - offset), offset)
            if not chunk:
                raise ImporterError(Reason.INTERNAL_ERROR, "the target is shorter than its resume state says")
            hasher.update(chunk)
            offset += len(chunk)
