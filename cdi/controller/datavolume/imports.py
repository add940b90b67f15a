"""The import reconciler: for every PVC that asks for an import (CDI's annotations, written by the
DataVolume reconciler or by a user), run the importer pod, mirror the pod into the PVC's annotations,
and decide retries from the importer's own verdict.

The controller never reads the source itself: the URL is the user's, and only a pod with the
DataVolume's network identity and `importProxy` settings should reach it. The importer starts
without scratch; where its route needs scratch (a vmdk, vhd, vhdx or vdi that qemu-img cannot read
in place) it says so from the first bytes, before downloading the rest (`scratchSpaceRequired` in
its termination message), and the controller starts the next pod with a scratch claim, which is
not a restart, as in CDI.

The importer reports `reason` and `retryable` in its termination message. A permanent failure
(bad checksum, image too large, 404, refused credentials ...) ends the import at once, and nothing
is downloaded again; a transient one is retried with exponential backoff until the retry budget is
spent. `storage.pod.restarts` counts the importer pods started again, so DataVolume `restartCount`
counts pod restarts as in CDI; failures the importer retried inside its pod are not restarts."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.importrequest import ImportRequest
from cdi.api.owners import owner_keys
from cdi.api.views import ClaimView, DataVolumeView, ObjectView, PodView
from cdi.common.backoff import backoff_delay
from cdi.controller import conditions, quota
from cdi.controller.claims import (
    annotate,
    claim_keys_of_pod,
    claim_overhead,
    config_status,
    delete_if_present,
    ensure_scratch,
    get_if_present,
    preallocation_wanted,
    scratch_name,
    waits_for_first_consumer,
)
from cdi.controller.datavolume.importpod import (
    IMPORTER_CONTAINER,
    WorkerSettings,
    importer_pod,
    mounts_scratch,
    pod_name,
)
from cdi.controller.datavolume.importproxy import MISSING_REASON, ProxyCaMissing, delete_proxy_ca, ensure_proxy_ca
from cdi.controller.runtime import Context, Reconciler
from cdi.controller.watches import Watch
from cdi.controller.workerpod import pod_settings
from cdi.kube import NORMAL, WARNING, AlreadyExists, Forbidden, object_key, split_key

Obj = dict[str, Any]
Body = Mapping[str, Any]


def is_import_claim(pvc: Body) -> bool:
    annotations = ClaimView(pvc).annotations
    return ann.IMPORT_ENDPOINT in annotations or annotations.get(ann.IMPORT_SOURCE) in ("blank", "none")


IMAGE_PULL_WAITING = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName")
IMAGE_PULL_FAILURE_TEXT = "failed to pull image"  # CDI's ImagePullFailureText


def _importer_first(pod: Body) -> list[Body]:
    return sorted(PodView(pod).container_statuses, key=lambda s: s.get("name") != IMPORTER_CONTAINER)


def image_pull_failure(pod: Body) -> str | None:
    """CDI's message when a container of the pod cannot get its image (`failed to pull image: IMAGE`)."""
    for status in PodView(pod).container_statuses:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if not status.get("started") and waiting.get("reason") in IMAGE_PULL_WAITING:
            return f"{IMAGE_PULL_FAILURE_TEXT}: {status.get('image', '')}"
    return None


def importer_ended(pod: Body) -> bool:
    """The importer container failed while the pod goes on (a node-pull pod whose server never started)."""
    for status in PodView(pod).container_statuses:
        terminated = (status.get("state") or {}).get("terminated")
        if status.get("name") == IMPORTER_CONTAINER and terminated and terminated.get("exitCode", 0) != 0:
            return True
    return False


def termination(pod: Body) -> tuple[str, Obj]:
    """(terminated reason, parsed termination message) of the pod's importer container."""
    for status in _importer_first(pod):
        terminated = (status.get("state") or {}).get("terminated")
        if terminated:
            text = terminated.get("message") or ""
            try:
                message = json.loads(text)
            except ValueError:
                message = {"message": text.strip()[-2000:], "reason": "InternalError", "retryable": True}
            if not isinstance(message, dict):
                message = {"message": str(message), "reason": "InternalError", "retryable": True}
            return str(terminated.get("reason") or ""), message
    return "", {}


def received(result: Body) -> dict[str, str]:
    """What a finished worker says it received, as the claim's annotations: the checksum it verified, and
    (our extension, for audits of what a golden image holds) the sha256 and format of the source's bytes."""
    out: dict[str, str] = {}
    for key, field in ((ann.IMPORT_CHECKSUM_RESULT, "checksum"), (ann.SOURCE_SHA256, "sourceSha256"),
                       (ann.SOURCE_FORMAT, "sourceFormat")):
        if result.get(field):
            out[key] = str(result[field])
    return out


def _time(seconds_from_now: float) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds_until(stamp: str) -> float:
    try:
        moment = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (moment - datetime.datetime.now(datetime.UTC)).total_seconds()


class ImportReconciler(Reconciler):
    name = "import"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)

    def watches(self) -> list[Watch]:
        """Claims asking for an import, and the scratch claims they own; pods owned by a claim (its
        importer) or mounting one; ResourceQuotas, for the claims whose scratch or pod a quota refused."""
        return [Watch(groups.PVCS, lambda pvc: [*([object_key(pvc)] if is_import_claim(pvc) else []),
                                                *owner_keys(pvc, "PersistentVolumeClaim")]),
                Watch(groups.PODS, claim_keys_of_pod), quota.quota_watch(self.ctx, groups.PVCS, is_import_claim)]

    def worker_settings(self) -> WorkerSettings:
        status = config_status(self.ctx)
        settings = self.ctx.settings
        config = self.ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME) or {}
        return WorkerSettings(
            importer_image=settings.importer_image, import_proxy=status.get("importProxy"),
            insecure_registries=tuple(ObjectView(config).spec.get("insecureRegistries") or ()),
            pod=pod_settings(self.ctx), retry_budget=settings.import_retry_budget,
        )

    def _dv_of(self, pvc: Body) -> Body | None:
        claim = ClaimView(pvc)
        for ref in claim.owner_references:
            if ref.get("kind") == "DataVolume":
                return self.ctx.cached(groups.DATAVOLUMES, str(ref["name"]), claim.namespace)
        return None

    async def reconcile(self, key: str) -> float | None:
        namespace, name = split_key(key)
        cached = self.ctx.cached(groups.PVCS, name, namespace)
        if cached is None or not is_import_claim(cached):
            return None
        if ClaimView(cached).deleting:
            await self._stop_for_deletion(cached)
            return None
        # the claim's annotations are this reconciler's memory (attempt, retry time, pod name): read them
        # fresh, never from a cache that may not have seen our last write yet
        pvc = await get_if_present(self.ctx, groups.PVCS, name, namespace)
        if pvc is None:
            return None
        annotations = ClaimView(pvc).annotations
        attempt = int(annotations.get(ann.POD_RESTARTS, "0") or 0)
        current_name = annotations.get(ann.IMPORT_POD_NAME) or pod_name(name, attempt)
        pod = self.ctx.cached(groups.PODS, current_name, namespace)
        if annotations.get(ann.POD_PHASE) == "Succeeded" or annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
            await self._cleanup(pvc, pod, succeeded=annotations.get(ann.POD_PHASE) == "Succeeded")
            return None
        if pod is not None:
            return await self._observe(pvc, pod, attempt)
        return await self._start(pvc, attempt)

    # -- starting --------------------------------------------------------------------------------------

    async def _start(self, pvc: Body, attempt: int) -> float | None:
        claim = ClaimView(pvc)
        annotations, namespace, name = claim.annotations, claim.namespace, claim.name
        wait = _seconds_until(annotations.get(ann.IMPORT_NEXT_RETRY, ""))
        if wait > 0:
            return wait
        if not claim.bound:
            storage_class = self.ctx.cached(groups.STORAGECLASSES, claim.storage_class)
            wffc = (storage_class or {}).get("volumeBindingMode") == "WaitForFirstConsumer"
            if not (wffc and not waits_for_first_consumer(self.ctx, pvc)):
                return None  # the provisioner binds it, or a consumer will
        in_use = self._used_by_other_pod(pvc)
        if in_use:
            dv = self._dv_of(pvc)
            self.ctx.recorder.record(dv or pvc, NORMAL, "ImportTargetInUse",
                                     f"pod {in_use} is using PVC {name}; waiting for it to finish")
            return 5.0
        source = ImportRequest.from_annotations(annotations)
        if source.source == "none":
            source = source.with_source("blank")
        # scratch only once an importer asked for it (or a user's annotation did): never from a look at the source
        scratch = annotations.get(ann.REQUIRES_SCRATCH) == "true"
        try:
            await ensure_proxy_ca(self.ctx, pvc)
        except ProxyCaMissing as exc:  # the pod could not start without it: say so instead of a hung pod
            self.ctx.recorder.record(self._dv_of(pvc) or pvc, WARNING, MISSING_REASON, str(exc))
            await annotate(self.ctx, pvc, {ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: MISSING_REASON,
                                           ann.CONDITION_RUNNING_MESSAGE: str(exc)})
            return 10.0
        try:
            scratch_claim = await ensure_scratch(self.ctx, pvc) if scratch else None
            pod = importer_pod(
                pvc, source, self.worker_settings(), attempt=attempt, scratch_claim=scratch_claim,
                filesystem_overhead=claim_overhead(self.ctx, pvc), preallocation=preallocation_wanted(self.ctx, pvc))
            await self.ctx.client.create(groups.PODS, pod, namespace)
        except AlreadyExists:
            return 0.5
        except Forbidden as exc:  # the scratch claim or the pod over a quota: said on the claim, tried again
            message = quota.refusal(exc)
            if message is None:
                raise
            raise await quota.worker_refused(self.ctx, pvc, message) from exc
        await annotate(self.ctx, pvc, {ann.IMPORT_POD_NAME: pod["metadata"]["name"], ann.POD_PHASE: "Pending",
                                   ann.REQUIRES_SCRATCH: "true" if scratch else "false",
                                   ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: "Pending",
                                   ann.CONDITION_RUNNING_MESSAGE: "", ann.IMPORT_NEXT_RETRY: None})
        return None

    def _used_by_other_pod(self, pvc: Body) -> str | None:
        claim = ClaimView(pvc)
        for body in self.ctx.cached_list(groups.PODS, claim.namespace):
            pod = PodView(body)
            if pod.finished or pod.owned_by_claim(claim.name):
                continue
            if claim.name in pod.claim_names:
                return pod.name
        return None

    # -- observing ------------------------------------------------------------------------------------

    async def _observe(self, pvc: Body, pod: Body, attempt: int) -> float | None:
        view = PodView(pod)
        if view.deleting:
            return None  # its deletion (a retry or a cleanup) is under way
        phase = view.phase or "Pending"
        changes: dict[str, str | None] = {ann.POD_PHASE: phase, ann.POD_RESTARTS: str(attempt),
                                          ann.IMPORT_POD_NAME: view.name}
        statuses = view.container_statuses
        ready = bool(statuses) and all(s.get("ready") for s in statuses)
        changes[ann.POD_READY] = "true" if ready else "false"
        if phase == "Succeeded":
            return await self._succeeded(pvc, pod, changes)
        if phase == "Failed" or importer_ended(pod):
            return await self._failed(pvc, pod, attempt, changes)
        self._running_condition(pod, changes)
        await annotate(self.ctx, pvc, changes)
        return None

    @staticmethod
    def _running_condition(pod: Body, changes: dict[str, str | None]) -> None:
        statuses = PodView(pod).container_statuses
        if statuses and all((s.get("state") or {}).get("running") for s in statuses):
            changes.update({ann.CONDITION_RUNNING: "true", ann.CONDITION_RUNNING_REASON: conditions.POD_RUNNING_REASON,
                            ann.CONDITION_RUNNING_MESSAGE: ""})
            return
        changes[ann.CONDITION_RUNNING] = "false"
        pull_failure = image_pull_failure(pod)
        if pull_failure:
            changes.update({ann.CONDITION_RUNNING_REASON: conditions.IMAGE_PULL_FAILED_REASON,
                            ann.CONDITION_RUNNING_MESSAGE: pull_failure})
            return
        waiting = next(((s.get("state") or {}).get("waiting") for s in statuses
                        if (s.get("state") or {}).get("waiting")), None)
        if waiting:
            changes.update({ann.CONDITION_RUNNING_REASON: str(waiting.get("reason") or ""),
                            ann.CONDITION_RUNNING_MESSAGE: str(waiting.get("message") or "")})
            return
        unschedulable = next((c for c in PodView(pod).conditions
                              if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
        changes[ann.POD_SCHEDULABLE] = "false" if unschedulable else None
        changes.setdefault(ann.CONDITION_RUNNING_REASON, "Pending")

    async def _succeeded(self, pvc: Body, pod: Body, changes: dict[str, str | None]) -> float | None:
        _, result = termination(pod)
        changes.update({ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: "Completed",
                        ann.CONDITION_RUNNING_MESSAGE: str(result.get("message") or "Import Complete"),
                        ann.POD_READY: "false", ann.IMPORT_REASON: None})
        if result.get("preallocationApplied"):
            changes[ann.PREALLOCATION_APPLIED] = "true"
        if result.get("retries"):  # failures retried inside the pod: not restarts (restartCount counts pods)
            changes[ann.IMPORT_RETRIES] = str(int(result["retries"]))
        changes.update(received(result))
        labels = result.get("labels") or {}
        patch: Obj = {"metadata": {"annotations": dict(changes)}}
        if labels:
            patch["metadata"]["labels"] = {str(k): str(v) for k, v in labels.items()}
        claim = ClaimView(pvc)
        await self.ctx.client.patch(groups.PVCS, claim.name, patch, claim.namespace)
        await self._cleanup(pvc, pod, succeeded=True)
        return None

    async def _failed(self, pvc: Body, pod: Body, attempt: int, changes: dict[str, str | None]) -> float | None:
        terminated_reason, result = termination(pod)
        annotations = ClaimView(pvc).annotations
        reason = str(result.get("reason") or terminated_reason or "Error")
        message = str(result.get("message") or f"importer exited with {terminated_reason or 'an error'}")
        pull_failure = image_pull_failure(pod)
        if pull_failure:  # the importer gave up waiting for the image's server: say why
            reason, message = conditions.IMAGE_PULL_FAILED_REASON, pull_failure
        claim = ClaimView(pvc)
        namespace, name = claim.namespace, claim.name
        if result.get("scratchSpaceRequired") and not mounts_scratch(pod):
            # the importer read the head and needs scratch: the next pod gets it, and this is no restart
            # (CDI's condition reason and message; the pod, not the claim, says whether scratch was there,
            # so a stale view of this pod after the annotation below asks for the same thing again)
            await annotate(self.ctx, pvc, {ann.REQUIRES_SCRATCH: "true", ann.IMPORT_POD_NAME: None,
                                           ann.CONDITION_RUNNING: "false",
                                           ann.CONDITION_RUNNING_REASON: conditions.SCRATCH_REQUIRED_REASON,
                                           ann.CONDITION_RUNNING_MESSAGE: conditions.SCRATCH_REQUIRED_MESSAGE})
            await self._delete_pod(pod)
            return None
        retryable = bool(result.get("retryable", terminated_reason in ("OOMKilled", "Error", "")))
        budget = int(annotations.get(ann.IMPORT_RETRY_BUDGET) or self.ctx.settings.retry_budget)
        changes.update({ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: reason,
                        ann.CONDITION_RUNNING_MESSAGE: message, ann.IMPORT_REASON: reason})
        dv = self._dv_of(pvc)
        if retryable and attempt < budget:
            delay = backoff_delay(attempt, self.ctx.settings.retry_base, self.ctx.settings.retry_max)
            changes.update({ann.POD_RESTARTS: str(attempt + 1), ann.IMPORT_NEXT_RETRY: _time(delay),
                            ann.IMPORT_POD_NAME: pod_name(name, attempt + 1), ann.POD_PHASE: "Pending"})
            await annotate(self.ctx, pvc, changes)
            self.ctx.metrics.import_retries.inc()
            self.ctx.recorder.record(dv or pvc, WARNING, reason,
                                     f"Import attempt {attempt + 1} failed, retrying in {delay:.0f}s "
                                     f"({attempt + 1}/{budget}): {message}")
            await self._delete_pod(pod)
            return delay
        if retryable:
            message = f"{message} (gave up after {attempt + 1} attempts)"
            changes[ann.CONDITION_RUNNING_MESSAGE] = message
        # the pod (restartPolicy Never) has ended for good: its phase is Failed even where the node has not
        # said so yet (a real kubelet reports the container's end before the phase), and this claim is not
        # looked at again, so the annotation must not keep the Running seen a moment earlier
        changes[ann.IMPORT_FATAL_ERROR], changes[ann.POD_PHASE] = "true", "Failed"
        await annotate(self.ctx, pvc, changes)
        self.ctx.metrics.import_failures.labels(reason).inc()
        self.ctx.recorder.record(dv or pvc, WARNING, "ImportFailed", f"Failed to import into PVC {name}: "
                                 f"{reason}: {message}")
        await self._delete_scratch(namespace, name)
        return None

    # -- cleanup ----------------------------------------------------------------------------------------

    async def _delete_pod(self, pod: Body) -> None:
        view = PodView(pod)
        await delete_if_present(self.ctx, groups.PODS, view.name, view.namespace, cached=False,
                                grace_period_seconds=0)

    async def _delete_scratch(self, namespace: str, name: str) -> None:
        await delete_if_present(self.ctx, groups.PVCS, scratch_name(name), namespace)

    async def _stop_for_deletion(self, pvc: Body) -> None:
        """The claim is being deleted (its DataVolume was): stop the import now, as CDI does. Left alone,
        the importer would download to the end, or wait on a stalled server, while pvc-protection
        holds the claim `Terminating`; its data is going anyway, so no grace period."""
        claim = ClaimView(pvc)
        namespace, name = claim.namespace, claim.name
        for pod in self.ctx.cached_list(groups.PODS, namespace):
            view = PodView(pod)
            if view.labels.get(ann.LABEL_COMPONENT) == "importer" and not view.deleting and view.owned_by_claim(name):
                await self._delete_pod(pod)
        await self._delete_scratch(namespace, name)

    async def _cleanup(self, pvc: Body, pod: Body | None, *, succeeded: bool) -> None:
        claim = ClaimView(pvc)
        annotations, namespace, name = claim.annotations, claim.namespace, claim.name
        await self._delete_scratch(namespace, name)
        if pod is not None:  # the import just ended (later cleanups mostly find the pod gone)
            await delete_proxy_ca(self.ctx, pvc)
        retain = annotations.get(ann.RETAIN_AFTER_COMPLETION) == "true"
        dv = self._dv_of(pvc)
        if dv is not None and DataVolumeView(dv).annotations.get(ann.RETAIN_AFTER_COMPLETION) == "true":
            retain = True
        if pod is not None and succeeded and not retain and not PodView(pod).deleting:
            await self._delete_pod(pod)
