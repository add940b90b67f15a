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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
