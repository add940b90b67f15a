"""API groups, versions and kinds, spelled as CDI and Kubernetes spell them."""

from typing import Final, NamedTuple

CDI_GROUP: Final = "cdi.kubevirt.io"
CDI_VERSION: Final = "v1beta1"
CDI_ALPHA_VERSION: Final = "v1alpha1"  # the CDI kind's old version, still in CDI's CRD
CDI_API_VERSION: Final = f"{CDI_GROUP}/{CDI_VERSION}"

UPLOAD_GROUP: Final = "upload.cdi.kubevirt.io"
UPLOAD_VERSION: Final = "v1beta1"
UPLOAD_API_VERSION: Final = f"{UPLOAD_GROUP}/{UPLOAD_VERSION}"

SNAPSHOT_GROUP: Final = "snapshot.storage.k8s.io"
SNAPSHOT_VERSION: Final = "v1"
SNAPSHOT_API_VERSION: Final = f"{SNAPSHOT_GROUP}/{SNAPSHOT_VERSION}"

CDI_NAMESPACE: Final = "cdi"
CDI_CONFIG_NAME: Final = "config"
CDI_CR_NAME: Final = "cdi"


class GVR(NamedTuple):
    """A group/version/resource triple: what the REST path of a kind is built from."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


DATAVOLUMES: Final = GVR(CDI_GROUP, CDI_VERSION, "datavolumes", "DataVolume", True)
DATASOURCES: Final = GVR(CDI_GROUP, CDI_VERSION, "datasources", "DataSource", True)
DATAIMPORTCRONS: Final = GVR(CDI_GROUP, CDI_VERSION, "dataimportcrons", "DataImportCron", True)
STORAGEPROFILES: Final = GVR(CDI_GROUP, CDI_VERSION, "storageprofiles", "StorageProfile", False)
CDICONFIGS: Final = GVR(CDI_GROUP, CDI_VERSION, "cdiconfigs", "CDIConfig", False)
CDIS: Final = GVR(CDI_GROUP, CDI_VERSION, "cdis", "CDI", False)
OBJECTTRANSFERS: Final = GVR(CDI_GROUP, CDI_VERSION, "objecttransfers", "ObjectTransfer", False)
VOLUMEIMPORTSOURCES: Final = GVR(CDI_GROUP, CDI_VERSION, "volumeimportsources", "VolumeImportSource", True)
VOLUMEUPLOADSOURCES: Final = GVR(CDI_GROUP, CDI_VERSION, "volumeuploadsources", "VolumeUploadSource", True)
VOLUMECLONESOURCES: Final = GVR(CDI_GROUP, CDI_VERSION, "volumeclonesources", "VolumeCloneSource", True)
# Gateway API's ReferenceGrant: what a claim's cross-namespace dataSourceRef needs in the source namespace
REFERENCEGRANTS: Final = GVR("gateway.networking.k8s.io", "v1beta1", "referencegrants", "ReferenceGrant", True)
UPLOADTOKENREQUESTS: Final = GVR(UPLOAD_GROUP, UPLOAD_VERSION, "uploadtokenrequests", "UploadTokenRequest", True)

VOLUMESNAPSHOTS: Final = GVR(SNAPSHOT_GROUP, SNAPSHOT_VERSION, "volumesnapshots", "VolumeSnapshot", True)
VOLUMESNAPSHOTCONTENTS: Final = GVR(
    SNAPSHOT_GROUP, SNAPSHOT_VERSION, "volumesnapshotcontents", "VolumeSnapshotContent", False
)
VOLUMESNAPSHOTCLASSES: Final = GVR(
    SNAPSHOT_GROUP, SNAPSHOT_VERSION, "volumesnapshotclasses", "VolumeSnapshotClass", False
)

NAMESPACES: Final = GVR("", "v1", "namespaces", "Namespace", False)
PODS: Final = GVR("", "v1", "pods", "Pod", True)
PVCS: Final = GVR("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True)
PVS: Final = GVR("", "v1", "persistentvolumes", "PersistentVolume", False)
SERVICES: Final = GVR("", "v1", "services", "Service", True)
ENDPOINTS: Final = GVR("", "v1", "endpoints", "Endpoints", True)
SECRETS: Final = GVR("", "v1", "secrets", "Secret", True)
CONFIGMAPS: Final = GVR("", "v1", "configmaps", "ConfigMap", True)
EVENTS: Final = GVR("", "v1", "events", "Event", True)
NODES: Final = GVR("", "v1", "nodes", "Node", False)
SERVICEACCOUNTS: Final = GVR("", "v1", "serviceaccounts", "ServiceAccount", True)
# what a DataVolume held back by a quota waits on: a change may give it room
RESOURCEQUOTAS: Final = GVR("", "v1", "resourcequotas", "ResourceQuota", True)
STORAGECLASSES: Final = GVR("storage.k8s.io", "v1", "storageclasses", "StorageClass", False)
CSIDRIVERS: Final = GVR("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False)
# what an admin puts in front of the upload proxy, and the controller reads its URL from (CDIConfig
# `status.uploadProxyURL`); Routes are OpenShift's, served only there
INGRESSES: Final = GVR("networking.k8s.io", "v1", "ingresses", "Ingress", True)
ROUTES: Final = GVR("route.openshift.io", "v1", "routes", "Route", True)
LEASES: Final = GVR("coordination.k8s.io", "v1", "leases", "Lease", True)
CRDS: Final = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
APISERVICES: Final = GVR("apiregistration.k8s.io", "v1", "apiservices", "APIService", False)
SUBJECTACCESSREVIEWS: Final = GVR("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False)
VALIDATING_WEBHOOKS: Final = GVR(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration", False,
)
MUTATING_WEBHOOKS: Final = GVR(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False
)
