"""`kubectl apply` of invalid DataVolumes is refused by cdi-apiserver's webhook with CDI's words."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from tests.e2e.workloads import new_namespace
from tests.support.cluster import Kubectl

DENIED = 'admission webhook "datavolume-validate.cdi.kubevirt.io" denied the request:  '


def manifest(name: str, spec: str) -> str:
    return f"apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata:\n  name: {name}\nspec:\n" + \
        textwrap.indent(textwrap.dedent(spec), "  ")


STORAGE = """\
storage:
  resources:
    requests:
      storage: 1Gi
"""
PVC = """\
pvc:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
"""
HTTP = """\
source:
  http:
    url: http://example.com/disk.img
"""


@pytest.mark.anycluster
@pytest.mark.parametrize(("name", "spec", "message"), [
    ("no-source", STORAGE, "Data volume should have either Source or SourceRef, or be externally populated"),
    ("two-sources", STORAGE + "source:\n  http:\n    url: http://example.com/a\n  blank: {}\n",
     "Multiple Data volume sources"),
    ("both-claims", STORAGE + PVC + HTTP, "Duplicate storage definition, both target storage and target pvc defined"),
    ("no-claim", HTTP, "Missing Data volume PVC"),
    ("tiny", "storage:\n  resources:\n    requests:\n      storage: 1Ki\n" + HTTP,
     "Storage size should be at least 1MiB"),
    ("bad-checksum", STORAGE + HTTP + "    checksum: sha256:1234\n",
     "Invalid checksum format: invalid sha256 hash length: expected 64 hex characters, got 4"),
])
def test_invalid_datavolumes_are_refused(shared_kubectl: Kubectl, name: str, spec: str, message: str) -> None:
    result = shared_kubectl("apply", "-f", "-", input=manifest(name, spec), check=False)
    assert result.returncode != 0
    assert DENIED + message in result.stderr
    assert not shared_kubectl.exists("dv", name)


def test_spec_changes_after_creation_are_refused(shared_kubectl: Kubectl) -> None:
    shared_kubectl("apply", "-f", "-", input=manifest("frozen", STORAGE + HTTP))
    changed = manifest("frozen", STORAGE + HTTP.replace("disk.img", "other.img"))
    result = shared_kubectl("apply", "-f", "-", input=changed, check=False)
    assert result.returncode != 0
    assert DENIED + "Cannot update DataVolume Spec" in result.stderr
    shared_kubectl("label", "dv", "frozen", "metadata=changes-are-fine")


def test_a_claim_not_owned_by_a_datavolume_is_not_taken_over(shared_kubectl: Kubectl) -> None:
    shared_kubectl.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "users-own"},
                          "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    result = shared_kubectl("apply", "-f", "-", input=manifest("users-own", STORAGE + HTTP), check=False)
    assert result.returncode != 0
    assert DENIED + "Destination PVC default/users-own already exists" in result.stderr


def test_uninstall_is_refused_while_datavolumes_exist_under_block_uninstall(kubectl: Kubectl) -> None:
    """CDI's `cdi-api-validate` webhook: with `uninstallStrategy: BlockUninstallIfWorkloadsExist`,
    deleting the CDI resource is refused while a DataVolume exists, and allowed once none does."""
    for name in ("keep", "keep-2", "keep-3"):  # the message counts them all (not one page of the list)
        kubectl("apply", "-f", "-", input=manifest(name, STORAGE + "source:\n  blank: {}\n"))
    kubectl("patch", "cdi", "cdi", "--type", "merge",
            "-p", '{"spec":{"uninstallStrategy":"BlockUninstallIfWorkloadsExist"}}')
    refused = kubectl("delete", "cdi", "cdi", check=False)
    assert refused.returncode != 0
    assert ('admission webhook "cdi-validate.cdi.kubevirt.io" denied the request: rejecting the uninstall request, '
            "since there are still 3 DataVolumes present. Either delete all DataVolumes or change the uninstall "
            "strategy before uninstalling CDI") in refused.stderr
    assert kubectl.exists("cdi", "cdi")
    kubectl("delete", "dv", "keep", "keep-2", "keep-3", "--wait=true")
    kubectl("delete", "cdi", "cdi")
    assert not kubectl.exists("cdi", "cdi")


POPULATOR_DENIED = 'admission webhook "populator-validate.cdi.kubevirt.io" denied the request:  '


def populator_source(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": kind, "metadata": {"name": name}, "spec": spec}


@pytest.mark.anycluster
@pytest.mark.parametrize(("kind", "name", "spec", "message"), [
    ("VolumeImportSource", "two-sources", {"source": {"http": {"url": "http://example.com/a"}, "blank": {}}},
     "Multiple VolumeImport sources"),
    ("VolumeImportSource", "no-source", {"contentType": "kubevirt"}, "Missing VolumeImport source"),
    ("VolumeImportSource", "ftp", {"source": {"http": {"url": "ftp://example.com/a"}}},
     "spec.source Invalid source URL scheme: ftp://example.com/a"),
    ("VolumeImportSource", "blank-archive", {"contentType": "archive", "source": {"blank": {}}},
     "SourceType cannot be blank and the contentType be archive"),
    ("VolumeImportSource", "x" * 64, {"source": {"blank": {}}}, "Name cannot be longer than 63 characters"),
    ("VolumeUploadSource", "odd-content", {"contentType": "iso"}, "ContentType not one of: kubevirt, archive"),
])
def test_invalid_populator_sources_are_refused(shared_kubectl: Kubectl, kind: str, name: str, spec: dict[str, Any],
                                               message: str) -> None:
    """CDI's populator webhook (`cdi-api-populator-validate`): a source the populator could not use is refused
    when it is written, not found out when a claim names it."""
    result = shared_kubectl.apply(populator_source(kind, name, spec), check=False)
    assert result.returncode != 0
    assert POPULATOR_DENIED + message in result.stderr
    assert not shared_kubectl.exists(kind.lower(), name)


@pytest.mark.anycluster
@pytest.mark.parametrize(("kind", "spec", "changed", "message"), [
    ("VolumeImportSource", {"source": {"http": {"url": "http://example.com/disk.img"}}},
     {"source": {"http": {"url": "http://example.com/other.img"}}}, "Cannot update VolumeImportSource Spec"),
    ("VolumeUploadSource", {"contentType": "kubevirt"}, {"contentType": "archive"},
     "Cannot update VolumeUploadSource Spec"),
])
def test_populator_source_specs_never_change(shared_kubectl: Kubectl, kind: str, spec: dict[str, Any],
                                             changed: dict[str, Any], message: str) -> None:
    """As CDI: the claims a source fills read it once, so its spec is frozen; its metadata is not."""
    k, name = shared_kubectl, "frozen"
    ns = new_namespace(k, "frozen")
    k.apply(populator_source(kind, name, spec), "-n", ns)
    result = k.apply(populator_source(kind, name, changed), "-n", ns, check=False)
    assert result.returncode != 0
    assert POPULATOR_DENIED + message in result.stderr
    k("label", kind.lower(), name, "-n", ns, "metadata=changes-are-fine")
    assert k.get(kind.lower(), name, ns)["spec"] == spec
