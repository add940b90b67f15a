"""cdi-operator's reconciler: one `CDI` resource in, CDI's components out.

Level-triggered: every pass computes the whole desired state from the resource and applies it with
server-side apply (field manager `cdi-operator`), so a hand-deleted or edited object comes back. A pass
runs when the resource or one of the component Deployments changes, and at least every `resync`
seconds (certificate rotation). Status as CDI's: `phase` Deploying -> Deployed (Deleting on removal),
conditions Available / Progressing / Degraded, and the versions.

Uninstall: the resource carries CDI's finalizer `operator.cdi.kubevirt.io`; deleting it (which
cdi-apiserver's `cdi-api-validate` webhook refuses under `BlockUninstallIfWorkloadsExist` while
DataVolumes exist) removes everything the operator and the components created, then the finalizer."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.groups import GVR
from cdi.kube import AlreadyExists, ApiError, Conflict, Forbidden, Informer, KubeClient, NotFound
from cdi.operator import monitoring, resources
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
    if not deployment:
        return False
    want = int((deployment.get("spec") or {}).get("replicas") or 0)
    status = deployment.get("status") or {}
    generation_seen = status.get("observedGeneration", 0) >= (deployment.get("metadata") or {}).get("generation", 0)
    return (generation_seen and int(status.get("readyReplicas") or 0) >= want
            and int(status.get("updatedReplicas") or 0) >= want)


class Operator:
    def __init__(self, client: KubeClient, namespace: str, images: Images, *, resync: float = 15.0) -> None:
        self.client = client
        self.namespace = namespace
        self.images = images
        self.resync = resync
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
        status = cr.get("status") or {}
        if not status.get("phase"):
            cr = await self._status(cr, "Deploying", available=False, progressing=True, degraded=False,
                                    reason="DeployStarted", message="Started Deployment")
        spec = cr.get("spec") or {}
        await self._ensure_config(spec)
        await self._ensure_operator_config(cr)
        await self._take_over()
        custom = spec.get("customizeComponents") or {}
        try:
            customize(resources.components(cr, self.namespace, self.images, {}), custom)
        except CustomizeError as exc:  # nothing applied half-customized; said on the resource
            await self._status(cr, status.get("phase") or "Deploying", available=_condition_is(cr, "Available", "True"),
                               progressing=False, degraded=True, reason="CustomizeComponentsFailed", message=str(exc))
            return self.resync
        uploadproxy_ip = await self._apply_all(
            customize(resources.components(cr, self.namespace, self.images, {}), custom), service=resources.UPLOADPROXY)
        hashes = await self.certs.reconcile(spec.get("certConfig") or {}, uploadproxy_ip)
        for obj in customize(resources.components(cr, self.namespace, self.images, hashes), custom):
            if obj["kind"] == "Deployment":
                await self._apply(obj)
        for obj in customize(resources.webhooks_and_apiservice(self.namespace, hashes["bundle"]), custom):
            await self._apply(obj)
        if await self.monitoring_available():
            for obj in monitoring.objects(self.namespace):
                await self._apply(obj)
        deployments = [self.deployments.get_by_name(name, self.namespace)
                       for name in (resources.CONTROLLER, resources.APISERVER, resources.UPLOADPROXY)]
        ready = all(_ready(d) for d in deployments)
        phase = status.get("phase") or "Deploying"
        if ready:
            # a resource another operator deployed (CDI's, taken over) says Deployed and Available already:
            # its observedVersion says whose components those are
            if phase != "Deployed" or not _condition_is(cr, "Available", "True") or \
                    status.get("observedVersion") != self.images.tag:
                await self._status(cr, "Deployed", available=True, progressing=False, degraded=False,
                                   reason="DeployCompleted", message="Deployment Completed")
            return self.resync
        if phase == "Deployed":  # was running, a component is not ready now
            await self._status(cr, "Deployed", available=False, progressing=True, degraded=True,
                               reason="DeploymentNotReady", message="a component Deployment is not ready")
        return 2.0

    async def monitoring_available(self) -> bool:
        """Are the Prometheus operator's PrometheusRule and ServiceMonitor kinds served (their CRDs exist)?"""
        for name in monitoring.CRD_NAMES:
            try:
                await self.client.get(groups.CRDS, name)
            except NotFound:
                return False
        return True

    async def _status(self, cr: Obj, phase: str, *, available: bool, progressing: bool, degraded: bool,
                      reason: str, message: str) -> Obj:
        old = (cr.get("status") or {}).get("conditions") or []
        status = {**(cr.get("status") or {}), "phase": phase,
                  "conditions": _conditions(old, available, progressing, degraded, reason, message),
                  "operatorVersion": self.images.tag, "targetVersion": self.images.tag}
        if phase == "Deployed" and available:
            status["observedVersion"] = self.images.tag
        body = {**cr, "status": status}
        result: Obj = await self.client.replace(groups.CDIS, body, subresource="status")
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
        meta = cr["metadata"]
        with contextlib.suppress(AlreadyExists):
            await self.client.create(groups.CONFIGMAPS, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": OPERATOR_CONFIG, "namespace": self.namespace,
                             "labels": {ann.LABEL_OPERATOR: "", **resources.MANAGED_BY},
                             "ownerReferences": [{"apiVersion": groups.CDI_API_VERSION, "kind": "CDI",
                                                  "name": meta["name"], "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]}}, self.namespace)

    async def _take_over(self) -> None:
        """What another installation of CDI (KubeVirt's, whose operator was removed for this one) left under
        the names cdi installs. Its component Deployments carry CDI's probes, volumes and containers, which
        server-side apply would merge into cdi's (two readiness handlers: refused): they go, and cdi's are
        created in their place. Its webhook configurations that send cdi-api what cdi-api does not serve
        (`objecttransfer-api-validate`) would refuse those requests: they go too. Nothing else of CDI's is
        touched: its CRDs, its CDI resource, CDIConfig, StorageProfiles, and every DataVolume and claim."""
        for name in (resources.CONTROLLER, resources.APISERVER, resources.UPLOADPROXY):
            try:
                current = await self.client.get(DEPLOYMENTS, name, self.namespace)
            except NotFound:
                continue
            if ((current.get("metadata") or {}).get("labels") or {}).get(ann.LABEL_OPERATOR_COMPONENT) != name:
                log.info("taking over Deployment %s/%s from another installation of CDI", self.namespace, name)
                await self._delete(DEPLOYMENTS, name, self.namespace)
        ours = {obj["metadata"]["name"] for obj in resources.webhooks_and_apiservice(self.namespace, "")}
        ours.update(REGISTERED_BY_APISERVER)
        for gvr in (groups.VALIDATING_WEBHOOKS, groups.MUTATING_WEBHOOKS):
            for configuration in (await self.client.list(gvr)).items:
                name = configuration["metadata"]["name"]
                if name not in ours and self._calls_our_apiserver(configuration):
                    log.info("removing %s %s, left by another installation of CDI", gvr.kind, name)
                    await self._delete(gvr, name, None)

    def _calls_our_apiserver(self, configuration: Mapping[str, Any]) -> bool:
        hooks = configuration.get("webhooks") or []
        return bool(hooks) and all(
            ((hook.get("clientConfig") or {}).get("service") or {}).get("namespace") == self.namespace and
            ((hook.get("clientConfig") or {}).get("service") or {}).get("name") == resources.API_SERVICE
            for hook in hooks)

    async def _apply(self, obj: Obj) -> Obj:
        gvr = KINDS[obj["kind"]]
        namespace = obj["metadata"].get("namespace")
        result: Obj = await self.client.patch(gvr, obj["metadata"]["name"], obj, namespace, patch_type="apply",
                                              field_manager=FIELD_MANAGER, force=True)
        return result

    async def _apply_all(self, objects: list[Obj], service: str) -> str | None:
        """Apply all but the Deployments (they wait for their certificates); return `service`'s cluster IP."""
        cluster_ip = None
        for obj in objects:
            if obj["kind"] == "Deployment":
                continue
            applied = await self._apply(obj)
            if obj["kind"] == "Service" and obj["metadata"]["name"] == service:
                cluster_ip = (applied.get("spec") or {}).get("clusterIP")
        return cluster_ip

    # -- uninstall -------------------------------------------------------------------------------------

    async def uninstall(self, cr: Obj) -> None:
        if (cr.get("status") or {}).get("phase") != "Deleting":
            cr = await self._status(cr, "Deleting", available=False, progressing=False, degraded=False,
                                    reason="DeletionStarted", message="Deleting CDI")
        created = [*resources.webhooks_and_apiservice(self.namespace, ""),
                   *resources.components(cr, self.namespace, self.images, {})]
        if await self.monitoring_available():
            created += monitoring.objects(self.namespace)
        for obj in created:
            await self._delete(KINDS[obj["kind"]], obj["metadata"]["name"], obj["metadata"].get("namespace"))
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

    async def _delete(self, gvr: GVR, name: str, namespace: str | None) -> None:
        try:
            await self.client.delete(gvr, name, namespace, propagation_policy="Background")
        except NotFound:
            pass
        except Forbidden as exc:  # left behind, and said so, rather than an uninstall that never ends
            log.warning("cannot remove %s %s/%s: %s", gvr.kind, namespace or "", name, exc)


def _condition_is(cr: Mapping[str, Any], kind: str, status: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == status
               for c in (cr.get("status") or {}).get("conditions") or [])
