"""The typed views read what the reconcilers read, and an absent field reads as empty, never raises."""

from __future__ import annotations

from cdi.api.views import (
    CDIView,
    ClaimView,
    DataImportCronView,
    DataSourceView,
    DataVolumeView,
    ObjectView,
    PersistentVolumeView,
    PodView,
    SnapshotContentView,
    SnapshotView,
    StorageProfileView,
)


def test_a_claim_view() -> None:
    claim = ClaimView({"metadata": {"name": "disk", "namespace": "ns", "annotations": {"a": "1"},
                                    "deletionTimestamp": "2026-01-01T00:00:00Z"},
                       "spec": {"storageClassName": "local", "volumeMode": "Block",
                                "resources": {"requests": {"storage": "2Gi"}}},
                       "status": {"phase": "Bound"}})
    assert (claim.key, claim.storage_class, claim.requested_storage) == ("ns/disk", "local", "2Gi")
    assert claim.bound and claim.block and claim.deleting and claim.annotations == {"a": "1"}
    empty = ClaimView({})
    assert (empty.phase, empty.storage_class, empty.requested_storage, empty.bound, empty.block) == \
        ("", "", "", False, False)


def test_a_pod_view() -> None:
    pod = PodView({"metadata": {"name": "importer-disk", "ownerReferences": [
        {"kind": "PersistentVolumeClaim", "name": "disk"}]},
        "spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "disk"}},
                             {"name": "tmp", "emptyDir": {}}]},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "importer"}],
                   "conditions": [{"type": "PodScheduled", "status": "True"}]}})
    assert pod.finished and pod.phase == "Failed"
    assert pod.claim_names == ["disk"]
    assert pod.owned_by_claim("disk") and not pod.owned_by_claim("other")
    assert [s["name"] for s in pod.container_statuses] == ["importer"]
    assert pod.conditions[0]["type"] == "PodScheduled"
    empty = PodView({"metadata": {"name": "p"}})
    assert (empty.phase, empty.finished, empty.claim_names, empty.container_statuses) == ("", False, [], [])


def test_every_view_reads_spec_and_status_as_empty_when_absent() -> None:
    for view in (ObjectView({}), DataVolumeView({"spec": None}), ClaimView({"status": "odd"})):
        assert (view.spec, view.status) == ({}, {})


def test_a_data_volume_view() -> None:
    dv = DataVolumeView({"metadata": {"name": "dv", "namespace": "ns"},
                         "spec": {"source": {"pvc": {"name": "src"}}, "sourceRef": {"kind": "DataSource",
                                                                                     "name": "golden"}},
                         "status": {"phase": "Succeeded"}})
    assert (dv.source_kind, dv.phase, dv.source_ref) == ("pvc", "Succeeded", {"kind": "DataSource", "name": "golden"})
    assert DataVolumeView({}).source_ref is None


def test_claim_view_volume_and_capacity() -> None:
    claim = ClaimView({"spec": {"volumeName": "pv-1"}, "status": {"capacity": {"storage": "1Gi"}}})
    assert (claim.volume_mode, claim.volume_name, claim.capacity) == ("Filesystem", "pv-1", "1Gi")
    assert (ClaimView({}).volume_name, ClaimView({}).capacity) == ("", "")


def test_pod_view_ip_and_termination() -> None:
    pod = PodView({"status": {"podIP": "10.0.0.5", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 0, "message": "done"}}}]}})
    assert pod.pod_ip == "10.0.0.5" and pod.first_terminated == {"exitCode": 0, "message": "done"}
    running = PodView({"status": {"containerStatuses": [{"state": {"running": {}}}]}})
    assert (running.first_terminated, PodView({}).first_terminated, PodView({}).pod_ip) == (None, None, "")


def test_a_data_source_view() -> None:
    ds = DataSourceView({"spec": {"source": {"pvc": {"name": "disk", "namespace": "golden"}}}})
    assert ds.source_of("pvc") == {"name": "disk", "namespace": "golden"}
    assert ds.source_of("snapshot") is None and DataSourceView({}).source == {}


def test_snapshot_views_and_storage_profile_view() -> None:
    snap = SnapshotView({"status": {"readyToUse": True, "restoreSize": "2Gi",
                                    "boundVolumeSnapshotContentName": "content-1"}})
    assert (snap.ready_to_use, snap.restore_size, snap.content_name) == (True, "2Gi", "content-1")
    assert (SnapshotView({"status": {"readyToUse": "true"}}).ready_to_use, SnapshotView({}).restore_size) == \
        (False, "")
    content = SnapshotContentView({"spec": {"driver": "csi.example", "sourceVolumeMode": "Block"}})
    assert (content.driver, content.source_volume_mode) == ("csi.example", "Block")
    profile = StorageProfileView({"status": {"cloneStrategy": "snapshot", "snapshotClass": "snap"}})
    assert (profile.clone_strategy, profile.snapshot_class) == ("snapshot", "snap")
    assert (StorageProfileView({}).clone_strategy, StorageProfileView({}).snapshot_class) == ("", "")


def test_a_persistent_volume_view() -> None:
    pv = PersistentVolumeView({"spec": {"claimRef": {"name": "tmp-pvc-1", "uid": "u1"}}})
    assert pv.claim_ref == {"name": "tmp-pvc-1", "uid": "u1"} and PersistentVolumeView({}).claim_ref == {}
    local = PersistentVolumeView({"spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                                           "volumeMode": "Block"}})
    assert (local.storage_class, local.access_modes, local.volume_mode) == ("local", ["ReadWriteOnce"], "Block")
    assert (PersistentVolumeView({}).access_modes, PersistentVolumeView({}).volume_mode) == ([], "Filesystem")


def test_a_data_import_cron_view() -> None:
    cron = DataImportCronView({"spec": {"managedDataSource": "fedora", "schedule": "0 */12 * * *",
                                        "template": {"spec": {"source": {"registry": {"url": "docker://f"}}}},
                                        "retentionPolicy": "None", "importsToKeep": 2}})
    assert (cron.managed_data_source, cron.schedule, cron.retention_policy, cron.imports_to_keep) == \
        ("fedora", "0 */12 * * *", "None", 2)
    assert cron.template_spec == {"source": {"registry": {"url": "docker://f"}}} and cron.garbage_collect == "Outdated"
    empty = DataImportCronView({})
    assert (empty.template, empty.template_spec, empty.schedule, empty.imports_to_keep) == ({}, {}, "", None)
    assert StorageProfileView({}).import_source_format == "pvc"
    assert StorageProfileView({"status": {"dataImportCronSourceFormat": "snapshot"}}).import_source_format == \
        "snapshot"



def test_a_cdi_view() -> None:
    cdi = CDIView({"spec": {"certConfig": {"ca": {"duration": "96h"}}, "cloneStrategyOverride": "copy"}})
    assert (cdi.cert_config, cdi.clone_strategy_override) == ({"ca": {"duration": "96h"}}, "copy")
    assert (CDIView({}).cert_config, CDIView({}).clone_strategy_override) == ({}, "")

def test_pod_view_containers_and_the_objects_its_volumes_mount() -> None:
    pod = PodView({"spec": {"containers": [{"name": "importer"}], "volumes": [
        {"name": "cdi-cert-vol", "configMap": {"name": "ca"}},
        {"name": "cdi-secret-vol", "secret": {"secretName": "creds"}}]}})
    assert [c["name"] for c in pod.containers] == ["importer"]
    assert (pod.configmap_of("cdi-cert-vol"), pod.secret_of("cdi-secret-vol")) == ("ca", "creds")
    assert (pod.configmap_of("cdi-secret-vol"), pod.secret_of("absent"), pod.volume("absent")) == ("", "", None)


def test_persistent_volume_view_capacity_and_phase() -> None:
    pv = PersistentVolumeView({"spec": {"capacity": {"storage": "5Gi"}}, "status": {"phase": "Available"}})
    assert (pv.capacity, pv.phase) == ("5Gi", "Available")
    assert (PersistentVolumeView({}).capacity, PersistentVolumeView({}).phase) == ("", "")


def test_claim_view_data_source_ref_prefers_the_ref() -> None:
    both = ClaimView({"spec": {"dataSourceRef": {"kind": "VolumeImportSource", "name": "a"},
                               "dataSource": {"kind": "PersistentVolumeClaim", "name": "b"}}})
    assert both.data_source_ref["name"] == "a"
    assert ClaimView({"spec": {"dataSource": {"name": "b"}}}).data_source_ref == {"name": "b"}
    assert ClaimView({}).data_source_ref == {}


def test_claim_view_populator_ref_reads_only_the_ref() -> None:
    """Populators serve `spec.dataSourceRef` alone: a claim with only `spec.dataSource` names none."""
    ref = {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource", "name": "a"}
    assert ClaimView({"spec": {"dataSourceRef": ref, "dataSource": {"name": "b"}}}).populator_ref == ref
    assert ClaimView({"spec": {"dataSource": {"name": "b"}}}).populator_ref == {}
    assert ClaimView({"spec": {"dataSourceRef": None}}).populator_ref == {}
    assert ClaimView({}).populator_ref == {}


def test_object_view_null_metadata_reads_empty() -> None:
    """An explicit null (a review object, a patch body) reads as unset, not as the string "None"."""
    view = ObjectView({"metadata": {"name": None, "namespace": None, "uid": None, "resourceVersion": None}})
    assert (view.name, view.namespace, view.uid, view.resource_version, view.key) == ("", "", "", "", "")
