"""What a clone's phases look at, put in the fake cluster as the components around the controller would
leave it: the source claim, the target a clone DataVolume (or a populated claim) made, the temporary
claim bound by its provisioner, the volume behind it."""

from __future__ import annotations

from typing import Any

from cdi.api import groups
from cdi.controller.clone.target import CloneTarget, temp_claim_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.conftest import NAMESPACE, STORAGE_CLASS

Obj = dict[str, Any]
A = "cdi.kubevirt.io/"
SOURCE = "golden"
DV_UID = "dv-uid"


def source_claim(kube: FakeKube, *, bound: bool = True, capacity: str = "1Gi", mode: str = "Filesystem") -> Obj:
    status: Obj = {"phase": "Bound", "capacity": {"storage": capacity}} if bound else {"phase": "Pending"}
    return kube.add(groups.PVCS, {"metadata": {"name": SOURCE, "namespace": NAMESPACE},
                                  "spec": {"storageClassName": STORAGE_CLASS, "volumeMode": mode,
                                           "accessModes": ["ReadWriteOnce"],
                                           "resources": {"requests": {"storage": capacity}},
                                           **({"volumeName": "pv-golden"} if bound else {})},
                                  "status": status})


ALLOW_IN_USE = {"extensions.cdi.dev/clone.allowSourceInUse": "true"}


def target_claim(kube: FakeKube, strategy: str, *, kind: str = "pvc", source: str = SOURCE, size: str = "2Gi",
                 phase: str = "Pending", datavolume: bool = True, extra: dict[str, str] | None = None) -> Obj:
    """The target as the clone reconciler created it (owned by its DataVolume, which shows the phase), with
    `extra` annotations passed from the DataVolume."""
    owner: list[Obj] = []
    if datavolume:
        kube.add(groups.DATAVOLUMES, {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                                      "metadata": {"name": "copy", "namespace": NAMESPACE, "uid": DV_UID},
                                      "spec": {"source": {kind: {"namespace": NAMESPACE, "name": source}}},
                                      "status": {"phase": "CloneScheduled"}})
        owner = [{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": "copy", "uid": DV_UID,
                  "controller": True}]
    return kube.add(groups.PVCS, {
        "metadata": {"name": "copy", "namespace": NAMESPACE, "ownerReferences": owner, "annotations": {
            A + "cloneType": strategy, A + "clonePhase": phase, A + "createdForDataVolume": DV_UID,
            A + "storage.clone.source": f"{kind}/{NAMESPACE}/{source}", **(extra or {})}},
        "spec": {"storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                 "resources": {"requests": {"storage": size}},
                 "dataSourceRef": {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeCloneSource", "name": "vcs"}}})


def stored(kube: FakeKube, gvr: groups.GVR, name: str) -> Obj:
    found = kube.object(gvr, name, NAMESPACE)
    assert found is not None, f"{gvr.plural}/{name} was not made"
    return found


def annotations(kube: FakeKube, name: str = "copy") -> dict[str, str]:
    result: dict[str, str] = stored(kube, groups.PVCS, name)["metadata"].get("annotations") or {}
    return result


def clone(ctx: Context, kube: FakeKube, name: str = "copy") -> CloneTarget:
    """The clone as a look begins: the target as stored, its recorded source, its temporary claim if any."""
    claim = stored(kube, groups.PVCS, name)
    kind, _, rest = claim["metadata"]["annotations"][A + "storage.clone.source"].partition("/")
    namespace, _, source = rest.partition("/")
    return CloneTarget(ctx, claim, kind, namespace, source, kube.object(groups.PVCS, temp_claim_name(claim), NAMESPACE))


def bind(kube: FakeKube, name: str, capacity: str, *, pv: str | None = None) -> Obj:
    """What a provisioner does: the claim gets a volume (named `pv-<name>`) of `capacity`, and is Bound."""
    claim = stored(kube, groups.PVCS, name)
    volume = pv or f"pv-{name}"
    claim["spec"]["volumeName"] = volume
    claim["status"] = {"phase": "Bound", "capacity": {"storage": capacity}}
    kube.add(groups.PVS, {"metadata": {"name": volume}, "spec": {
        "capacity": {"storage": capacity}, "claimRef": {
            "kind": "PersistentVolumeClaim", "namespace": NAMESPACE, "name": name,
            "uid": claim["metadata"]["uid"]}}})
    return kube.add(groups.PVCS, claim)


def pod(kube: FakeKube, name: str, claim: str = SOURCE, *, read_only: bool = False, phase: str = "Running",
        labels: dict[str, str] | None = None) -> Obj:
    """A pod mounting `claim` (writable unless `read_only`)."""
    mount: Obj = {"name": "data", "mountPath": "/data", **({"readOnly": True} if read_only else {})}
    return kube.add(groups.PODS, {"metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}},
                                  "spec": {"containers": [{"name": "main", "volumeMounts": [mount]}],
                                           "volumes": [{"name": "data", "persistentVolumeClaim": {
                                               "claimName": claim}}]},
                                  "status": {"phase": phase}})


def settle(kube: FakeKube) -> None:
    """One pass of what the storage side does for a clone, as a real cluster's provisioner, resizer,
    snapshotter and PV controller would: a snapshot is taken; a claim filled from a data source (or made
    an upload target) is provisioned and bound at its request; a bound claim asked to grow grows; a PV
    whose claimRef was moved binds the claim it names, and the claim it left is Lost."""
    for snapshot in kube.objects(groups.VOLUMESNAPSHOTS):
        if not (snapshot.get("status") or {}).get("readyToUse"):
            source = kube.object(groups.PVCS, snapshot["spec"]["source"].get("persistentVolumeClaimName", ""),
                                 snapshot["metadata"]["namespace"])
            snapshot["status"] = {"readyToUse": True, "restoreSize": (source or {}).get("status", {}).get(
                "capacity", {}).get("storage", "1Gi")}
            kube.add(groups.VOLUMESNAPSHOTS, snapshot)
    for claim in kube.objects(groups.PVCS):
        spec, status = claim["spec"], claim.get("status") or {}
        requested = spec["resources"]["requests"]["storage"]
        if status.get("phase") in ("", "Pending", None) and not spec.get("volumeName") and \
                (spec.get("dataSource") or A + "storage.upload.target" in claim["metadata"].get("annotations", {})):
            bind(kube, claim["metadata"]["name"], requested)
        elif status.get("phase") == "Bound" and status["capacity"]["storage"] != requested:
            claim["status"]["capacity"]["storage"] = requested
            kube.add(groups.PVCS, claim)
    for pv in kube.objects(groups.PVS):
        ref, name = pv["spec"]["claimRef"], pv["metadata"]["name"]
        for claim in kube.objects(groups.PVCS, ref["namespace"]):
            if claim["spec"].get("volumeName") != name and claim["metadata"]["uid"] == ref["uid"]:
                claim["spec"]["volumeName"] = name
                claim["status"] = {"phase": "Bound", "capacity": dict(pv["spec"]["capacity"])}
                kube.add(groups.PVCS, claim)
            elif claim["spec"].get("volumeName") == name and claim["metadata"]["uid"] != ref["uid"] and \
                    claim["status"].get("phase") != "Lost":
                claim["status"]["phase"] = "Lost"
                kube.add(groups.PVCS, claim)
