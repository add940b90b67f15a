"""The typed views read what the reconcilers read, and an absent field reads as empty, never raises."""

from __future__ import annotations

from cdi.api.views import ClaimView, PodView


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
