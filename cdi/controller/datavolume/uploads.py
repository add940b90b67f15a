"""The upload reconciler: a PVC annotated `cdi.kubevirt.io/storage.upload.target` (written by the
DataVolume reconciler for `source: upload`, or by a user for a bare PVC) gets an upload-server pod
with its own TLS certificate and a `cdi-upload-<pvc>` Service; the pod's readiness becomes
`storage.pod.ready` (DataVolume phase UploadReady), its successful exit `storage.pod.phase=Succeeded`,
and then pod, Service, certificate and scratch are removed.

Upload-server pod contract: its environment is `cdi.api.uploadrequest.UploadServerRequest` (CDI's names:
its certificate, the proxy's client CA and name, the target volume, CDIConfig's TLS profile, ...); the
certificate Secret at /etc/tls, scratch at /scratch when mounted; HTTPS on $POD_IP:8443; readiness on
GET /healthz. A Block volume without scratch also gets an emptyDir at UPLOAD_STATE_DIR (ours), where the
server keeps the resume offset of a raw upload across its restarts.

Failures: an upload the server refuses (too large, bad image) is answered to the client and leaves
the server ready for another attempt, so the DataVolume stays `UploadReady`. A failure after an
async upload was accepted ends the server with a non-zero exit and a termination message carrying
`reason` and `retryable`: a permanent one (`retryable: false`, e.g. ConversionFailed) ends the
DataVolume in `Failed` with that reason (pod, Service and scratch removed, nothing restarted); a
transient one shows in the Running condition while the pod restarts (`restartPolicy: OnFailure`)
and waits for a new upload. A body that does not hash to the claim's `extensions.cdi.dev/upload.checksum`
(our extension) is answered 400 and ends the server `ChecksumMismatch` (permanent): the DataVolume fails, as
an import's mismatch does. A completed upload records the checksum it verified, and the sha256 and format
of the bytes it received (`received`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import env, groups, tlsprofile
from cdi.api.owners import owner_keys, owner_reference
from cdi.api.targetvolume import TargetVolume, default_path
from cdi.api.upload import CLIENT_NAME, UPLOAD_PORT, upload_resource_name, upload_service_name
from cdi.api.uploadrequest import UploadServerRequest
from cdi.api.views import ClaimView, ObjectView, PodView
from cdi.common.imageprobe import ACCESS_STREAM, needs_scratch
from cdi.controller import quota
from cdi.controller.claims import (
    annotate,
    claim_overhead,
    delete_if_present,
    ensure_scratch,
    get_if_present,
    preallocation_wanted,
    progress_owner_uid,
    scratch_name,
    waits_for_first_consumer,
)
from cdi.controller.datavolume.imports import received, termination
from cdi.controller.datavolume.uploadpki import UploadPki, cert_days, ensure_upload_pki
from cdi.controller.runtime import Reconciler
from cdi.controller.watches import Watch
from cdi.controller.workerpod import pod_settings, worker_pod
from cdi.kube import WARNING, AlreadyExists, Forbidden, object_key, split_key

Obj = dict[str, Any]
Body = Mapping[str, Any]

UPLOAD_CONTAINER = "cdi-upload-server"
SERVICE_LABEL = "service"


def upload_name(pvc_name: str) -> str:
    return upload_resource_name(pvc_name)


def is_upload_claim(pvc: Body) -> bool:
    return ann.UPLOAD_TARGET in ClaimView(pvc).annotations


def upload_needs_scratch(pvc: Body) -> bool:
    """Unknown formats get scratch (as in CDI, where every upload has it): an upload cannot be asked
    for again with scratch added. A declared raw or qcow2 image, compressed or not, streams straight
    to the target."""
    annotations = ClaimView(pvc).annotations
    if ann.UPLOAD_CLIENT_NAME in annotations:
        return False  # a clone target receives extents, written in place (CDI: no scratch for clones)
    declared = annotations.get(ann.UPLOAD_FORMAT)  # what our CLI said it sends: `raw`, `qcow2+gz`, ...
    if not declared:
        return True
    fmt, _, compression = declared.partition("+")
    return needs_scratch(fmt, compression or None, ACCESS_STREAM)


class UploadReconciler(Reconciler):
    name = "upload"

    def watches(self) -> list[Watch]:
        """Claims that are upload targets, and the scratch claims they own; pods owned by a claim (its
        upload server); ResourceQuotas, for the claims whose scratch or pod a quota refused."""
        return [Watch(groups.PVCS, lambda pvc: [*([object_key(pvc)] if is_upload_claim(pvc) else []),
                                                *owner_keys(pvc, "PersistentVolumeClaim")]),
                Watch(groups.PODS, lambda pod: owner_keys(pod, "PersistentVolumeClaim")),
                quota.quota_watch(self.ctx, groups.PVCS, is_upload_claim)]

    async def pki(self) -> UploadPki:
        """The upload signers as they are now, read for each pod: rotated per certConfig, a pod made after
        a renewal gets a certificate from the new signer (a copy kept since start would be the old one)."""
        return await ensure_upload_pki(self.ctx.client, self.ctx.settings.namespace)

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        cached = self.ctx.cached(groups.PVCS, name, namespace)
        if cached is None or not is_upload_claim(cached):
            return None
        if ClaimView(cached).deleting:
            # as CDI: a claim being deleted loses its upload server now, which pvc-protection waits for
            await self._cleanup(cached, self.ctx.cached(groups.PODS, upload_name(name), namespace))
            return None
        pvc = await get_if_present(self.ctx, groups.PVCS, name, namespace)
        if pvc is None:
            return None
        claim = ClaimView(pvc)
        annotations = claim.annotations
        pod = self.ctx.cached(groups.PODS, upload_name(name), namespace)
        if annotations.get(ann.POD_PHASE) == "Succeeded" or annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
            await self._cleanup(pvc, pod)
            return None
        if not claim.bound:
            storage_class = self.ctx.cached(groups.STORAGECLASSES, claim.storage_class)
            wffc = (storage_class or {}).get("volumeBindingMode") == "WaitForFirstConsumer"
            if not (wffc and not waits_for_first_consumer(self.ctx, pvc)):
                return None
        if pod is not None and ann.CREATED_BY_UPLOAD_CONTROLLER in PodView(pod).annotations:
            await self._replace_cdis(pvc, pod)
            return None
        if pod is None:
            await self._create(pvc)
            return None
        return await self._observe(pvc, pod)

    async def _replace_cdis(self, pvc: Body, pod: Body) -> None:
        """An upload server CDI's controller started (a cluster cdi took over from CDI): its headless Service
        cannot route cdi's proxy to it, and its certificates are CDI's. It goes, with its Service, as CDI's
        controller lets its own go when their deadline passes, and the pod watch brings the claim back for
        cdi's. No upload is cut: CDI's proxy, the only way to it, went with CDI."""
        claim = ClaimView(pvc)
        service = await get_if_present(self.ctx, groups.SERVICES, upload_service_name(claim.name), claim.namespace)
        if service is not None and ann.CREATED_BY_UPLOAD_CONTROLLER in ObjectView(service).annotations:
            await delete_if_present(self.ctx, groups.SERVICES, upload_service_name(claim.name), claim.namespace,
                                    cached=False)
        self.log.info("%s: replacing CDI's upload server %s", claim.key, PodView(pod).name)
        await annotate(self.ctx, pvc, {ann.POD_PHASE: "", ann.POD_READY: "false"})
        await delete_if_present(self.ctx, groups.PODS, PodView(pod).name, claim.namespace, cached=False,
                                grace_period_seconds=0)

    async def _create(self, pvc: Body) -> None:
        claim = ClaimView(pvc)
        namespace, name = claim.namespace, claim.name
        resource, service = upload_name(name), upload_service_name(name)
        owner = [owner_reference(groups.PVCS, pvc)]
        labels = {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_COMPONENT: "cdi-upload-server"}
        pki_ = await self.pki()
        cdi = next(iter(self.ctx.cached_list(groups.CDIS)), None)
        pair = pki_.server_certificate(service, namespace, cert_days(cdi, "server"))
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": resource, "namespace": namespace, "labels": labels, "ownerReferences": owner},
                  "data": {"tls.crt": base64.b64encode(pair.cert_pem).decode(),
                           "tls.key": base64.b64encode(pair.key_pem).decode(),
                           "ca.crt": base64.b64encode(pki_.client_signer.cert_pem).decode()}}
        svc = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": service, "namespace": namespace, "labels": labels, "ownerReferences": owner},
               "spec": {"selector": {SERVICE_LABEL: service},
                        "ports": [{"name": "uploadserver", "port": UPLOAD_PORT, "targetPort": UPLOAD_PORT}]}}
        try:
            scratch = await ensure_scratch(self.ctx, pvc) if upload_needs_scratch(pvc) else None
            for gvr, body in ((groups.SECRETS, secret), (groups.SERVICES, svc)):
                try:
                    await self.ctx.client.create(gvr, body, namespace)
                except AlreadyExists:
                    pass
            await self.ctx.client.create(groups.PODS, self._pod(pvc, resource, service, labels, owner, scratch),
                                         namespace)
        except AlreadyExists:
            return
        except Forbidden as exc:  # over a quota: said on the claim, tried again
            message = quota.refusal(exc)
            if message is None:
                raise
            raise await quota.worker_refused(self.ctx, pvc, message) from exc
        await annotate(self.ctx, pvc, {ann.POD_PHASE: "Pending", ann.POD_READY: "false",
                                   ann.UPLOAD_POD_NAME: resource, ann.CONDITION_RUNNING: "false",
                                   ann.CONDITION_RUNNING_REASON: "Pending", ann.CONDITION_RUNNING_MESSAGE: "",
                                   ann.REQUIRES_SCRATCH: "true" if scratch else "false"})

    def _pod(self, pvc: Body, resource: str, service: str, labels: Mapping[str, str], owner: list[Obj],
             scratch: str | None) -> Obj:
        claim = ClaimView(pvc)
        name, annotations, block = claim.name, claim.annotations, claim.block
        request = UploadServerRequest(
            volume=TargetVolume(path=default_path(block), size=claim.requested_storage,
                                filesystem_overhead=claim_overhead(self.ctx, pvc),
                                preallocation=preallocation_wanted(self.ctx, pvc), owner_uid=progress_owner_uid(pvc)),
            content_type=annotations.get(ann.CONTENT_TYPE) or env.CONTENT_KUBEVIRT,
            client_name=annotations.get(ann.UPLOAD_CLIENT_NAME) or CLIENT_NAME,  # a clone source's, or the proxy's
            tls_profile=tlsprofile.of_config(self.ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)),
            # where the server keeps the resume offset of a raw upload across its restarts
            state_dir=env.UPLOAD_STATE_DIR_DEFAULT if block and not scratch else "",
            # only what the user wrote on the DataVolume or claim: a request can never choose its own checksum
            checksum=annotations.get(ann.UPLOAD_CHECKSUM, "").strip())
        mounts: list[Obj] = [{"name": "tls", "mountPath": env.TLS_DIR_DEFAULT, "readOnly": True}]
        volumes: list[Obj] = [{"name": "cdi-data-vol", "persistentVolumeClaim": {"claimName": name}},
                              {"name": "tls", "secret": {"secretName": resource}}]
        devices: list[Obj] = []
        if block:
            devices.append({"name": "cdi-data-vol", "devicePath": env.BLOCK_PATH_DEFAULT})
        else:
            mounts.append({"name": "cdi-data-vol", "mountPath": env.DATA_DIR_DEFAULT})
        if scratch:
            volumes.append({"name": "cdi-scratch-vol", "persistentVolumeClaim": {"claimName": scratch}})
            mounts.append({"name": "cdi-scratch-vol", "mountPath": env.SCRATCH_DIR_DEFAULT})
        elif request.state_dir:
            volumes.append({"name": "cdi-upload-state", "emptyDir": {}})
            mounts.append({"name": "cdi-upload-state", "mountPath": request.state_dir})
        container: Obj = {
            "name": UPLOAD_CONTAINER, "image": self.ctx.settings.uploadserver_image, "env": request.to_env(),
            "volumeMounts": mounts,
            "ports": [{"name": "uploadserver", "containerPort": UPLOAD_PORT, "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": UPLOAD_PORT, "scheme": "HTTPS"},
                               "periodSeconds": 1, "failureThreshold": 3},
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        if devices:
            container["volumeDevices"] = devices
        return worker_pod(
            name=resource, namespace=claim.namespace, component=labels[ann.LABEL_COMPONENT],
            annotated=pvc, owner=owner[0], containers=[container], volumes=volumes, restart_policy="OnFailure",
            settings=pod_settings(self.ctx),
            labels={**labels, SERVICE_LABEL: service, ann.LABEL_UPLOAD_TARGET: claim.uid})

    async def _observe(self, pvc: Body, pod: Body) -> float | None:
        phase = PodView(pod).phase or "Pending"
        statuses = PodView(pod).container_statuses
        ready = bool(statuses) and all(s.get("ready") for s in statuses)
        restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
        changes: dict[str, str | None] = {ann.POD_PHASE: phase, ann.POD_READY: "true" if ready else "false",
                                          ann.POD_RESTARTS: str(restarts)}
        running = statuses and all((s.get("state") or {}).get("running") for s in statuses)
        if running:
            changes.update({ann.CONDITION_RUNNING: "true", ann.CONDITION_RUNNING_REASON: "Pod is running",
                            ann.CONDITION_RUNNING_MESSAGE: ""})
        if phase == "Succeeded" and termination(pod)[1].get("deadlinePassed"):
            # CDI's upload server ends when its certificates' deadline passes, with nothing uploaded: CDI
            # starts another, and so does cdi (a pod CDI started before cdi took over can end so)
            await annotate(self.ctx, pvc, {ann.POD_PHASE: "", ann.POD_READY: "false"})
            await delete_if_present(self.ctx, groups.PODS, PodView(pod).name, PodView(pod).namespace, cached=False)
            return None
        if phase == "Succeeded":
            _, result = termination(pod)
            changes.update({ann.POD_READY: "false", ann.CONDITION_RUNNING: "false",
                            ann.CONDITION_RUNNING_REASON: "Completed",
                            ann.CONDITION_RUNNING_MESSAGE: str(result.get("message") or "Upload Complete")})
            if result.get("preallocationApplied"):
                changes[ann.PREALLOCATION_APPLIED] = "true"
            changes.update(received(result))
            await annotate(self.ctx, pvc, changes)
            await self._cleanup(pvc, pod)
            return None
        failure = last_failure(pod)
        if phase == "Failed" or (failure is not None and not failure.get("retryable", True)):
            result = failure if failure is not None else termination(pod)[1]
            reason = str(result.get("reason") or "Error")
            message = str(result.get("message") or "upload server failed")
            changes.update({ann.IMPORT_FATAL_ERROR: "true", ann.POD_PHASE: "Failed", ann.POD_READY: "false",
                            ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: reason,
                            ann.CONDITION_RUNNING_MESSAGE: message})
            await annotate(self.ctx, pvc, changes)
            self.ctx.recorder.record(pvc, WARNING, "UploadFailed", f"Upload into PVC {ClaimView(pvc).name} "
                                     f"failed: {reason}: {message}")
            await self._cleanup(pvc, pod)
            return None
        if failure is not None and not running:
            changes.update({ann.CONDITION_RUNNING: "false",
                            ann.CONDITION_RUNNING_REASON: str(failure.get("reason") or "Error"),
                            ann.CONDITION_RUNNING_MESSAGE: str(failure.get("message") or "upload server failed")})
        await annotate(self.ctx, pvc, changes)
        return None

    async def _cleanup(self, pvc: Body, pod: Body | None) -> None:
        """Remove what served the upload: pod (unless retained after success), Service, Secret, scratch."""
        claim = ClaimView(pvc)
        namespace, name, annotations = claim.namespace, claim.name, claim.annotations
        resource, service = upload_name(name), upload_service_name(name)
        succeeded = annotations.get(ann.POD_PHASE) == "Succeeded"
        retain = annotations.get(ann.RETAIN_AFTER_COMPLETION) == "true" and succeeded
        if not retain and pod is not None:
            await delete_if_present(self.ctx, groups.PODS, resource, namespace)
        await delete_if_present(self.ctx, groups.PVCS, scratch_name(pvc), namespace)
        if ann.UPLOAD_POD_NAME in annotations:  # services and secrets are not cached: remember that ours are gone
            await delete_if_present(self.ctx, groups.SERVICES, service, namespace, cached=False)
            await delete_if_present(self.ctx, groups.SECRETS, resource, namespace, cached=False)
            await annotate(self.ctx, pvc, {ann.UPLOAD_POD_NAME: None})


def last_failure(pod: Body) -> Obj | None:
    """The termination message of the upload server's last non-zero exit (current or previous run)."""
    for status in PodView(pod).container_statuses:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            terminated = state.get("terminated")
            if terminated and int(terminated.get("exitCode") or 0) != 0:
                text = terminated.get("message") or ""
                try:
                    message = json.loads(text)
                except ValueError:
                    message = None
                if not isinstance(message, dict):
                    message = {"message": text.strip()[-2000:] or f"exit code {terminated.get('exitCode')}",
                               "reason": str(terminated.get("reason") or "Error"), "retryable": True}
                return message
    return None
