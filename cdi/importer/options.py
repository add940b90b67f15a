"""What one import is asked to do (`ImportOptions`): the target's sizing rules, the checksum, scratch
and the tuning of range reads.

Its own module because both the pipeline (which picks a route) and every route (through
`routes.context.ImportContext`) read it, and the pipeline imports the routes: kept in either, it
would tie the two into a circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cdi.api import env as envnames

from .checksum import Checksum


@dataclass
class ImportOptions:
    content_type: str = envnames.CONTENT_KUBEVIRT
    requested_size: int | None = None  # IMPORTER_IMAGE_SIZE in bytes
    filesystem_overhead: str = "0"
    preallocation: bool = False
    checksum: Checksum | None = None
    scratch_dir: Path | None = None  # None: no scratch volume mounted
    workers: int = 4  # parallel range requests
    span_size: int = 4 << 20  # bytes per range request
    window: int = 16  # span buffers in flight (memory = window x span_size)
    checkpoint_bytes: int = 256 << 20  # fdatasync + resume checkpoint every ... bytes
    checkpoint_seconds: float = 2.0  # ... or seconds, whichever comes first
    resume: bool = True
