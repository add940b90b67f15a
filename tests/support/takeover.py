"""What a takeover test looks at, on `cdi up` and on a real cluster alike: a snapshot of the objects CDI
left (taken before cdi starts, compared after), the pods scheduled meanwhile, the bytes of each claim, and
the checks of issue 29 item 1 ("take over from CDI without touching a byte") on the two snapshots."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.support.cdistate import DIGESTS, Kube, Left

Obj = dict[str, Any]


@dataclass
class Snapshot:
    claims: dict[str, Obj]  # name -> metadata (resourceVersion, annotations, labels, owners), spec, status.phase
    datavolumes: dict[str, Obj]  # name -> {"resourceVersion", "status"}
    cron: Obj
    data_source: Obj
    profile: Obj
    config: Obj
    cdi: Obj | None
    scheduled: set[str]  # pods the scheduler placed (its Scheduled events), ever, in the namespace


def _items(kube: Kube, kind: str, namespace: str) -> list[Obj]:
    items: list[Obj] = json.loads(kube("get", kind, "-n", namespace, "-o", "json"))["items"]
    return items


def scheduled_pods(kube: Kube, namespace: str) -> set[str]:
    """Every pod the scheduler placed in `namespace` (its `Scheduled` events stay an hour): a pod started
    and deleted between two looks still shows here."""
    events = _items(kube, "events", namespace)
    return {e["involvedObject"]["name"] for e in events
            if e.get("reason") == "Scheduled" and e.get("involvedObject", {}).get("kind") == "Pod"}


def snapshot(kube: Kube, left: Left) -> Snapshot:
    ns = left.namespace
    claims = {c["metadata"]["name"]: {"metadata": c["metadata"], "spec": c["spec"],
                                      "phase": c.get("status", {}).get("phase")} for c in _items(kube, "pvc", ns)}
    dvs = {d["metadata"]["name"]: {"resourceVersion": d["metadata"]["resourceVersion"], "status": d.get("status", {})}
           for d in _items(kube, "datavolumes", ns)}
    cron = json.loads(kube("get", "dataimportcron", left.cron, "-n", ns, "-o", "json"))
    source = json.loads(kube("get", "datasource", left.data_source, "-n", ns, "-o", "json"))
    profile = json.loads(kube("get", "storageprofile", left.profile, "-o", "json"))
    config = json.loads(kube("get", "cdiconfig", "config", "-o", "json"))
    found = kube("get", "cdis", "--ignore-not-found", "-o", "json").strip()
    crs = json.loads(found)["items"] if found else []
    return Snapshot(claims, dvs, cron, source, profile, config, crs[0] if crs else None, scheduled_pods(kube, ns))


def waiting_upload_claims(left: Left) -> set[str]:
    """The claims of the upload CDI left waiting: cdi replaces CDI's upload server there (as CDI's controller
    does when its server ends), which the claims' pod annotations follow, and the new server gets scratch."""
    return {left.upload_waiting, left.upload_prime, f"{left.upload_prime}-scratch"}


def check_untouched(before: Snapshot, after: Snapshot, left: Left) -> None:
    """Issue 29 item 1's promises, on the objects: no claim rewritten or deleted, every DataVolume in the phase
    CDI left, nothing re-imported, the cron's schedule and history kept, the DataSource Ready on the same
    import, the admin's profile edit and the CDI resource's spec kept."""
    moving = waiting_upload_claims(left)
    assert set(after.claims) >= set(before.claims), f"claims deleted: {set(before.claims) - set(after.claims)}"
    created = set(after.claims) - set(before.claims)
    assert created <= {f"{left.upload_prime}-scratch"}, f"claims created: {created}"  # the new upload server's
    for name, was in before.claims.items():
        now = after.claims[name]
        if name in moving:
            continue
        old_meta, new_meta = was["metadata"], now["metadata"]
        assert new_meta["resourceVersion"] == old_meta["resourceVersion"], (
            f"claim {name} was written: annotations {_diff(old_meta.get('annotations'), new_meta.get('annotations'))}, "
            f"labels {_diff(old_meta.get('labels'), new_meta.get('labels'))}, "
            f"owners {old_meta.get('ownerReferences')} -> {new_meta.get('ownerReferences')}")
        assert now["spec"].get("volumeName") == was["spec"].get("volumeName") and now["phase"] == was["phase"], name
    for name, was in before.datavolumes.items():
        assert after.datavolumes[name]["status"].get("phase") == left.phases[name], (
            name, after.datavolumes[name]["status"])
        if name != left.upload_waiting:
            assert after.datavolumes[name]["status"] == was["status"], (
                f"DataVolume {name}'s status was rewritten: {_diff(was['status'], after.datavolumes[name]['status'])}")
    assert set(after.datavolumes) == set(before.datavolumes), "a DataVolume was created or deleted"
    started = after.scheduled - before.scheduled
    assert started <= {left.upload_pod}, f"pods started for what CDI had finished: {sorted(started)}"
    # the DataImportCron: same schedule, same next run, same history, same imports, nothing collected
    for key in ("schedule", "importsToKeep", "managedDataSource"):
        assert after.cron["spec"].get(key) == before.cron["spec"].get(key), key
    cron_annotations = after.cron["metadata"].get("annotations", {})
    for key, value in before.cron["metadata"].get("annotations", {}).items():
        assert cron_annotations.get(key) == value, (key, value, cron_annotations.get(key))
    status = after.cron.get("status", {})
    assert status.get("lastImportedPVC") == before.cron["status"]["lastImportedPVC"], status
    assert status.get("currentImports") == [{"DataVolumeName": left.cron_imports[-1], "Digest": DIGESTS[-1]}], status
    assert status.get("lastExecutionTimestamp") == before.cron["status"]["lastExecutionTimestamp"], status
    assert status.get("lastImportTimestamp") == before.cron["status"]["lastImportTimestamp"], status
    up_to_date = next(c for c in status["conditions"] if c["type"] == "UpToDate")
    assert up_to_date["status"] == "True", status
    for name in left.cron_imports:
        assert name in after.claims and name in after.datavolumes, f"cron import {name} collected"
    # the DataSource: Ready, on the same import
    assert after.data_source["spec"] == before.data_source["spec"]
    ready = next(c for c in after.data_source["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", after.data_source["status"]
    assert after.data_source["status"]["source"] == {"pvc": {"namespace": left.namespace,
                                                             "name": left.cron_imports[-1]}}
    # the admin's StorageProfile edit, and what it means
    assert after.profile["spec"] == left.profile_spec, after.profile["spec"]
    assert after.profile["metadata"]["annotations"] == before.profile["metadata"]["annotations"]
    assert after.profile["status"]["claimPropertySets"] == left.profile_spec["claimPropertySets"]
    assert after.profile["status"]["cloneStrategy"] == left.profile_spec["cloneStrategy"]
    # CDIConfig as CDI kept it, and the CDI resource: the admin's spec as it was
    assert after.config["spec"] == before.config["spec"], _diff(before.config["spec"], after.config["spec"])
    if before.cdi is not None:
        assert after.cdi is not None and after.cdi["metadata"]["uid"] == before.cdi["metadata"]["uid"]
        assert after.cdi["spec"] == before.cdi["spec"], _diff(before.cdi["spec"], after.cdi["spec"])


def _diff(before: Any, after: Any) -> str:
    if not isinstance(before, dict) or not isinstance(after, dict):
        return f"{before!r} -> {after!r}"
    keys = sorted(set(before) | set(after))
    return ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in keys if before.get(k) != after.get(k))
