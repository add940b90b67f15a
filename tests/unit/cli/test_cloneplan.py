"""`cdi clone-plan` on FakeKube: the source it finds (directly, through a DataSource, through a chained
DataSource) and the lines it prints, or why no clone can be planned yet."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.cli.cloneplan import explain
from tests.support.fakekube import FakeKube


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.add(groups.STORAGECLASSES, {"metadata": {"name": "fast", "annotations": {ann.DEFAULT_STORAGE_CLASS: "true"}},
                                     "provisioner": "x"})
    kube.add(groups.STORAGEPROFILES, {"metadata": {"name": "fast"}, "status": {
        "cloneStrategy": "copy",
        "claimPropertySets": [{"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}]}})
    kube.add(groups.PVCS, {"metadata": {"name": "src", "namespace": "golden"},
                           "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                                    "resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem"},
                           "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}})
    kube.add(groups.DATASOURCES, {"metadata": {"name": "image", "namespace": "golden"},
                                  "spec": {"source": {"pvc": {"name": "src"}}}})
    kube.add(groups.DATASOURCES, {"metadata": {"name": "latest", "namespace": "golden"},
                                  "spec": {"source": {"dataSource": {"name": "image"}}}})
    return kube


def _dv(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": groups.CDI_API_VERSION, "kind": "DataVolume",
            "metadata": {"name": "vm-disk", "namespace": "default"}, "spec": {"storage": {}, **spec}}


@pytest.mark.parametrize("spec", [
    {"source": {"pvc": {"name": "src", "namespace": "golden"}}},
    {"sourceRef": {"kind": "DataSource", "name": "image", "namespace": "golden"}},
    {"sourceRef": {"kind": "DataSource", "name": "latest", "namespace": "golden"}},
], ids=["pvc", "datasource", "chained-datasource"])
async def test_the_plan_names_source_strategy_and_size(kube: FakeKube, spec: dict[str, Any]) -> None:
    code, text = await explain(kube, _dv(spec))
    assert code == 0, text
    first, strategy, size = text.splitlines()
    assert first.startswith("Cloning from golden/src into default/vm-disk scheduled: host-assisted copy")
    assert strategy == "strategy: copy"
    assert size.startswith("size: ") and int(size.removeprefix("size: ")) > 1 << 30  # with the filesystem overhead


async def test_a_missing_source_is_no_plan_yet(kube: FakeKube) -> None:
    code, text = await explain(kube, _dv({"source": {"pvc": {"name": "absent", "namespace": "golden"}}}))
    assert code == 1 and text.startswith("no clone can be planned yet")
