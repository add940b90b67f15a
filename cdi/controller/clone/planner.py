"""The clone planner: which strategy a clone runs and why, as CDI's planner decides it.

Strategy = the CDI resource's `cloneStrategyOverride`, else the target StorageProfile's
`status.cloneStrategy`, else `snapshot`. `snapshot` needs a VolumeSnapshotClass for the driver;
`snapshot` and `csi-clone` need the same driver on both sides, the same volume mode, and volume
expansion when the target is larger. Whatever is missing falls back to host-assisted copy with
CDI's event reason and message (kept in the target's `cdi.kubevirt.io/cloneFallbackReason`).

Pure: the caller passes what the cluster holds, so `cdi clone-plan` and the controller say the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdi.api import annotations as ann
from cdi.api.quantity import QuantityError, parse_bytes
from cdi.api.views import dig

Body = Mapping[str, Any]

COPY = "copy"
SNAPSHOT = "snapshot"
CSI_CLONE = "csi-clone"

# fallback event reasons and messages (CDI's planner constants)
NO_VOLUME_SNAPSHOT_CLASS = ("NoVolumeSnapshotClass", "No compatible volumesnapshotclass found")
INCOMPATIBLE_VOLUME_MODES = ("IncompatibleVolumeModes", "The volume modes of source and target are incompatible")
NO_VOLUME_EXPANSION = ("NoVolumeExpansion", "No volume expansion is possible")
NO_PROVISIONER_MATCH = ("NoProvisionerMatch",
                        "The storageclass provisioner does not match the volumesnapshotcontent driver")
INCOMPATIBLE_PROVISIONERS = ("IncompatibleProvisioners", "Provisioners are incompatible")

CLONE_VALIDATION_FAILED = "CloneValidationFailed"
MESSAGE_CLONE_VALIDATION_FAILED = "The clone doesn't meet the validation requirements"
ERR_INCOMPATIBLE_PVC = "ErrIncompatiblePVC"
DEFAULT_SNAPSHOT_CLASS = "snapshot.storage.kubernetes.io/is-default-class"


class CloneValidationError(Exception):
    """The clone cannot run as asked (a target smaller than the source); the message is CDI's."""


@dataclass(frozen=True)
class Cluster:
    """What planning needs to know of the cluster."""

    storage_classes: Sequence[Body]
    storage_profiles: Mapping[str, Body]
    snapshot_classes: Sequence[Body]
    strategy_override: str | None = None

    def storage_class(self, name: str | None) -> Body | None:
        return next((sc for sc in self.storage_classes if name and dig(sc, "metadata", "name") == name), None)


@dataclass(frozen=True)
class Plan:
    strategy: str
    why: str
    fallback_reason: str | None = None  # the Warning event's reason
    fallback_message: str | None = None  # its message, also the PVC annotation
    snapshot_class: str | None = None


def _volume_mode(spec: Body | None) -> str:
    return str((spec or {}).get("volumeMode") or "Filesystem")


def _bytes(value: Any) -> int | None:
    try:
        return parse_bytes(value) if value is not None else None
    except QuantityError:
        return None


def validate_size(source_request: Any, target_request: Any, target_annotations: Mapping[str, str]) -> None:
    """CDI's ValidateRequestedCloneSize, skipped with `cdi.kubevirt.io/permissiveClone`."""
    if ann.PERMISSIVE_CLONE in target_annotations:
        return
    source, target = _bytes(source_request), _bytes(target_request)
    if source is None or target is None:
        raise CloneValidationError("source/target missing storage resource requests")
    if source > target:
        raise CloneValidationError(
            f"target resources requests storage size is smaller than the source {target} < {source}")


def snapshot_class_for(driver: str, cluster: Cluster, target_class: str | None) -> str | None:
    """The StorageProfile's `snapshotClass`, else the default one for the driver, else the first by name."""
    matching = sorted((c for c in cluster.snapshot_classes if c.get("driver") == driver),
                      key=lambda c: str(dig(c, "metadata", "name")))
    wanted = dig(cluster.storage_profiles.get(target_class or ""), "status", "snapshotClass")
    if wanted:
        return str(wanted) if any(dig(c, "metadata", "name") == wanted for c in matching) else None
    for klass in matching:
        if (dig(klass, "metadata", "annotations") or {}).get(DEFAULT_SNAPSHOT_CLASS) == "true":
            return str(dig(klass, "metadata", "name"))
    return str(dig(matching[0], "metadata", "name")) if matching else None


def _fallback(reason: tuple[str, str], why: str) -> Plan:
    return Plan(COPY, f"host-assisted copy: {reason[1]} ({why})", reason[0], reason[1])


def plan_from_pvc(source: Body, target_spec: Body, target_annotations: Mapping[str, str], cluster: Cluster) -> Plan:
    """The strategy for cloning the claim `source` into a claim of `target_spec`. Raises
    CloneValidationError when the target is smaller than the source."""
    validate_size(dig(source, "spec", "resources", "requests", "storage"),
                  dig(target_spec, "resources", "requests", "storage"), target_annotations)
    target_class_name = target_spec.get("storageClassName")
    profile = cluster.storage_profiles.get(str(target_class_name or ""))
    if cluster.strategy_override:
        strategy, origin = cluster.strategy_override, "the CDI resource's cloneStrategyOverride"
    elif dig(profile, "status", "cloneStrategy"):
        strategy, origin = str(dig(profile, "status", "cloneStrategy")), \
            f"the cloneStrategy of StorageProfile {target_class_name}"
    else:
        strategy, origin = SNAPSHOT, "the default"
    source_class = cluster.storage_class(dig(source, "spec", "storageClassName"))
    target_class = cluster.storage_class(target_class_name)
    source_driver = (source_class or {}).get("provisioner")
    target_driver = (target_class or {}).get("provisioner")
    snapshot_class = None
    if strategy == COPY:
        return Plan(COPY, f"host-assisted copy, as asked by {origin}")
    if strategy == SNAPSHOT:
        snapshot_class = snapshot_class_for(str(target_driver or ""), cluster, target_class_name) \
            if source_driver == target_driver else None
        if snapshot_class is None:
            return _fallback(NO_VOLUME_SNAPSHOT_CLASS, f"{strategy} from {origin}; no VolumeSnapshotClass for "
                                                       f"driver {target_driver} of both claims")
    if not source_driver or source_driver != target_driver:
        return _fallback(INCOMPATIBLE_PROVISIONERS, f"{strategy} from {origin}; source driver {source_driver}, "
                                                    f"target driver {target_driver}")
    if _volume_mode(dig(source, "spec")) != _volume_mode(target_spec):
        return _fallback(INCOMPATIBLE_VOLUME_MODES, f"{strategy} from {origin}; source "
                                                    f"{_volume_mode(dig(source, 'spec'))}, target "
                                                    f"{_volume_mode(target_spec)}")
    capacity = _bytes(dig(source, "status", "capacity", "storage"))
    request = _bytes(dig(target_spec, "resources", "requests", "storage"))
    if capacity is not None and request is not None and capacity < request and \
            not (target_class or {}).get("allowVolumeExpansion"):
        return _fallback(NO_VOLUME_EXPANSION, f"{strategy} from {origin}; the target is larger than the source "
                                              f"and StorageClass {target_class_name} does not allow expansion")
    how = "smart clone through a VolumeSnapshot" if strategy == SNAPSHOT else "CSI volume clone"
    extra = f" with VolumeSnapshotClass {snapshot_class}" if snapshot_class else ""
    return Plan(strategy, f"{strategy}: {how}{extra} (driver {target_driver}, {_volume_mode(target_spec)}), "
                          f"as chosen by {origin}", snapshot_class=snapshot_class)


def plan_from_snapshot(snapshot: Body, content: Body | None, target_spec: Body, cluster: Cluster) -> Plan:
    """The strategy for restoring the VolumeSnapshot `snapshot` (bound to `content`) into a claim of
    `target_spec`: a restore where the driver, size and volume mode allow, else host-assisted copy."""
    target_class_name = target_spec.get("storageClassName")
    target_class = cluster.storage_class(target_class_name)
    driver = dig(content, "spec", "driver")
    provisioner = (target_class or {}).get("provisioner")
    if not driver or driver != provisioner:
        return _fallback(NO_PROVISIONER_MATCH, f"snapshot content driver {driver}, StorageClass "
                                               f"{target_class_name} provisioner {provisioner}")
    restore = _bytes(dig(snapshot, "status", "restoreSize"))
    request = _bytes(dig(target_spec, "resources", "requests", "storage"))
    if restore is not None and request is not None and restore < request and \
            not (target_class or {}).get("allowVolumeExpansion"):
        return _fallback(NO_VOLUME_EXPANSION, f"the target is larger than the snapshot and StorageClass "
                                              f"{target_class_name} does not allow expansion")
    source_mode = str(dig(content, "spec", "sourceVolumeMode") or _volume_mode(target_spec))
    if source_mode != _volume_mode(target_spec):
        return _fallback(INCOMPATIBLE_VOLUME_MODES, f"snapshot of a {source_mode} volume, target "
                                                    f"{_volume_mode(target_spec)}")
    return Plan(SNAPSHOT, f"snapshot: restore of VolumeSnapshot {dig(snapshot, 'metadata', 'name')} "
                          f"(driver {driver}, {_volume_mode(target_spec)})")
