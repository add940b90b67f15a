"""Per-DataVolume worker overrides, an extension (README "Extensions"): what one DataVolume asks of the
worker pods that fill it, on top of what the cluster says for every worker pod.

CDI sizes and places worker pods from cluster-wide settings only (CDIConfig's `podResourceRequirements`,
the CDI CR's `spec.workload`). An importer that needs more memory than the default 600M (OOM-killed
importers are CDI's most reported failure) or a node behind a taint can only be helped there, for every
volume at once. Two annotations on a DataVolume change that for its own pods:

- `worker.resources`, a ResourceRequirements (`requests`, `limits`), merged per resource name over
  CDIConfig's defaults: `{"limits": {"memory": "4Gi"}}` raises the memory limit and keeps the rest;
- `worker.placement`, a NodePlacement: the shape of the CDI CR's `spec.workload` (`nodeSelector`,
  `tolerations`, `affinity`), so that what an admin writes for the cluster and what a user writes for one
  volume read alike and are validated alike, as one object. It adds to the workload's placement and never
  undoes it: the workload's nodeSelector keys and affinity kinds win, tolerations join.

Priority class needs no extension: CDI has the DataVolume's `spec.priorityClassName` and the
`cdi.kubevirt.io/storage.pod.priorityclassname` annotation.

An admin caps resources with `worker.maxResources` on CDIConfig `config` (resource name -> quantity). A
DataVolume asking above the cap is refused at admission; one admitted before the cap was lowered gets its
worker pods clamped to the cap (a Warning event says so): a volume once accepted is still filled, within
what the admin allows now, rather than left waiting on an edit of an annotation nobody may be watching.
A cap that is itself malformed allows no override at all (fail closed).

Pure functions: parsing, with messages naming the annotation, for the admission webhook; merging and
clamping for the worker-pod builder, which ignores a malformed override (the webhook refuses those on
DataVolumes; a claim annotated by hand just gets the defaults)."""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api.quantity import QuantityError, parse_decimal
from cdi.api.validation import Cause

Body = Mapping[str, Any]
Resources = dict[str, dict[str, str]]  # "requests"/"limits" -> resource name -> quantity

WORKER_OVERRIDES = (ann.WORKER_RESOURCES, ann.WORKER_PLACEMENT)  # what travels DataVolume -> claims -> pods
CLAMPED_REASON = "WorkerResourcesClamped"  # ours: the Warning event of a DataVolume asking above a lowered cap
_RESOURCE_PARTS = ("requests", "limits")
_PLACEMENT = ("nodeSelector", "tolerations", "affinity")
_TOLERATION = {"key", "operator", "value", "effect", "tolerationSeconds"}
_OPERATORS = ("Exists", "Equal")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_SCHEDULING = frozenset({"requiredDuringSchedulingIgnoredDuringExecution",
                         "preferredDuringSchedulingIgnoredDuringExecution"})
_AFFINITY = dict.fromkeys(("nodeAffinity", "podAffinity", "podAntiAffinity"), _SCHEDULING)  # kind -> its two keys


class OverrideError(ValueError):
    """A malformed override; the message starts with the annotation's key."""


def _object(text: str, key: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise OverrideError(f"{key}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise OverrideError(f"{key}: must be a JSON object, not {type(value).__name__}")
    return value


def _unknown(obj: Body, known: Collection[str], key: str, where: str = "") -> None:
    extra = sorted(set(obj) - set(known))
    if extra:
        raise OverrideError(f"{key}: unknown field {where}{extra[0]!r} (known: {', '.join(sorted(known))})")


def _quantities(value: Any, key: str, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise OverrideError(f"{key}: {where} must be an object of resource name to quantity")
    out: dict[str, str] = {}
    for name, quantity in value.items():
        if not isinstance(quantity, (str, int, float)) or isinstance(quantity, bool):
            raise OverrideError(f"{key}: {where}.{name} must be a quantity, not {quantity!r}")
        try:
            amount = parse_decimal(quantity)
        except QuantityError as exc:
            raise OverrideError(f"{key}: {where}.{name}: {exc}") from exc
        if amount < 0:
            raise OverrideError(f"{key}: {where}.{name} {quantity} must not be negative")
        out[str(name)] = str(quantity)
    return out


def parse_resources(text: str) -> Resources:
    """A DataVolume's `worker.resources`: `requests` and `limits`, non-negative, no limit below its request."""
    key = ann.WORKER_RESOURCES
    obj = _object(text, key)
    _unknown(obj, _RESOURCE_PARTS, key)
    resources = {part: _quantities(obj[part], key, part) for part in _RESOURCE_PARTS if obj.get(part) is not None}
    for name, request in resources.get("requests", {}).items():
        limit = resources.get("limits", {}).get(name)
        if limit is not None and parse_decimal(limit) < parse_decimal(request):
            raise OverrideError(f"{key}: limits.{name} {limit} is below requests.{name} {request}")
    return resources


def parse_placement(text: str) -> dict[str, Any]:
    """A DataVolume's `worker.placement`: a NodePlacement (nodeSelector, tolerations, affinity)."""
    key = ann.WORKER_PLACEMENT
    obj = _object(text, key)
    _unknown(obj, _PLACEMENT, key)
    selector = obj.get("nodeSelector")
    if selector is not None and (not isinstance(selector, dict) or
                                 not all(isinstance(v, str) for v in selector.values())):
        raise OverrideError(f"{key}: nodeSelector must be an object of label to string value")
    tolerations = obj.get("tolerations")
    if tolerations is not None:
        if not isinstance(tolerations, list):
            raise OverrideError(f"{key}: tolerations must be a list")
        for i, toleration in enumerate(tolerations):
            _toleration(toleration, key, f"tolerations[{i}]")
    affinity = obj.get("affinity")
    if affinity is not None:
        if not isinstance(affinity, dict):
            raise OverrideError(f"{key}: affinity must be an object")
        _unknown(affinity, tuple(_AFFINITY), key, "affinity.")
        for kind, terms in affinity.items():
            if not isinstance(terms, dict):
                raise OverrideError(f"{key}: affinity.{kind} must be an object")
            _unknown(terms, _AFFINITY[kind], key, f"affinity.{kind}.")
    return obj


def _toleration(toleration: Any, key: str, where: str) -> None:
    if not isinstance(toleration, dict):
        raise OverrideError(f"{key}: {where} must be an object")
    _unknown(toleration, _TOLERATION, key, f"{where}.")
    operator = toleration.get("operator", "Equal")
    if operator not in _OPERATORS:
        raise OverrideError(f"{key}: {where}.operator {operator!r} is not one of {', '.join(_OPERATORS)}")
    if operator == "Exists" and toleration.get("value"):
        raise OverrideError(f"{key}: {where}.value must be empty when operator is Exists")
    effect = toleration.get("effect", "")
    if effect and effect not in _EFFECTS:
        raise OverrideError(f"{key}: {where}.effect {effect!r} is not one of {', '.join(_EFFECTS)}")
    seconds = toleration.get("tolerationSeconds")
    if seconds is not None and (not isinstance(seconds, int) or isinstance(seconds, bool)):
        raise OverrideError(f"{key}: {where}.tolerationSeconds must be an integer")


def parse_cap(text: str) -> dict[str, str]:
    """CDIConfig's `worker.maxResources`: resource name -> the most any request or limit may ask."""
    key = ann.WORKER_MAX_RESOURCES
    return _quantities(_object(text, key), key, "cap")


def describe_cap(cap: Mapping[str, str]) -> str:
    return ", ".join(f"{name} {quantity}" for name, quantity in sorted(cap.items()))


def above_cap(resources: Resources, cap: Mapping[str, str]) -> list[str]:
    """What asks more than the cap, as "limits.memory 4Gi" (empty: within it)."""
    return [f"{part}.{name} {quantity}" for part in _RESOURCE_PARTS
            for name, quantity in (resources.get(part) or {}).items()
            if name in cap and parse_decimal(quantity) > parse_decimal(cap[name])]


def clamp(resources: Resources, cap: Mapping[str, str]) -> Resources:
    """`resources` with every request and limit above the cap lowered to it."""
    return {part: {name: cap[name] if name in cap and parse_decimal(q) > parse_decimal(cap[name]) else q
                   for name, q in values.items()} for part, values in resources.items()}


def effective_resources(default: Body | None, override: Resources) -> dict[str, Any]:
    """CDIConfig's default requirements with the override's values per resource name. A request the
    override raises above a default limit raises that limit with it, and a limit it lowers below a default
    request lowers that request: a pod whose request exceeds its limit would be refused."""
    out: dict[str, Any] = copy.deepcopy(dict(default or {}))
    for part in _RESOURCE_PARTS:
        merged = {**(out.get(part) or {}), **override.get(part, {})}
        if merged:
            out[part] = merged
    requests, limits = out.get("requests") or {}, out.get("limits") or {}
    for name in set(requests) & set(limits):
        if parse_decimal(requests[name]) > parse_decimal(limits[name]):
            if name in override.get("requests", {}):
                limits[name] = requests[name]
            else:
                requests[name] = limits[name]
    return out


def merged_placement(workload: Body, override: Body) -> dict[str, Any]:
    """The workload's placement with the override added: nodeSelector keys and affinity kinds the workload
    sets are the workload's; tolerations are both's."""
    out: dict[str, Any] = {k: copy.deepcopy(workload[k]) for k in _PLACEMENT if workload.get(k)}
    if override.get("nodeSelector"):
        out["nodeSelector"] = {**override["nodeSelector"], **(out.get("nodeSelector") or {})}
    if override.get("tolerations"):
        tolerations = list(out.get("tolerations") or [])
        out["tolerations"] = tolerations + [t for t in override["tolerations"] if t not in tolerations]
    if override.get("affinity"):
        out["affinity"] = {**copy.deepcopy(override["affinity"]), **(out.get("affinity") or {})}
    return out


def worker_override_causes(dv: Body, old: Body | None, cap_text: str | None) -> list[Cause]:
    """The admission rules of both annotations, each checked on creation and whenever its value changes
    (an update that leaves it alone is not refused for a cap lowered since)."""
    have = (dv.get("metadata") or {}).get("annotations") or {}
    had = ((old or {}).get("metadata") or {}).get("annotations") or {}
    changed = [key for key in WORKER_OVERRIDES if key in have and (old is None or had.get(key) != have[key])]
    causes: list[Cause] = []
    for key in changed:
        field = f"metadata.annotations[{key}]"
        try:
            if key == ann.WORKER_PLACEMENT:
                parse_placement(str(have[key]))
                continue
            resources = parse_resources(str(have[key]))
            cap = parse_cap(cap_text) if cap_text is not None else {}
        except OverrideError as exc:
            message = str(exc) if not str(exc).startswith(ann.WORKER_MAX_RESOURCES) else \
                f"{key}: refused while CDIConfig's cap is malformed: {exc}"
            causes.append(Cause(field, message))
            continue
        above = above_cap(resources, cap)
        if above:
            causes.append(Cause(field, f"{key}: {', '.join(above)} above the cap {ann.WORKER_MAX_RESOURCES} "
                                       f"on CDIConfig: {describe_cap(cap)}"))
    return causes
