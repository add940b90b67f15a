"""HostClone: the temporary claim is an upload target, and once its upload server is ready a clone source
pod streams the source into it; done when the upload server says it succeeded."""

from __future__ import annotations

from typing import Any

from cdi.api import groups
from cdi.api.upload import upload_service_name
from cdi.controller.clone import planner
from cdi.controller.clone.hostclone import HostClonePhase
from cdi.controller.clone.phase import STARTED, WAIT, Step
from cdi.controller.clone.target import source_pod_name, temp_claim_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import ALLOW_IN_USE, SOURCE, A, clone, pod, source_claim, stored, target_claim
from tests.unit.controller.conftest import NAMESPACE

Obj = dict[str, Any]
S = A + "storage."


def upload_server(kube: FakeKube, target: Obj, **annotations: str) -> Obj:
    """What the upload reconciler made of the temporary claim: its pod's state, and its Service."""
    temp = stored(kube, groups.PVCS, temp_claim_name(target))
    temp["metadata"]["annotations"].update(annotations)
    kube.add(groups.SERVICES, {"metadata": {"name": upload_service_name(temp_claim_name(target)),
                                            "namespace": NAMESPACE}, "spec": {"clusterIP": "10.96.0.7"}})
    return kube.add(groups.PVCS, temp)


def env(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


async def test_the_temporary_claim_is_an_upload_target_named_for_its_client(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.COPY, size="2Gi")
    assert await HostClonePhase(clone(ctx, kube), SOURCE).reconcile() == Step()
    temp = stored(kube, groups.PVCS, temp_claim_name(target))
    assert temp["metadata"]["annotations"] == {
        S + "bind.immediate.requested": "true", S + "upload.target": "", S + "contentType": "kubevirt",
        A + "uploadClientName": f"{NAMESPACE}/{SOURCE}-{NAMESPACE}/copy",
        "k8s.io/CloneRequest": f"{NAMESPACE}/{SOURCE}"}
    assert temp["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert "dataSource" not in temp["spec"] and "dataSourceRef" not in temp["spec"]


async def test_a_long_client_name_is_the_targets_uid(kube: FakeKube, ctx: Context) -> None:
    source = "s" * 60
    target = target_claim(kube, planner.COPY, source=source)
    await HostClonePhase(clone(ctx, kube), source).reconcile()
    annotations = stored(kube, groups.PVCS, temp_claim_name(target))["metadata"]["annotations"]
    assert annotations[A + "uploadClientName"] == f"clone-source-{target['metadata']['uid']}"  # a CN holds 64


async def test_the_source_pod_starts_once_the_upload_server_is_ready(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, mode="Block")
    target = target_claim(kube, planner.COPY, phase="HostClone")
    await HostClonePhase(clone(ctx, kube), SOURCE).reconcile()
    temp = upload_server(kube, target)
    assert await HostClonePhase(clone(ctx, kube), SOURCE).reconcile() is WAIT  # its server is not ready
    assert kube.created(groups.PODS) == []

    temp = upload_server(kube, target, **{S + "pod.ready": "true"})
    assert await HostClonePhase(clone(ctx, kube), SOURCE).reconcile() == STARTED
    name = source_pod_name(temp)
    source_pod = stored(kube, groups.PODS, name)
    [container] = source_pod["spec"]["containers"]
    assert container["name"] == "cdi-clone-source"
    assert container["volumeDevices"] == [{"name": "cdi-data-vol", "devicePath": "/dev/cdi-block-volume"}]
    assert source_pod["spec"]["volumes"] == [{"name": "cdi-data-vol", "persistentVolumeClaim": {
        "claimName": SOURCE, "readOnly": True}}]
    assert source_pod["metadata"]["ownerReferences"][0]["uid"] == temp["metadata"]["uid"]
    values = env(container)
    assert values["UPLOAD_URL"].startswith("https://10.96.0.7:8443/")
    assert values["UPLOAD_SERVER_NAME"] == f"{upload_service_name(temp_claim_name(target))}.{NAMESPACE}.svc"
    assert values["OWNER_UID"] == "dv-uid"  # progress is the DataVolume's
    assert (values["VOLUME_MODE"], values["MOUNT_POINT"]) == ("block", "/dev/cdi-block-volume")
    secret = stored(kube, groups.SECRETS, name)
    assert set(secret["stringData"]) == {"tls.crt", "tls.key"}
    assert values["CLIENT_CERT"] == {"secretKeyRef": {"name": name, "key": "tls.crt"}}
    # a running source pod is not started twice
    assert await HostClonePhase(clone(ctx, kube), SOURCE).reconcile() is WAIT
    assert kube.created(groups.PODS) == [f"{NAMESPACE}/{name}"]


async def test_no_copy_starts_while_a_pod_writes_to_the_source(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.COPY, phase="HostClone")
    await HostClonePhase(clone(ctx, kube), SOURCE).reconcile()
    upload_server(kube, target, **{S + "pod.ready": "true"})
    pod(kube, "vm")
    step = await HostClonePhase(clone(ctx, kube), SOURCE).reconcile()
    assert step is not None and step.annotations[S + "condition.running.reason"] == "CloneSourceInUse"
    assert kube.created(groups.PODS) == []


async def test_a_copy_waits_for_writers_even_where_the_target_allows_clones_in_use(kube: FakeKube,
                                                                                 ctx: Context) -> None:
    """A host-assisted copy reads the source over minutes: no instant to be crash-consistent at, so the
    opt-in does not apply, and the wait says so rather than ignore it silently."""
    source_claim(kube)
    target = target_claim(kube, planner.COPY, phase="HostClone", extra=ALLOW_IN_USE)
    await HostClonePhase(clone(ctx, kube), SOURCE).reconcile()
    upload_server(kube, target, **{S + "pod.ready": "true"})
    pod(kube, "vm")
    step = await HostClonePhase(clone(ctx, kube), SOURCE).reconcile()
    assert step is not None and step.annotations[S + "condition.running.reason"] == "CloneSourceInUse"
    assert step.annotations[S + "condition.running.message"] == (
        f"pod {NAMESPACE}/vm using PersistentVolumeClaim {SOURCE} "
        "(extensions.cdi.dev/clone.allowSourceInUse applies to csi-clone and snapshot clones only)")
    assert kube.created(groups.PODS) == []


async def test_done_once_uploaded_and_the_source_pod_goes(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.COPY, phase="HostClone")
    await HostClonePhase(clone(ctx, kube), SOURCE).reconcile()
    upload_server(kube, target, **{S + "pod.ready": "true"})
    await HostClonePhase(clone(ctx, kube), SOURCE).reconcile()
    temp = upload_server(kube, target, **{S + "pod.phase": "Succeeded", S + "pod.restarts": "2"})
    assert await HostClonePhase(clone(ctx, kube), SOURCE).reconcile() is None
    assert kube.object(groups.PODS, source_pod_name(temp), NAMESPACE) is None
    assert kube.object(groups.SECRETS, source_pod_name(temp), NAMESPACE) is None
    # the upload server's restarts are the DataVolume's restartCount
    assert stored(kube, groups.PVCS, "copy")["metadata"]["annotations"][S + "pod.restarts"] == "2"
