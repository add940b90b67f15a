"""`referencegrant.granted`: a ReferenceGrant of the source's namespace lets PersistentVolumeClaims of the
claim's namespace refer to the kinds (and names) it lists, and nothing else, as the CSI
external-provisioner decides for the kinds it restores from."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api import referencegrant

CLAIMS = "tenant-b"
CLONE = {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeCloneSource", "name": "offer", "namespace": "tenant-a"}
IMPORT = {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource", "name": "feed", "namespace": "tenant-a"}
CLAIM = {"kind": "PersistentVolumeClaim", "name": "disk", "namespace": "tenant-a"}  # core group: no apiGroup
SNAPSHOT = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap", "namespace": "tenant-a"}


def grant(*to: dict[str, str], from_: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": "share", "namespace": "tenant-a"},
            "spec": {"from": from_ if from_ is not None else
                     [{"group": "", "kind": "PersistentVolumeClaim", "namespace": CLAIMS}], "to": list(to)}}


def test_a_grant_of_the_kind_lets_every_name_of_it_through() -> None:
    grants = [grant({"group": "cdi.kubevirt.io", "kind": "VolumeCloneSource"})]
    assert referencegrant.granted(grants, CLAIMS, CLONE)
    assert referencegrant.granted(grants, CLAIMS, {**CLONE, "name": "any-other"})


def test_a_named_grant_lets_only_that_name_through() -> None:
    grants = [grant({"group": "cdi.kubevirt.io", "kind": "VolumeCloneSource", "name": "offer"})]
    assert referencegrant.granted(grants, CLAIMS, CLONE)
    assert not referencegrant.granted(grants, CLAIMS, {**CLONE, "name": "private"})


@pytest.mark.parametrize("from_", [
    [{"group": "", "kind": "PersistentVolumeClaim", "namespace": "tenant-c"}],  # claims of another namespace
    [{"group": "", "kind": "Pod", "namespace": CLAIMS}],  # another kind of the right namespace
    [{"group": "gateway.networking.k8s.io", "kind": "PersistentVolumeClaim", "namespace": CLAIMS}],  # wrong group
    [],
], ids=["other-namespace", "other-kind", "other-group", "nobody"])
def test_only_claims_of_the_claims_namespace_are_granted(from_: list[dict[str, str]]) -> None:
    grants = [grant({"group": "cdi.kubevirt.io", "kind": "VolumeCloneSource"}, from_=from_)]
    assert not referencegrant.granted(grants, CLAIMS, CLONE)


def test_one_matching_entry_among_several_will_do() -> None:
    grants = [grant({"group": "cdi.kubevirt.io", "kind": "VolumeCloneSource"},
                    from_=[{"group": "", "kind": "PersistentVolumeClaim", "namespace": "tenant-c"},
                           {"group": "", "kind": "PersistentVolumeClaim", "namespace": CLAIMS}]),
              grant({"group": "", "kind": "PersistentVolumeClaim"})]
    assert referencegrant.granted(grants, CLAIMS, CLONE)
    assert referencegrant.granted(grants, CLAIMS, CLAIM)


def test_the_kind_and_group_must_both_match() -> None:
    clone_only = [grant({"group": "cdi.kubevirt.io", "kind": "VolumeCloneSource"})]
    assert not referencegrant.granted(clone_only, CLAIMS, IMPORT)  # another kind of the group
    assert not referencegrant.granted(clone_only, CLAIMS, {**CLONE, "apiGroup": "example.org"})  # the kind elsewhere
    assert not referencegrant.granted([grant({"group": "cdi.kubevirt.io", "kind": "PersistentVolumeClaim"})],
                                      CLAIMS, CLAIM)  # a claim is of the core group
    # the core group is "" in a grant and absent from a dataSourceRef: they match
    assert referencegrant.granted([grant({"group": "", "kind": "PersistentVolumeClaim"})], CLAIMS, CLAIM)
    assert referencegrant.granted([grant({"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"})],
                                  CLAIMS, SNAPSHOT)


def test_no_grant_no_reference() -> None:
    assert not referencegrant.granted([], CLAIMS, CLONE)
    assert not referencegrant.granted([{"spec": {}}], CLAIMS, CLONE)


def test_only_a_reference_into_another_namespace_needs_a_grant() -> None:
    assert referencegrant.cross_namespace(CLAIMS, CLONE) == "tenant-a"
    assert referencegrant.cross_namespace(CLAIMS, {**CLONE, "namespace": CLAIMS}) is None
    assert referencegrant.cross_namespace(CLAIMS, {k: v for k, v in CLONE.items() if k != "namespace"}) is None
    assert referencegrant.refusal(CLAIMS, "stolen", CLONE) == (
        "accessing tenant-a/offer of VolumeCloneSource dataSource from tenant-b/stolen isn't allowed: "
        "no ReferenceGrant in namespace tenant-a allows it")
