"""cdi-operator's reconciler: one `CDI` resource in, CDI's components out.

Level-triggered: every pass computes the whole desired state from the resource and applies it with
server-side apply (field manager `cdi-operator`), so a hand-deleted or edited object comes back. A pass
runs when the resource or one of the component Deployments changes, and at least every `resync`
seconds (certificate rotation). Status as CDI's: `phase` Deploying -> Deployed (Deleting on removal),
conditions Available / Progressing / Degraded, and the versions.

Upgrades, as CDI's operator (controller-lifecycle-operator-sdk's reconciler) makes them: the operator's
version (`OPERATOR_VERSION`) is written to `status.operatorVersion` and `targetVersion` as soon as a pass
finds them different; a resource whose `observedVersion` is older enters `Upgrading` (Progressing=True,
`UpgradeStarted`) while the new components roll out, and only once every component Deployment of the new
version is ready are the objects the earlier version applied and this one does not removed and
`observedVersion` written, `Deployed` again. An operator older than the components it finds (a downgrade)
reconciles nothing. See `_check_upgrade` and `_complete_upgrade` for where each differs from CDI's.

Uninstall: the resource carries CDI's finalizer `operator.cdi.kubevirt.io`; deleting it (which
cdi-apiserver's `cdi-api-validate` webhook refuses under `BlockUninstallIfWorkloadsExist` while
DataVolumes exist) removes everything the operator and the components created, then the finalizer."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Mapping
from typing import Any, Literal

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.groups import GVR
from cdi.api.owners import owner_reference
from cdi.api.views import CDIView
from cdi.kube import (
    NORMAL,
    WARNING,
    AlreadyExists,
    ApiError,
    Conflict,
    EventRecorder,
    Forbidden,
    Informer,
    KubeClient,
    NotFound,
)
from cdi.operator import monitoring, resources, versions
from cdi.operator.certs import (
    APISERVER_SERVER,
    APISERVER_SIGNER,
    UPLOADPROXY_CA_CONFIGMAP,
    UPLOADPROXY_SERVER,
    UPLOADPROXY_SIGNER,
    UPLOADSERVER_CLIENT,
    UPLOADSERVER_CLIENT_SIGNER,
    UPLOADSERVER_SIGNER,
    Certificates,
)
from cdi.operator.customize import CustomizeError, customize
from cdi.operator.resources import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    DEPLOYMENTS,
    PDBS,
    ROLEBINDINGS,
    ROLES,
    Images,
)

log = logging.getLogger(__name__)
Obj = dict[str, Any]
FIELD_MANAGER = "cdi-operator"
KINDS: dict[str, GVR] = {gvr.kind: gvr for gvr in (
    groups.SERVICEACCOUNTS, groups.SERVICES, groups.SECRETS, groups.CONFIGMAPS, groups.APISERVICES,
    groups.VALIDATING_WEBHOOKS, groups.MUTATING_WEBHOOKS, DEPLOYMENTS, ROLES, ROLEBINDINGS, CLUSTERROLES,
    CLUSTERROLEBINDINGS, PDBS, monitoring.PROMETHEUSRULES, monitoring.SERVICEMONITORS)}
# what the components create for themselves in CDI's namespace, removed with them on uninstall
COMPONENT_CREATED = {
    groups.SECRETS: ("cdi-api-signing-key", UPLOADSERVER_SIGNER, UPLOADSERVER_CLIENT_SIGNER, UPLOADSERVER_CLIENT,
                     APISERVER_SIGNER, APISERVER_SERVER, UPLOADPROXY_SIGNER, UPLOADPROXY_SERVER),
    groups.CONFIGMAPS: ("cdi-api-public-key", f"{UPLOADSERVER_SIGNER}-bundle", f"{APISERVER_SIGNER}-bundle",
                        f"{UPLOADPROXY_SIGNER}-bundle", UPLOADPROXY_CA_CONFIGMAP),
    groups.LEASES: ("cdi-controller-leader-election-helper",),
}
# the mutating webhooks cdi-apiserver registers itself (the operator installs the validating ones)
REGISTERED_BY_APISERVER = ("cdi-api-pvc-mutate", "cdi-api-datavolume-mutate")
# CDI's ConfigMap naming the installed `CDI` resource (its operator's `cdi-config`)
OPERATOR_CONFIG = "cdi-config"
# the worker pods and Services the controller runs (CDI's operator removes them with the controller)
WORKERS_SELECTOR = "cdi.kubevirt.io in (importer, cdi-upload-server, cdi-clone-source)"
COMPONENT_DEPLOYMENTS = (resources.CONTROLLER, resources.APISERVER, resources.UPLOADPROXY)
# what this operator applied, at any version: CDI's operator also stamps createVersion on what it creates,
# which tells its objects (left by CDI, never removed here) from cdi's
APPLIED_BY_CDI = f"{ann.LABEL_UPDATE_VERSION},!{ann.LABEL_CREATE_VERSION}"
# CDI's event recorder name for its operator (`GetEventRecorderFor("operator-controller")`)
EVENT_COMPONENT = "operator-controller"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(old: list[Obj], available: bool, progressing: bool, degraded: bool, reason: str,
                message: str) -> list[Obj]:
    """CDI's three conditions; lastTransitionTime moves only when a status changes."""
    previous = {c.get("type"): c for c in old}
    now = _now()
    out = []
    for kind, value in (("Available", available), ("Progressing", progressing), ("Degraded", degraded)):
        status = "True" if value else "False"
        before = previous.get(kind) or {}
        out.append({"type": kind, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": before.get("lastTransitionTime", now)
                    if before.get("status") == status else now})
    return out


def _ready(deployment: Mapping[str, Any] | None) -> bool:
    """Rolled out: CDI's `CheckDeploymentReady` (as many pods as asked for, all ready), and also every pod of the
    current template (`kubectl rollout status`): mid-rollout an old ready pod and a new unready one add up to the
    count CDI's check wants, which would call a component ready that is not running its new version yet."""
    if not deployment:
        return False
    replicas = (deployment.get("spec") or {}).get("replicas")
    want = 1 if replicas is None else int(replicas)  # the API server's default
    status = deployment.get("status") or {}
    generation_seen = status.get("observedGeneration", 0) >= (deployment.get("metadata") or {}).get("generation", 0)
    return (generation_seen and int(status.get("replicas") or 0) == want
            and int(status.get("readyReplicas") or 0) == want and int(status.get("updatedReplicas") or 0) == want)


def _serving(deployment: Mapping[str, Any] | None) -> bool:
    """At least one ready pod, of whichever version: what keeps a component available through a rolling update."""
    return bool(deployment) and int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0) > 0


def _ours(deployment: Mapping[str, Any] | None, name: str) -> bool:
    """A component Deployment this operator made (CDI's operator's carry no `cdi.kubevirt.io/component`)."""
    labels = ((deployment or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(ann.LABEL_OPERATOR_COMPONENT) == name


class Operator:
    """`version` is the operator's (CDI's `OPERATOR_VERSION`), by default its images' tag, as CDI's release
    manifests set it."""

    def __init__(self, client: KubeClient, namespace: str, images: Images, *, resync: float = 15.0,
                 version: str | None = None) -> None:
        self.client = client
        self.namespace = namespace
        self.images = images
        self.version = version or images.tag
        self.resync = resync
        self.recorder = EventRecorder(client, EVENT_COMPONENT)
        self.certs = Certificates(client, namespace)
        self.wake = asyncio.Event()
        self.cdis = Informer(client, groups.CDIS)
        self.deployments = Informer(client, DEPLOYMENTS, namespace)
        for informer in (self.cdis, self.deployments):
            informer.add_handler(self._poke, self._poke, self._poke)
        # the Prometheus operator's CRDs arriving (or going) changes what is installed: a pass then, not at resync
        self.crds = Informer(client, groups.CRDS)
        self.crds.add_handler(self._poke_for_crd, self._poke_for_crd, self._poke_for_crd)
        self.passes = 0

    def _poke(self, *_: Any) -> None:
        self.wake.set()

    def _poke_for_crd(self, *objs: Any) -> None:
        if any(isinstance(o, Mapping) and (o.get("metadata") or {}).get("name") in monitoring.CRD_NAMES for o in objs):
            self.wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        for informer in (self.cdis, self.deployments, self.crds):
            informer.start()
        try:
            while not stop.is_set():
                self.wake.clear()
                after = self.resync
                try:
                    after = await self.reconcile()
                except Conflict:
                    after = 0.2
                except ApiError as exc:
                    log.warning("reconcile failed: %s", exc)
                    after = 2.0
                except Exception:
                    log.exception("reconcile failed")
                    after = 5.0
                self.passes += 1
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(after):
                        waits = [asyncio.create_task(self.wake.wait()), asyncio.create_task(stop.wait())]
                        try:
                            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                        finally:
                            for task in waits:
                                task.cancel()
        finally:
            for informer in (self.cdis, self.deployments, self.crds):
                await informer.stop()
            await self.recorder.close()

    # -- one pass --------------------------------------------------------------------------------------

    async def reconcile(self) -> float:
        listed = (await self.client.list(groups.CDIS)).items
        if not listed:
            return self.resync
        listed.sort(key=lambda c: (c["metadata"].get("creationTimestamp", ""), c["metadata"]["name"]))
        cr, others = listed[0], listed[1:]
        for other in others:  # CDI runs one installation per cluster
            if (other.get("status") or {}).get("phase") != "Error":
                await self._status(other, "Error", available=False, progressing=False, degraded=True,
                                   reason="ConfigError", message="only one CDI resource is reconciled")
        if (cr["metadata"]).get("deletionTimestamp"):
            await self.uninstall(cr)
            return self.resync
        if ann.OPERATOR_FINALIZER not in (cr["metadata"].get("finalizers") or []):
            cr = await self.client.patch(groups.CDIS, cr["metadata"]["name"], [
                {"op": "test", "path": "/metadata/resourceVersion", "value": cr["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/metadata/finalizers",
                 "value": [*(cr["metadata"].get("finalizers") or []), ann.OPERATOR_FINALIZER]}], patch_type="json")
        if not (cr.get("status") or {}).get("phase"):
            cr = await self._status(cr, "Deploying", available=False, progressing=True, degraded=False,
                                    reason="DeployStarted", message="Started Deployment")
            self.recorder.record(cr, NORMAL, "DeployStarted", "Started Deployment")
        current = await self._component_deployments()
        checked = await self._check_upgrade(cr, current)
        if checked is None:  # a downgrade: nothing is touched
            return self.resync
        cr = checked
        status = cr.get("status") or {}
        spec = cr.get("spec") or {}
        await self._ensure_config(spec)
        await self._ensure_operator_config(cr)
        if await self._take_over(current):
            return 1.0  # a Deployment is going (foreground): applied again once it is gone
        custom = spec.get("customizeComponents") or {}
        try:
            customize(resources.components(cr, self.namespace, self.images, {}), custom)
        except CustomizeError as exc:  # nothing applied half-customized; said on the resource
            await self._status(cr, status.get("phase") or "Deploying", available=_condition_is(cr, "Available", "True"),
                               progressing=False, degraded=True, reason="CustomizeComponentsFailed", message=str(exc))
            return self.resync
        applied: set[tuple[str, str, str]] = set()
        uploadproxy_ip = await self._apply_all(
            customize(resources.components(cr, self.namespace, self.images, {}), custom), service=resources.UPLOADPROXY,
            applied=applied)
        hashes = await self.certs.reconcile(CDIView(cr).cert_config, uploadproxy_ip)
        rolled: dict[str, Obj] = {}  # the Deployments as applied: this pass's generation, never an older copy
        for obj in customize(resources.components(cr, self.namespace, self.images, hashes), custom):
            if obj["kind"] == "Deployment":
                rolled[obj["metadata"]["name"]] = await self._apply(obj, applied)
        for obj in customize(resources.webhooks_and_apiservice(self.namespace, hashes["bundle"],
                                                               hashes["proxy_bundle"]), custom):
            await self._apply(obj, applied)
        monitored = await self.monitoring_available()
        if monitored:
            for obj in monitoring.objects(self.namespace):
                await self._apply(obj, applied)
        # read from what the apply returned, not the informer: right after an apply that changed a template, the
        # informer may still hold the Deployment before it, with the old generation observed and its pods all
        # ready, and an upgrade would look complete before a single new pod ran
        deployments = [rolled.get(name) or self.deployments.get_by_name(name, self.namespace)
                       for name in COMPONENT_DEPLOYMENTS]
        ready = all(_ready(d) for d in deployments)
        phase = status.get("phase") or "Deploying"
        if phase == "Upgrading":
            if ready:
                await self._complete_upgrade(cr, applied, monitored)
                return self.resync
            serving = all(_serving(d) for d in deployments)
            if _condition_is(cr, "Available", "False" if serving else "True"):
                await self._status(cr, "Upgrading", available=serving, progressing=True, degraded=False,
                                   reason="UpgradeStarted", message=f"Started upgrade to version {self.version}")
            return 2.0
        if ready:
            if phase != "Deployed" or not _condition_is(cr, "Available", "True") or \
                    status.get("observedVersion") != self.version:
                await self._status(cr, "Deployed", available=True, progressing=False, degraded=False,
                                   reason="DeployCompleted", message="Deployment Completed", observed=True)
                self.recorder.record(cr, NORMAL, "DeployCompleted", "Deployment Completed")
            return self.resync
        if phase == "Deployed":  # was running, a component is not ready now
            await self._status(cr, "Deployed", available=False, progressing=True, degraded=True,
                               reason="DeploymentNotReady", message="a component Deployment is not ready")
        return 2.0

    # -- upgrades --------------------------------------------------------------------------------------

    async def _component_deployments(self) -> dict[str, Obj | None]:
        found: dict[str, Obj | None] = {}
        for name in COMPONENT_DEPLOYMENTS:
            try:
                found[name] = await self.client.get(DEPLOYMENTS, name, self.namespace)
            except NotFound:
                found[name] = None
        return found

    def installed_version(self, cr: Mapping[str, Any], current: Mapping[str, Obj | None]) -> str | None:
        """The version of the components in place, if they are this operator's: the newest that applied one of
        its Deployments (their updateVersion label), else, for Deployments an operator from before that label
        made, the resource's observedVersion. None when none is this operator's (a first install, or one where
        CDI's operator ran: its versions are not on the same scale)."""
        ours = [d for name, d in current.items() if d is not None and _ours(d, name)]
        stamped = [str(d["metadata"]["labels"][ann.LABEL_UPDATE_VERSION]) for d in ours
                   if ann.LABEL_UPDATE_VERSION in d["metadata"]["labels"]]
        if stamped:
            return versions.newest(stamped)
        if ours:
            return str((cr.get("status") or {}).get("observedVersion") or "") or None
        return None

    async def _check_upgrade(self, cr: Obj, current: Mapping[str, Obj | None]) -> Obj | None:
        """CDI's `CheckUpgrade`: the resource gets this operator's version as operatorVersion and targetVersion at
        once (before anything is applied, a downgrade included); a resource not first deploying whose
        observedVersion differs enters `Upgrading`. Returns the resource, or None when this is a downgrade.

        CDI's reconciler sets Available=True, Progressing=True and Degraded=True (`UpgradeStarted`, "Started
        upgrade to version X", also a Normal event) and in the same pass Degraded=False again (it marks Degraded
        only in `Deployed`); what it leaves is written here, with the reason kept on the conditions. Available is
        whether every component still has a ready pod (CDI says True regardless; during a rolling update the old
        pods serve, so the two agree unless nothing serves).

        A downgrade is judged as CDI's `ShouldTakeUpdatePath` judges it, against the version of the components in
        place (`installed_version`) rather than observedVersion alone: after a takeover from CDI's operator the
        observedVersion is CDI's (v1.x, above any of cdi's), which is an upgrade to cdi's components, not a
        downgrade; and while an upgrade is under way the components are already the newer version's."""
        status = cr.get("status") or {}
        if status.get("operatorVersion") != self.version or status.get("targetVersion") != self.version:
            cr = await self._write_status(cr, {**status, "operatorVersion": self.version,
                                               "targetVersion": self.version})
            status = cr.get("status") or {}
        phase = status.get("phase") or "Deploying"
        deploying = phase == "Deploying"
        installed = self.installed_version(cr, current)
        if installed and not deploying:
            try:
                versions.should_take_update_path(self.version, installed, deploying)
            except versions.Downgrade as exc:
                message = f"{exc}: the components in place are version {installed}"
                if not self.recorder.recorded(cr, WARNING, "UpgradeRefused", message):
                    log.warning("%s", message)
                    self.recorder.record(cr, WARNING, "UpgradeRefused", message)
                return None
        observed = str(status.get("observedVersion") or "")
        upgrade = not deploying and observed != self.version and versions.compare(self.version, observed) != 0
        if upgrade and phase != "Upgrading":
            message = f"Started upgrade to version {self.version}"
            log.info("observed version %s is not %s: upgrading", observed or "(none)", self.version)
            serving = all(_serving(d) for d in current.values())
            cr = await self._status(cr, "Upgrading", available=serving, progressing=True, degraded=False,
                                    reason="UpgradeStarted", message=message)
            self.recorder.record(cr, NORMAL, "UpgradeStarted", message)
        return cr

    async def _complete_upgrade(self, cr: Obj, applied: set[tuple[str, str, str]], monitored: bool) -> None:
        """CDI's `completeUpgrade`, run once every component Deployment of the new version is ready: what an
        earlier version applied and this one does not goes (CDI's `CleanupUnusedResources`), then the resource is
        `Deployed` with this version as observedVersion. CDI removes what carries its createVersion label and is
        controlled by the resource, CRDs included; here, what this operator applied (`APPLIED_BY_CDI`), of the
        kinds it applies: never a CRD (`cdi manifests` installs those), never anything CDI's operator made."""
        previous = (cr.get("status") or {}).get("observedVersion") or ""
        await self._remove_unapplied(cr, applied, monitored)
        await self._status(cr, "Deployed", available=True, progressing=False, degraded=False,
                           reason="DeployCompleted", message="Deployment Completed", observed=True)
        self.recorder.record(cr, NORMAL, "DeployCompleted", "Deployment Completed")
        log.info("upgrade from version %s to %s completed", previous or "(none)", self.version)

    async def _remove_unapplied(self, cr: Mapping[str, Any] | None, keep: set[tuple[str, str, str]],
                                monitored: bool) -> None:
        """Delete (foreground, as CDI's cleanup) every object this operator applied at some version that is not in
        `keep`. Looked for in this namespace (every namespaced kind), in the other namespaces `keep` names, and
        cluster-wide."""
        kinds = [gvr for gvr in KINDS.values() if monitored or gvr not in (monitoring.PROMETHEUSRULES,
                                                                          monitoring.SERVICEMONITORS)]
        places: set[tuple[GVR, str | None]] = set()
        for gvr in kinds:
            if not gvr.namespaced:
                places.add((gvr, None))
            else:
                places.add((gvr, self.namespace))
                places.update((gvr, ns) for kind, ns, _ in keep if kind == gvr.kind and ns)
        for gvr, namespace in sorted(places, key=lambda p: (p[0].kind, p[1] or "")):
            try:
                found = (await self.client.list(gvr, namespace, label_selector=APPLIED_BY_CDI)).items
            except (NotFound, Forbidden) as exc:
                log.warning("cannot list %s in %s for what an earlier version left: %s", gvr.kind,
                            namespace or "the cluster", exc)
                continue
            for obj in found:
                meta = obj["metadata"]
                if (gvr.kind, meta.get("namespace") or "", meta["name"]) in keep:
                    continue
                log.info("removing %s %s/%s: version %s applied it, %s does not", gvr.kind, namespace or "",
                         meta["name"], (meta.get("labels") or {}).get(ann.LABEL_UPDATE_VERSION), self.version)
                await self._delete(gvr, meta["name"], namespace, propagation="Foreground")
                if cr is not None:
                    self.recorder.record(cr, NORMAL, "DeleteResourceSuccess",
                                         f"Successfully deleted resource {gvr.kind} {meta['name']}")

    async def monitoring_available(self) -> bool:
        """Are the Prometheus operator's PrometheusRule and ServiceMonitor kinds served (their CRDs exist)?"""
        for name in monitoring.CRD_NAMES:
            try:
                await self.client.get(groups.CRDS, name)
            except NotFound:
                return False
        return True

    async def _status(self, cr: Obj, phase: str, *, available: bool, progressing: bool, degraded: bool,
                      reason: str, message: str, observed: bool = False) -> Obj:
        """Phase and conditions, with this operator's version as operatorVersion and targetVersion; observedVersion
        only with `observed`: when every component of this version is ready (CDI writes it there and nowhere
        else: on the first `Deployed` and at the end of an upgrade)."""
        old = (cr.get("status") or {}).get("conditions") or []
        status = {**(cr.get("status") or {}), "phase": phase,
                  "conditions": _conditions(old, available, progressing, degraded, reason, message),
                  "operatorVersion": self.version, "targetVersion": self.version}
        if observed:
            status["observedVersion"] = self.version
        return await self._write_status(cr, status)

    async def _write_status(self, cr: Obj, status: Obj) -> Obj:
        result: Obj = await self.client.replace(groups.CDIS, {**cr, "status": status}, subresource="status")
        return result

    async def _ensure_config(self, spec: Mapping[str, Any]) -> None:
        """CDIConfig `config`: created from `spec.config`; the controller keeps its spec in step and writes
        its status."""
        try:
            await self.client.get(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
        except NotFound:
            await self.client.create(groups.CDICONFIGS, {
                "apiVersion": groups.CDI_API_VERSION, "kind": "CDIConfig",
                "metadata": {"name": groups.CDI_CONFIG_NAME, "labels": {ann.LABEL_COMPONENT: ""}},
                "spec": dict(spec.get("config") or {})})

    async def _ensure_operator_config(self, cr: Mapping[str, Any]) -> None:
        """CDI's `cdi-config` ConfigMap, controlled by the `CDI` resource: how CDI's operator knows which
        resource is the installed one (without it, CDI's operator puts a resource whose status has a phase
        in Error). Kept as CDI made it, or made as CDI makes it, so that going back to CDI works."""
        try:
            await self.client.get(groups.CONFIGMAPS, OPERATOR_CONFIG, self.namespace)
            return
        except NotFound:
            pass
        with contextlib.suppress(AlreadyExists):
            await self.client.create(groups.CONFIGMAPS, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": OPERATOR_CONFIG, "namespace": self.namespace,
                             "labels": {ann.LABEL_OPERATOR: "", **resources.MANAGED_BY},
                             "ownerReferences": [owner_reference(groups.CDIS, cr)]}}, self.namespace)

    async def _take_over(self, current: Mapping[str, Obj | None]) -> bool:
        """What another installation of CDI (KubeVirt's, whose operator was removed for this one) left under
        the names cdi installs. Its component Deployments carry CDI's probes, volumes and containers, which
        server-side apply would merge into cdi's (two readiness handlers: refused): they go, and cdi's are
        created in their place. Its webhook configurations that send cdi-api what cdi-api does not serve
        (`objecttransfer-api-validate`) would refuse those requests: they go too. Nothing else of CDI's is
        touched: its CRDs, its CDI resource, CDIConfig, StorageProfiles, and every DataVolume and claim.

        Also, as CDI's `reconcileUpdateControllerDeploymentSelector`: a Deployment of cdi's own whose selector is
        not the one this version gives it (immutable: an apply would be refused) is deleted, foreground, and made
        again on a later pass; True then. CDI does this for the controller only; here for each component, since an
        apply of any of them would be refused alike. Its worker pods are left running, as CDI leaves them."""
        going = False
        desired = {obj["metadata"]["name"]: obj for obj in resources.components(
            {"spec": {}}, self.namespace, self.images, {}) if obj["kind"] == "Deployment"}
        for name in COMPONENT_DEPLOYMENTS:
            deployment = current.get(name)
            if deployment is None:
                continue
            if not _ours(deployment, name):
                log.info("taking over Deployment %s/%s from another installation of CDI", self.namespace, name)
                await self._delete(DEPLOYMENTS, name, self.namespace)
                continue
            selector = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels")
            if selector != desired[name]["spec"]["selector"]["matchLabels"]:
                going = True
                if not (deployment.get("metadata") or {}).get("deletionTimestamp"):
                    log.info("Deployment %s/%s has another selector than this version's: made again", self.namespace,
                             name)
                    await self._delete(DEPLOYMENTS, name, self.namespace, propagation="Foreground")
        ours = {obj["metadata"]["name"] for obj in resources.webhooks_and_apiservice(self.namespace, "")}
        ours.update(REGISTERED_BY_APISERVER)
        for gvr in (groups.VALIDATING_WEBHOOKS, groups.MUTATING_WEBHOOKS):
            for configuration in (await self.client.list(gvr)).items:
                name = configuration["metadata"]["name"]
                if name not in ours and self._calls_our_apiserver(configuration):
                    log.info("removing %s %s, left by another installation of CDI", gvr.kind, name)
                    await self._delete(gvr, name, None)
        return going

    def _calls_our_apiserver(self, configuration: Mapping[str, Any]) -> bool:
        hooks = configuration.get("webhooks") or []
        return bool(hooks) and all(
            ((hook.get("clientConfig") or {}).get("service") or {}).get("namespace") == self.namespace and
            ((hook.get("clientConfig") or {}).get("service") or {}).get("name") == resources.API_SERVICE
            for hook in hooks)

    async def _apply(self, obj: Obj, applied: set[tuple[str, str, str]] | None = None) -> Obj:
        """Server-side apply, labelled with this operator's version (CDI's updateVersion label): what a later
        version finds so labelled and no longer applies is removed when it completes its upgrade."""
        gvr = KINDS[obj["kind"]]
        meta = obj["metadata"]
        namespace = meta.get("namespace")
        stamped = {**obj, "metadata": {**meta, "labels": {**(meta.get("labels") or {}),
                                                          ann.LABEL_UPDATE_VERSION: self.version}}}
        result: Obj = await self.client.patch(gvr, meta["name"], stamped, namespace, patch_type="apply",
                                              field_manager=FIELD_MANAGER, force=True)
        if applied is not None:
            applied.add((obj["kind"], namespace or "", meta["name"]))
        return result

    async def _apply_all(self, objects: list[Obj], service: str, applied: set[tuple[str, str, str]]) -> str | None:
        """Apply all but the Deployments (they wait for their certificates); return `service`'s cluster IP."""
        cluster_ip = None
        for obj in objects:
            if obj["kind"] == "Deployment":
                continue
            result = await self._apply(obj, applied)
            if obj["kind"] == "Service" and obj["metadata"]["name"] == service:
                cluster_ip = (result.get("spec") or {}).get("clusterIP")
        return cluster_ip

    # -- uninstall -------------------------------------------------------------------------------------

    async def uninstall(self, cr: Obj) -> None:
        if (cr.get("status") or {}).get("phase") != "Deleting":
            cr = await self._status(cr, "Deleting", available=False, progressing=False, degraded=False,
                                    reason="DeletionStarted", message="Deleting CDI")
        created = [*resources.webhooks_and_apiservice(self.namespace, ""),
                   *resources.components(cr, self.namespace, self.images, {})]
        monitored = await self.monitoring_available()
        if monitored:
            created += monitoring.objects(self.namespace)
        for obj in created:
            await self._delete(KINDS[obj["kind"]], obj["metadata"]["name"], obj["metadata"].get("namespace"))
        # and what an earlier version applied that this one does not (an upgrade cut short leaves some)
        await self._remove_unapplied(None, {(o["kind"], o["metadata"].get("namespace") or "", o["metadata"]["name"])
                                            for o in created}, monitored)
        for gvr in (groups.PODS, groups.SERVICES):  # the workers the controller left (it is gone now)
            for worker in (await self.client.list_all(gvr, label_selector=WORKERS_SELECTOR)).items:
                await self._delete(gvr, worker["metadata"]["name"], worker["metadata"]["namespace"])
        for gvr, names in COMPONENT_CREATED.items():
            for name in names:
                await self._delete(gvr, name, self.namespace)
        for own in REGISTERED_BY_APISERVER:
            await self._delete(groups.MUTATING_WEBHOOKS, own, None)
        await self._delete(groups.CDICONFIGS, groups.CDI_CONFIG_NAME, None)
        for profile in (await self.client.list(groups.STORAGEPROFILES)).items:
            await self._delete(groups.STORAGEPROFILES, profile["metadata"]["name"], None)
        finalizers = [f for f in cr["metadata"].get("finalizers") or [] if f != ann.OPERATOR_FINALIZER]
        await self.client.patch(groups.CDIS, cr["metadata"]["name"], [
            {"op": "test", "path": "/metadata/resourceVersion", "value": cr["metadata"]["resourceVersion"]},
            {"op": "replace", "path": "/metadata/finalizers", "value": finalizers}], patch_type="json")
        log.info("CDI %s uninstalled", cr["metadata"]["name"])

    async def _delete(self, gvr: GVR, name: str, namespace: str | None, *,
                      propagation: Literal["Background", "Foreground"] = "Background") -> None:
        try:
            await self.client.delete(gvr, name, namespace, propagation_policy=propagation)
        except NotFound:
            pass
        except Forbidden as exc:  # left behind, and said so, rather than an uninstall that never ends
            log.warning("cannot remove %s %s/%s: %s", gvr.kind, namespace or "", name, exc)


def _condition_is(cr: Mapping[str, Any], kind: str, status: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == status
               for c in (cr.get("status") or {}).get("conditions") or [])
