"""Annotation, label and finalizer keys, exactly as CDI spells them (users and KubeVirt read them).

Every `cdi.kubevirt.io/...` name is a constant here and nowhere else: `tests/test_code_quality.py`
forbids such literals in the rest of `cdi/`, so that two spellings of one key cannot drift apart."""

from typing import Final

_P: Final = "cdi.kubevirt.io/"

# set by users
BIND_IMMEDIATE: Final = _P + "storage.bind.immediate.requested"
RETAIN_AFTER_COMPLETION: Final = _P + "storage.pod.retainAfterCompletion"
USE_POPULATOR: Final = _P + "storage.usePopulator"
ALLOW_CLAIM_ADOPTION: Final = _P + "allowClaimAdoption"
PRE_POPULATED: Final = _P + "storage.prePopulated"
POPULATED_FOR: Final = _P + "storage.populatedFor"
CHECK_STATIC_VOLUME: Final = _P + "storage.checkStaticVolume"
PERSISTENT_VOLUME_LIST: Final = _P + "storage.persistentVolumeList"  # the volumes a checkStaticVolume claim may take
PERMISSIVE_CLONE: Final = _P + "permissiveClone"
DEFAULT_VIRT_STORAGE_CLASS: Final = "storageclass.kubevirt.io/is-default-virt-class"
DEFAULT_STORAGE_CLASS: Final = "storageclass.kubernetes.io/is-default-class"
DEFAULT_STORAGE_CLASS_BETA: Final = "storageclass.beta.kubernetes.io/is-default-class"
CLONE_STRATEGY: Final = _P + "clone-strategy"
DEFAULT_SNAPSHOT_CLASS: Final = "snapshot.storage.kubernetes.io/is-default-class"
SOURCE_VOLUME_MODE: Final = _P + "storage.import.sourceVolumeMode"
MULTUS_NETWORKS: Final = "k8s.v1.cni.cncf.io/networks"
MULTUS_DEFAULT_NETWORK: Final = "v1.multus-cni.io/default-network"
ISTIO_INJECT: Final = "sidecar.istio.io/inject"
LINKERD_INJECT: Final = "linkerd.io/inject"
POD_PRIORITY_CLASS: Final = _P + "storage.pod.priorityclassname"
POD_SERVICE_ACCOUNT: Final = _P + "storage.pod.serviceAccountName"
POPULATOR_KIND: Final = _P + "storage.populator.kind"
REFRESH_NOW: Final = _P + "refreshNow"  # on a DataImportCron: poll now

# legacy PVC import API (also written by the DataVolume controller onto the PVC)
IMPORT_ENDPOINT: Final = _P + "storage.import.endpoint"
IMPORT_SOURCE: Final = _P + "storage.import.source"
IMPORT_SECRET: Final = _P + "storage.import.secretName"
IMPORT_CERT_CONFIGMAP: Final = _P + "storage.import.certConfigMap"
IMPORT_EXTRA_HEADERS: Final = _P + "storage.import.extraHeaders"
IMPORT_SECRET_EXTRA_HEADERS: Final = _P + "storage.import.secretExtraHeaders"
IMPORT_CHECKSUM: Final = _P + "storage.import.checksum"
IMPORT_INSECURE_SKIP_VERIFY: Final = _P + "storage.import.insecureSkipVerify"
IMPORT_REGISTRY_IMPORT_METHOD: Final = _P + "storage.import.registryImportMethod"
IMPORT_REGISTRY_ARCHITECTURE: Final = _P + "storage.import.registryImageArchitecture"
CONTENT_TYPE: Final = _P + "storage.contentType"
PREALLOCATION_REQUESTED: Final = _P + "storage.preallocation.requested"
UPLOAD_TARGET: Final = _P + "storage.upload.target"
# ours, written by `cdi image-upload`: what it is about to send ("raw", "qcow2+gz", ...), so that formats
# that stream get no scratch volume
UPLOAD_FORMAT: Final = _P + "storage.upload.format"
CLONE_REQUEST: Final = "k8s.io/CloneRequest"
CLONE_OF: Final = "k8s.io/CloneOf"

# set by CDI
POD_PHASE: Final = _P + "storage.pod.phase"
POD_READY: Final = _P + "storage.pod.ready"
POD_RESTARTS: Final = _P + "storage.pod.restarts"
POD_SCHEDULABLE: Final = _P + "storage.pod.schedulable"
IMPORT_POD_NAME: Final = _P + "storage.import.importPodName"
UPLOAD_POD_NAME: Final = _P + "storage.uploadPodName"
# CDI's upload controller marks the pods and Services it creates so; cdi never does: what carries it is CDI's
CREATED_BY_UPLOAD_CONTROLLER: Final = _P + "storage.createdByUploadController"
CONDITION_RUNNING: Final = _P + "storage.condition.running"
CONDITION_RUNNING_REASON: Final = _P + "storage.condition.running.reason"
CONDITION_RUNNING_MESSAGE: Final = _P + "storage.condition.running.message"
CONDITION_BOUND: Final = _P + "storage.condition.bound"
CONDITION_BOUND_REASON: Final = _P + "storage.condition.bound.reason"
CONDITION_BOUND_MESSAGE: Final = _P + "storage.condition.bound.message"
REQUIRES_SCRATCH: Final = _P + "storage.import.requiresScratch"
REQUIRES_DIRECT_IO: Final = _P + "storage.import.requiresDirectIo"
IMPORT_FATAL_ERROR: Final = _P + "storage.import.fatalError"
PREALLOCATION_APPLIED: Final = _P + "storage.preallocation"
POPULATOR_PROGRESS: Final = _P + "storage.populator.progress"
PVC_PRIME_NAME: Final = _P + "storage.populator.pvcPrime"
CLONE_TYPE: Final = _P + "cloneType"
CLONE_FALLBACK_REASON: Final = _P + "cloneFallbackReason"
CLONE_PHASE: Final = _P + "clonePhase"
CLONE_ERROR: Final = _P + "cloneError"
CREATED_FOR_DATAVOLUME: Final = _P + "createdForDataVolume"
OWNED_BY_DATAVOLUME: Final = _P + "ownedByDataVolume"
OWNER_UID: Final = _P + "ownerUID"  # with OWNED_BY_DATAVOLUME, where an owner reference cannot cross namespaces
EXTERNAL_POPULATION: Final = _P + "externalPopulation"  # the claim is filled by its own data source or populator
DATA_SOURCE_NAMESPACE: Final = _P + "dataSourceNamespace"  # a clone target: the namespace of the DataSource it used
UPLOAD_CLIENT_NAME: Final = _P + "uploadClientName"  # a host-assisted clone's upload target: its source's client name
CLONE_TOKEN: Final = _P + "storage.clone.token"
EXTENDED_CLONE_TOKEN: Final = _P + "storage.extended.clone.token"
LAST_USE_TIME: Final = _P + "storage.import.lastUseTime"
SOURCE_DESIRED_DIGEST: Final = _P + "storage.import.sourceDesiredDigest"
ADVISED_RESTORE_SIZE: Final = _P + "storage.import.advisedRestoreSize"
NEXT_CRON_TIME: Final = _P + "storage.import.nextCronTime"
LAST_CRON_TIME: Final = _P + "storage.import.lastCronTime"
CRON_STORAGE_CLASS: Final = _P + "storage.import.storageClass"
# ours: why the DataImportCron's last poll told no version (empty or absent: it did); shown as UpToDate=False
CRON_POLL_ERROR: Final = _P + "storage.import.pollError"
MINIMUM_PVC_SIZE: Final = _P + "minimumSupportedPvcSize"
USE_RWO_FOR_DATA_IMPORT_CRON: Final = _P + "useReadWriteOnceForDataImportCron"
SNAPSHOT_CLASS_FOR_DATA_IMPORT_CRON: Final = _P + "snapshotClassForDataImportCron"
KUBECTL_LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
SELECTED_NODE: Final = "volume.kubernetes.io/selected-node"
STORAGE_PROVISIONER: Final = "volume.kubernetes.io/storage-provisioner"
STORAGE_PROVISIONER_BETA: Final = "volume.beta.kubernetes.io/storage-provisioner"
BOUND_BY_CONTROLLER: Final = "pv.kubernetes.io/bind-completed"
PROVISIONED_BY: Final = "pv.kubernetes.io/provisioned-by"

# our additions (the cdi.kubevirt.io prefix keeps them in CDI's namespace of keys)
IMPORT_REASON: Final = _P + "storage.import.reason"
IMPORT_RETRIES: Final = _P + "storage.import.retries"
IMPORT_NEXT_RETRY: Final = _P + "storage.import.nextRetryTime"
IMPORT_CHECKSUM_RESULT: Final = _P + "storage.import.verifiedChecksum"
IMPORT_RETRY_BUDGET: Final = _P + "storage.import.retryBudget"  # seconds; overrides --import-retry-budget
CLONE_SOURCE: Final = _P + "storage.clone.source"  # kind/namespace/name of what a clone target clones
# on what the operator installs: a hash of the mounted certificates (a rotation restarts the pods), and of
# the customization patches applied to an object
CERTIFICATES_HASH: Final = _P + "certificates"
CUSTOMIZER_IDENTIFIER: Final = _P + "customizer-identifier"

# extensions: ours, under one prefix of our own (not CDI's `cdi.kubevirt.io/`), each a row of the README's
# "Extensions" table; a DataVolume written for CDI carries none and behaves as CDI's, and a key of ours is never
# taken for one of CDI's
EXTENSION_PREFIX: Final = "extensions.cdi.dev/"
# on a DataVolume (passed to its claims, like CDI's pass-through annotations): its worker pods' resources
# (a JSON ResourceRequirements) and placement (a JSON NodePlacement, the shape of the CDI CR's spec.workload)
WORKER_RESOURCES: Final = EXTENSION_PREFIX + "worker.resources"
WORKER_PLACEMENT: Final = EXTENSION_PREFIX + "worker.placement"
# on CDIConfig `config`: an admin's cap on what worker.resources may ask (JSON: resource name -> quantity)
WORKER_MAX_RESOURCES: Final = EXTENSION_PREFIX + "worker.maxResources"
# set by users (or `cdi image-upload --checksum`) on an upload DataVolume or claim: `algorithm:hex` the bytes
# received must hash to (the upload server checks; a mismatch fails as an import's ChecksumMismatch does)
UPLOAD_CHECKSUM: Final = EXTENSION_PREFIX + "upload.checksum"
# written when an import or upload succeeded: the sha256 of the bytes as the source delivered them (before
# decompression or conversion), and the format the worker detected (`qcow2`, `raw.xz`, ...)
SOURCE_SHA256: Final = EXTENSION_PREFIX + "source.sha256"
SOURCE_FORMAT: Final = EXTENSION_PREFIX + "source.format"
# on a clone DataVolume (passed to its claim) or a clone populator's claim, "true": a csi-clone or snapshot
# clone starts while a running pod writes to the source (crash-consistent) instead of waiting
CLONE_ALLOW_SOURCE_IN_USE: Final = EXTENSION_PREFIX + "clone.allowSourceInUse"

# labels
LABEL_APP: Final = "app"
LABEL_APP_VALUE: Final = "containerized-data-importer"
LABEL_COMPONENT: Final = "cdi.kubevirt.io"
LABEL_DATAIMPORTCRON: Final = _P + "dataImportCron"
LABEL_DATAIMPORTCRON_CLEANUP: Final = _P + "dataImportCron.cleanup"
LABEL_UPLOAD_TARGET: Final = _P + "uploadTarget"
LABEL_OWNED_BY_UID: Final = _P + "OwnedByUID"
LABEL_EXCLUDE_FROM_BACKUP: Final = "velero.io/exclude-from-backup"
LABEL_FILLING_UP_ALERT: Final = "alerts.k8s.io/KubePersistentVolumeFillingUp"
LABEL_PROMETHEUS: Final = "prometheus.cdi.kubevirt.io"
LABEL_APPLY_STORAGE_PROFILE: Final = _P + "applyStorageProfile"
# KubeVirt's: the instancetype and preference a VM made from the volume defaults to (set by `image-upload
# --default-instancetype ...`; a DataImportCron passes them on to its DataSource), and a DataSource's
# dynamic-credentials support (passed on too)
LABEL_DEFAULT_INSTANCETYPE: Final = "instancetype.kubevirt.io/default-instancetype"
LABEL_DEFAULT_INSTANCETYPE_KIND: Final = "instancetype.kubevirt.io/default-instancetype-kind"
LABEL_DEFAULT_PREFERENCE: Final = "instancetype.kubevirt.io/default-preference"
LABEL_DEFAULT_PREFERENCE_KIND: Final = "instancetype.kubevirt.io/default-preference-kind"
INSTANCETYPE_LABELS: Final = (LABEL_DEFAULT_INSTANCETYPE, LABEL_DEFAULT_INSTANCETYPE_KIND, LABEL_DEFAULT_PREFERENCE,
                              LABEL_DEFAULT_PREFERENCE_KIND)
LABEL_DYNAMIC_CREDENTIALS_SUPPORT: Final = "kubevirt.io/dynamic-credentials-support"
LABEL_OPERATOR_COMPONENT: Final = _P + "component"  # on what the operator installs: which component it is
LABEL_OPERATOR: Final = "operator.cdi.kubevirt.io"  # on the operator's own objects (CDI's cdi-config ConfigMap)
# CDI's operator stamps what it creates with its version (createVersion) and what it changes (updateVersion);
# cdi's applies everything server-side, so it stamps updateVersion only: the version that last applied it
LABEL_CREATE_VERSION: Final = "operator.cdi.kubevirt.io/createVersion"
LABEL_UPDATE_VERSION: Final = "operator.cdi.kubevirt.io/updateVersion"

# finalizers
DATAVOLUME_FINALIZER: Final = _P + "dataVolumeFinalizer"
OPERATOR_FINALIZER: Final = "operator.cdi.kubevirt.io"  # on the CDI resource
