"""The importer's failure taxonomy: every way an import can end, as a stable reason code.

The controller decides what to do with a failed import from two fields of the termination message
alone, `reason` and `retryable`, so this module is the one place where both are defined. Codes are
part of the worker-pod contract (DESIGN §3.1): add new ones, never rename or repurpose old ones.

Permanent failures (`retryable: false`) will fail again with the same inputs: a bad checksum, an
image that does not fit, an unsafe or unsupported image, a missing object, refused credentials.
Re-running the pod only burns bandwidth (CDI#3619: a too-small DataVolume re-downloaded forever).
Transient failures (network or server trouble) are retried inside the run; one that outlasts the
retry budget (IMPORTER_RETRY_BUDGET) ends the import with `retryable: false` and "gave up after N
attempts in Ts", because the budget is the whole time an import may spend on a source that does not
deliver. What still ends retryable (a changed source, a signal, a bug) gets a new attempt, which
resumes where this one stopped when it can.
"""

from __future__ import annotations

import errno
from enum import StrEnum


class Reason(StrEnum):
    """Stable reason codes of the termination message. Each member's meaning is in `REASONS`."""

    COMPLETE = "Complete"
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    IMAGE_TOO_LARGE = "ImageTooLarge"
    UNSUPPORTED_FORMAT = "UnsupportedFormat"
    BACKING_FILE_NOT_ALLOWED = "BackingFileNotAllowed"
    INVALID_IMAGE = "InvalidImage"
    UNSAFE_ARCHIVE = "UnsafeArchive"
    DISK_NOT_FOUND_IN_IMAGE = "DiskNotFoundInImage"
    NOT_FOUND = "NotFound"
    UNAUTHORIZED = "Unauthorized"
    TLS_ERROR = "TLSError"
    REQUEST_REJECTED = "RequestRejected"
    CONNECTION_FAILED = "ConnectionFailed"
    SERVER_ERROR = "ServerError"
    SOURCE_CHANGED = "SourceChanged"
    SCRATCH_SPACE_REQUIRED = "ScratchSpaceRequired"
    NO_SPACE_LEFT = "NoSpaceLeft"
    CONVERSION_FAILED = "ConversionFailed"
    INVALID_CONFIGURATION = "InvalidConfiguration"
    TERMINATED = "Terminated"
    INTERNAL_ERROR = "InternalError"

    @property
    def retryable(self) -> bool:
        """Whether a new attempt with the same inputs can succeed (the default for this code)."""
        return REASONS[self][0]

    @property
    def description(self) -> str:
        return REASONS[self][1]


# code -> (retryable by default, meaning). Kept next to the enum so that the docs cannot drift.
REASONS: dict[Reason, tuple[bool, str]] = {
    Reason.COMPLETE: (False, "The import finished: the target holds the image, flushed to stable storage."),
    Reason.CHECKSUM_MISMATCH: (
        False,
        "The downloaded bytes do not hash to IMPORTER_CHECKSUM (or a registry blob does not match "
        "its digest). The written data was removed.",
    ),
    Reason.IMAGE_TOO_LARGE: (
        False,
        "The image's virtual size (or the decompressed stream, or the archive's contents) is larger "
        "than the usable space of the target volume. The message states both numbers.",
    ),
    Reason.UNSUPPORTED_FORMAT: (
        False,
        "A format or feature the importer does not convert: encrypted images, qcow v1, QED, LUKS, "
        "unknown qcow2 incompatible features, docker schema 1 manifests, bootc images, "
        "GNU sparse tar members.",
    ),
    Reason.BACKING_FILE_NOT_ALLOWED: (
        False,
        "The image refers to other files: a qcow2 backing file or external data file, a vmdk "
        "descriptor or extents in other files, a differencing vhd/vhdx/vdi.",
    ),
    Reason.INVALID_IMAGE: (
        False,
        "The image is corrupt or truncated (bad header, table beyond the end of the file, "
        "undecodable compressed data, empty source).",
    ),
    Reason.UNSAFE_ARCHIVE: (
        False,
        "An archive member has an absolute path, a '..' component, or a link that escapes the "
        "volume; nothing of the archive was kept.",
    ),
    Reason.DISK_NOT_FOUND_IN_IMAGE: (
        False,
        "The container image has no regular file under disk/ (or ./disk/) in any layer.",
    ),
    Reason.NOT_FOUND: (
        False,
        "The source answered 404/410 (or the bucket, key, repository, tag or architecture does not exist).",
    ),
    Reason.UNAUTHORIZED: (
        False,
        "The source refused the credentials (401/403), or needs some and none were given.",
    ),
    Reason.TLS_ERROR: (
        False,
        "The TLS handshake failed: unknown certificate authority, wrong host name, expired "
        "certificate, or a plain-HTTP server where HTTPS was expected.",
    ),
    Reason.REQUEST_REJECTED: (
        False,
        "The source answered with a 4xx status other than 401/403/404/408/410/429.",
    ),
    Reason.CONNECTION_FAILED: (
        True,
        "The network failed (refused, reset, timed out, name not resolved) longer than the retry "
        "budget allows; final (retryable false) once the budget is spent.",
    ),
    Reason.SERVER_ERROR: (
        True,
        "The source kept answering 5xx/429/408 longer than the retry budget allows; final "
        "(retryable false) once the budget is spent.",
    ),
    Reason.SOURCE_CHANGED: (
        True,
        "The source object changed during the import (its ETag, Last-Modified or size differ from "
        "the first response); the next attempt starts over.",
    ),
    Reason.SCRATCH_SPACE_REQUIRED: (
        True,
        "This image cannot be streamed (for example a compressed qcow2, or a non-raw image from a "
        "server without Range support) and no scratch volume is mounted. Said before any data is "
        "written; retry with scratch space. The message field scratchSpaceRequired is true.",
    ),
    Reason.NO_SPACE_LEFT: (
        False,
        "A write failed with ENOSPC/EDQUOT although the image passed the size check (the volume "
        "holds less than it reports, or scratch is too small).",
    ),
    Reason.CONVERSION_FAILED: (False, "qemu-img (or nbdkit) failed on the image."),
    Reason.INVALID_CONFIGURATION: (
        False,
        "The pod's environment is unusable: unknown source, bad endpoint, bad checksum "
        "specification, bad PREALLOCATION value, archive content on a Block volume ...",
    ),
    Reason.TERMINATED: (
        True,
        "The importer received SIGTERM/SIGINT and stopped; what was durably written is kept.",
    ),
    Reason.INTERNAL_ERROR: (
        True,
        "An unexpected error inside the importer (a bug); the message has the details.",
    ),
}


class ImporterError(Exception):
    """A failure with its reason code, a message for a person, and whether retrying can help."""

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        retryable: bool | None = None,
        scratch_space_required: bool = False,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retryable = reason.retryable if retryable is None else retryable
        self.scratch_space_required = scratch_space_required

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class TransientError(ImporterError):
    """A failure that the in-run retry loop may retry (network trouble, 5xx)."""


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def no_space(what: str, exc: OSError) -> ImporterError:
    return ImporterError(Reason.NO_SPACE_LEFT, f"no space left while writing {what}: {exc.strerror}")
