"""The termination message: one line of JSON, at most 4096 bytes, read by the controller.

Kubernetes keeps at most 4096 bytes of `/dev/termination-log` (and CDI refuses to write more), so the
message is shrunk to fit rather than lost: first the free-text `message` is shortened, then the
image `labels` are dropped, never the fields the controller decides on (`reason`, `retryable`,
`scratchSpaceRequired`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_BYTES = 4096
COMPLETE_MESSAGE = "Import Complete"


@dataclass
class TerminationMessage:
    """CDI's fields (`scratchSpaceRequired`, `preallocationApplied`, `labels`, `message`) plus ours."""

    message: str
    reason: str
    retryable: bool
    scratch_space_required: bool = False
    preallocation_applied: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    virtual_size: int | None = None
    checksum: str | None = None
    bytes_transferred: int | None = None
    source_format: str | None = None
    route: str | None = None
    retries: int | None = None
    source_digest: str | None = None  # poll mode: the source's current version
    source_sha256: str | None = None  # hex sha256 of the source's bytes as received (the controller records it)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scratchSpaceRequired": self.scratch_space_required,
            "preallocationApplied": self.preallocation_applied,
            "message": self.message,
            "reason": self.reason,
            "retryable": self.retryable,
        }
        if self.labels:
            out["labels"] = dict(self.labels)
        optional = {
            "virtualSize": self.virtual_size,
            "checksum": self.checksum,
            "bytesTransferred": self.bytes_transferred,
            "sourceFormat": self.source_format,
            "route": self.route,
            "retries": self.retries,
            "sourceDigest": self.source_digest,
            "sourceSha256": self.source_sha256,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    def render(self) -> str:
        """The message as one line of at most MAX_BYTES bytes."""
        data = self.as_dict()
        text = _dumps(data)
        if len(text.encode()) <= MAX_BYTES:
            return text
        message = data["message"]
        overflow = len(text.encode()) - MAX_BYTES
        if len(message.encode()) > overflow + 16:
            data["message"] = _truncate(message, len(message.encode()) - overflow - 3) + "..."
            text = _dumps(data)
        if len(text.encode()) > MAX_BYTES and "labels" in data:
            del data["labels"]
            text = _dumps(data)
        while len(text.encode()) > MAX_BYTES:
            data["message"] = _truncate(data["message"], max(0, len(data["message"].encode()) - 256))
            text = _dumps(data)
        return text


def _dumps(data: dict[str, Any]) -> str:
    # json.dumps never emits raw newlines, so the result is a single line as kubelet expects
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _truncate(text: str, limit: int) -> str:
    return text.encode()[: max(0, limit)].decode(errors="ignore")


def write(path: Path, message: TerminationMessage) -> str:
    """Write the message where kubelet reads it; returns the line written."""
    line = message.render()
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        # a missing termination log must not turn a finished import into a failure
        pass
    return line
