"""Rendering a DataVolume's claim with CDI's rules for the `storage` API."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.rendering import (
    ClusterStorage,
    NoStorageClass,
    ProfileNotReady,
    RenderError,
    render_claim_spec,
    render_pvc_spec,
    unrendered_claim_spec,
)
from cdi.api.sizing import required_space


def sc(name: str, *, default: bool = False, virt: bool = False,
       created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    annotations = {}
    if default:
        annotations["storageclass.kubernetes.io/is-default-class"] = "true"
    if virt:
        annotations["storageclass.kubevirt.io/is-default-virt-class"] = "true"
    return {"metadata": {"name": name, "annotations": annotations, "creationTimestamp": created},
            "provisioner": "x"}


def profile(*sets: tuple[list[str], str], min_size: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": {"cdi.kubevirt.io/minimumSupportedPvcSize": min_size} if min_size else {}}
    return {"metadata": meta, "status": {"claimPropertySets": [
        {"accessModes": modes, "volumeMode": mode} for modes, mode in sets]}}


CLUSTER = ClusterStorage(
    storage_classes=[sc("local", default=True), sc("fast", virt=True), sc("block")],
    storage_profiles={"local": profile((["ReadWriteOnce"], "Filesystem")),
                      "fast": profile((["ReadWriteMany"], "Block"), (["ReadWriteOnce"], "Filesystem")),
                      "block": profile((["ReadWriteOnce"], "Block"), min_size="4Gi")},
    cdi_config_status={"filesystemOverhead": {"global": "0.06", "storageClass": {"local": "0.055"}}},
)


def dv(storage: dict[str, Any] | None = None, pvc: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"source": {"http": {"url": "http://x/y"}}, **spec}
    if pvc is not None:
        body["pvc"] = pvc
    else:
        body["storage"] = {"resources": {"requests": {"storage": "1Gi"}}, **(storage or {})}
    return {"metadata": {"name": "d", "namespace": "ns"}, "spec": body}


def test_pvc_api_is_copied_verbatim() -> None:
    pvc = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    assert render_claim_spec(dv(pvc=pvc), CLUSTER) == pvc


def test_storage_api_prefers_the_virt_default_class_and_its_profile() -> None:
    spec = render_claim_spec(dv(), CLUSTER)
    assert spec["storageClassName"] == "fast"
    assert spec["accessModes"] == ["ReadWriteMany"] and spec["volumeMode"] == "Block"
    assert spec["resources"]["requests"]["storage"] == str(1024 ** 3)  # block: no overhead


def test_archive_content_uses_the_kubernetes_default_and_filesystem_overhead() -> None:
    spec = render_claim_spec(dv(contentType="archive"), CLUSTER)
    assert spec["storageClassName"] == "local" and spec["volumeMode"] == "Filesystem"
    assert spec["resources"]["requests"]["storage"] == str(required_space("0.055", 1024 ** 3))


def test_given_volume_mode_picks_matching_access_modes() -> None:
    spec = render_claim_spec(dv({"storageClassName": "fast", "volumeMode": "Filesystem"}), CLUSTER)
    assert spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["resources"]["requests"]["storage"] == str(required_space("0.06", 1024 ** 3))


def test_given_access_modes_pick_the_volume_mode() -> None:
    spec = render_claim_spec(dv({"storageClassName": "fast", "accessModes": ["ReadWriteOnce"]}), CLUSTER)
    assert spec["volumeMode"] == "Filesystem"


def test_profile_minimum_size_is_applied() -> None:
    spec = render_claim_spec(dv({"storageClassName": "block"}), CLUSTER)
    assert spec["resources"]["requests"]["storage"] == "4Gi"  # the minimum as the annotation writes it
    spec = render_claim_spec(dv({"storageClassName": "block", "resources": {"requests": {"storage": "5Gi"}}}),
                             CLUSTER)
    assert spec["resources"]["requests"]["storage"] == str(5 * 1024 ** 3)


def test_profile_without_claim_properties_is_an_invalid_claim() -> None:
    written = {"status": {"storageClass": "bare", "provisioner": "example.com/unknown"}}
    cluster = ClusterStorage([sc("bare", default=True)], {"bare": written}, {})
    with pytest.raises(RenderError, match="cannot get access mode from StorageProfile bare") as info:
        render_claim_spec(dv(contentType="archive"), cluster)
    assert info.value.reason == "ErrClaimNotValid"


@pytest.mark.parametrize("profile", [None, {"metadata": {"name": "new"}, "spec": {}}])
def test_a_class_whose_profile_is_not_written_yet_waits_for_it(profile: dict[str, Any] | None) -> None:
    """The class was just created: its profile is not there, or not yet written by the profile controller.
    That is no invalid claim (a class of a known provisioner gets its modes a moment later): it waits."""
    cluster = ClusterStorage([sc("new")], {"new": profile} if profile else {}, {})
    with pytest.raises(ProfileNotReady, match="Waiting for the StorageProfile of storage class new") as info:
        render_claim_spec(dv({"storageClassName": "new"}), cluster)
    assert isinstance(info.value, NoStorageClass) and info.value.reason == "Pending"
    stated = dv({"storageClassName": "new", "accessModes": ["ReadWriteOnce"], "volumeMode": "Block"})
    assert render_claim_spec(stated, cluster)["volumeMode"] == "Block"  # nothing asked of the profile


def test_no_storage_class_at_all_waits() -> None:
    with pytest.raises(NoStorageClass):
        render_claim_spec(dv(), ClusterStorage([], {}, {}))


def test_archive_on_block_is_refused() -> None:
    with pytest.raises(RenderError, match="ContentType Archive cannot have block volumeMode"):
        render_claim_spec(dv({"volumeMode": "Block"}, contentType="archive"), CLUSTER)


def pvc(spec: dict[str, Any], **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "annotations": annotations},
            "spec": {"resources": {"requests": {"storage": "1Gi"}}, **spec}}


def test_a_bare_claim_is_rendered_as_a_datavolumes() -> None:
    rendered = render_pvc_spec(pvc({"volumeMode": "Filesystem"}), CLUSTER)
    assert rendered == render_claim_spec(dv({"volumeMode": "Filesystem"}), CLUSTER)


def test_from_storage_profile_takes_the_first_claim_property_set() -> None:
    rendered = render_pvc_spec(pvc({"volumeMode": "FromStorageProfile"}), CLUSTER)
    assert (rendered["storageClassName"], rendered["accessModes"], rendered["volumeMode"]) == \
        ("fast", ["ReadWriteMany"], "Block")


def test_archive_annotation_on_a_claim_picks_the_kubernetes_default_and_filesystem() -> None:
    rendered = render_pvc_spec(pvc({"volumeMode": "FromStorageProfile"}, **{"cdi.kubevirt.io/storage.contentType":
                                                                              "archive"}), CLUSTER)
    assert (rendered["storageClassName"], rendered["volumeMode"]) == ("local", "Filesystem")


def test_a_claim_restored_from_a_snapshot_keeps_its_size() -> None:
    source = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}
    rendered = render_pvc_spec(pvc({"volumeMode": "Filesystem", "dataSource": source}), CLUSTER)
    assert rendered["resources"]["requests"]["storage"] == "1Gi" and rendered["accessModes"] == ["ReadWriteOnce"]


def test_an_empty_class_name_is_not_the_default_class() -> None:
    with pytest.raises(NoStorageClass):
        render_pvc_spec(pvc({"storageClassName": "", "volumeMode": "Filesystem"}), CLUSTER)


def test_a_datavolume_left_to_the_webhook_asks_for_the_profiles_volume_mode() -> None:
    assert unrendered_claim_spec(dv()) == {"resources": {"requests": {"storage": "1Gi"}},
                                           "volumeMode": "FromStorageProfile"}
