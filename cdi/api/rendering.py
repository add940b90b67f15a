"""The PVC a DataVolume asks for: the `pvc` API verbatim, or the `storage` API with its gaps
filled as CDI fills them (storage class from the virt default then the Kubernetes default, access
and volume modes from the StorageProfile, size inflated by the filesystem overhead, the profile's
minimum size). The same rules complete a bare PVC labelled `cdi.kubevirt.io/applyStorageProfile`
(the PVC mutating webhook, CDI's RenderPvc). Pure: the caller passes what the cluster holds, which is
why it lives in `cdi.api`: the controller, the webhook and `cdi image-upload` share this one implementation."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdi.api import annotations as ann
from cdi.api.quantity import QuantityError, parse_bytes
from cdi.api.sizing import DEFAULT_FILESYSTEM_OVERHEAD, required_space
from cdi.api.views import DataVolumeView, ObjectView, StorageProfileView

Body = Mapping[str, Any]
MIB = 1024 * 1024
FROM_STORAGE_PROFILE = "FromStorageProfile"  # a PVC volumeMode the PVC mutating webhook replaces
_STORAGE_FIELDS = ("accessModes", "selector", "resources", "volumeName", "storageClassName", "volumeMode",
                   "dataSource", "dataSourceRef")


class RenderError(Exception):
    """A DataVolume whose claim cannot be rendered; `reason` is the event reason CDI uses."""

    def __init__(self, message: str, reason: str = "ErrClaimNotValid") -> None:
        super().__init__(message)
        self.reason = reason


class NoStorageClass(RenderError):
    """No storage class was named and the cluster has no default: the DataVolume waits (Pending)."""


class ProfileNotReady(NoStorageClass):
    """The class is there, the modes must come from its StorageProfile, and the profile controller has not
    written it yet (the class was just created): the DataVolume waits (Pending) without a warning, rather than
    report for a moment that a profile complete from the start lacks its modes."""


@dataclass(frozen=True)
class ClusterStorage:
    """What rendering needs to know of the cluster."""

    storage_classes: Sequence[Body]
    storage_profiles: Mapping[str, Body]
    cdi_config_status: Body

    def storage_class(self, name: str) -> Body | None:
        return next((sc for sc in self.storage_classes if ObjectView(sc).name == name), None)

    def default_class(self, content_type: str) -> Body | None:
        """The virt default for disk images, else the Kubernetes default; newest, then by name."""
        keys = ([ann.DEFAULT_VIRT_STORAGE_CLASS] if content_type != "archive" else []) + [ann.DEFAULT_STORAGE_CLASS]
        for key in keys:
            defaults = [sc for sc in self.storage_classes if ObjectView(sc).annotations.get(key) == "true"]
            if defaults:
                defaults.sort(key=lambda sc: ObjectView(sc).name)
                defaults.sort(key=lambda sc: ObjectView(sc).creation_timestamp, reverse=True)
                return defaults[0]
        return None

    def filesystem_overhead(self, storage_class: str | None) -> str:
        overhead = self.cdi_config_status.get("filesystemOverhead") or {}
        per_class = overhead.get("storageClass") or {}
        if storage_class and storage_class in per_class:
            return str(per_class[storage_class])
        return str(overhead.get("global") or DEFAULT_FILESYSTEM_OVERHEAD)


def _modes_from_profile(spec: dict[str, Any], storage_class: str, profile: Body | None) -> None:
    if spec.get("accessModes") and spec.get("volumeMode"):
        return
    if profile is None or not StorageProfileView(profile).status:
        raise ProfileNotReady(f"Waiting for the StorageProfile of storage class {storage_class}", "Pending")
    sets = StorageProfileView(profile).claim_property_sets if profile is not None else []
    volume_mode = spec.get("volumeMode")
    if not volume_mode and not spec.get("accessModes"):
        if not sets or not sets[0].get("accessModes"):
            raise RenderError(f"Spec is missing accessMode and volumeMode, cannot get access mode from "
                              f"StorageProfile {storage_class}")
        spec["accessModes"] = list(sets[0]["accessModes"])
        spec["volumeMode"] = sets[0].get("volumeMode") or "Filesystem"
    elif not spec.get("accessModes"):
        for cps in sets:
            if cps.get("volumeMode") == volume_mode and cps.get("accessModes"):
                spec["accessModes"] = list(cps["accessModes"])
                return
        raise RenderError(f"Spec is missing accessMode and cannot get access mode from StorageProfile "
                          f"{storage_class}")
    elif not volume_mode:
        wanted = set(spec["accessModes"])
        for cps in sets:
            if wanted & set(cps.get("accessModes") or []):
                if cps.get("volumeMode"):
                    spec["volumeMode"] = cps["volumeMode"]
                return


def render_claim_spec(dv: Body, cluster: ClusterStorage) -> dict[str, Any]:
    """The spec of the PVC for `dv`. Raises RenderError (event ErrClaimNotValid) or NoStorageClass."""
    view = DataVolumeView(dv)
    if view.pvc_spec is not None:
        return copy.deepcopy(dict(view.pvc_spec))
    storage: Body = view.storage_spec or {}
    spec: dict[str, Any] = {k: copy.deepcopy(storage[k]) for k in _STORAGE_FIELDS if storage.get(k) is not None}
    _render_class_and_modes(spec, cluster, view.content_type)
    source = view.source
    is_clone = source.get("pvc") is not None or source.get("snapshot") is not None or view.source_ref is not None
    _render_size(spec, cluster, is_clone)
    return spec


def webhook_rendering_enabled(config_spec: Body) -> bool:
    """CDIConfig `spec.webhookPvcRendering`: the PVC mutating webhook is on unless it says `Disabled`
    (CDI made the old `WebhookPvcRendering` feature gate the default; listing it changes nothing)."""
    return config_spec.get("webhookPvcRendering") != "Disabled"


def unrendered_claim_spec(dv: Body) -> dict[str, Any]:
    """The `storage` API copied as a PVC spec and left for the PVC mutating webhook to complete (a
    DataVolume labelled `cdi.kubevirt.io/applyStorageProfile` while the webhook is enabled, as CDI)."""
    storage: Body = DataVolumeView(dv).storage_spec or {}
    spec: dict[str, Any] = {k: copy.deepcopy(storage[k]) for k in _STORAGE_FIELDS if storage.get(k) is not None}
    spec.setdefault("volumeMode", FROM_STORAGE_PROFILE)
    return spec


def render_pvc_spec(pvc: Body, cluster: ClusterStorage) -> dict[str, Any]:
    """CDI's RenderPvc: the spec of a bare PVC completed from its StorageProfile as a DataVolume's would be
    (storage class, access and volume modes, size with the filesystem overhead). `volumeMode:
    FromStorageProfile` asks for the profile's mode; an absent one was already defaulted to Filesystem
    by the API server. Claims restored from a VolumeSnapshot keep their size: the snapshot bounds it."""
    spec = copy.deepcopy(dict(pvc.get("spec") or {}))
    if spec.get("volumeMode") == FROM_STORAGE_PROFILE:
        del spec["volumeMode"]
    archive = ObjectView(pvc).annotations.get(ann.CONTENT_TYPE) == "archive"
    _render_class_and_modes(spec, cluster, "archive" if archive else "kubevirt")
    if any((spec.get(key) or {}).get("kind") == "VolumeSnapshot" and
           (spec.get(key) or {}).get("apiGroup") == "snapshot.storage.k8s.io"
           for key in ("dataSource", "dataSourceRef")):
        return spec
    _render_size(spec, cluster, False)
    return spec


def _render_class_and_modes(spec: dict[str, Any], cluster: ClusterStorage, content_type: str) -> None:
    """Storage class (named, else the default for the content type), then the access and volume modes
    the StorageProfile prefers for what is missing. A name that matches no class renders nothing."""
    if content_type == "archive":
        if spec.get("volumeMode") == "Block":
            raise RenderError("ContentType Archive cannot have block volumeMode")
        spec["volumeMode"] = "Filesystem"
    name = spec.get("storageClassName")
    storage_class = cluster.storage_class(name) if name is not None else cluster.default_class(content_type)
    if storage_class is None:
        if not spec.get("accessModes"):
            raise NoStorageClass("DataVolume.storage spec is missing accessMode and no storageClass to choose "
                                 "profile", "ErrClaimNotValid")
    else:
        class_name = ObjectView(storage_class).name
        spec["storageClassName"] = class_name
        _modes_from_profile(spec, class_name, cluster.storage_profiles.get(class_name))


def _render_size(spec: dict[str, Any], cluster: ClusterStorage, is_clone: bool) -> None:
    requests = spec.setdefault("resources", {}).setdefault("requests", {})
    if requests.get("storage") is None:
        if not is_clone:
            raise RenderError("PVC Spec is not valid - missing storage size")
        return
    try:
        requested = parse_bytes(requests["storage"])
    except QuantityError as exc:
        raise RenderError(f"PVC Spec is not valid - {exc}") from exc
    if requested < MIB:
        raise RenderError("PVC Spec is not valid - storage size should be at least 1MiB")
    size = requested
    class_name = spec.get("storageClassName")
    if (spec.get("volumeMode") or "Filesystem") == "Filesystem":
        size = required_space(cluster.filesystem_overhead(class_name), requested)
    requests["storage"] = str(size)
    if class_name:
        # CDI raises the (inflated) request of either volume mode to the profile's minimum, and then asks for
        # the minimum as the annotation writes it ("4Gi"); an unparsable annotation is ignored.
        profile = cluster.storage_profiles.get(class_name)
        annotations = ObjectView(profile).annotations if profile is not None else {}
        minimum = str(annotations.get(ann.MINIMUM_PVC_SIZE) or "").strip()
        try:
            if minimum and size < parse_bytes(minimum):
                requests["storage"] = minimum
        except QuantityError:
            pass
