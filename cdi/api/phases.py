"""DataVolume phases, condition types and reasons, and event reasons, with CDI's spelling."""

from enum import StrEnum
from typing import Final


class Phase(StrEnum):
    UNSET = ""
    PENDING = "Pending"
    PVC_BOUND = "PVCBound"
    IMPORT_SCHEDULED = "ImportScheduled"
    IMPORT_IN_PROGRESS = "ImportInProgress"
    CLONE_SCHEDULED = "CloneScheduled"
    CLONE_IN_PROGRESS = "CloneInProgress"
    SNAPSHOT_FOR_SMART_CLONE_IN_PROGRESS = "SnapshotForSmartCloneInProgress"
    CLONE_FROM_SNAPSHOT_SOURCE_IN_PROGRESS = "CloneFromSnapshotSourceInProgress"
    SMART_CLONE_PVC_IN_PROGRESS = "SmartClonePVCInProgress"
    CSI_CLONE_IN_PROGRESS = "CSICloneInProgress"
    EXPANSION_IN_PROGRESS = "ExpansionInProgress"
    NAMESPACE_TRANSFER_IN_PROGRESS = "NamespaceTransferInProgress"
    UPLOAD_SCHEDULED = "UploadScheduled"
    UPLOAD_READY = "UploadReady"
    WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
    PENDING_POPULATION = "PendingPopulation"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"
    PAUSED = "Paused"
    PREP_CLAIM_IN_PROGRESS = "PrepClaimInProgress"
    REBIND_IN_PROGRESS = "RebindInProgress"


class ConditionType(StrEnum):
    READY = "Ready"
    BOUND = "Bound"
    RUNNING = "Running"


PROGRESS_UNKNOWN: Final = "N/A"
PROGRESS_COMPLETE: Final = "100.0%"


class EventReason(StrEnum):
    IMPORT_SCHEDULED = "ImportScheduled"
    IMPORT_IN_PROGRESS = "ImportInProgress"
    IMPORT_FAILED = "ImportFailed"
    IMPORT_SUCCEEDED = "ImportSucceeded"
    IMPORT_PAUSED = "ImportPaused"
    UPLOAD_SCHEDULED = "UploadScheduled"
    UPLOAD_READY = "UploadReady"
    UPLOAD_FAILED = "UploadFailed"
    UPLOAD_SUCCEEDED = "UploadSucceeded"
    CLONE_SCHEDULED = "CloneScheduled"
    CLONE_IN_PROGRESS = "CloneInProgress"
    CLONE_FAILED = "CloneFailed"
    CLONE_SUCCEEDED = "CloneSucceeded"
    ERR_RESOURCE_EXISTS = "ErrResourceExists"
    ERR_RESOURCE_MARKED_FOR_DELETION = "ErrResourceMarkedForDeletion"
    ERR_CLAIM_LOST = "ErrClaimLost"
    ERR_CLAIM_NOT_VALID = "ErrClaimNotValid"
    ERR_EXCEEDED_QUOTA = "ErrExceededQuota"
    ERR_INCOMPATIBLE_PVC = "ErrIncompatiblePVC"
    IMPORT_TARGET_IN_USE = "ImportTargetInUse"
    CLONE_SOURCE_IN_USE = "CloneSourceInUse"
    PENDING = "Pending"
    BOUND = "Bound"
    CLAIM_PENDING = "ClaimPending"
    WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
