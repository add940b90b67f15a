"""HostClone (CDI's host-clone.go): a host-assisted copy. The temporary claim `tmp-pvc-<target uid>` is made
an upload target, so the upload reconciler runs an upload server for it; once that server is ready, a
clone source pod (`<tmp-pvc uid>-source-pod`, container `cdi-clone-source`) in the source namespace reads
the source and streams it there over mutual TLS. Done once the upload server reports success; the
source pod and its Secret then go.

The source pod starts only while no pod may write to the source; its restarts are the upload server's,
counted on the target (the DataVolume's restartCount, as CDI's populator copies them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from cdi.api import annotations as ann
from cdi.api import clonesourcerequest, groups
from cdi.api.clonesourcerequest import CloneSourceRequest
from cdi.api.owners import owner_reference
from cdi.api.targetvolume import TargetVolume
from cdi.api.upload import SYNC_PATHS, UPLOAD_PORT, upload_service_name
from cdi.api.views import ClaimView, ObjectView, PodView
from cdi.common import pki
from cdi.controller.clone import sourceclaim
from cdi.controller.clone.phase import STARTED, WAIT, Step
from cdi.controller.clone.target import (
    SOURCE_CONTAINER,
    CloneTarget,
    recorded_source,
    source_pod_name,
    temp_claim_name,
)
from cdi.controller.datavolume.uploadpki import cert_days, ensure_upload_pki
from cdi.controller.runtime import Context
from cdi.controller.workerpod import pod_settings, worker_pod

Obj = dict[str, Any]
Body = Mapping[str, Any]

HOST_CLONE = "HostClone"


@dataclass(frozen=True)
class HostClonePhase:
    target: CloneTarget
    source_claim: str  # the claim the source pod reads: the source, or a snapshot restored for the copy
    name: ClassVar[str] = HOST_CLONE

    async def reconcile(self) -> Step | None:
        target, temp = self.target, self.target.temp
        namespace, claim = target.source_namespace, target.view
        if temp is None:
            client_name = f"{namespace}/{self.source_claim}-{claim.key}"
            if len(client_name) > 64:  # a certificate's CN holds 64 characters
                client_name = f"clone-source-{claim.uid}"
            body = target.temp_claim(claim.requested_storage, None)
            body["metadata"]["annotations"].update({
                ann.UPLOAD_TARGET: "", ann.UPLOAD_CLIENT_NAME: client_name, ann.CONTENT_TYPE: "kubevirt",
                ann.CLONE_REQUEST: f"{namespace}/{self.source_claim}"})
            await target.create(groups.PVCS, body)
            return Step()
        temp_annotations = ClaimView(temp).annotations
        restarts = temp_annotations.get(ann.POD_RESTARTS)
        if restarts and restarts != claim.annotations.get(ann.POD_RESTARTS):
            await target.ctx.client.patch(groups.PVCS, claim.name, {"metadata": {
                "annotations": {ann.POD_RESTARTS: restarts}}}, claim.namespace)
        pod_name = source_pod_name(temp)
        if temp_annotations.get(ann.POD_PHASE) == "Succeeded":
            for gvr in (groups.PODS, groups.SECRETS):
                await target.delete(gvr, pod_name, namespace)
            return None
        if temp_annotations.get(ann.POD_READY) != "true" or \
                target.ctx.cached(groups.PODS, pod_name, namespace) is not None:
            return WAIT
        wait = sourceclaim.while_in_use(target, self.name, self.source_claim)
        if wait is not None:
            return wait
        await create_source_pod(target, temp, self.source_claim)
        return STARTED


def source_owner_uid(target: Body) -> str:
    """The uid the clone source pod labels its progress with: the DataVolume's (as CDI), else the target's."""
    return ClaimView(target).annotations.get(ann.CREATED_FOR_DATAVOLUME) or ClaimView(target).uid


def copy_source(ctx: Context, target: Body) -> tuple[str, str] | None:
    """(pod IP, owner uid) of the clone source pod of a host-assisted copy into `target`, whose metrics say how
    far the copy is; None while there is no such pod with an IP."""
    _, namespace, _ = recorded_source(target)
    temp = ctx.cached(groups.PVCS, temp_claim_name(target), namespace)
    pod = ctx.cached(groups.PODS, source_pod_name(temp), namespace) if temp else None
    pod_ip = PodView(pod).pod_ip if pod else ""
    return (pod_ip, source_owner_uid(target)) if pod_ip else None


async def create_source_pod(clone: CloneTarget, temp: Obj, source_name: str) -> None:
    """`<uid>-source-pod` (container `cdi-clone-source`) in the source namespace: the source read-only,
    a client certificate for the upload server's CLIENT_NAME, the server's CA, the Service's address.
    The upload signers are read for each pod: rotated per certConfig, a pod made after a renewal gets a
    certificate from the new signer (a copy kept since start would be the old one)."""
    ctx, target, namespace = clone.ctx, clone.claim, clone.source_namespace
    source = ctx.cached(groups.PVCS, source_name, namespace)
    temp_name = ClaimView(temp).name
    service = await clone.get(groups.SERVICES, upload_service_name(temp_name), namespace)
    cluster_ip = ObjectView(service or {}).spec.get("clusterIP")
    if source is None or not cluster_ip:
        return
    pod_name = source_pod_name(temp)
    pki_ = await ensure_upload_pki(ctx.client, ctx.settings.namespace)
    client_name = ClaimView(temp).annotations.get(ann.UPLOAD_CLIENT_NAME, "")
    cdi = next(iter(ctx.cached_list(groups.CDIS)), None)
    pair = pki.issue(pki_.client_signer, client_name, None, server=False, client=True,
                     days=cert_days(cdi, "client"))
    owner = [owner_reference(groups.PVCS, temp)]
    labels = {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_COMPONENT: SOURCE_CONTAINER,
              ann.LABEL_OWNED_BY_UID: ClaimView(target).uid}
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": pod_name, "namespace": namespace, "labels": labels, "ownerReferences": owner},
              "stringData": {"tls.crt": pair.cert_pem.decode(), "tls.key": pair.key_pem.decode()}}
    await clone.create(groups.SECRETS, secret)
    block = ClaimView(source).block
    host = f"[{cluster_ip}]" if ":" in str(cluster_ip) else str(cluster_ip)
    owner_uid = source_owner_uid(target)
    request = CloneSourceRequest(
        upload_url=f"https://{host}:{UPLOAD_PORT}{SYNC_PATHS[0]}", server_ca=pki_.server_signer.cert_pem.decode(),
        server_name=f"{upload_service_name(temp_name)}.{namespace}.svc", client_secret=pod_name,
        volume=TargetVolume(path=clonesourcerequest.source_path(block), owner_uid=owner_uid))
    mount = request.mount_point
    container: Obj = {
        "name": SOURCE_CONTAINER, "image": ctx.settings.cloner_image, "env": request.to_env(),
        "ports": [{"name": "metrics", "containerPort": 8443, "protocol": "TCP"}],
    }
    if block:
        container["volumeDevices"] = [{"name": "cdi-data-vol", "devicePath": mount}]
    else:
        container["volumeMounts"] = [{"name": "cdi-data-vol", "mountPath": mount, "readOnly": True}]
    pod = worker_pod(name=pod_name, namespace=namespace, component=SOURCE_CONTAINER, annotated=target,
                     owner=owner[0], containers=[container], restart_policy="OnFailure",
                     volumes=[{"name": "cdi-data-vol", "persistentVolumeClaim": {"claimName": source_name,
                                                                                 "readOnly": True}}],
                     settings=pod_settings(ctx), labels=labels)
    await clone.create(groups.PODS, pod)
