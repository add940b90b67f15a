"""The clone planner: which strategy a clone runs and why, as CDI's planner decides it.

Strategy = the CDI resource's `cloneStrategyOverride`, else the target StorageProfile's
`status.cloneStrategy`, else `snapshot`. `snapshot` needs a VolumeSnapshotClass for the driver;
`snapshot` and `csi-clone` need the same driver on both sides, the same volume mode, and volume
expansion when the target is larger. Whatever is missing falls back to host-assisted copy with
CDI's event reason and message (kept in the target's `cdi.kubevirt.io/cloneFallbackReason`).

The strategy is carried out by phases, one module each (CDI's pkg/controller/clone): `phases` returns
them in order for a target that records its strategy, as CDI's Planner.Plan does:

- csi-clone: CSIClone, PrepClaim, Rebind;
- snapshot: Snapshot, SnapshotClone, PrepClaim, Rebind (a `source.snapshot` clone: SnapshotClone,
  PrepClaim, Rebind);
- copy: HostClone, Rebind (from a snapshot: SnapshotClone into a claim the copy reads first).

Pure: the caller passes what the cluster holds (`cluster_from` reads it from the informers), so
`cdi clone-plan` and the controller say the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.views import CDIView, ClaimView, ObjectView, SnapshotContentView, SnapshotView, StorageProfileView
from cdi.controller.clone.csiclone import CSIClonePhase
from cdi.controller.clone.hostclone import HostClonePhase
from cdi.controller.clone.phase import Phase
from cdi.controller.clone.prepclaim import PrepClaimPhase
from cdi.controller.clone.rebind import RebindPhase
from cdi.controller.clone.size import byte_count
from cdi.controller.clone.snapclone import SnapshotClonePhase, SourceRestorePhase
from cdi.controller.clone.snapshot import SnapshotPhase
from cdi.controller.clone.target import CloneTarget, temp_snapshot_name, temp_source_claim_name
from cdi.controller.runtime import Context

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
        return next((sc for sc in self.storage_classes if name and ObjectView(sc).name == name), None)


@dataclass(frozen=True)
class Plan:
    strategy: str
    why: str
    fallback_reason: str | None = None  # the Warning event's reason
    fallback_message: str | None = None  # its message, also the PVC annotation
    snapshot_class: str | None = None


def validate_size(source_request: Any, target_request: Any, target_annotations: Mapping[str, str]) -> None:
    """CDI's ValidateRequestedCloneSize, skipped with `cdi.kubevirt.io/permissiveClone`."""
    if ann.PERMISSIVE_CLONE in target_annotations:
        return
    source, target = byte_count(source_request), byte_count(target_request)
    if source is None or target is None:
        raise CloneValidationError("source/target missing storage resource requests")
    if source > target:
        raise CloneValidationError(
            f"target resources requests storage size is smaller than the source {target} < {source}")


def snapshot_class_for(driver: str, cluster: Cluster, target_class: str | None) -> str | None:
    """The StorageProfile's `snapshotClass`, else the default one for the driver, else the first by name."""
    matching = sorted((c for c in cluster.snapshot_classes if c.get("driver") == driver),
                      key=lambda c: ObjectView(c).name)
    wanted = StorageProfileView(cluster.storage_profiles.get(target_class or "") or {}).snapshot_class
    if wanted:
        return wanted if any(ObjectView(c).name == wanted for c in matching) else None
    for klass in matching:
        if ObjectView(klass).annotations.get(DEFAULT_SNAPSHOT_CLASS) == "true":
            return ObjectView(klass).name
    return ObjectView(matching[0]).name if matching else None


def cluster_from(ctx: Context) -> Cluster:
    """What the informers hold of the cluster, as planning needs it."""
    cdi = next(iter(ctx.cached_list(groups.CDIS)), None)
    override = CDIView(cdi or {}).clone_strategy_override
    profiles = {ObjectView(p).name: p for p in ctx.cached_list(groups.STORAGEPROFILES)}
    return Cluster(ctx.cached_list(groups.STORAGECLASSES), profiles, ctx.cached_list(groups.VOLUMESNAPSHOTCLASSES),
                   override or None)


def _fallback(reason: tuple[str, str], why: str) -> Plan:
    return Plan(COPY, f"host-assisted copy: {reason[1]} ({why})", reason[0], reason[1])


def plan_from_pvc(source: Body, target_spec: Body, target_annotations: Mapping[str, str], cluster: Cluster) -> Plan:
    """The strategy for cloning the claim `source` into a claim of `target_spec`. Raises
    CloneValidationError when the target is smaller than the source."""
    source_claim, target = ClaimView(source), ClaimView({"spec": target_spec})
    validate_size(source_claim.requested_storage or None, target.requested_storage or None, target_annotations)
    target_class_name = target_spec.get("storageClassName")
    profile = StorageProfileView(cluster.storage_profiles.get(target.storage_class) or {})
    if cluster.strategy_override:
        strategy, origin = cluster.strategy_override, "the CDI resource's cloneStrategyOverride"
    elif profile.clone_strategy:
        strategy, origin = profile.clone_strategy, f"the cloneStrategy of StorageProfile {target_class_name}"
    else:
        strategy, origin = SNAPSHOT, "the default"
    source_class = cluster.storage_class(source_claim.storage_class)
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
    if source_claim.volume_mode != target.volume_mode:
        return _fallback(INCOMPATIBLE_VOLUME_MODES, f"{strategy} from {origin}; source "
                                                    f"{source_claim.volume_mode}, target {target.volume_mode}")
    capacity = byte_count(source_claim.capacity or None)
    request = byte_count(target.requested_storage or None)
    if capacity is not None and request is not None and capacity < request and \
            not (target_class or {}).get("allowVolumeExpansion"):
        return _fallback(NO_VOLUME_EXPANSION, f"{strategy} from {origin}; the target is larger than the source "
                                              f"and StorageClass {target_class_name} does not allow expansion")
    how = "smart clone through a VolumeSnapshot" if strategy == SNAPSHOT else "CSI volume clone"
    extra = f" with VolumeSnapshotClass {snapshot_class}" if snapshot_class else ""
    return Plan(strategy, f"{strategy}: {how}{extra} (driver {target_driver}, {target.volume_mode}), "
                          f"as chosen by {origin}", snapshot_class=snapshot_class)


def plan_from_snapshot(snapshot: Body, content: Body | None, target_spec: Body, cluster: Cluster) -> Plan:
    """The strategy for restoring the VolumeSnapshot `snapshot` (bound to `content`) into a claim of
    `target_spec`: a restore where the driver, size and volume mode allow, else host-assisted copy."""
    target = ClaimView({"spec": target_spec})
    target_class_name = target_spec.get("storageClassName")
    target_class = cluster.storage_class(target_class_name)
    content_view = SnapshotContentView(content or {})
    driver = content_view.driver or None
    provisioner = (target_class or {}).get("provisioner")
    if not driver or driver != provisioner:
        return _fallback(NO_PROVISIONER_MATCH, f"snapshot content driver {driver}, StorageClass "
                                               f"{target_class_name} provisioner {provisioner}")
    restore = byte_count(SnapshotView(snapshot).restore_size or None)
    request = byte_count(target.requested_storage or None)
    if restore is not None and request is not None and restore < request and \
            not (target_class or {}).get("allowVolumeExpansion"):
        return _fallback(NO_VOLUME_EXPANSION, f"the target is larger than the snapshot and StorageClass "
                                              f"{target_class_name} does not allow expansion")
    source_mode = content_view.source_volume_mode or target.volume_mode
    if source_mode != target.volume_mode:
        return _fallback(INCOMPATIBLE_VOLUME_MODES, f"snapshot of a {source_mode} volume, target "
                                                    f"{target.volume_mode}")
    return Plan(SNAPSHOT, f"snapshot: restore of VolumeSnapshot {SnapshotView(snapshot).name} "
                          f"(driver {driver}, {target.volume_mode})")


def phases(target: CloneTarget, cluster: Cluster) -> list[Phase]:
    """The phases that carry out the strategy the target records (`cdi.kubevirt.io/cloneType`), in order."""
    strategy = target.view.annotations.get(ann.CLONE_TYPE, COPY)
    from_snapshot = target.source_kind == "snapshot"
    if strategy == COPY:
        if from_snapshot:
            return [SourceRestorePhase(target), HostClonePhase(target, temp_source_claim_name(target.claim)),
                    RebindPhase(target)]
        return [HostClonePhase(target, target.source_name), RebindPhase(target)]
    if from_snapshot:
        return [SnapshotClonePhase(target, target.source_name), PrepClaimPhase(target), RebindPhase(target)]
    if strategy == CSI_CLONE:
        return [CSIClonePhase(target), PrepClaimPhase(target), RebindPhase(target)]
    target_class = target.view.storage_class
    driver = str((cluster.storage_class(target_class) or {}).get("provisioner") or "")
    return [SnapshotPhase(target, snapshot_class_for(driver, cluster, target_class)),
            SnapshotClonePhase(target, temp_snapshot_name(target.claim), taken_of=target.source_name),
            PrepClaimPhase(target), RebindPhase(target)]
