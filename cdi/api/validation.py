"""DataVolume admission rules as pure functions, with CDI's field paths and messages
(pkg/apiserver/webhooks), so a manifest CDI refuses is refused here with the same words.

The webhook server (cdi.apiserver) wraps these; the controller reuses them to refuse specs that
reached it without a webhook."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from cdi.api import annotations as ann
from cdi.api.checksum import ChecksumSyntaxError, parse_checksum
from cdi.api.quantity import QuantityError, parse_bytes

Body = Mapping[str, Any]
MIB = 1024 * 1024
ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
_MODES_MESSAGE = 'supported values: "ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"'
IMPORT_SOURCES = ("http", "s3", "gcs", "registry", "blank", "imageio", "vddk")
# field-path spelling of each source key, as CDI's Go field names appear in its messages
_SOURCE_FIELD = {"http": "HTTP", "s3": "S3", "gcs": "GCS", "registry": "Registry", "pvc": "PVC", "upload": "Upload",
                 "blank": "Blank", "imageio": "Imageio", "vddk": "VDDK", "snapshot": "Snapshot"}


@dataclass(frozen=True)
class Cause:
    field: str
    message: str
    reason: str = "FieldValueInvalid"


def _claim(spec: Body) -> Body:
    claim = spec.get("pvc")
    if claim is None:
        claim = spec.get("storage")
    return claim if isinstance(claim, Mapping) else {}


def _size_causes(spec: Body, is_clone: bool) -> list[Cause]:
    name = "PVC" if spec.get("pvc") is not None else "Storage"
    claim = _claim(spec)
    field = f"spec.{name}.resources.requests.size"
    size = ((claim.get("resources") or {}).get("requests") or {}).get("storage")
    if size is None:
        if spec.get("storage") is None or not is_clone:
            return [Cause(field, f"{name} size is missing")]
        return []
    try:
        value = parse_bytes(size)
    except QuantityError:
        return [Cause(field, f"{name} size can't be equal or less than zero")]
    if value <= 0:
        return [Cause(field, f"{name} size can't be equal or less than zero")]
    if value < MIB:
        return [Cause(field, f"{name} size should be at least 1MiB")]
    return []


def _url_cause(url: str | None, source: str) -> list[Cause]:
    field = f"spec.source.{source}.url"
    if not url:
        return [Cause(field, "spec.source source URL is empty")]
    parsed = urlparse(url)
    if not parsed.scheme or not (parsed.netloc or parsed.path.startswith("/")):
        return [Cause(field, f"spec.source Invalid source URL: {url}")]
    if parsed.scheme not in ("http", "https", "gs"):
        return [Cause(field, f"spec.source Invalid source URL scheme: {url}")]
    return []


def _registry_causes(registry: Body, content_type: str) -> list[Cause]:
    if content_type not in ("", "kubevirt"):
        return [Cause("spec.contentType", "ContentType must be kubevirt when Source is Registry")]
    url, stream = registry.get("url"), registry.get("imageStream")
    if (url is None) == (stream is None):
        return [Cause("spec.source.Registry", "Source registry should have either URL or ImageStream")]
    if url is not None:
        scheme = urlparse(url).scheme
        if scheme not in ("docker", "oci-archive"):
            return [Cause("spec.source.Registry.URL", f"Illegal registry source URL scheme {url}")]
    method = registry.get("pullMethod")
    if method not in (None, "pod", "node"):
        return [Cause("spec.source.Registry.importMethod", f'ImportMethod {method} is neither pod, node or ""')]
    if stream is not None and stream == "":
        return [Cause("spec.source.Registry.importMethod", "Source registry ImageStream is not valid")]
    if stream is not None and method != "node":
        return [Cause("spec.source.Registry.importMethod",
                      "Source registry ImageStream is supported only with node pull import method")]
    return []


def _source_causes(spec: Body) -> list[Cause]:
    source: Body = spec.get("source") or {}
    content_type = str(spec.get("contentType") or "")
    present = [key for key, value in source.items() if value is not None]
    if not present:
        return [Cause("spec.source", "Missing Data volume source")]
    if len(present) > 1:
        return [Cause("spec.source", "Multiple Data volume sources")]
    if content_type not in ("", "kubevirt", "archive"):
        return [Cause("spec.contentType", "ContentType not one of: kubevirt, archive")]
    kind = present[0]
    body: Body = source[kind] or {}
    if kind == "http":
        causes = _url_cause(body.get("url"), "HTTP")
        if body.get("checksum"):
            try:
                parse_checksum(str(body["checksum"]))
            except ChecksumSyntaxError as exc:
                causes.append(Cause("spec.source.HTTP.checksum", f"Invalid checksum format: {exc}"))
        return causes
    if kind in ("s3", "gcs"):
        return _url_cause(body.get("url"), _SOURCE_FIELD[kind])
    if kind == "blank" and content_type == "archive":
        return [Cause("spec.contentType", "SourceType cannot be blank and the contentType be archive")]
    if kind == "registry":
        return _registry_causes(body, content_type)
    if kind == "imageio":
        if not body.get("secretRef") or not body.get("diskId"):
            return [Cause("spec.source.Imageio", "spec.source.Imageio source Imageio is not valid")]
        if not body.get("certConfigMap") and not body.get("insecureSkipVerify"):
            return [Cause("spec.source.Imageio",
                          "spec.source.Imageio source Imageio requires CertConfigMap or InsecureSkipVerify")]
        return _url_cause(body.get("url"), "ImageIO")
    if kind == "vddk":
        if not all(body.get(k) for k in ("secretRef", "uuid", "backingFile", "thumbprint")):
            return [Cause("spec.source.VDDK", "spec.source.VDDK source VDDK is not valid")]
        return _url_cause(body.get("url"), "VDDK")
    if kind in ("pvc", "snapshot") and (not body.get("namespace") or not body.get("name")):
        label = "PVC" if kind == "pvc" else "snapshot"
        path = f"spec.source.{_SOURCE_FIELD[kind]}"
        return [Cause(path, f"{path} source {label} is not valid")]
    return []


def _reference_causes(ref: Body, field: str, what: str, allow_namespace: bool) -> list[Cause]:
    causes = []
    if not allow_namespace and ref.get("namespace"):
        causes.append(Cause(f"{field}.namespace", f"Invalid value: {what} namespace not supported"))
    if not ref.get("name"):
        causes.append(Cause(f"{field}.name", f"Required value: {what} name"))
    if not ref.get("kind"):
        causes.append(Cause(f"{field}.kind", f"Required value: {what} kind"))
    if not ref.get("apiGroup") and ref.get("kind") != "PersistentVolumeClaim":
        causes.append(Cause(f"{field}.apiGroup",
                            f"Required value: {what} apiGroup when kind is not 'PersistentVolumeClaim'"))
    return causes


def validate_datavolume_spec(spec: Body) -> list[Cause]:
    """Causes for refusing a DataVolume spec; CDI stops at the first problem, and so do we."""
    if spec.get("pvc") is None and spec.get("storage") is None:
        return [Cause("spec.PVC", "Missing Data volume PVC")]
    if spec.get("pvc") is not None and spec.get("storage") is not None:
        return [Cause("spec.PVC.Storage", "Duplicate storage definition, both target storage and target pvc defined")]
    source: Body = spec.get("source") or {}
    is_clone = spec.get("sourceRef") is not None or source.get("pvc") is not None or \
        source.get("snapshot") is not None
    causes = _size_causes(spec, is_clone)
    if causes:
        return causes
    claim = _claim(spec)
    storage_class = claim.get("storageClassName")
    if storage_class and len(storage_class) > 253:
        return [Cause("", "Name cannot be longer than 253 characters")]
    modes = list(claim.get("accessModes") or [])
    if spec.get("pvc") is not None:
        if not modes:
            return [Cause("spec.PVC.accessModes", "Required value: at least 1 access mode is required")]
        if len(modes) > 1:
            return [Cause("spec.PVC.accessModes", "PVC multiple accessModes")]
    for mode in modes:
        if mode not in ACCESS_MODES:
            return [Cause("spec.PVC.accessModes", f'Unsupported value: "{modes[0]}": {_MODES_MESSAGE}')]
    data_source, data_source_ref = claim.get("dataSource"), claim.get("dataSourceRef")
    if data_source is not None or data_source_ref is not None:
        causes = []
        if spec.get("source") is not None or spec.get("sourceRef") is not None:
            causes.append(Cause("spec.source", "External population is incompatible with Source and SourceRef"))
        if data_source is not None and data_source_ref is not None and dict(data_source) != dict(data_source_ref):
            causes.append(Cause("", "DataSourceRef and DataSource must match"))
        if data_source is not None:
            causes += _reference_causes(data_source, "spec.dataSource", "DataSource", allow_namespace=True)
        if data_source_ref is not None:
            causes += _reference_causes(data_source_ref, "spec.dataSourceRef", "DataSourceRef", allow_namespace=False)
        return causes
    if (spec.get("source") is None) == (spec.get("sourceRef") is None):
        return [Cause("spec.source", "Data volume should have either Source or SourceRef, or be externally populated")]
    ref = spec.get("sourceRef")
    if ref is not None:
        if not ref.get("kind"):
            return [Cause("spec.sourceRef.Kind", "Missing sourceRef kind")]
        if ref.get("kind") != "DataSource":
            return [Cause("spec.sourceRef.Kind",
                          f"Unsupported sourceRef kind {ref.get('kind')}, currently only DataSource is supported")]
        if not ref.get("name"):
            return [Cause("spec.sourceRef.Name", "Missing sourceRef name")]
        return []
    return _source_causes(spec)


def validate_datavolume(dv: Body, old: Body | None = None) -> list[Cause]:
    """Everything the validating webhook checks that needs no API lookups."""
    if old is not None:
        new_spec, old_spec = dict(dv.get("spec") or {}), dict(old.get("spec") or {})
        source = new_spec.get("source") or {}
        multi_stage = bool(new_spec.get("checkpoints")) and (source.get("vddk") or source.get("imageio"))
        if multi_stage:
            for spec in (new_spec, old_spec):
                spec.pop("checkpoints", None)
                spec.pop("finalCheckpoint", None)
        if new_spec != old_spec:
            return [Cause("DataVolume.Spec", "Cannot update DataVolume Spec", "FieldValueDuplicate")]
    name = str((dv.get("metadata") or {}).get("name", ""))
    if len(name) > 253:
        return [Cause("", "Name cannot be longer than 253 characters")]
    return _extension_causes(dv) + (validate_datavolume_spec(dv.get("spec") or {}) or _switch_causes(dv))


def _extension_causes(dv: Body) -> list[Cause]:
    """Our extension annotations with a syntax: refused at admission rather than by the worker pod."""
    annotations: Body = (dv.get("metadata") or {}).get("annotations") or {}
    checksum = annotations.get(ann.UPLOAD_CHECKSUM)
    if checksum is None:
        return []
    try:
        parse_checksum(str(checksum))
    except ChecksumSyntaxError as exc:
        return [Cause(f"metadata.annotations[{ann.UPLOAD_CHECKSUM}]", f"Invalid checksum format: {exc}")]
    return []


_SWITCHES = (ann.CLONE_ALLOW_SOURCE_IN_USE,)  # extensions that are on or off


def _switch_causes(dv: Body) -> list[Cause]:
    """An extension switch says "true" or "false": anything else is refused rather than taken as off, since
    a user who wrote `yes` meant on."""
    annotations: Body = (dv.get("metadata") or {}).get("annotations") or {}
    return [Cause(f"metadata.annotations[{key}]", f'{key}: must be "true" or "false", not {annotations[key]!r}')
            for key in _SWITCHES if key in annotations and annotations[key] not in ("true", "false")]


POPULATOR_NAME_MAX = 63  # CDI's DNS1035LabelMaxLength for populator sources


def _without_nulls(spec: Body) -> dict[str, Any]:
    """A spec as Go decodes it: a field given as null is a field not given."""
    return {k: v for k, v in spec.items() if v is not None}


def _frozen_spec(kind: str, new: Body, old: Body | None, multi_stage: bool = False) -> list[Cause]:
    """CDI refuses any change of a populator source's spec (the claims it fills read it once); a multi-stage
    import (vddk or imageio with checkpoints) may still move its checkpoints."""
    if old is None:
        return []
    new_spec, old_spec = _without_nulls(new.get("spec") or {}), _without_nulls(old.get("spec") or {})
    if multi_stage:
        for spec in (new_spec, old_spec):
            spec.pop("checkpoints", None)
            spec.pop("finalCheckpoint", None)
    if new_spec != old_spec:
        return [Cause(f"{kind}.Spec", f"Cannot update {kind} Spec", "FieldValueDuplicate")]
    return []


def _populator_name(obj: Body) -> list[Cause]:
    if len(str((obj.get("metadata") or {}).get("name", ""))) > POPULATOR_NAME_MAX:
        return [Cause("", f"Name cannot be longer than {POPULATOR_NAME_MAX} characters")]
    return []


def _content_type_causes(spec: Body) -> list[Cause]:
    if str(spec.get("contentType") or "") not in ("", "kubevirt", "archive"):
        return [Cause("spec.contentType", "ContentType not one of: kubevirt, archive")]
    return []


def validate_volume_import_source(obj: Body, old: Body | None = None) -> list[Cause]:
    """CDI's populator validating webhook for a VolumeImportSource: its spec never changes after creation
    (but a multi-stage import's checkpoints), its name fits a DNS label, and its one source is checked as a
    DataVolume's (same field paths and words), with CDI's order of checks."""
    spec: Body = obj.get("spec") or {}
    source: Body = spec.get("source") or {}
    multi_stage = bool(spec.get("checkpoints")) and bool(source.get("vddk") or source.get("imageio"))
    causes = _frozen_spec("VolumeImportSource", obj, old, multi_stage) or _populator_name(obj) or \
        _content_type_causes(spec)
    if causes:
        return causes
    present = [key for key, value in source.items() if value is not None]
    if not present:
        return [Cause("spec.source", "Missing VolumeImport source")]
    if len(present) > 1:
        return [Cause("spec.source", "Multiple VolumeImport sources")]
    if multi_stage and not spec.get("targetClaim"):
        return [Cause("spec.targetClaim", "Unable to do multi-stage import without specifying a target claim")]
    return _source_causes({"source": {present[0]: source[present[0]]}, "contentType": spec.get("contentType")})


def validate_volume_upload_source(obj: Body, old: Body | None = None) -> list[Cause]:
    """CDI's populator validating webhook for a VolumeUploadSource: a frozen spec, a DNS-label name and a
    content type CDI knows."""
    return _frozen_spec("VolumeUploadSource", obj, old) or _populator_name(obj) or \
        _content_type_causes(obj.get("spec") or {})


def rejection_message(causes: list[Cause]) -> str:
    """How CDI's webhooks join causes into the denial message (each prefixed with a space)."""
    return "".join(f" {c.message}" for c in causes)


UNSUPPORTED_SOURCE_REASON = "UnsupportedSource"
_UNSUPPORTED = {
    "imageio": ("spec.source.imageio", "importing from oVirt/RHV ImageIO is not supported: this CDI has no "
                "ImageIO client; export the disk and import it with spec.source.http or spec.source.s3"),
    "vddk": ("spec.source.vddk", "importing from VMware through VDDK is not supported: it needs VMware's "
             "proprietary VDDK library, which this CDI does not ship; export the disk and import it with "
             "spec.source.http or spec.source.s3"),
}


def unsupported_source(spec: Body) -> Cause | None:
    """A source CDI admits but this implementation cannot import from, with the field and why.

    CDI's webhook admits these (so ours does too, and a manifest written for CDI is not refused);
    the DataVolume then ends `Failed` with this cause instead of waiting forever for a worker that
    will never come."""
    source: Body = spec.get("source") or {}
    present = [key for key, value in source.items() if value is not None]
    if len(present) != 1:
        return None
    kind = present[0]
    if kind in _UNSUPPORTED:
        field, why = _UNSUPPORTED[kind]
        return Cause(field, f"{field}: {why}", UNSUPPORTED_SOURCE_REASON)
    if kind == "registry":
        registry: Body = source["registry"] or {}
        if registry.get("imageStream") is not None:
            field = "spec.source.registry.imageStream"
            return Cause(field, f"{field}: OpenShift ImageStreams are not supported: resolving one needs "
                                "OpenShift's image policy, which this CDI does not use; name the image with "
                                "spec.source.registry.url", UNSUPPORTED_SOURCE_REASON)
        if urlparse(str(registry.get("url") or "")).scheme == "oci-archive":
            field = "spec.source.registry.url"
            return Cause(field, f"{field}: oci-archive URLs are not supported: they name a file inside the "
                                "importer pod, which nothing can put there; push the image to a registry and "
                                "use a docker:// URL", UNSUPPORTED_SOURCE_REASON)
    return None


def external_population(spec: Body) -> Body | None:
    """The claim's dataSourceRef (else dataSource) when the DataVolume is filled by a volume populator
    or a PVC/snapshot data source of the provisioner's (CDI's external population)."""
    claim = _claim(spec)
    ref = claim.get("dataSourceRef") or claim.get("dataSource")
    return ref if isinstance(ref, Mapping) else None
