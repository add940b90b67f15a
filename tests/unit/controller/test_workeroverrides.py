"""Per-DataVolume worker overrides (an extension) on the fake cluster: the DataVolume's annotations reach
its claim, a populator's prime claim and a host-assisted copy's temporary claim, and from each of them the
worker pods, merged over CDIConfig's defaults and the CDI CR's workload, clamped to the admin's cap; a cap
lowered after admission is said in a Warning on the DataVolume."""

from __future__ import annotations

import json
from typing import Any

from cdi.api import groups
from cdi.controller.clone.sizedetection import size_detection_pod
from cdi.controller.clone.target import CloneTarget
from cdi.controller.datavolume.imports import ImportReconciler
from cdi.controller.datavolume.importsource import ImportDataVolumeReconciler
from cdi.controller.datavolume.uploads import UploadReconciler
from cdi.controller.datavolume.uploadsource import UploadDataVolumeReconciler
from cdi.controller.populators.base import prime_name
from cdi.controller.populators.imports import ImportPopulator
from cdi.controller.runtime import Context
from cdi.controller.workerpod import pod_settings
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import stored
from tests.unit.controller.conftest import NAMESPACE, events_of
from tests.unit.controller.test_populators import claim as populated_claim
from tests.unit.controller.test_populators import import_source
from tests.unit.controller.test_reconcilers import HTTP_SOURCE, bind, datavolume

Obj = dict[str, Any]
RESOURCES = "extensions.cdi.dev/worker.resources"
PLACEMENT = "extensions.cdi.dev/worker.placement"
CAP = "extensions.cdi.dev/worker.maxResources"
DEFAULTS = {"requests": {"cpu": "100m", "memory": "60M"}, "limits": {"cpu": "750m", "memory": "600M"}}
WORKLOAD = {"nodeSelector": {"kubernetes.io/os": "linux"}}
ASKED = {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}
TOLERATION = {"key": "storage-only", "operator": "Exists", "effect": "NoSchedule"}
OVERRIDES = {RESOURCES: json.dumps(ASKED), PLACEMENT: json.dumps({"nodeSelector": {"disk": "nvme"},
                                                                  "tolerations": [TOLERATION]})}
MERGED = {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"cpu": "750m", "memory": "2Gi"}}


def configure(kube: FakeKube, cap: Obj | str | None = None) -> None:
    """CDIConfig's default worker resources (and an admin's cap), the CDI CR's workload placement."""
    config = stored(kube, groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
    config["status"]["defaultPodResourceRequirements"] = DEFAULTS
    if cap is not None:
        config["metadata"]["annotations"] = {CAP: cap if isinstance(cap, str) else json.dumps(cap)}
    kube.add(groups.CDICONFIGS, config)
    kube.add(groups.CDIS, {"metadata": {"name": "cdi"}, "spec": {"workload": WORKLOAD}})


def overridden(kube: FakeKube, name: str, source: Obj, annotations: dict[str, str] = OVERRIDES) -> None:
    dv = datavolume(name, source)
    dv["metadata"]["annotations"] = {"cdi.kubevirt.io/storage.usePopulator": "false", **annotations}
    kube.add(groups.DATAVOLUMES, dv)


def shape(pod: Obj) -> tuple[list[Obj], Obj, list[Obj] | None]:
    spec = pod["spec"]
    return [c.get("resources") for c in spec["containers"]], spec.get("nodeSelector"), spec.get("tolerations")


async def test_an_importer_and_an_upload_server_get_the_datavolumes_overrides(kube: FakeKube, ctx: Context) -> None:
    configure(kube)
    overridden(kube, "imported", HTTP_SOURCE)
    overridden(kube, "uploaded", {"upload": {}})
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/imported")
    await UploadDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/uploaded")
    for name in ("imported", "uploaded"):
        annotations = stored(kube, groups.PVCS, name)["metadata"]["annotations"]
        assert {k: annotations[k] for k in OVERRIDES} == OVERRIDES  # they travel as pass-through annotations
        bind(kube, name)
    await ImportReconciler(ctx).reconcile(f"{NAMESPACE}/imported")
    await UploadReconciler(ctx).reconcile(f"{NAMESPACE}/uploaded")
    expected = ([MERGED], {"kubernetes.io/os": "linux", "disk": "nvme"}, [TOLERATION])
    assert shape(stored(kube, groups.PODS, "importer-imported")) == expected
    assert shape(stored(kube, groups.PODS, "cdi-upload-uploaded")) == expected


async def test_a_datavolume_without_overrides_gets_the_clusters_alone(kube: FakeKube, ctx: Context) -> None:
    configure(kube, cap={"memory": "1Gi"})
    overridden(kube, "plain", HTTP_SOURCE, {})
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/plain")
    bind(kube, "plain")
    await ImportReconciler(ctx).reconcile(f"{NAMESPACE}/plain")
    assert shape(stored(kube, groups.PODS, "importer-plain")) == ([DEFAULTS], WORKLOAD["nodeSelector"], None)


async def test_a_cap_lowered_after_admission_clamps_the_pod_and_says_so(kube: FakeKube, ctx: Context) -> None:
    configure(kube, cap={"memory": "1500Mi"})
    overridden(kube, "clamped", HTTP_SOURCE)
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/clamped")
    bind(kube, "clamped")
    await ImportReconciler(ctx).reconcile(f"{NAMESPACE}/clamped")
    resources = stored(kube, groups.PODS, "importer-clamped")["spec"]["containers"][0]["resources"]
    assert resources["limits"]["memory"] == "1500Mi" and resources["requests"]["memory"] == "1Gi"
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/clamped")
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/clamped")
    warnings = [e for e in await events_of(ctx, "clamped") if e[1] == "WorkerResourcesClamped"]
    assert warnings == [("Warning", "WorkerResourcesClamped",
                         f"{RESOURCES}: limits.memory 2Gi above the cap {CAP} on CDIConfig (memory 1500Mi): "
                         "worker pods are clamped to it")]


async def test_a_malformed_cap_allows_no_resource_override(kube: FakeKube, ctx: Context) -> None:
    configure(kube, cap="{memory: 1Gi")
    overridden(kube, "capless", HTTP_SOURCE)
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/capless")
    bind(kube, "capless")
    await ImportReconciler(ctx).reconcile(f"{NAMESPACE}/capless")
    resources, selector, _ = shape(stored(kube, groups.PODS, "importer-capless"))
    assert resources == [DEFAULTS] and selector == {"kubernetes.io/os": "linux", "disk": "nvme"}
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/capless")
    assert ("Warning", "WorkerResourcesClamped", f"{RESOURCES} ignored: the cap {CAP} on CDIConfig is malformed; "
            "worker pods get the default resources") in await events_of(ctx, "capless")


async def test_a_populators_prime_claim_carries_the_overrides(kube: FakeKube, ctx: Context) -> None:
    user = populated_claim(kube, "VolumeImportSource", **OVERRIDES)
    import_source(kube)
    await ImportPopulator(ctx).reconcile(f"{NAMESPACE}/disk")
    annotations = stored(kube, groups.PVCS, prime_name(user))["metadata"]["annotations"]
    assert {k: annotations[k] for k in OVERRIDES} == OVERRIDES


async def test_clone_and_size_detection_pods_take_the_targets_overrides(kube: FakeKube, ctx: Context) -> None:
    configure(kube)
    target = {"metadata": {"name": "copy", "namespace": NAMESPACE, "uid": "t1", "annotations": dict(OVERRIDES)},
              "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    temp = CloneTarget(ctx=ctx, claim=target, source_kind="pvc", source_namespace=NAMESPACE, source_name="golden",
                       temp=None).temp_claim("1Gi", None)
    # the host-assisted copy's receiving upload server is built from the temporary claim
    assert {k: temp["metadata"]["annotations"][k] for k in OVERRIDES} == OVERRIDES
    dv = {**datavolume("copy", {"pvc": {"namespace": NAMESPACE, "name": "golden"}}),
          "metadata": {"name": "copy", "namespace": NAMESPACE, "uid": "d1", "annotations": dict(OVERRIDES)}}
    source = {"metadata": {"name": "golden", "namespace": NAMESPACE, "uid": "s1"}}
    pod = size_detection_pod(source, dv, "importer", pod_settings(ctx))
    assert shape(pod) == ([MERGED], {"kubernetes.io/os": "linux", "disk": "nvme"}, [TOLERATION])
