"""What ResourceQuota counts and when it refuses (`cdi.embedded.kubeapi.quotausage`), as Kubernetes'
quota evaluators and admission plugin decide it, without a server."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from cdi.embedded.kubeapi.quotausage import CLAIMS, PODS, Refused, admit, namespace_used, pod_usage, render

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


def quota(hard: dict[str, str], used: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "q"}, "spec": {"hard": hard, **spec},
            "status": {"hard": hard, "used": used if used is not None else {k: "0" for k in hard}}}


def container(name: str, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
              **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests or {}, "limits": limits or {}}, **extra}


def claim(size: str, storage_class: str = "local") -> dict[str, Any]:
    return {"metadata": {"name": "c"}, "spec": {"storageClassName": storage_class,
                                                "resources": {"requests": {"storage": size}}}}


def test_a_pod_counts_its_containers_summed_and_its_init_containers_at_their_peak() -> None:
    # containers and the sidecar: 350m; the init container runs before the sidecar starts: 500m alone
    pod = {"spec": {"containers": [container("a", {"cpu": "100m", "memory": "64Mi"}, {"cpu": "1"}),
                                   container("b", {"cpu": "200m"})],
                    "initContainers": [container("init", {"cpu": "500m", "memory": "1Gi"}),
                                       container("sidecar", {"cpu": "50m"}, restartPolicy="Always")]}}
    assert render(pod_usage(pod, NOW)) == {
        "count/pods": "1", "pods": "1", "cpu": "500m", "requests.cpu": "500m", "memory": "1Gi",
        "requests.memory": "1Gi", "limits.cpu": "1"}


def test_an_ended_pod_counts_only_as_an_object() -> None:
    pod = {"spec": {"containers": [container("a", {"cpu": "1"})]}, "status": {"phase": "Failed"}}
    assert render(pod_usage(pod, NOW)) == {"count/pods": "1"}
    stuck = {"metadata": {"deletionTimestamp": "2029-12-31T23:59:00Z", "deletionGracePeriodSeconds": 30},
             "spec": {"containers": [container("a", {"cpu": "1"})]}}
    assert render(pod_usage(stuck, NOW)) == {"count/pods": "1"}


def test_a_claim_is_charged_its_request_in_whole_bytes_also_under_its_class() -> None:
    charges = admit([quota({"requests.storage": "1Gi", "local.storageclass.storage.k8s.io/requests.storage": "1Gi",
                            "persistentvolumeclaims": "2"})], CLAIMS, claim("0.5Gi"), now=NOW)
    assert render(charges[0].used) == {"requests.storage": "512Mi", "persistentvolumeclaims": "1",
                                       "local.storageclass.storage.k8s.io/requests.storage": "512Mi"}
    assert admit([quota({"requests.storage": "1Gi"})], PODS, {"spec": {"containers": []}}, now=NOW) == []


def test_the_refusal_names_only_what_went_over() -> None:
    with pytest.raises(Refused) as refused:
        admit([quota({"requests.storage": "10Gi", "persistentvolumeclaims": "1"}, {"requests.storage": "1Gi",
                                                                                   "persistentvolumeclaims": "1"})],
              CLAIMS, claim("2Gi"), now=NOW)
    assert str(refused.value) == ("exceeded quota: q, requested: persistentvolumeclaims=1, used: "
                                  "persistentvolumeclaims=1, limited: persistentvolumeclaims=1")


def test_a_quota_whose_usage_is_not_known_yet_refuses_and_one_without_status_is_ignored() -> None:
    with pytest.raises(Refused, match=r"^status unknown for quota: q, resources: requests\.storage$"):
        admit([quota({"requests.storage": "1Gi"}, {})], CLAIMS, claim("1Mi"), now=NOW)
    fresh = {"metadata": {"name": "q"}, "spec": {"hard": {"requests.storage": "1Gi"}}, "status": {}}
    assert admit([fresh], CLAIMS, claim("5Gi"), now=NOW) == []  # the controller has not copied `hard` yet


def test_priority_class_scope_selector() -> None:
    scoped = quota({"pods": "0"}, scopeSelector={"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]})
    low = {"spec": {"priorityClassName": "low", "containers": [container("a")]}}
    high = {"spec": {"priorityClassName": "high", "containers": [container("a")]}}
    assert admit([scoped], PODS, low, now=NOW) == []
    with pytest.raises(Refused):
        admit([scoped], PODS, high, now=NOW)
    assert render(namespace_used(scoped, [(PODS, low), (PODS, high)], NOW)) == {"pods": "1"}


def test_namespace_usage_sums_what_each_name_counts_and_leaves_out_what_nothing_counts() -> None:
    counted = {"requests.storage": "1", "count/configmaps": "1", "configmaps": "1", "services.loadbalancers": "1"}
    objects = [(CLAIMS, claim("1Gi")), (CLAIMS, claim("512Mi")), ("/configmaps", {}), ("/secrets", {})]
    assert render(namespace_used({"spec": {"hard": counted}}, objects, NOW)) == {
        "requests.storage": "1536Mi", "count/configmaps": "1", "configmaps": "1"}
