"""The DataImportCron reconciler: golden images kept fresh on a schedule, as CDI does it.

Each run asks the source for its current version. The controller never reads the user's URL itself: a
short poller pod (`poller-<cron>-<uid>`, the importer program with IMPORTER_POLL=true and the import's
own environment: proxy, CA bundle, credentials, insecure registries) reports it in its termination
message. One mechanism for registries, HTTP and S3, on `cdi up` and on a real cluster alike, and the
controller needs no network path to any registry. As in CDI, two kinds differ: a registry with
`pullMethod: node` is polled by the node (the poller runs the image; the digest is its `imageID`), and a
`pvc` source's version is the claim's uid, read by the controller (there is no URL to ask). The version becomes the
annotation CDI uses (`storage.import.sourceDesiredDigest`): a registry's manifest digest, or for HTTP
and S3 `sha256:` of the object's validators (ETag, Last-Modified).

A new digest creates a DataVolume from the cron's template named as CDI names it
(`<managedDataSource>-<12 digest chars>`, a registry URL pinned to `@digest`); once it succeeds the
managed DataSource points at it (or, with `dataImportCronSourceFormat: snapshot`, at a VolumeSnapshot
of it). Status, conditions (`Progressing`, `UpToDate`), their reasons, the labels and annotations are
CDI's. Unlike CDI, a failed import never blocks the next version: a new digest replaces a failed
DataVolume, while the DataSource keeps the last good image; garbage collection keeps `importsToKeep`
and never deletes what the DataSource points at.

Schedules are evaluated here with croniter against an injectable clock: the next run time is kept in
`storage.import.nextCronTime`; a run missed while the controller was down runs once when it is back.
`cdi.kubevirt.io/refreshNow` on the cron runs one now."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable, Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups, naming
from cdi.api.cronvalidation import next_schedule_time
from cdi.api.importrequest import ImportRequest
from cdi.api.owners import owner_reference
from cdi.api.views import (
    ClaimView,
    DataImportCronView,
    DataSourceView,
    DataVolumeView,
    ObjectView,
    PodView,
    SnapshotView,
    StorageProfileView,
)
from cdi.controller import conditions
from cdi.controller.claims import config_status
from cdi.controller.datavolume.importpod import (
    DATA_VOLUME,
    NODE_POLLER_CONTAINER,
    WorkerSettings,
    importer_pod,
    node_pull_poller,
)
from cdi.controller.datavolume.imports import termination
from cdi.controller.runtime import Context, Reconciler, write_status
from cdi.controller.watches import Watch
from cdi.controller.workerpod import pod_settings
from cdi.kube import NORMAL, WARNING, AlreadyExists, NotFound, object_key, split_key

Obj = dict[str, Any]
Body = Mapping[str, Any]
Clock = Callable[[], datetime.datetime]

NEXT_CRON, LAST_CRON = ann.NEXT_CRON_TIME, ann.LAST_CRON_TIME
POLLER_RECHECK = 1.0  # seconds between looks at a poller pod that is running or going away
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
# cron labels CDI passes on to what it creates
PASSED_LABELS = (*ann.INSTANCETYPE_LABELS, ann.LABEL_DYNAMIC_CREDENTIALS_SUPPORT)
DEFAULT_IMPORTS_TO_KEEP = 3
POLL_RETRY_BUDGET = 30.0  # seconds the poller retries an unreachable source; the next scheduled run tries again
DIGEST_NAME_LENGTH = 12

# condition reasons (CDI's)
NO_DIGEST, NO_IMPORT, OUTDATED = "NoDigest", "NoImport", "Outdated"
SCHEDULED, IN_PROGRESS, UP_TO_DATE = "ImportScheduled", "ImportProgressing", "UpToDate"
ALREADY_MANAGED = "ErrDataSourceAlreadyManaged"
NOT_AUTHORIZED = "NotAuthorized"
# ours: why a run told no version, why a schedule runs never, why an outdated import is kept
POLL_FAILED, POLLER_TIMED_OUT, NO_SCHEDULED_RUN = "PollFailed", "PollerTimedOut", "NoScheduledRun"
NO_SCHEDULED_RUN_MESSAGE = ("schedule {!r} names no time that ever comes: the source is polled only when the cron is "
                            "created and on cdi.kubevirt.io/refreshNow")
IMPORT_IN_USE = "OutdatedImportInUse"
# ours: a condition type of the cron's own (CDI's conditions are free-form: its CRD schema keeps any type) saying
# which outdated imports garbage collection keeps past importsToKeep because something uses them
IMPORTS_IN_USE, IMPORTS_COLLECTED = "OutdatedImportsInUse", "OutdatedImportsCollected"
IMAGE_PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(stamp: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def next_run(schedule: str, after: datetime.datetime) -> datetime.datetime | None:
    """The first time after `after` that `schedule` (standard five-field cron) names; None when it names
    none that ever comes (`0 0 31 2 *`), which admission refuses but a cron stored before may still have."""
    return next_schedule_time(schedule, after)


def dv_name(data_source: str, digest: str) -> str | None:
    """CDI's `createDvName`: the DataSource's name and the first 12 characters of the digest."""
    for prefix in ("sha256:", "uid:"):
        if digest.startswith(prefix) and len(digest) >= len(prefix) + DIGEST_NAME_LENGTH:
            return naming.resource_name(data_source, digest[len(prefix):len(prefix) + DIGEST_NAME_LENGTH])
    return None


def run_due(schedule: str, annotations: Mapping[str, str],
            now: datetime.datetime) -> tuple[bool, datetime.datetime | None]:
    """Whether a poll is due now, and the next scheduled time (None when none is recorded yet).

    Due: on `refreshNow`; on the first reconcile (no digest, never run); when the recorded next run time
    has come. After a run the next time is computed from that moment, so runs missed while the controller
    was down become one run, not one per missed slot. An empty schedule polls only on creation and
    on `refreshNow`."""
    next_time = _parse(annotations.get(ann.NEXT_CRON_TIME, ""))
    if ann.REFRESH_NOW in annotations:
        return True, next_time
    if ann.SOURCE_DESIRED_DIGEST not in annotations and ann.LAST_CRON_TIME not in annotations:
        return True, next_time
    return bool(schedule and next_time is not None and next_time <= now), next_time


def _age(obj: Body, now: datetime.datetime) -> float | None:
    created = _parse(str(ObjectView(obj).metadata.get("creationTimestamp") or ""))
    return (now - created).total_seconds() if created else None


def node_pull_answer(pod: Body) -> tuple[bool, str, str]:
    """(answered, digest, failure) of a node-pull poller, as CDI's fetchContainerImageDigest reads it: the
    digest of the image the node pulled, from the image container's `imageID` once it ran; an image the
    node cannot pull fails the run at once (CDI's "failed to pull image" text)."""
    status = next((s for s in PodView(pod).container_statuses if s.get("name") == NODE_POLLER_CONTAINER), None)
    if status is None:
        return False, "", ""
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in IMAGE_PULL_FAILURES:
        return True, "", f"failed to pull image: {status.get('image')}: {waiting.get('reason')}"
    if not state.get("terminated"):
        return False, "", ""
    image_id = str(status.get("imageID") or "")
    at = image_id.find("sha256:")
    if at < 0:
        return True, "", f"the node reports no digest for image {status.get('image')} (imageID {image_id!r})"
    return True, image_id[at:], ""


def claim_source(cron: Body) -> tuple[str, str] | None:
    """(namespace, name) of the claim a cron's template clones (`source.pvc`, CDI's isPvcSource), or None."""
    ref = (DataImportCronView(cron).template_spec.get("source") or {}).get("pvc")
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return None
    return str(ref.get("namespace") or DataImportCronView(cron).namespace), str(ref["name"])


def poller_name(cron: Body) -> str:
    """CDI's poller pod name: `poller-<cron>-<first 8 of its uid>`."""
    return naming.resource_name(f"poller-{DataImportCronView(cron).name}", DataImportCronView(cron).uid[:8])


def pinned_registry_url(url: str, digest: str) -> str:
    """`docker://host/repo:tag` -> `docker://host/repo@sha256:...` (CDI's untagDigestedDockerURL)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "docker", url
    rest = rest.split("@", 1)[0]
    head, slash, last = rest.rpartition("/")
    if ":" in last:
        last = last.split(":", 1)[0]
    return f"{scheme}://{head}{slash}{last}@{digest}"


def set_condition(status: Obj, type_: str, value: str, message: str, reason: str) -> None:
    """CDI's updateConditionState: a new status stamps the transition; any change the heartbeat."""
    found = conditions.find(status.setdefault("conditions", []), type_)
    if found is None:
        found = {"type": type_}
        status["conditions"].append(found)
    stamp = conditions.now()
    if found.get("status") != value or found.get("message") != message or found.get("reason") != reason:
        if found.get("status") != value:
            found["lastTransitionTime"] = stamp
        found.update(status=value, message=message, reason=reason, lastHeartbeatTime=stamp)


def _drop_condition(status: Obj, type_: str) -> None:
    listed = status.get("conditions")
    if listed and any(c.get("type") == type_ for c in listed):
        status["conditions"] = [c for c in listed if c.get("type") != type_]


class DataImportCronReconciler(Reconciler):
    name = "dataimportcron"

    def __init__(self, ctx: Context, clock: Clock | None = None) -> None:
        super().__init__(ctx)
        self.clock: Clock = clock or utcnow

    def watches(self) -> list[Watch]:
        """A cron itself. What it made or manages (by CDI's label: DataVolumes, claims, snapshots,
        DataSources, poller pods) and what uses its images (a pod's claims, a DataSource, a clone
        DataVolume, a claim filled from one), as they are and as they were: what lets go of an outdated
        import lets the cron collect it. Every cron when a StorageClass or StorageProfile changes: a new
        default class moves their images, a profile says their format (dataImportCronSourceFormat)."""
        def made_or_using(gvr: groups.GVR) -> Watch:
            return Watch(gvr, lambda obj: [*cron_keys_of(obj), *cron_keys_of_user(self.ctx.cached, gvr, obj)],
                         before_too=True)

        def every_cron(_: Obj) -> list[str]:
            return [object_key(cron) for cron in self.ctx.cached_list(groups.DATAIMPORTCRONS)]

        return [Watch(groups.DATAIMPORTCRONS, lambda cron: [object_key(cron)]),
                *(made_or_using(gvr) for gvr in USER_KINDS),
                Watch(groups.VOLUMESNAPSHOTS, cron_keys_of, before_too=True),
                Watch(groups.STORAGECLASSES, every_cron), Watch(groups.STORAGEPROFILES, every_cron)]

    # -- entry -----------------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> float | None:
        namespace_or_none, name = split_key(key)
        namespace = namespace_or_none or ""
        cron = self.ctx.cached(groups.DATAIMPORTCRONS, name, namespace)
        if cron is None or DataImportCronView(cron).deleting:
            self.ctx.metrics.cron_gone(namespace, name)
            await self._cleanup(namespace, name)
            return None
        if not await self._manages_its_source(cron):
            return None
        cron = copy.deepcopy(cron)
        requeue = await self._poll(cron)
        if requeue == -1.0:
            return None  # the cron's annotations changed; its update event runs us again
        after = await self._update(cron)
        return min(x for x in (requeue, after) if x is not None) if (requeue or after) else None

    async def _manages_its_source(self, cron: Obj) -> bool:
        """One cron per DataSource (CDI's shouldReconcileCron): a DataSource labelled for another live cron
        is left alone, and this cron says why."""
        view = DataImportCronView(cron)
        namespace, name = view.namespace, view.name
        source = self.ctx.cached(groups.DATASOURCES, view.managed_data_source, namespace)
        owner = DataSourceView(source).labels.get(ann.LABEL_DATAIMPORTCRON, "") if source else ""
        if owner in ("", name) or self.ctx.cached(groups.DATAIMPORTCRONS, owner, namespace) is None:
            return True
        message = f"DataSource {view.managed_data_source} is already managed by DataImportCron {owner}"
        status: Obj = copy.deepcopy(cron.get("status") or {})
        set_condition(status, "UpToDate", "False", message, ALREADY_MANAGED)
        if status != (cron.get("status") or {}):
            self.ctx.recorder.record(cron, WARNING, ALREADY_MANAGED, message)
            await write_status(self.ctx.client, groups.DATAIMPORTCRONS, cron, status)
        return False

    # -- polling ---------------------------------------------------------------------------------------

    async def _poll(self, cron: Obj) -> float | None:
        """Run the poller pod when a run is due; returns seconds until the next run, or -1 when the cron's
        annotations were written (a new digest, a new next run time)."""
        view = DataImportCronView(cron)
        annotations, schedule = view.annotations, view.schedule
        now = self.clock()
        pod = self.ctx.cached(groups.PODS, poller_name(cron), DataImportCronView(cron).namespace)
        if pod is not None:
            return await self._poll_result(cron, pod, schedule, now)
        due, next_time = run_due(schedule, annotations, now)
        if schedule and next_time is None and not due:
            upcoming = next_run(schedule, now)
            if upcoming is None:
                # stored before admission refused such schedules: say so, and run only on refreshNow
                self.ctx.recorder.record(cron, WARNING, NO_SCHEDULED_RUN, NO_SCHEDULED_RUN_MESSAGE.format(schedule))
                return None
            await self._annotate(cron, {ann.NEXT_CRON_TIME: _stamp(upcoming)})
            return -1.0
        if not due:
            return max(1.0, (next_time - now).total_seconds()) if next_time else None
        claim = claim_source(cron)
        if claim is not None:
            # CDI's updatePvcDesiredDigest: the controller reads the version (the claim's uid) itself, as
            # no pod could: there is no URL to ask. A claim recreated under the same name is a new image.
            found = self.ctx.cached(groups.PVCS, claim[1], claim[0])
            if found is None:
                return await self._record_run(cron, schedule, now, "", f"PVC {claim[0]}/{claim[1]} not found")
            return await self._record_run(cron, schedule, now, f"uid:{ClaimView(found).uid}", "")
        await self._start_poller(cron)
        return None

    async def _start_poller(self, cron: Obj) -> None:
        namespace = DataImportCronView(cron).namespace
        template = DataImportCronView(cron).template
        request = ImportRequest.from_datavolume(template)
        pseudo = {"metadata": {"name": DataImportCronView(cron).name, "namespace": namespace,
                               "uid": DataImportCronView(cron).uid, "annotations": request.to_annotations()},
                  "spec": {}}
        config = self.ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME) or {}
        settings = WorkerSettings(
            importer_image=self.ctx.settings.importer_image, import_proxy=config_status(self.ctx).get("importProxy"),
            insecure_registries=tuple(ObjectView(config).spec.get("insecureRegistries") or ()),
            pod=pod_settings(self.ctx),
            retry_budget=POLL_RETRY_BUDGET)
        owner = owner_reference(groups.DATAIMPORTCRONS, cron)
        if request.node_pull:
            pod = node_pull_poller(pseudo, request, settings, owner)
        else:
            pod = importer_pod(pseudo, request, settings, poll=True)
            pod["metadata"]["ownerReferences"] = [owner]
            spec = pod["spec"]
            spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") != DATA_VOLUME]
            for container in spec["containers"]:
                for field in ("volumeMounts", "volumeDevices"):
                    kept = [m for m in container.get(field) or [] if m.get("name") != DATA_VOLUME]
                    if kept:
                        container[field] = kept
                    else:
                        container.pop(field, None)
        pod["metadata"]["name"] = poller_name(cron)
        pod["metadata"].setdefault("labels", {})[ann.LABEL_DATAIMPORTCRON] = DataImportCronView(cron).name
        try:
            await self.ctx.client.create(groups.PODS, pod, namespace)
        except AlreadyExists:
            pass

    async def _poll_result(self, cron: Obj, pod: Body, schedule: str, now: datetime.datetime) -> float | None:
        """Take the poller's answer (a version, or why there is none) into the cron's annotations and delete
        the pod. A poller that has not answered within the poller timeout (it cannot start: a ConfigMap or
        Secret it mounts is gone, its image cannot be pulled, no node takes it) is given up on the same
        way, or it would hold every later run of the cron while the cron still says it is up to date."""
        view = PodView(pod)
        if view.deleting:
            return POLLER_RECHECK  # its result was taken; a run due meanwhile must not wait for an event
        node_pull = any(c.get("name") == NODE_POLLER_CONTAINER for c in view.containers)
        digest, failure = "", ""
        if node_pull:
            answered, digest, failure = node_pull_answer(pod)
        elif view.phase in ("Succeeded", "Failed"):
            answered = True
            _, result = termination(pod)
            digest = str(result.get("sourceDigest") or "") if view.phase == "Succeeded" else ""
            if not digest:
                failure = str(result.get("message") or "poller pod failed")
        else:
            answered = False
        if not answered:
            age = _age(pod, now)
            timeout = self.ctx.settings.poller_timeout
            if age is None or age < timeout:
                return POLLER_RECHECK
            failure = await self._stuck(pod, timeout)
            self.ctx.recorder.record(cron, WARNING, POLLER_TIMED_OUT, failure)
        await self._record_run(cron, schedule, now, digest, failure)
        try:
            await self.ctx.client.delete(groups.PODS, view.name, view.namespace)
        except NotFound:
            pass
        return -1.0

    async def _record_run(self, cron: Body, schedule: str, now: datetime.datetime, digest: str,
                          failure: str) -> float:
        """A run's outcome in the cron's annotations (CDI's, and ours for a failure); -1: they changed."""
        changes: dict[str, str | None] = {ann.REFRESH_NOW: None, ann.LAST_CRON_TIME: _stamp(now),
                                          ann.CRON_POLL_ERROR: None}
        if schedule:
            upcoming = next_run(schedule, now)
            changes[ann.NEXT_CRON_TIME] = _stamp(upcoming) if upcoming else None
        annotations: Mapping[str, str] = DataImportCronView(cron).annotations
        if digest:
            if annotations.get(ann.SOURCE_DESIRED_DIGEST) != digest:
                changes[ann.SOURCE_DESIRED_DIGEST] = digest
                self.ctx.recorder.record(cron, NORMAL, "SourceDigestUpdated", f"Source digest updated to {digest}")
        else:
            changes[ann.CRON_POLL_ERROR] = f"Polling the source failed: {failure}"[:1000]
            self.ctx.recorder.record(cron, WARNING, POLL_FAILED, f"Polling the source failed: {failure}")
        await self._annotate(cron, changes)
        return -1.0

    async def _stuck(self, pod: Body, timeout: float) -> str:
        """Why a poller never answered, as a user can act on it: what its containers wait for and the last
        warning the node gave about it (FailedMount names the missing ConfigMap)."""
        view = PodView(pod)
        waits = [f"{s.get('name')}: {w.get('reason')}" + (f" ({w['message']})" if w.get("message") else "")
                 for s in view.container_statuses if (w := (s.get("state") or {}).get("waiting"))]
        detail = "; ".join(waits) or f"phase {view.phase or 'Pending'}"
        try:
            found = await self.ctx.client.list(groups.EVENTS, view.namespace,
                                               field_selector=f"involvedObject.name={view.name}")
            warnings = sorted((e for e in found.items if e.get("type") == WARNING),
                              key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
            if warnings:
                detail += f"; {warnings[-1].get('reason')}: {warnings[-1].get('message')}"
        except NotFound:
            pass
        return f"poller pod {view.name} did not finish within {timeout:g}s, replaced at the next run: {detail}"

    async def _annotate(self, cron: Body, changes: Mapping[str, str | None]) -> None:
        await self.ctx.client.patch(groups.DATAIMPORTCRONS, DataImportCronView(cron).name,
                                    {"metadata": {"annotations": dict(changes)}},
                                    DataImportCronView(cron).namespace)

    # -- imports ---------------------------------------------------------------------------------------

    def _storage_class(self, cron: Body) -> Body | None:
        template = DataImportCronView(cron).template_spec
        claim = template.get("storage") if template.get("storage") is not None else template.get("pvc") or {}
        name = (claim or {}).get("storageClassName")
        classes = self.ctx.cached_list(groups.STORAGECLASSES)
        if name:
            return next((c for c in classes if ObjectView(c).name == name), None)
        for key in (ann.DEFAULT_VIRT_STORAGE_CLASS, ann.DEFAULT_STORAGE_CLASS):
            found = next((c for c in classes if ObjectView(c).annotations.get(key) == "true"), None)
            if found is not None:
                return found
        return None

    def _source_format(self, storage_class: Body | None) -> tuple[str, Body]:
        if storage_class is None:
            return "pvc", {}
        profile = self.ctx.cached(groups.STORAGEPROFILES, ObjectView(storage_class).name) or {}
        return StorageProfileView(profile).import_source_format, profile

    async def _update(self, cron: Obj) -> float | None:
        namespace = DataImportCronView(cron).namespace
        status: Obj = copy.deepcopy(cron.get("status") or {})
        imports: list[Obj] = list(status.get("currentImports") or [])
        current = str(imports[0].get("DataVolumeName", "")) if imports else ""
        dv = self.ctx.cached(groups.DATAVOLUMES, current, namespace) if current else None
        pvc = self.ctx.cached(groups.PVCS, current, namespace) if current else None
        snapshot = self.ctx.cached(groups.VOLUMESNAPSHOTS, current, namespace) if current else None
        storage_class = self._storage_class(cron)
        if storage_class is not None:
            wanted = ObjectView(storage_class).name
            if pvc is not None and ClaimView(pvc).phase == "Pending" and \
                    ClaimView(pvc).storage_class not in ("", wanted):
                await self._delete(groups.PVCS, current, namespace)  # CDI's deleteOutdatedPendingPvc
                return 1.0
            recorded = DataImportCronView(cron).annotations.get(ann.CRON_STORAGE_CLASS)
            if recorded is not None and recorded != wanted:
                return await self._storage_class_changed(cron, wanted)
            if recorded is None:
                await self._annotate(cron, {ann.CRON_STORAGE_CLASS: wanted})
        source_format, profile = self._source_format(storage_class)
        succeeded = False
        requeue: float | None = None
        failed_dv: Body | None = None

        if dv is not None and not DataVolumeView(dv).deleting:
            phase = DataVolumeView(dv).phase
            if phase == "Succeeded":
                succeeded = True
                if pvc is not None:
                    await self._touch(cron, groups.PVCS, pvc)
                    if source_format == "snapshot":
                        requeue = await self._snapshot(cron, pvc, snapshot, profile)
            elif phase == "ImportScheduled":
                set_condition(status, "Progressing", "False", "Import is scheduled", SCHEDULED)
            elif phase == "ImportInProgress":
                set_condition(status, "Progressing", "True", "Import is progressing", IN_PROGRESS)
            else:
                set_condition(status, "Progressing", "False", f"Import DataVolume phase {phase}", phase)
                if phase == "Failed":
                    failed_dv = dv
        elif pvc is not None and ClaimView(pvc).bound and \
                not ClaimView(pvc).deleting:
            succeeded = True
            await self._touch(cron, groups.PVCS, pvc)
            if source_format == "snapshot":
                requeue = await self._snapshot(cron, pvc, snapshot, profile)
        elif snapshot is not None:
            if source_format == "pvc":  # the format went back to pvc: as CDI, the snapshot goes and is imported again
                await self._delete(groups.VOLUMESNAPSHOTS, current, namespace)
                return 1.0
            succeeded = True
            await self._touch(cron, groups.VOLUMESNAPSHOTS, snapshot)
        else:
            imports = imports[1:]
            set_condition(status, "Progressing", "False", "No current import", NO_IMPORT)

        if succeeded and imports:
            last = {"namespace": namespace, "name": current}
            if status.get("lastImportedPVC") != last:
                status["lastImportedPVC"] = last
                status["lastImportTimestamp"] = conditions.now()
                self.ctx.recorder.record(cron, NORMAL, "ImportSucceeded", f"Imported {current}")
            set_condition(status, "Progressing", "False", "No current import", NO_IMPORT)

        await self._update_data_source(cron, status, source_format)
        if succeeded and imports:  # after the DataSource moved on: what it named before is free now
            await self._collect_garbage(cron, status)

        annotations: Mapping[str, str] = DataImportCronView(cron).annotations
        desired = annotations.get(ann.SOURCE_DESIRED_DIGEST, "")
        up_to_date: tuple[str, str, str]  # status, message, reason
        if desired and (not imports or desired != imports[0].get("Digest")):
            up_to_date = ("False", "Source digest updated since last import", OUTDATED)
            if failed_dv is not None:  # unlike CDI: a failed import never blocks the next version
                await self._delete_dv_pvc(DataVolumeView(failed_dv).name, namespace)
                imports = []
            claim = claim_source(cron)
            refused = await self._clone_refused(cron, *claim) if claim and (succeeded or not imports) else ""
            if refused:  # CDI's notAuthorized: said on Progressing in place of what was set above
                before = conditions.find(list((cron.get("status") or {}).get("conditions") or []), "Progressing")
                listed = status.setdefault("conditions", [])
                at = next((i for i, c in enumerate(listed) if c.get("type") == "Progressing"), None)
                if at is not None:
                    if before is not None:
                        listed[at] = copy.deepcopy(dict(before))
                    else:
                        del listed[at]
                set_condition(status, "Progressing", "False", refused, NOT_AUTHORIZED)
            elif succeeded or not imports:
                imports = await self._create_import(cron, desired, storage_class, profile) or imports
        elif succeeded:
            status["sourceFormat"] = source_format
            if source_format == "snapshot" and not (snapshot and SnapshotView(snapshot).ready_to_use):
                up_to_date = ("False", "Snapshot of imported data is progressing", IN_PROGRESS)
            else:
                up_to_date = ("True", "Latest import is up to date", UP_TO_DATE)
        elif imports:
            up_to_date = ("False", "Import is progressing", IN_PROGRESS)
        else:
            up_to_date = ("False", "No source digest", NO_DIGEST)
        poll_error = annotations.get(ann.CRON_POLL_ERROR, "")
        if poll_error and up_to_date[2] in (UP_TO_DATE, NO_DIGEST):
            # the last run could not tell the source's version: the image may be outdated, and nothing
            # else would say why no import follows
            up_to_date = ("False", poll_error, POLL_FAILED)
        set_condition(status, "UpToDate", *up_to_date)
        if imports:
            status["currentImports"] = imports
        else:
            status.pop("currentImports", None)
        last_cron = annotations.get(ann.LAST_CRON_TIME)
        if last_cron:
            status["lastExecutionTimestamp"] = last_cron
        self._metric(cron, status)
        old = cron.get("status") or {}
        if status != old:
            await write_status(self.ctx.client, groups.DATAIMPORTCRONS, cron, status)
            self._condition_events(cron, old, status)
        return requeue

    async def _storage_class_changed(self, cron: Body, wanted: str) -> float:
        """CDI's handleStorageClassChange: the desired image on the old class goes (snapshot, DataVolume,
        claim); once it is gone the new class is recorded and the image is imported again onto it."""
        namespace = DataImportCronView(cron).namespace
        digest = DataImportCronView(cron).annotations.get(ann.SOURCE_DESIRED_DIGEST, "")
        name = dv_name(DataImportCronView(cron).managed_data_source, digest) if digest else None
        if name is not None:
            gvrs = (groups.VOLUMESNAPSHOTS, groups.DATAVOLUMES, groups.PVCS)
            for gvr in gvrs:
                await self._delete(gvr, name, namespace)
            for gvr in gvrs:
                try:
                    await self.ctx.client.get(gvr, name, namespace)
                    return 1.0  # waiting for the old sources to be cleaned up
                except NotFound:
                    pass
        self.ctx.recorder.record(cron, NORMAL, "StorageClassChanged", f"Importing again onto storage class {wanted}")
        await self._annotate(cron, {ann.CRON_STORAGE_CLASS: wanted})
        return 1.0

    def _metric(self, cron: Body, status: Body) -> None:
        up = conditions.find(list(status.get("conditions") or []), "UpToDate")
        up_to_date = bool(up and up.get("status") == "True")
        template = DataImportCronView(cron).template_spec
        claim = template.get("storage") if template.get("storage") is not None else template.get("pvc") or {}
        pending = not up_to_date and ann.CRON_STORAGE_CLASS not in DataImportCronView(cron).annotations \
            and not (claim or {}).get("storageClassName") and self._storage_class(cron) is None
        self.ctx.metrics.cron_outdated(DataImportCronView(cron).namespace, DataImportCronView(cron).name,
                                       not up_to_date, pending)

    def _condition_events(self, cron: Body, old: Body, new: Body) -> None:
        for type_ in ("Progressing", "UpToDate"):
            before = conditions.find(list(old.get("conditions") or []), type_) or {}
            after = conditions.find(list(new.get("conditions") or []), type_) or {}
            if after and (before.get("status"), before.get("reason")) != (after.get("status"), after.get("reason")):
                if after.get("reason") == POLL_FAILED:
                    continue  # recorded with the run that failed
                kind = WARNING if after.get("reason") in ("Failed", NOT_AUTHORIZED) else NORMAL
                self.ctx.recorder.record(cron, kind, str(after.get("reason") or type_), str(after.get("message", "")))

    def _labels(self, cron: Body, base: Mapping[str, str] | None = None) -> dict[str, str]:
        labels = dict(base or {})
        cron_labels: Mapping[str, str] = DataImportCronView(cron).labels
        labels.update({k: v for k, v in cron_labels.items() if k in PASSED_LABELS})
        labels[LABEL_COMPONENT] = "storage"
        labels[LABEL_MANAGED_BY] = "cdi-controller"
        labels[ann.LABEL_DATAIMPORTCRON] = DataImportCronView(cron).name
        if DataImportCronView(cron).retention_policy == "None":
            labels[ann.LABEL_DATAIMPORTCRON_CLEANUP] = "true"
        return labels

    async def _touch(self, cron: Body, gvr: groups.GVR, obj: Body) -> None:
        """CDI's updateSource: the cron's labels and a fresh last-use time (what garbage collection sorts by)."""
        labels = self._labels(cron, ObjectView(obj).labels)
        patch: Obj = {"metadata": {"annotations": {ann.LAST_USE_TIME: _stamp(self.clock())}}}
        if labels != ObjectView(obj).labels:
            patch["metadata"]["labels"] = labels
        elif ann.LAST_USE_TIME in ObjectView(obj).annotations:
            return  # in use and labelled; CDI stamps every reconcile, once is enough to order them
        await self.ctx.client.patch(gvr, ObjectView(obj).name, patch,
                                    ObjectView(obj).namespace)

    async def _create_import(self, cron: Body, digest: str, storage_class: Body | None,
                             profile: Body) -> list[Obj] | None:
        namespace = DataImportCronView(cron).namespace
        name = dv_name(DataImportCronView(cron).managed_data_source, digest)
        if name is None:
            return None
        entry = [{"DataVolumeName": name, "Digest": digest}]
        for gvr in (groups.VOLUMESNAPSHOTS, groups.PVCS):
            existing = self.ctx.cached(gvr, name, namespace)
            if existing is not None:  # already imported (a restart between create and status): adopt it
                await self._touch(cron, gvr, existing)
                return entry
        template: Obj = copy.deepcopy(dict(DataImportCronView(cron).template))
        meta = template.get("metadata") or {}
        spec = template.setdefault("spec", {})
        registry = (spec.get("source") or {}).get("registry")
        if registry and registry.get("url"):
            registry["url"] = pinned_registry_url(str(registry["url"]), digest)
        if (profile.get("metadata") or {}).get("annotations", {}).get(ann.USE_RWO_FOR_DATA_IMPORT_CRON) == "true" \
                and spec.get("storage") is not None and not spec["storage"].get("accessModes"):
            spec["storage"]["accessModes"] = ["ReadWriteOnce"]
        annotations = dict(meta.get("annotations") or {})
        annotations[ann.BIND_IMMEDIATE] = "true"
        annotations[ann.LAST_USE_TIME] = _stamp(self.clock())
        retain = DataImportCronView(cron).annotations.get(ann.RETAIN_AFTER_COMPLETION)
        if retain:
            annotations[ann.RETAIN_AFTER_COMPLETION] = retain
        dv = {"apiVersion": groups.CDI_API_VERSION, "kind": "DataVolume",
              "metadata": {"name": name, "namespace": namespace, "annotations": annotations,
                           "labels": self._labels(cron, meta.get("labels") or {})},
              "spec": spec}
        try:
            await self.ctx.client.create(groups.DATAVOLUMES, dv, namespace)
            self.ctx.recorder.record(cron, NORMAL, "ImportCreated", f"Created DataVolume {name} for {digest}")
        except AlreadyExists:
            pass
        return entry

    async def _clone_refused(self, cron: Body, namespace: str, name: str) -> str:
        """CDI's authorizeCloneDataVolume: the DataVolume is created by the controller, which may read every
        claim, so whether the cron may clone its source is asked for the cron's service account
        (`spec.serviceAccountName`, else `default`), as the DataVolume webhook asks it for a user:
        `datavolumes/source`, else `pods`, in the source's namespace. Returns why not ("" when it may)."""
        cron_ns = DataImportCronView(cron).namespace
        account = str(DataImportCronView(cron).spec.get("serviceAccountName") or "default")
        user = {"user": f"system:serviceaccount:{cron_ns}:{account}",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{cron_ns}", "system:authenticated"]}

        async def allowed(resource: str, subresource: str = "", group: str = "") -> bool:
            attributes = {"namespace": namespace, "verb": "create", "group": group, "resource": resource,
                          "subresource": subresource, "name": name}
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": {**user, "resourceAttributes": attributes}}
            answer = await self.ctx.client.create(groups.SUBJECTACCESSREVIEWS, review)
            return bool((answer.get("status") or {}).get("allowed"))

        if await allowed("datavolumes", "source", groups.CDI_GROUP) or await allowed("pods"):
            return ""
        return f"Not authorized to create DataVolume: {user['user']} may not clone PVC {namespace}/{name}"

    async def _snapshot(self, cron: Body, pvc: Body, snapshot: Body | None, profile: Body) -> float | None:
        """`dataImportCronSourceFormat: snapshot`: a VolumeSnapshot of the imported claim, named as it; once
        ready the DataVolume and claim go (the snapshot is the golden image)."""
        namespace, name = ClaimView(pvc).namespace, ClaimView(pvc).name
        if snapshot is None:
            body: Obj = {
                "apiVersion": f"{groups.SNAPSHOT_GROUP}/{groups.SNAPSHOT_VERSION}", "kind": "VolumeSnapshot",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": self._labels(cron, {"cdi.kubevirt.io": ""}),
                             "annotations": {ann.LAST_USE_TIME: _stamp(self.clock())}},
                "spec": {"source": {"persistentVolumeClaimName": name}}}
            claim = ClaimView(pvc)
            if claim.requested_storage:
                body["metadata"]["annotations"][ann.ADVISED_RESTORE_SIZE] = claim.requested_storage
            if claim.spec.get("volumeMode"):
                body["metadata"]["annotations"][ann.SOURCE_VOLUME_MODE] = str(claim.spec["volumeMode"])
            snapshot_class = StorageProfileView(profile).annotations.get(
                ann.SNAPSHOT_CLASS_FOR_DATA_IMPORT_CRON) or StorageProfileView(profile).snapshot_class
            if snapshot_class:
                body["spec"]["volumeSnapshotClassName"] = snapshot_class
            try:
                await self.ctx.client.create(groups.VOLUMESNAPSHOTS, body, namespace)
            except AlreadyExists:
                pass
            return 1.0
        if SnapshotView(snapshot).ready_to_use:
            await self._delete_dv_pvc(name, namespace)
            return None
        return 1.0

    async def _update_data_source(self, cron: Body, status: Body, source_format: str) -> None:
        namespace = DataImportCronView(cron).namespace
        name = DataImportCronView(cron).managed_data_source
        existing = self.ctx.cached(groups.DATASOURCES, name, namespace)
        if existing is not None and DataSourceView(existing).labels.get(ann.LABEL_DATAIMPORTCRON) != \
                DataImportCronView(cron).name:
            return  # not ours (CDI's ErrNotManagedByCron)
        last = status.get("lastImportedPVC")
        source: Obj | None = None
        if last:
            ref = {"namespace": last["namespace"], "name": last["name"]}
            source = {"snapshot": ref} if source_format == "snapshot" else {"pvc": ref}
        if existing is None:
            body: Obj = {"apiVersion": groups.CDI_API_VERSION, "kind": "DataSource",
                         "metadata": {"name": name, "namespace": namespace, "labels": self._labels(cron)},
                         "spec": {"source": source or {}}}
            try:
                await self.ctx.client.create(groups.DATASOURCES, body, namespace)
            except AlreadyExists:
                pass
            return
        labels = self._labels(cron, DataSourceView(existing).labels)
        patch: Obj = {}
        if labels != DataSourceView(existing).labels:
            patch["metadata"] = {"labels": labels}
        if source is not None and DataSourceView(existing).source != source:
            # a merge patch would keep the other kind's key: replace the whole source
            patch["spec"] = {"source": {"pvc": None, "snapshot": None, **source}}
            kind = next(iter(source))
            self.ctx.recorder.record(cron, NORMAL, "DataSourceUpdated",
                                     f"DataSource {name} points at {kind} {source[kind]['name']}")
        if patch:
            await self.ctx.client.patch(groups.DATASOURCES, name, patch, namespace)

    # -- garbage collection and cleanup ----------------------------------------------------------------

    async def _collect_garbage(self, cron: Body, status: Obj) -> None:
        """CDI's rule (keep the `importsToKeep` most recently used, by last-use time) with guarantees CDI
        lacks: the image the DataSource points at and the newest good import are never deleted, nor is an
        outdated import anything uses (a pod mounting it, any DataSource naming it, a clone reading it):
        CDI's users lost the image a running VM had mounted and the one their own DataSource named. Such
        an import is kept past the limit, the cron says so (an OutdatedImportInUse event, and its condition
        OutdatedImportsInUse naming each kept import and its users) and it is collected on a later reconcile
        once free (what lets it go wakes the cron: `cron_keys_of_user`); the condition then turns False."""
        view = DataImportCronView(cron)
        if view.garbage_collect != "Outdated":
            _drop_condition(status, IMPORTS_IN_USE)  # nothing is kept past a limit that is not applied
            return
        wanted = view.imports_to_keep
        keep = DEFAULT_IMPORTS_TO_KEEP if wanted is None or wanted < 0 else wanted
        namespace, name = DataImportCronView(cron).namespace, DataImportCronView(cron).name
        protected = {str((status.get("lastImportedPVC") or {}).get("name", ""))}
        protected.update(str(i.get("DataVolumeName")) for i in status.get("currentImports") or [])
        users: dict[tuple[str, str], list[str]] | None = None
        in_use: list[str] = []
        for gvr in (groups.PVCS, groups.VOLUMESNAPSHOTS):
            mine = [o for o in self.ctx.cached_list(gvr, namespace)
                    if ObjectView(o).labels.get(ann.LABEL_DATAIMPORTCRON) == name
                    and not ObjectView(o).deleting]
            if len(mine) <= keep:
                continue
            mine.sort(key=lambda o: ObjectView(o).annotations.get(ann.LAST_USE_TIME, ""), reverse=True)
            kept = [o for o in mine if ObjectView(o).name in protected]
            for obj in mine:
                obj_name = ObjectView(obj).name
                if obj in kept:
                    continue
                if len(kept) < keep:
                    kept.append(obj)
                    continue
                if users is None:
                    users = self._users(namespace, self._own_data_source(cron))
                held = users.get((gvr.plural, obj_name))
                if held:
                    self.ctx.recorder.record(cron, NORMAL, IMPORT_IN_USE,
                                             f"Keeping outdated import {obj_name} beyond importsToKeep ({keep}) "
                                             f"while {', '.join(sorted(held))} uses it")
                    in_use.append(f"{obj_name} (used by {', '.join(sorted(held))})")
                    continue
                self.ctx.recorder.record(cron, NORMAL, "GarbageCollected", f"Deleted outdated import {obj_name}")
                if gvr == groups.PVCS:
                    await self._delete_dv_pvc(obj_name, namespace)
                else:
                    await self._delete(gvr, obj_name, namespace)
        if in_use:
            set_condition(status, IMPORTS_IN_USE, "True", f"Keeping outdated imports beyond importsToKeep ({keep}) "
                          f"while in use: {'; '.join(in_use)}", IMPORT_IN_USE)
        elif conditions.find(list(status.get("conditions") or []), IMPORTS_IN_USE) is not None:
            set_condition(status, IMPORTS_IN_USE, "False",
                          f"No outdated import is kept beyond importsToKeep ({keep})", IMPORTS_COLLECTED)

    def _own_data_source(self, cron: Body) -> tuple[str, str] | None:
        """The cron's managed DataSource when it is the cron's: it was just pointed at the last import (which
        is never collected), whatever the cache still shows it naming."""
        view = DataImportCronView(cron)
        source = self.ctx.cached(groups.DATASOURCES, view.managed_data_source, view.namespace)
        if source is None or DataSourceView(source).labels.get(ann.LABEL_DATAIMPORTCRON) != view.name:
            return None
        return view.namespace, view.managed_data_source

    def _users(self, namespace: str, own: tuple[str, str] | None) -> dict[tuple[str, str], list[str]]:
        """(resource, name) of the claims and snapshots of `namespace` in use now -> who uses each (the cron's
        own DataSource, `own`, aside)."""
        found: dict[tuple[str, str], list[str]] = {}
        for gvr in USER_KINDS:
            for obj in self.ctx.cached_list(gvr, namespace if gvr == groups.PODS else None):
                if gvr == groups.DATASOURCES and (ObjectView(obj).namespace, ObjectView(obj).name) == own:
                    continue
                for used_gvr, used_ns, used_name in uses(gvr, obj, live=True):
                    if used_ns == namespace:
                        who = f"{gvr.kind} {ObjectView(obj).namespace}/{ObjectView(obj).name}"
                        found.setdefault((used_gvr.plural, used_name), []).append(who)
        return found

    async def _delete(self, gvr: groups.GVR, name: str, namespace: str) -> bool:
        try:
            await self.ctx.client.delete(gvr, name, namespace)
            return True
        except NotFound:
            return False

    async def _delete_dv_pvc(self, name: str, namespace: str) -> None:
        """CDI's deleteDvPvc: the DataVolume (its claim goes with it), or the claim when the DataVolume is gone."""
        if not await self._delete(groups.DATAVOLUMES, name, namespace):
            await self._delete(groups.PVCS, name, namespace)

    async def _cleanup(self, namespace: str, name: str) -> None:
        """`retentionPolicy: None`: what the cron created goes with it (CDI's cleanup label)."""
        selector = f"{ann.LABEL_DATAIMPORTCRON}={name},{ann.LABEL_DATAIMPORTCRON_CLEANUP}=true"
        for gvr in (groups.DATASOURCES, groups.DATAVOLUMES, groups.PVCS, groups.VOLUMESNAPSHOTS):
            try:
                found = await self.ctx.client.list(gvr, namespace, label_selector=selector)
            except NotFound:
                continue
            for obj in found.items:
                await self._delete(gvr, ObjectView(obj).name, namespace)


USER_KINDS = (groups.PODS, groups.DATASOURCES, groups.DATAVOLUMES, groups.PVCS)
_SNAPSHOT_KIND = "VolumeSnapshot"


def _ref(gvr: groups.GVR, ref: Any, namespace: str) -> list[tuple[groups.GVR, str, str]]:
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return []
    return [(gvr, str(ref.get("namespace") or namespace), str(ref["name"]))]


def uses(gvr: groups.GVR, obj: Body, *, live: bool) -> list[tuple[groups.GVR, str, str]]:
    """The claims and snapshots (gvr, namespace, name) that `obj` uses: a pod's mounted claims, what a
    DataSource names, the source of a DataVolume's clone or of a claim being filled from one. With `live`,
    only while that use lasts (a finished pod, a finished DataVolume, a bound claim use nothing)."""
    view = ObjectView(obj)
    namespace = view.namespace
    if gvr == groups.PODS:
        if live and PodView(obj).phase in ("Succeeded", "Failed"):
            return []
        return [(groups.PVCS, namespace, claim) for claim in PodView(obj).claim_names]
    if gvr in (groups.DATASOURCES, groups.DATAVOLUMES):
        if gvr == groups.DATAVOLUMES and live and DataVolumeView(obj).phase in ("Succeeded", "Failed"):
            return []
        source = view.spec.get("source") or {}
        return [*_ref(groups.PVCS, source.get("pvc"), namespace),
                *_ref(groups.VOLUMESNAPSHOTS, source.get("snapshot"), namespace)]
    if gvr == groups.PVCS:
        if live and ClaimView(obj).bound:
            return []
        found: list[tuple[groups.GVR, str, str]] = []
        for key in ("dataSource", "dataSourceRef"):
            ref = view.spec.get(key) or {}
            if ref.get("kind") == "PersistentVolumeClaim":
                found += _ref(groups.PVCS, ref, namespace)
            elif ref.get("kind") == _SNAPSHOT_KIND:
                found += _ref(groups.VOLUMESNAPSHOTS, ref, namespace)
        return found
    return []


def cron_keys_of_user(lookup: Callable[[groups.GVR, str, str], Body | None], gvr: groups.GVR,
                      obj: Body) -> list[str]:
    """The crons whose images `obj` uses or used (any state, so a pod that ended or went counts): when it
    lets go of an outdated import kept for it, the cron may collect that import."""
    keys = []
    for used_gvr, namespace, name in uses(gvr, obj, live=False):
        used = lookup(used_gvr, name, namespace)
        cron = ObjectView(used).labels.get(ann.LABEL_DATAIMPORTCRON) if used else None
        if cron:
            keys.append(f"{namespace}/{cron}")
    return keys


def cron_keys_of(obj: Body) -> list[str]:
    """The cron an object belongs to, by CDI's label (DataVolumes, claims, snapshots, DataSources, poller pods)."""
    cron = ObjectView(obj).labels.get(ann.LABEL_DATAIMPORTCRON)
    namespace = ObjectView(obj).namespace
    return [f"{namespace}/{cron}"] if cron and namespace else []

