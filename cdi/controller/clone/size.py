"""The size of a clone's target when the `storage` API leaves it out, by CDI's rules (detectCloneSize
of the PVC and snapshot clone controllers):

- a PVC source holding a disk image (Filesystem, annotated `cdi.kubevirt.io/storage.contentType:
  kubevirt`): the virtual size of its `disk.img`, measured once by a size-detection pod and kept on
  the source claim (`cdi.Kubervirt.io/virtualSize` with the capacity it was measured at,
  `cdi.Kubervirt.io/sourceCapacity`: CDI's spelling); the measurement is also made when the target
  is Block and has a size, only to decide whether the clone is permissive;
- any other PVC source: its capacity;
- a snapshot: its restoreSize;

then inflated by the target class's filesystem overhead when the target is Filesystem (a snapshot only
when it was taken of a Block volume). The clone is permissive (`cdi.kubevirt.io/permissiveClone`, the
source-request check skipped) when the source's capacity exceeds the detected size, or, for a
Block target with a size, when that size holds the image.

Pure: the caller passes the objects and the cluster's storage settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api import annotations as ann
from cdi.api.quantity import QuantityError, parse_bytes
from cdi.api.rendering import ClusterStorage
from cdi.api.sizing import required_space
from cdi.api.views import ClaimView, SnapshotContentView, SnapshotView

Body = Mapping[str, Any]

VIRTUAL_SIZE = "cdi.Kubervirt.io/virtualSize"  # sic: CDI's annotation names
SOURCE_CAPACITY = "cdi.Kubervirt.io/sourceCapacity"


class NeedsVirtualSize(Exception):
    """The source's disk image must be measured (a size-detection pod) before the size is known."""


@dataclass(frozen=True)
class CloneSize:
    request: str | None  # the target's storage request to set; None: keep what was rendered
    permissive: bool = False


def byte_count(value: Any) -> int | None:
    """A quantity's bytes; None for none, or one that does not parse."""
    try:
        return parse_bytes(value) if value is not None else None
    except QuantityError:
        return None


def holds_disk_image(source: Body) -> bool:
    """CDI measures only a Filesystem source explicitly annotated as a kubevirt disk (else its pod would
    fail on a claim that holds no `disk.img`)."""
    claim = ClaimView(source)
    return claim.volume_mode == "Filesystem" and claim.annotations.get(ann.CONTENT_TYPE) == "kubevirt"


def recorded_virtual_size(source: Body) -> int | None:
    """The virtual size kept on the source claim, while its capacity is the one it was measured at."""
    claim = ClaimView(source)
    virtual, measured_at = claim.annotations.get(VIRTUAL_SIZE), claim.annotations.get(SOURCE_CAPACITY)
    capacity = byte_count(claim.capacity or None)
    if virtual is None or measured_at is None or capacity is None or byte_count(measured_at) != capacity:
        return None
    try:
        return int(virtual)
    except ValueError:
        return None


def inflate(size: int, spec: Body, storage: ClusterStorage) -> int:
    """CDI's InflateSizeWithOverhead: a Filesystem target leaves `size` usable after the overhead."""
    if ClaimView({"spec": spec}).volume_mode != "Filesystem":
        return size
    return required_space(storage.filesystem_overhead(spec.get("storageClassName")), size)


def pvc_clone_size(source: Body, spec: Body, storage: ClusterStorage) -> CloneSize:
    """The target size and permissiveness for cloning the claim `source` into a claim of `spec`.
    Raises NeedsVirtualSize when the source's disk image must be measured first."""
    claim, target = ClaimView(source), ClaimView({"spec": spec})
    requested = byte_count(target.requested_storage or None)
    size_required = not requested
    if not size_required and not (target.volume_mode == "Block" and holds_disk_image(source)):
        return CloneSize(None)
    capacity = byte_count(claim.capacity or None)
    if holds_disk_image(source):
        size = recorded_virtual_size(source)
        if size is None:
            raise NeedsVirtualSize(f"the virtual size of {claim.name}'s disk image")
    elif capacity is None:
        return CloneSize(None)  # not bound yet: no size to take
    else:
        size = capacity
    if not size_required:
        return CloneSize(None, permissive=(requested or 0) >= size)
    return CloneSize(str(inflate(size, spec, storage)), permissive=capacity is not None and capacity > size)


def snapshot_clone_size(snapshot: Body, content: Body | None, spec: Body, storage: ClusterStorage) -> CloneSize:
    """A snapshot's restoreSize, inflated for a Filesystem target of a Block volume's snapshot."""
    target, taken = ClaimView({"spec": spec}), SnapshotView(snapshot)
    if byte_count(target.requested_storage or None):
        return CloneSize(None)
    restore = byte_count(taken.restore_size or None)
    if restore is None:
        return CloneSize(None)
    source_mode = SnapshotContentView(content or {}).source_volume_mode or target.volume_mode
    if target.volume_mode == "Filesystem" and source_mode == "Block":
        return CloneSize(str(inflate(restore, spec, storage)))
    return CloneSize(taken.restore_size)
