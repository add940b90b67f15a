"""CDI's size rules for a clone target without a size (detectCloneSize), as pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.rendering import ClusterStorage
from cdi.api.sizing import required_space
from cdi.controller.clone.size import CloneSize, NeedsVirtualSize, pvc_clone_size, snapshot_clone_size

MIB = 1024 * 1024
STORAGE = ClusterStorage([], {}, {"filesystemOverhead": {"global": "0.06", "storageClass": {"thin": "0.1"}}})


def source(mode: str = "Filesystem", content: str | None = "kubevirt", virtual: int | None = None,
           measured_at: str = "64Mi") -> dict[str, Any]:
    annotations = {} if content is None else {"cdi.kubevirt.io/storage.contentType": content}
    if virtual is not None:
        annotations.update({"cdi.Kubervirt.io/virtualSize": str(virtual),
                            "cdi.Kubervirt.io/sourceCapacity": measured_at})
    return {"metadata": {"name": "golden", "annotations": annotations},
            "spec": {"volumeMode": mode, "resources": {"requests": {"storage": "64Mi"}}},
            "status": {"capacity": {"storage": "64Mi"}}}


def spec(mode: str = "Filesystem", size: str | None = None, storage_class: str = "local") -> dict[str, Any]:
    out: dict[str, Any] = {"volumeMode": mode, "storageClassName": storage_class, "resources": {"requests": {}}}
    if size is not None:
        out["resources"]["requests"]["storage"] = size
    return out


def test_a_disk_image_is_measured_once_then_its_virtual_size_is_used() -> None:
    with pytest.raises(NeedsVirtualSize):
        pvc_clone_size(source(), spec("Block"), STORAGE)
    assert pvc_clone_size(source(virtual=40 * MIB), spec("Block"), STORAGE) == CloneSize(str(40 * MIB), True)
    assert pvc_clone_size(source(virtual=40 * MIB), spec(storage_class="thin"), STORAGE) == \
        CloneSize(str(required_space("0.1", 40 * MIB)), True)
    # measured at another capacity (the source grew): measured again
    with pytest.raises(NeedsVirtualSize):
        pvc_clone_size(source(virtual=40 * MIB, measured_at="32Mi"), spec("Block"), STORAGE)


def test_a_sized_block_target_is_permissive_when_it_holds_the_image() -> None:
    assert pvc_clone_size(source(virtual=40 * MIB), spec("Block", "48Mi"), STORAGE) == CloneSize(None, True)
    assert pvc_clone_size(source(virtual=40 * MIB), spec("Block", "32Mi"), STORAGE) == CloneSize(None, False)
    # a sized Filesystem target needs no measuring at all
    assert pvc_clone_size(source(), spec(size="48Mi"), STORAGE) == CloneSize(None)


def test_other_sources_give_their_capacity() -> None:
    assert pvc_clone_size(source(content=None), spec(), STORAGE) == CloneSize(str(required_space("0.06", 64 * MIB)))
    assert pvc_clone_size(source(content="archive"), spec("Block"), STORAGE) == CloneSize(str(64 * MIB))
    assert pvc_clone_size(source("Block"), spec("Block"), STORAGE) == CloneSize(str(64 * MIB))


def test_a_snapshot_gives_its_restore_size_inflated_only_from_block() -> None:
    snapshot = {"status": {"restoreSize": "64Mi"}}
    assert snapshot_clone_size(snapshot, {"spec": {"sourceVolumeMode": "Filesystem"}}, spec(), STORAGE) == \
        CloneSize("64Mi")
    assert snapshot_clone_size(snapshot, {"spec": {"sourceVolumeMode": "Block"}}, spec(), STORAGE) == \
        CloneSize(str(required_space("0.06", 64 * MIB)))
    assert snapshot_clone_size(snapshot, None, spec(size="1Gi"), STORAGE) == CloneSize(None)
