"""The DataVolume side of the populators (CDI's shouldUseCDIPopulator and the volume source CRs the
import and upload DataVolume controllers make): an import or upload DataVolume on a CSI storage class
(one whose provisioner has a CSIDriver object) is filled through a populator unless annotated
`cdi.kubevirt.io/storage.usePopulator: "false"`. Its claim then names a `VolumeImportSource` or
`VolumeUploadSource` the DataVolume owns (`volume-import-source-<dv uid>`,
`volume-upload-source-<dv uid>`), stays Pending until the prime claim's volume is handed over, and
shows `PendingPopulation` while a WaitForFirstConsumer class waits for a consumer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.owners import owner_reference
from cdi.api.views import ClaimView, DataVolumeView, ObjectView
from cdi.controller.runtime import Context
from cdi.kube import AlreadyExists, NotFound

Obj = dict[str, Any]
Body = Mapping[str, Any]

IMPORT_SOURCE_PREFIX = "volume-import-source"
UPLOAD_SOURCE_PREFIX = "volume-upload-source"
_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # Go's strconv.ParseBool
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def parse_bool(value: str) -> bool | None:
    return True if value in _TRUE else False if value in _FALSE else None


def csi_driver_exists(ctx: Context, storage_class_name: str | None) -> bool:
    """CDI's storageClassCSIDriverExists: the class's provisioner (the default class's for a claim
    that names none) has a CSIDriver object."""
    if storage_class_name:
        storage_class = ctx.cached(groups.STORAGECLASSES, storage_class_name)
    else:
        storage_class = next((c for c in ctx.cached_list(groups.STORAGECLASSES)
                              if ObjectView(c).annotations.get(ann.DEFAULT_STORAGE_CLASS) == "true"),
                             None)
    if storage_class is None:
        return False
    return ctx.cached(groups.CSIDRIVERS, str(storage_class.get("provisioner", ""))) is not None


def uses_populator(ctx: Context, dv: Body, claim_spec: Body) -> bool:
    """The DataVolume's `storage.usePopulator` annotation when set (the DataVolume remembers the
    choice there), else whether the class is CSI storage."""
    chosen = parse_bool(str(DataVolumeView(dv).annotations.get(ann.USE_POPULATOR, "")))
    if chosen is not None:
        return chosen
    return csi_driver_exists(ctx, claim_spec.get("storageClassName"))


def claim_uses_populator(pvc: Body) -> bool:
    """CDI's CheckPVCUsingPopulators: a dataSourceRef and the usePopulator annotation true."""
    view = ClaimView(pvc)
    return bool(view.populator_ref) and parse_bool(str(view.annotations.get(ann.USE_POPULATOR, ""))) is True


def pending_population(ctx: Context, pvc: Body) -> bool:
    """CDI's shouldBeMarkedPendingPopulation: a WaitForFirstConsumer class, no node chosen yet, and no
    immediate binding asked for."""
    view = ClaimView(pvc)
    storage_class = ctx.cached(groups.STORAGECLASSES, view.storage_class)
    annotations = view.annotations
    return (storage_class or {}).get("volumeBindingMode") == "WaitForFirstConsumer" and \
        not annotations.get(ann.SELECTED_NODE) and ann.BIND_IMMEDIATE not in annotations


def _volume_source(dv: Body) -> tuple[groups.GVR, Obj]:
    view = DataVolumeView(dv)
    spec: Obj = {}
    if view.spec.get("contentType"):
        spec["contentType"] = view.spec["contentType"]
    if view.spec.get("preallocation") is not None:
        spec["preallocation"] = view.spec["preallocation"]
    if view.source_kind == "upload":
        gvr, name = groups.VOLUMEUPLOADSOURCES, f"{UPLOAD_SOURCE_PREFIX}-{view.uid}"
    else:
        gvr, name = groups.VOLUMEIMPORTSOURCES, f"{IMPORT_SOURCE_PREFIX}-{view.uid}"
        kind = view.source_kind or "blank"
        spec["source"] = {kind: dict(view.source.get(kind) or {})}
    return gvr, {"apiVersion": groups.CDI_API_VERSION, "kind": gvr.kind,
                 "metadata": {"name": name, "namespace": view.namespace,
                              "ownerReferences": [owner_reference(groups.DATAVOLUMES, dv)]},
                 "spec": spec}


async def ensure_volume_source(ctx: Context, dv: Body) -> Obj:
    """Create the DataVolume's volume source CR (if it is not there) and return the dataSourceRef
    its claim names."""
    gvr, body = _volume_source(dv)
    try:
        await ctx.client.create(gvr, body, body["metadata"]["namespace"])
    except AlreadyExists:
        pass
    return {"apiGroup": groups.CDI_GROUP, "kind": gvr.kind, "name": body["metadata"]["name"]}


async def delete_volume_source(ctx: Context, dv: Body) -> None:
    """The DataVolume succeeded: its volume source CR has served (CDI's cleanup)."""
    gvr, body = _volume_source(dv)
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    if ctx.cached(gvr, name, namespace) is None:
        return
    try:
        await ctx.client.delete(gvr, name, namespace)
    except NotFound:
        pass
