"""CustomResourceDefinition manifests for CDI's kinds and the CSI snapshot kinds.

The embedded API server installs these at start; `cdi manifests` renders them for a real cluster.
Field names, short names, categories and printer columns follow CDI (cdi.kubevirt.io/v1beta1) and
external-snapshotter (snapshot.storage.k8s.io/v1), so manifests written for either apply here."""

from typing import Any

from cdi.api import groups
from cdi.api.openapi import (
    ACCESS_MODES,
    Schema,
    array,
    boolean,
    condition,
    date_time,
    enum,
    free_form,
    integer,
    map_of,
    node_placement,
    obj,
    pvc_spec,
    quantity,
    resource_requirements,
    string,
)

Manifest = dict[str, Any]

_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _namespaced_name(description: str = "") -> Schema:
    return obj({"namespace": string(), "name": string()}, required=("namespace", "name"),
               description=description)


def _http_source() -> Schema:
    return obj({
        "url": string("URL is the URL of the http(s) endpoint"),
        "secretRef": string("SecretRef A Secret reference, the secret should contain accessKeyId "
                            "(user name) base64 encoded, and secretKey (password) also base64 encoded"),
        "certConfigMap": string("CertConfigMap is a configmap reference, containing a Certificate "
                                "Authority(CA) public key, and a base64 encoded pem certificate"),
        "extraHeaders": array(string(), "ExtraHeaders is a list of strings containing extra headers "
                                        "to include with HTTP transfer requests"),
        "secretExtraHeaders": array(string(), "SecretExtraHeaders is a list of Secret references, "
                                              "each containing an extra HTTP header"),
        "checksum": string("Checksum is the expected checksum of the downloaded file, "
                           "'algorithm:hex' with md5, sha1, sha256 or sha512"),
        "insecureSkipVerify": boolean("InsecureSkipVerify skips TLS verification of the server"),
    }, required=("url",))


def _registry_source() -> Schema:
    return obj({
        "url": string("URL is the url of the registry source (starting with docker:// or oci-archive://)"),
        "imageStream": string("ImageStream is the name of image stream for import"),
        "pullMethod": enum("pod", "node", description="PullMethod can be either \"pod\" (default) or \"node\""),
        "secretRef": string(),
        "certConfigMap": string(),
        "platform": obj({"architecture": string()}),
    })


def _import_sources() -> dict[str, Schema]:
    return {
        "http": _http_source(),
        "s3": obj({"url": string(), "secretRef": string(), "certConfigMap": string()}, required=("url",)),
        "gcs": obj({"url": string(), "secretRef": string()}, required=("url",)),
        "registry": _registry_source(),
        "blank": obj(description="DataVolumeBlankImage provides the parameters to create a new raw blank image"),
        "imageio": obj({
            "url": string(), "diskId": string(), "secretRef": string(), "certConfigMap": string(),
            "insecureSkipVerify": boolean(),
        }, required=("url", "diskId")),
        "vddk": obj({
            "url": string(), "uuid": string(), "backingFile": string(), "thumbprint": string(),
            "secretRef": string(), "certConfigMap": string(), "initImageURL": string(), "extraArgs": string(),
        }),
    }


def datavolume_spec() -> Schema:
    sources = _import_sources()
    sources.update({
        "pvc": _namespaced_name("DataVolumeSourcePVC provides the parameters to create a DataVolume "
                                "from an existing PVC"),
        "snapshot": _namespaced_name(),
        "upload": obj(description="DataVolumeSourceUpload provides the parameters to create a DataVolume "
                                  "by uploading the source"),
    })
    storage = pvc_spec("Storage is the requested storage, like pvc but with gaps filled by CDI")
    return obj({
        "source": obj(sources, description="Source is the src of the data for the requested DataVolume"),
        "sourceRef": obj({"kind": string(), "namespace": string(), "name": string()},
                         required=("kind", "name"),
                         description="SourceRef is an indirect reference to the source of data"),
        "pvc": pvc_spec("PVC is the PVC specification"),
        "storage": storage,
        "priorityClassName": string(),
        "serviceAccountName": string(),
        "contentType": enum("kubevirt", "archive", description="DataVolumeContentType options: "
                                                               "\"kubevirt\", \"archive\""),
        "checkpoints": array(obj({"previous": string(), "current": string()},
                                 required=("previous", "current"))),
        "finalCheckpoint": boolean(),
        "preallocation": boolean("Preallocation controls whether storage for DataVolumes should be allocated "
                                 "in advance."),
    }, description="DataVolumeSpec defines the DataVolume type specification")


def datavolume_status() -> Schema:
    return obj({
        "claimName": string(),
        "phase": string("Phase is the current phase of the data volume"),
        "progress": string(),
        "restartCount": integer("RestartCount is the number of times the pod populating the DataVolume "
                                "has restarted"),
        "conditions": array(condition("type of condition ie. Ready|Bound|Running.")),
    })


def _crd(plural: str, kind: str, *, group: str = groups.CDI_GROUP, version: str = groups.CDI_VERSION,
         namespaced: bool, spec: Schema | None, status: Schema | None, short_names: tuple[str, ...] = (),
         categories: tuple[str, ...] = (), columns: tuple[dict[str, Any], ...] = (),
         required: tuple[str, ...] = ("spec",), top_level: dict[str, Schema] | None = None,
         singular: str | None = None, status_subresource: bool = True) -> Manifest:
    properties: dict[str, Schema] = {
        "apiVersion": string(), "kind": string(), "metadata": obj(),
    }
    if spec is not None:
        properties["spec"] = spec
    if status is not None:
        properties["status"] = status
    properties.update(top_level or {})
    names: dict[str, Any] = {"plural": plural, "singular": singular or kind.lower(), "kind": kind,
                             "listKind": kind + "List"}
    if short_names:
        names["shortNames"] = list(short_names)
    if categories:
        names["categories"] = list(categories)
    served: dict[str, Any] = {
        "name": version, "served": True, "storage": True,
        "schema": {"openAPIV3Schema": obj(properties, required=tuple(r for r in required if r in properties))},
    }
    if status is not None and status_subresource:
        served["subresources"] = {"status": {}}
    if columns:
        served["additionalPrinterColumns"] = list(columns)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "labels": {"cdi.kubevirt.io": ""}},
        "spec": {
            "group": group,
            "names": names,
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [served],
        },
    }


def datavolume_crd() -> Manifest:
    return _crd("datavolumes", "DataVolume", namespaced=True, spec=datavolume_spec(),
                status=datavolume_status(), short_names=("dv", "dvs"), categories=("all",), columns=(
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase",
                     "description": "The phase the data volume is in"},
                    {"name": "Progress", "type": "string", "jsonPath": ".status.progress",
                     "description": "Transfer progress in percentage if known, N/A otherwise"},
                    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restartCount",
                     "description": "The number of times the transfer has been restarted."},
                    _AGE,
                ))


def _data_source_source() -> Schema:
    return obj({
        "pvc": _namespaced_name(), "snapshot": _namespaced_name(), "dataSource": _namespaced_name(),
    })


def datasource_crd() -> Manifest:
    return _crd("datasources", "DataSource", namespaced=True,
                spec=obj({"source": _data_source_source()}, required=("source",)),
                status=obj({"source": _data_source_source(),
                            "conditions": array(condition("type of condition ie. Ready"))}),
                short_names=("das",), categories=("all",))


def dataimportcron_crd() -> Manifest:
    template = obj({
        "apiVersion": string(), "kind": string(), "metadata": free_form(),
        "spec": datavolume_spec(), "status": datavolume_status(),
    }, required=("spec",))
    return _crd("dataimportcrons", "DataImportCron", namespaced=True,
                spec=obj({
                    "template": template,
                    "schedule": string("Schedule specifies in cron format when and how often to look for "
                                       "new imports"),
                    "garbageCollect": enum("Outdated", "Never"),
                    "importsToKeep": integer(minimum=0),
                    "managedDataSource": string(),
                    "retentionPolicy": enum("None", "All"),
                    "serviceAccountName": string(minLength=1),
                }, required=("template", "schedule", "managedDataSource")),
                status=obj({
                    "currentImports": array(obj({"DataVolumeName": string(), "Digest": string()},
                                                required=("DataVolumeName",))),
                    "lastImportedPVC": _namespaced_name(),
                    "lastExecutionTimestamp": date_time(),
                    "lastImportTimestamp": date_time(),
                    "sourceFormat": string(),
                    "conditions": array(condition("type of condition ie. Progressing, UpToDate")),
                }),
                short_names=("dic", "dics"), categories=("all",),
                columns=({"name": "Format", "type": "string", "jsonPath": ".status.sourceFormat",
                          "description": "The format in which created sources are saved"},))


def _claim_property_sets() -> Schema:
    return array(obj({
        "accessModes": array(enum(*ACCESS_MODES), maxItems=4),
        "volumeMode": enum("Block", "Filesystem"),
    }, required=("accessModes", "volumeMode")), maxItems=8)


def storageprofile_crd() -> Manifest:
    clone = enum("copy", "snapshot", "csi-clone")
    fmt = enum("pvc", "snapshot")
    return _crd("storageprofiles", "StorageProfile", namespaced=False,
                spec=obj({"cloneStrategy": clone, "claimPropertySets": _claim_property_sets(),
                          "dataImportCronSourceFormat": fmt, "snapshotClass": string()}),
                status=obj({"storageClass": string(), "provisioner": string(), "cloneStrategy": clone,
                            "claimPropertySets": _claim_property_sets(), "dataImportCronSourceFormat": fmt,
                            "snapshotClass": string(),
                            "conditions": array(condition("type of condition ie. Recognized"))}))


def _import_proxy() -> Schema:
    return obj({"HTTPProxy": string(), "HTTPSProxy": string(), "noProxy": string(),
                "trustedCAProxy": string()})


def _filesystem_overhead() -> Schema:
    percent = string(pattern=r"^(0(?:\.\d{1,3})?|1)$")
    return obj({"global": percent, "storageClass": map_of(percent)})


def cdiconfig_spec() -> Schema:
    return obj({
        "uploadProxyURLOverride": string(),
        "importProxy": _import_proxy(),
        "scratchSpaceStorageClass": string(),
        "podResourceRequirements": resource_requirements(),
        "featureGates": array(string()),
        "webhookPvcRendering": enum("Disabled", "Enabled"),
        "filesystemOverhead": _filesystem_overhead(),
        "preallocation": boolean(),
        "insecureRegistries": array(string()),
        "dataVolumeTTLSeconds": integer(),
        "tlsSecurityProfile": free_form(),
        "imagePullSecrets": array(obj({"name": string()})),
        "logVerbosity": integer(minimum=0),
    })


def cdiconfig_crd() -> Manifest:
    return _crd("cdiconfigs", "CDIConfig", namespaced=False, spec=cdiconfig_spec(),
                status=obj({
                    "uploadProxyURL": string(), "uploadProxyCA": string(), "importProxy": _import_proxy(),
                    "scratchSpaceStorageClass": string(),
                    "defaultPodResourceRequirements": resource_requirements(),
                    "filesystemOverhead": _filesystem_overhead(), "preallocation": boolean(),
                    "imagePullSecrets": array(obj({"name": string()})),
                }))


def cdi_crd() -> Manifest:
    cert = obj({"duration": string(), "renewBefore": string()})
    crd = _crd("cdis", "CDI", namespaced=False, singular="cdi",
                spec=obj({
                    "imagePullPolicy": enum("Always", "IfNotPresent", "Never"),
                    "uninstallStrategy": enum("RemoveWorkloads", "BlockUninstallIfWorkloadsExist"),
                    "infra": obj({**node_placement()["properties"], "deploymentReplicas": integer(),
                                  "apiServerReplicas": integer(), "uploadProxyReplicas": integer()}),
                    "workload": node_placement(),
                    "customizeComponents": obj({
                        "patches": array(obj({
                            "resourceName": string(minLength=1), "resourceType": string(minLength=1),
                            "patch": string(), "type": enum("json", "merge", "strategic"),
                        }, required=("resourceName", "resourceType", "patch", "type"))),
                        "flags": obj({"api": map_of(string()), "controller": map_of(string()),
                                      "uploadProxy": map_of(string())}),
                    }),
                    "cloneStrategyOverride": enum("copy", "snapshot", "csi-clone"),
                    "config": cdiconfig_spec(),
                    "certConfig": obj({"ca": cert, "server": cert, "client": cert}),
                    "priorityClass": string(),
                }),
                status=obj({
                    "phase": string(), "conditions": array(free_form()), "operatorVersion": string(),
                    "targetVersion": string(), "observedVersion": string(),
                }),
                short_names=("cdi", "cdis"),
                columns=(_AGE, {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}),
                required=())
    # As CDI's release (`cdi-operator.yaml`) ships it: the CDI kind's old version too, served and not stored.
    # A cluster where CDI ran may list it in the CRD's status.storedVersions, and kube-apiserver refuses a
    # CRD whose spec.versions lacks a stored version: without it, installing over CDI would fail here.
    beta = crd["spec"]["versions"][0]
    crd["spec"]["versions"] = [{**beta, "name": groups.CDI_ALPHA_VERSION, "storage": False}, beta]
    return crd


def objecttransfer_crd() -> Manifest:
    return _crd("objecttransfers", "ObjectTransfer", namespaced=False,
                spec=obj({
                    "source": obj({"apiVersion": string(), "kind": string(), "namespace": string(),
                                   "name": string(), "requiredAnnotations": map_of(string())},
                                  required=("kind", "namespace", "name")),
                    "target": obj({"namespace": string(), "name": string()}),
                    "parentName": string(),
                }, required=("source", "target")),
                status=obj({"phase": enum("Pending", "Running", "Complete", "Error"),
                            "conditions": array(condition("type of condition ie. Complete")),
                            "data": map_of(string())}),
                short_names=("ot", "ots"),
                columns=(_AGE, {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}))


def _checkpoints() -> Schema:
    return array(obj({"previous": string(), "current": string()}, required=("previous", "current")))


def volumeimportsource_crd() -> Manifest:
    """The import populator's source (CDI: no status subresource, an empty status object)."""
    return _crd("volumeimportsources", "VolumeImportSource", namespaced=True, status_subresource=False,
                spec=obj({
                    "source": obj(_import_sources(), description="Source is the src of the data to be "
                                                                 "imported in the target PVC"),
                    "preallocation": boolean("Preallocation controls whether storage for the target PVC "
                                             "should be allocated in advance."),
                    "contentType": string("ContentType represents the type of the imported data "
                                          "(Kubevirt or archive)"),
                    "targetClaim": string("TargetClaim the name of the specific claim to be populated "
                                          "with a multistage import."),
                    "checkpoints": _checkpoints(),
                    "finalCheckpoint": boolean(),
                }, description="VolumeImportSourceSpec defines the Spec field for VolumeImportSource"),
                status=obj(description="VolumeImportSourceStatus provides the most recently observed status "
                                       "of the VolumeImportSource"))


def volumeuploadsource_crd() -> Manifest:
    return _crd("volumeuploadsources", "VolumeUploadSource", namespaced=True, status_subresource=False,
                spec=obj({
                    "contentType": string("ContentType represents the type of the upload data "
                                          "(Kubevirt or archive)"),
                    "preallocation": boolean("Preallocation controls whether storage for the target PVC "
                                             "should be allocated in advance."),
                }, description="VolumeUploadSourceSpec defines specification for VolumeUploadSource"),
                status=obj(description="VolumeUploadSourceStatus provides the most recently observed status "
                                       "of the VolumeUploadSource"))


def volumeclonesource_crd() -> Manifest:
    return _crd("volumeclonesources", "VolumeCloneSource", namespaced=True, status=None,
                spec=obj({
                    "source": obj({"apiGroup": string(), "kind": string(), "name": string()},
                                  required=("kind", "name"),
                                  description="Source is the src of the data to be cloned to the target PVC"),
                    "preallocation": boolean("Preallocation controls whether storage for the target PVC "
                                             "should be allocated in advance."),
                    "priorityClassName": string("PriorityClassName is the priorityclass for the claim"),
                }, required=("source",),
                    description="VolumeCloneSourceSpec defines the Spec field for VolumeCloneSource"))


def populator_crds() -> list[Manifest]:
    """CDI's volume populator kinds, named by a PVC's `spec.dataSourceRef`."""
    return [volumeimportsource_crd(), volumeuploadsource_crd(), volumeclonesource_crd()]


def _snapshot_error() -> Schema:
    return obj({"message": string(), "time": date_time()})


def volumesnapshot_crd() -> Manifest:
    return _crd("volumesnapshots", "VolumeSnapshot", group=groups.SNAPSHOT_GROUP,
                version=groups.SNAPSHOT_VERSION, namespaced=True,
                spec=obj({
                    "source": obj({"persistentVolumeClaimName": string(),
                                   "volumeSnapshotContentName": string()}),
                    "volumeSnapshotClassName": string(),
                }, required=("source",)),
                status=obj({
                    "boundVolumeSnapshotContentName": string(), "creationTime": date_time(),
                    "readyToUse": boolean(), "restoreSize": quantity(), "error": _snapshot_error(),
                    "volumeGroupSnapshotName": string(),
                }),
                short_names=("vs",),
                columns=(
                    {"name": "ReadyToUse", "type": "boolean", "jsonPath": ".status.readyToUse"},
                    {"name": "SourcePVC", "type": "string", "jsonPath": ".spec.source.persistentVolumeClaimName"},
                    {"name": "SourceSnapshotContent", "type": "string",
                     "jsonPath": ".spec.source.volumeSnapshotContentName"},
                    {"name": "RestoreSize", "type": "string", "jsonPath": ".status.restoreSize"},
                    {"name": "SnapshotClass", "type": "string", "jsonPath": ".spec.volumeSnapshotClassName"},
                    {"name": "SnapshotContent", "type": "string",
                     "jsonPath": ".status.boundVolumeSnapshotContentName"},
                    {"name": "CreationTime", "type": "date", "jsonPath": ".status.creationTime"},
                    _AGE,
                ))


def volumesnapshotcontent_crd() -> Manifest:
    return _crd("volumesnapshotcontents", "VolumeSnapshotContent", group=groups.SNAPSHOT_GROUP,
                version=groups.SNAPSHOT_VERSION, namespaced=False,
                spec=obj({
                    "deletionPolicy": enum("Delete", "Retain"),
                    "driver": string(),
                    "source": obj({"volumeHandle": string(), "snapshotHandle": string()}),
                    "sourceVolumeMode": string(),
                    "volumeSnapshotClassName": string(),
                    "volumeSnapshotRef": obj({
                        "apiVersion": string(), "kind": string(), "name": string(), "namespace": string(),
                        "uid": string(), "resourceVersion": string(), "fieldPath": string(),
                    }),
                }, required=("deletionPolicy", "driver", "source", "volumeSnapshotRef")),
                status=obj({
                    "creationTime": integer(fmt="int64"), "readyToUse": boolean(),
                    "restoreSize": integer(fmt="int64", minimum=0), "snapshotHandle": string(),
                    "error": _snapshot_error(), "volumeGroupSnapshotHandle": string(),
                }),
                short_names=("vsc", "vscs"),
                columns=(
                    {"name": "ReadyToUse", "type": "boolean", "jsonPath": ".status.readyToUse"},
                    {"name": "RestoreSize", "type": "integer", "jsonPath": ".status.restoreSize"},
                    {"name": "DeletionPolicy", "type": "string", "jsonPath": ".spec.deletionPolicy"},
                    {"name": "Driver", "type": "string", "jsonPath": ".spec.driver"},
                    {"name": "VolumeSnapshotClass", "type": "string", "jsonPath": ".spec.volumeSnapshotClassName"},
                    {"name": "VolumeSnapshot", "type": "string", "jsonPath": ".spec.volumeSnapshotRef.name"},
                    {"name": "VolumeSnapshotNamespace", "type": "string",
                     "jsonPath": ".spec.volumeSnapshotRef.namespace"},
                    _AGE,
                ))


def volumesnapshotclass_crd() -> Manifest:
    return _crd("volumesnapshotclasses", "VolumeSnapshotClass", group=groups.SNAPSHOT_GROUP,
                version=groups.SNAPSHOT_VERSION, namespaced=False, spec=None, status=None,
                top_level={"driver": string(), "deletionPolicy": enum("Delete", "Retain"),
                           "parameters": map_of(string())},
                required=("driver", "deletionPolicy"),
                short_names=("vsclass", "vsclasses"),
                columns=(
                    {"name": "Driver", "type": "string", "jsonPath": ".driver"},
                    {"name": "DeletionPolicy", "type": "string", "jsonPath": ".deletionPolicy"},
                    _AGE,
                ))


def cdi_crds() -> list[Manifest]:
    return [datavolume_crd(), datasource_crd(), dataimportcron_crd(), storageprofile_crd(),
            cdiconfig_crd(), cdi_crd(), objecttransfer_crd(), *populator_crds()]


def snapshot_crds() -> list[Manifest]:
    return [volumesnapshot_crd(), volumesnapshotcontent_crd(), volumesnapshotclass_crd()]


def all_crds() -> list[Manifest]:
    return cdi_crds() + snapshot_crds()
