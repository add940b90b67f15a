"""What ResourceQuota counts, as Kubernetes' quota evaluators count it, and the admission decision over a
namespace's quotas: pure functions of objects, shared by the embedded API server's quota admission and
status controller (`quota`) and by the tests' fake client, so that all three refuse the same requests
with the same words.

- Claims (`persistentvolumeclaims`): `persistentvolumeclaims` and `count/persistentvolumeclaims` (one
  each), `requests.storage` (the request, whole bytes), and per class
  `<class>.storageclass.storage.k8s.io/requests.storage` and `.../persistentvolumeclaims`.
- Pods: `count/pods` (every pod); and, while the pod is not terminal, `pods`, `requests.cpu`/`cpu`,
  `requests.memory`/`memory`, `limits.cpu`, `limits.memory`, ephemeral storage, hugepages and extended
  `requests.<name>`, summed over containers as the scheduler sums them (init containers as a maximum).
  A quota on cpu or memory requires every container to state it (`must specify ...`).
- Any other kind: `count/<resource>[.<group>]`, and the legacy `services`, `secrets`, `configmaps`.

A quota counts only the resources its `status.hard` names (what the quota controller copied from
`spec.hard`), and with `scopes`/`scopeSelector` only the pods in scope; a request is refused when what it
adds to `status.used` goes over `status.hard` for any of them."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api.quantity import Quantity, QuantityError

Obj = Mapping[str, Any]
Usage = dict[str, Quantity]

PODS = "/pods"
CLAIMS = "/persistentvolumeclaims"
STORAGE_CLASS_SUFFIX = ".storageclass.storage.k8s.io/"
LEGACY_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
ONE = Quantity.parse(1)

_CLAIM_NAMES = frozenset({"persistentvolumeclaims", "count/persistentvolumeclaims", "requests.storage"})
_POD_NAMES = frozenset({"pods", "count/pods", "cpu", "memory", "ephemeral-storage", "requests.cpu",
                        "requests.memory", "requests.ephemeral-storage", "limits.cpu", "limits.memory",
                        "limits.ephemeral-storage"})
_POD_PREFIXES = ("hugepages-", "requests.hugepages-")
_MUST_SPECIFY = frozenset({"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"})
_LEGACY_COUNTS = {"services": "/services", "secrets": "/secrets", "configmaps": "/configmaps"}
_POD_SCOPES = frozenset({"Terminating", "NotTerminating", "BestEffort", "NotBestEffort", "PriorityClass"})


class Refused(Exception):
    """The request goes over a quota (or cannot be measured against one): kube-apiserver's words, which the
    caller prefixes with `<resource> "<name>" is forbidden: `."""


def count_name(key: str) -> str:
    """`count/<resource>[.<group>]` of a storage key (`group/plural`)."""
    group, plural = key.split("/", 1)
    return f"count/{plural}.{group}" if group else f"count/{plural}"


def quantities(values: Mapping[str, Any] | None) -> Usage:
    """A resource list (`{"cpu": "100m"}`), parsed; a value that is not a quantity is left out (the API
    server refused it when the object was written)."""
    parsed: Usage = {}
    for name, value in (values or {}).items():
        try:
            parsed[str(name)] = Quantity.parse(value)
        except QuantityError:
            continue
    return parsed


def render(usage: Mapping[str, Quantity]) -> dict[str, str]:
    return {name: str(usage[name]) for name in sorted(usage)}


def _add(left: Mapping[str, Quantity], right: Mapping[str, Quantity]) -> Usage:
    total = dict(left)
    for name, value in right.items():
        total[name] = total[name] + value if name in total else value
    return total


def _maximum(left: Mapping[str, Quantity], right: Mapping[str, Quantity]) -> Usage:
    biggest = dict(left)
    for name, value in right.items():
        if name not in biggest or value.value > biggest[name].value:
            biggest[name] = value
    return biggest


def _pretty(usage: Mapping[str, Quantity], names: Iterable[str]) -> str:
    return ",".join(f"{name}={usage.get(name, Quantity())}" for name in sorted(names))


# -- what one object uses -----------------------------------------------------------------------------------

def tracked(key: str, names: Iterable[str]) -> set[str]:
    """Which of a quota's resource names objects under `key` are measured by."""
    found = set()
    for name in names:
        if key == CLAIMS:
            hit = name in _CLAIM_NAMES or (STORAGE_CLASS_SUFFIX in name and name.endswith(
                ("/requests.storage", "/persistentvolumeclaims")))
        elif key == PODS:
            hit = name in _POD_NAMES or name.startswith(_POD_PREFIXES) or (
                name.startswith("requests.") and "/" in name)
        else:
            hit = name == count_name(key) or _LEGACY_COUNTS.get(name) == key
        if hit:
            found.add(name)
    return found


def claim_class(claim: Obj) -> str:
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(LEGACY_STORAGE_CLASS) or (claim.get("spec") or {}).get("storageClassName") or "")


def claim_usage(claim: Obj) -> Usage:
    usage: Usage = {"persistentvolumeclaims": ONE, "count/persistentvolumeclaims": ONE}
    storage_class = claim_class(claim)
    if storage_class:
        usage[f"{storage_class}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims"] = ONE
    requested = quantities(((claim.get("spec") or {}).get("resources") or {}).get("requests")).get("storage")
    if requested is not None:
        usage["requests.storage"] = requested.rounded_up()
        if storage_class:
            usage[f"{storage_class}{STORAGE_CLASS_SUFFIX}requests.storage"] = usage["requests.storage"]
    return usage


def _containers_total(spec: Obj, field: str) -> Usage:
    """A pod's requests or limits as the scheduler counts them (resourcehelper.PodRequests/PodLimits):
    the containers and sidecars summed, each other init container's own, the largest of those."""
    total: Usage = {}
    for container in spec.get("containers") or ():
        total = _add(total, quantities((container.get("resources") or {}).get(field)))
    sidecars: Usage = {}
    init_peak: Usage = {}
    for container in spec.get("initContainers") or ():
        own = quantities((container.get("resources") or {}).get(field))
        if container.get("restartPolicy") == "Always":
            total = _add(total, own)
            sidecars = _add(sidecars, own)
            own = sidecars
        else:
            own = _add(own, sidecars)
        init_peak = _maximum(init_peak, own)
    total = _maximum(total, init_peak)
    return _add(total, quantities(spec.get("overhead"))) if field == "requests" else total


def _compute_usage(requests: Mapping[str, Quantity], limits: Mapping[str, Quantity]) -> Usage:
    """podComputeUsageHelper: the quota names a pod's (or one container's) requests and limits fill."""
    usage: Usage = {"pods": ONE}
    for resource in ("cpu", "memory", "ephemeral-storage"):
        if resource in requests:
            usage[resource] = usage[f"requests.{resource}"] = requests[resource]
        if resource in limits:
            usage[f"limits.{resource}"] = limits[resource]
    for resource, value in requests.items():
        if resource.startswith("hugepages-"):
            usage[resource] = usage[f"requests.{resource}"] = value
        elif "/" in resource and not resource.startswith("kubernetes.io/"):
            usage[f"requests.{resource}"] = value
    return usage


def _pod_live(pod: Obj, now: datetime.datetime) -> bool:
    """Not terminal, and not past the end of its deletion grace period (quota.QuotaV1Pod)."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    meta = pod.get("metadata") or {}
    stamp, grace = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
    if stamp and grace is not None:
        try:
            deleted = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        except ValueError:
            return True
        return now <= deleted + datetime.timedelta(seconds=int(grace))
    return True


def pod_usage(pod: Obj, now: datetime.datetime | None = None) -> Usage:
    usage: Usage = {"count/pods": ONE}
    if not _pod_live(pod, now or datetime.datetime.now(datetime.UTC)):
        return usage
    spec = pod.get("spec") or {}
    return _add(usage, _compute_usage(_containers_total(spec, "requests"), _containers_total(spec, "limits")))


def usage_of(key: str, obj: Obj, now: datetime.datetime | None = None) -> Usage:
    """What one stored object counts for."""
    if key == PODS:
        return pod_usage(obj, now)
    if key == CLAIMS:
        return claim_usage(obj)
    usage = {count_name(key): ONE}
    usage.update({name: ONE for name, legacy in _LEGACY_COUNTS.items() if legacy == key})
    return usage


def must_specify(pod: Obj, names: Iterable[str]) -> str | None:
    """The pod evaluator's constraint: a quota on cpu or memory needs every container to request (or limit)
    it, or none of that pod is admitted (`must specify requests.cpu for: main`)."""
    required = set(names) & _MUST_SPECIFY
    if not required:
        return None
    spec = pod.get("spec") or {}
    missing: dict[str, set[str]] = {}
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {}
        stated = _compute_usage(quantities(resources.get("requests")), quantities(resources.get("limits")))
        for name in required - set(stated):
            missing.setdefault(name, set()).add(str(container.get("name", "")))
    if not missing:
        return None
    return "must specify " + "; ".join(f"{name} for: {','.join(sorted(missing[name]))}" for name in sorted(missing))


# -- which quotas a request is measured against -------------------------------------------------------------

def _selectors(quota: Obj) -> list[Obj]:
    spec = quota.get("spec") or {}
    selectors: list[Obj] = [{"scopeName": scope, "operator": "Exists"} for scope in spec.get("scopes") or ()]
    selectors += list((spec.get("scopeSelector") or {}).get("matchExpressions") or ())
    return selectors


def _best_effort(spec: Obj) -> bool:
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {}
        for field in ("requests", "limits"):
            if set(resources.get(field) or {}) & {"cpu", "memory"}:
                return False
    return True


def _pod_in_scope(selector: Obj, pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    scope, operator = selector.get("scopeName"), selector.get("operator", "Exists")
    if scope in ("Terminating", "NotTerminating"):
        deadline = spec.get("activeDeadlineSeconds")
        terminating = deadline is not None and int(deadline) >= 0
        return terminating if scope == "Terminating" else not terminating
    if scope in ("BestEffort", "NotBestEffort"):
        return _best_effort(spec) is (scope == "BestEffort")
    if scope == "PriorityClass":
        value = str(spec.get("priorityClassName") or "")
        values = set(selector.get("values") or ())
        verdicts = {"Exists": bool(value), "DoesNotExist": not value, "In": value in values,
                    "NotIn": value not in values}
        return verdicts.get(str(operator), False)
    return False  # CrossNamespacePodAffinity, VolumeAttributesClass: never here


def in_scope(quota: Obj, key: str, obj: Obj) -> bool:
    """Whether the quota's scopes (all of them) take `obj` in; a quota without scopes takes everything."""
    return all(key == PODS and selector.get("scopeName") in _POD_SCOPES and _pod_in_scope(selector, obj)
               for selector in _selectors(quota))


def matches(quota: Obj, key: str, obj: Obj) -> set[str]:
    """The resources of `quota` (by its status.hard) that `obj` is measured against: none when the quota
    names none of its kind's or its scopes leave it out (scopes select pods only)."""
    names = tracked(key, ((quota.get("status") or {}).get("hard") or {}).keys())
    return names if names and in_scope(quota, key, obj) else set()


# -- the admission decision ---------------------------------------------------------------------------------

@dataclass
class Charge:
    """What an admitted request adds to one quota: its new `status.used`."""

    quota: Obj
    used: Usage


def admit(quotas: Iterable[Obj], key: str, obj: Obj, old: Obj | None = None,
          now: datetime.datetime | None = None) -> list[Charge]:
    """The quota admission plugin's CheckRequest: the new usage of every quota the request counts against,
    or `Refused` with kube-apiserver's reason. An update is charged only what it adds (a claim that grows)."""
    relevant: list[tuple[Obj, set[str]]] = []
    for quota in quotas:
        names = matches(quota, key, obj)
        if not names:
            continue
        name = (quota.get("metadata") or {}).get("name", "")
        if key == PODS:
            constraint = must_specify(obj, names)
            if constraint:
                raise Refused(f"failed quota: {name}: {constraint}")
        if any(n not in ((quota.get("status") or {}).get("used") or {}) for n in names):
            raise Refused(f"status unknown for quota: {name}, resources: {','.join(sorted(names))}")
        relevant.append((quota, names))
    if not relevant:
        return []
    delta = usage_of(key, obj, now)
    negative = sorted(n for n, v in delta.items() if v.value < 0)
    if negative:
        raise Refused(f"quota usage is negative for resource(s): {','.join(negative)}")
    if old is not None:  # charged only what it adds
        before = usage_of(key, old, now)
        delta = {n: v - before[n] if n in before else v for n, v in delta.items()}
        delta = {n: v for n, v in delta.items() if v.value > 0}
    if not any(v.value for v in delta.values()):
        return []
    charges = []
    for quota, names in relevant:
        status = quota.get("status") or {}
        hard, used = quantities(status.get("hard")), quantities(status.get("used"))
        requested = {n: v for n, v in delta.items() if n in names}
        if not requested:
            continue
        new_used = _add(used, requested)
        exceeded = [n for n in requested if new_used[n].value > hard[n].value]
        if exceeded:
            raise Refused(f"exceeded quota: {(quota.get('metadata') or {}).get('name', '')}, "
                          f"requested: {_pretty(requested, exceeded)}, used: {_pretty(used, exceeded)}, "
                          f"limited: {_pretty(hard, exceeded)}")
        charges.append(Charge(quota, new_used))
    return charges


def namespace_used(quota: Obj, objects: Iterable[tuple[str, Obj]], now: datetime.datetime | None = None) -> Usage:
    """What the quota controller writes in `status.used`: for each name of the quota's `spec.hard` that
    some kind counts, the sum over the namespace's objects (`(storage key, object)` pairs) in the quota's
    scope, 0 when none; a name no kind counts is left out."""
    names = set(((quota.get("spec") or {}).get("hard") or {}).keys())
    now = now or datetime.datetime.now(datetime.UTC)
    used: Usage = {}
    for key, obj in objects:
        mine = tracked(key, names)
        if mine and in_scope(quota, key, obj):
            used = _add(used, {n: v for n, v in usage_of(key, obj, now).items() if n in mine})
    counted = {n for n in names if tracked(PODS, [n]) or tracked(CLAIMS, [n]) or n.startswith("count/") or
               n in _LEGACY_COUNTS}
    return {n: used.get(n, Quantity()) for n in sorted(counted)}


def relevant_keys(quota: Obj) -> set[str]:
    """The storage keys whose objects change what `quota` counts."""
    keys: set[str] = set()
    for name in ((quota.get("spec") or {}).get("hard") or {}):
        if tracked(PODS, [name]):
            keys.add(PODS)
        elif tracked(CLAIMS, [name]):
            keys.add(CLAIMS)
        elif name in _LEGACY_COUNTS:
            keys.add(_LEGACY_COUNTS[name])
        elif name.startswith("count/"):
            plural, _, group = name.removeprefix("count/").partition(".")
            keys.add(f"{group}/{plural}")
    return keys
