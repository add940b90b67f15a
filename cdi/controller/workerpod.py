"""One builder for every worker pod (importer, upload server, and the clone and populator pods), so that
what the cluster's configuration and the user's claim say about worker pods applies to all of them alike,
as in CDI:

- placement from the CDI CR's `spec.workload` (nodeSelector, tolerations, affinity);
- container resources from CDIConfig's `defaultPodResourceRequirements`, on every container;
- `imagePullSecrets` from CDIConfig's status, the controller's image pull policy;
- the restricted security context CDI sets (`SetRestrictedSecurityContext`): uid 107 (qemu), non-root,
  all capabilities dropped, no privilege escalation, seccomp `RuntimeDefault`; fsGroup 107 when a
  container mounts a volume, so the volume is writable by that uid;
- CDI's pass-through annotations (`allowedAnnotations` in CDI's controller/common/util.go) copied from
  the claim (or DataVolume) the pod serves: Multus networks, Istio and Linkerd sidecar opt-outs (with
  CDI's defaults `false` / `disabled`, so a mesh never holds a finished worker pod open), priority
  class and service account; the latter two also become the pod's `priorityClassName` and
  `serviceAccountName`;
- a populator's pod runs on the node its claim was selected for (`SetNodeNameIfPopulator`);
- ours, an extension: the worker overrides of the DataVolume the claim was made for (`worker.resources`,
  `worker.placement`, `cdi.api.workeroverrides`), on top of the cluster's resources and placement, with
  resources clamped to CDIConfig's `worker.maxResources`; they travel DataVolume -> claim -> prime
  claim -> pod as the pass-through annotations do;
- Service environment variables off (`enableServiceLinks: false`, a namespace with many Services
  would otherwise overflow the worker's environment).

A caller builds only what is its own (containers with their env, mounts and ports, volumes, restart
policy, its labels) and passes them through `worker_pod`. A clone source or target pod, for example:

    worker_pod(name=..., namespace=..., component="cdi-clone-source", annotated=target_pvc,
               owner=owner_reference(groups.PVCS, source_pvc), containers=[cloner_container], volumes=[...],
               restart_policy="OnFailure", settings=pod_settings(ctx))

where `annotated` is the object whose pass-through annotations the pod takes (CDI uses the target
claim for host-assisted clone pods) and `owner` the controller reference that cleans it up."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups, workeroverrides
from cdi.api.views import ObjectView
from cdi.common import verbosity as verbosity_
from cdi.controller.claims import config_status
from cdi.controller.runtime import Context

Body = Mapping[str, Any]
Obj = dict[str, Any]

WORKER_UID = 107  # CDI's worker pods run as qemu's uid (common.QemuSubGid), non-root

# CDI's allowedAnnotations: the annotations a worker pod takes from the claim or DataVolume it serves,
# with the value it gets when the claim has none ("" means: none then)
PASSED_ANNOTATIONS: Mapping[str, str] = {
    ann.MULTUS_NETWORKS: "",
    ann.ISTIO_INJECT: "false",
    ann.LINKERD_INJECT: "disabled",
    ann.POD_PRIORITY_CLASS: "",
    ann.POD_SERVICE_ACCOUNT: "",
    ann.MULTUS_DEFAULT_NETWORK: "",
}
_PLACEMENT = ("nodeSelector", "tolerations", "affinity")


@dataclass(frozen=True)
class PodSettings:
    """The cluster-wide part of every worker pod: CDI CR `spec.workload`, CDIConfig status's
    `defaultPodResourceRequirements` and `imagePullSecrets`, the controller's pull policy."""

    pull_policy: str = "IfNotPresent"
    resources: Body | None = None
    image_pull_secrets: tuple[Body, ...] = ()
    node_placement: Body = field(default_factory=dict)
    verbosity: int = verbosity_.DEFAULT  # CDIConfig `logVerbosity`: `-v=N` of the programs' containers
    # CDIConfig's `worker.maxResources` (None: no cap); `resource_overrides` False when that cap is malformed
    max_resources: Mapping[str, str] | None = None
    resource_overrides: bool = True


def pod_settings(ctx: Context) -> PodSettings:
    """What the cluster's configuration says about worker pods, from the controller's caches."""
    status = config_status(ctx)
    cdi = next(iter(ctx.cached_list(groups.CDIS)), None) or {}
    config = ctx.cached(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
    cap, allowed = worker_cap(config)
    return PodSettings(
        pull_policy=ctx.settings.pull_policy,
        resources=status.get("defaultPodResourceRequirements") or None,
        image_pull_secrets=tuple(status.get("imagePullSecrets") or ()),
        node_placement=ObjectView(cdi).spec.get("workload") or {},
        verbosity=_verbosity(config),
        max_resources=cap, resource_overrides=allowed,
    )


def worker_cap(config: Body | None) -> tuple[dict[str, str] | None, bool]:
    """CDIConfig's cap on worker resources (None: none) and whether overrides are allowed at all (not
    under a malformed cap: an admin's typo must not lift the limit it meant to set)."""
    text = ObjectView(config).annotations.get(ann.WORKER_MAX_RESOURCES) if config else None
    if text is None:
        return None, True
    try:
        return workeroverrides.parse_cap(text), True
    except workeroverrides.OverrideError:
        return None, False


def worker_resources(annotated: Body, settings: PodSettings) -> Body | None:
    """The container resources of the pods serving `annotated`: CDIConfig's defaults, with the
    DataVolume's `worker.resources` over them (clamped to the cap) where it has a well-formed one."""
    text = ObjectView(annotated).annotations.get(ann.WORKER_RESOURCES)
    if text is None or not settings.resource_overrides:
        return settings.resources
    try:
        override = workeroverrides.parse_resources(text)
    except workeroverrides.OverrideError:
        return settings.resources
    if settings.max_resources is not None:
        override = workeroverrides.clamp(override, settings.max_resources)
    return workeroverrides.effective_resources(settings.resources, override) or None


def worker_placement(annotated: Body, settings: PodSettings) -> Body:
    """The CDI CR's `spec.workload` with the DataVolume's `worker.placement` added, where well-formed."""
    text = ObjectView(annotated).annotations.get(ann.WORKER_PLACEMENT)
    if text is None:
        return settings.node_placement
    try:
        override = workeroverrides.parse_placement(text)
    except workeroverrides.OverrideError:
        return settings.node_placement
    return workeroverrides.merged_placement(settings.node_placement, override)


def _verbosity(config: Body | None) -> int:
    value = ObjectView(config).spec.get("logVerbosity") if config else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else verbosity_.DEFAULT


def passed_annotations(annotated: Body) -> dict[str, str]:
    """CDI's `CopyAllowedAnnotations`: the allowed keys the object has, else their defaults."""
    have = ObjectView(annotated).annotations
    out: dict[str, str] = {}
    for key, default in PASSED_ANNOTATIONS.items():
        value = have.get(key, default)
        if value:
            out[key] = value
    return out


def _restricted(container: Obj, settings: PodSettings, resources: Body | None) -> Obj:
    container = dict(container)
    container.setdefault("imagePullPolicy", settings.pull_policy)
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    if "command" not in container and "args" not in container:
        container["args"] = [f"-v={settings.verbosity}"]  # the image's own program: CDI's verbosity flag
    if resources:
        container["resources"] = copy.deepcopy(dict(resources))
    container["securityContext"] = {
        **(container.get("securityContext") or {}),
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
        "runAsUser": WORKER_UID, "seccompProfile": {"type": "RuntimeDefault"},
    }
    return container


def worker_pod(*, name: str, namespace: str, component: str, annotated: Body, owner: Body,
               containers: Sequence[Obj], volumes: Sequence[Obj], restart_policy: str, settings: PodSettings,
               init_containers: Sequence[Obj] = (), labels: Mapping[str, str] | None = None,
               annotations: Mapping[str, str] | None = None) -> Obj:
    """A worker pod: the caller's containers and volumes with everything every worker pod shares.

    `annotated` is the claim (or DataVolume) whose pass-through annotations the pod takes; they win
    over the caller's own `annotations`, as CDI copies them last."""
    passed = passed_annotations(annotated)
    resources = worker_resources(annotated, settings)
    initial = [_restricted(c, settings, resources) for c in init_containers]
    main = [_restricted(c, settings, resources) for c in containers]
    security: Obj = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if any(c.get("volumeMounts") for c in (*initial, *main)):
        security["fsGroup"] = WORKER_UID
    spec: Obj = {"restartPolicy": restart_policy, "containers": main, "volumes": [dict(v) for v in volumes],
                 "securityContext": security, "enableServiceLinks": False}
    if initial:
        spec["initContainers"] = initial
    placement = worker_placement(annotated, settings)
    for key in _PLACEMENT:
        if placement.get(key):
            spec[key] = copy.deepcopy(placement[key])
    if passed.get(ann.POD_PRIORITY_CLASS):
        spec["priorityClassName"] = passed[ann.POD_PRIORITY_CLASS]
    if passed.get(ann.POD_SERVICE_ACCOUNT):
        spec["serviceAccountName"] = passed[ann.POD_SERVICE_ACCOUNT]
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [dict(s) for s in settings.image_pull_secrets]
    claim_annotations = ObjectView(annotated).annotations
    if ann.POPULATOR_KIND in claim_annotations and claim_annotations.get(ann.SELECTED_NODE):
        spec["nodeName"] = claim_annotations[ann.SELECTED_NODE]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_COMPONENT: component, **(labels or {})},
            "annotations": {**(annotations or {}), **passed},
            "ownerReferences": [dict(owner)],
        },
        "spec": spec,
    }
