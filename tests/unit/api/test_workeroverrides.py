"""The admission rules of the worker overrides (an extension): every refusal names the annotation and says
what is wrong with it, the cap an admin set is quoted when a DataVolume asks above it, and an update that
leaves an annotation alone is not refused for a cap lowered since the DataVolume was admitted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdi.api.workeroverrides import effective_resources, merged_placement, worker_override_causes

RESOURCES = "extensions.cdi.dev/worker.resources"
PLACEMENT = "extensions.cdi.dev/worker.placement"
CAP = "extensions.cdi.dev/worker.maxResources"


def dv(**annotations: Any) -> dict[str, Any]:
    values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in annotations.items()}
    return {"metadata": {"name": "disk", "namespace": "ns", "annotations": values}, "spec": {}}


def messages(obj: dict[str, Any], cap: Any = None, old: dict[str, Any] | None = None) -> list[str]:
    cap_text = cap if cap is None or isinstance(cap, str) else json.dumps(cap)
    causes = worker_override_causes(obj, old, cap_text)
    for cause in causes:
        assert cause.field.startswith("metadata.annotations[extensions.cdi.dev/worker.")
    return [c.message for c in causes]


def test_well_formed_overrides_are_admitted() -> None:
    assert messages(dv(**{RESOURCES: {"requests": {"memory": "1Gi", "cpu": "500m"}, "limits": {"memory": "4Gi"}},
                          PLACEMENT: {"nodeSelector": {"disk": "fast"},
                                      "tolerations": [{"key": "storage", "operator": "Exists",
                                                       "effect": "NoSchedule"}],
                                      "affinity": {"nodeAffinity": {
                                          "preferredDuringSchedulingIgnoredDuringExecution": []}}}}),
                    cap={"memory": "8Gi"}) == []


@pytest.mark.parametrize(("annotations", "expected"), [
    ({RESOURCES: "{limits: 4Gi"}, f"{RESOURCES}: not valid JSON"),
    ({RESOURCES: '["4Gi"]'}, f"{RESOURCES}: must be a JSON object, not list"),
    ({RESOURCES: {"limit": {"memory": "4Gi"}}}, f"{RESOURCES}: unknown field 'limit'"),
    ({RESOURCES: {"limits": {"memory": "-1Gi"}}}, f"{RESOURCES}: limits.memory -1Gi must not be negative"),
    ({RESOURCES: {"limits": {"memory": "lots"}}}, f"{RESOURCES}: limits.memory: quantities must match"),
    ({RESOURCES: {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
     f"{RESOURCES}: limits.memory 1Gi is below requests.memory 2Gi"),
    ({PLACEMENT: {"nodeSelectors": {"a": "b"}}}, f"{PLACEMENT}: unknown field 'nodeSelectors'"),
    ({PLACEMENT: {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}},
     f"{PLACEMENT}: tolerations[0].value must be empty when operator is Exists"),
    ({PLACEMENT: {"tolerations": [{"key": "k", "effect": "NoWay"}]}}, f"{PLACEMENT}: tolerations[0].effect 'NoWay'"),
    ({PLACEMENT: {"affinity": {"nodeAffinity": {"required": {}}}}},
     f"{PLACEMENT}: unknown field affinity.nodeAffinity.'required'"),
    ({PLACEMENT: {"nodeSelector": {"disk": 1}}}, f"{PLACEMENT}: nodeSelector must be an object of label to string"),
])
def test_a_malformed_override_is_refused_naming_the_annotation(annotations: dict[str, Any], expected: str) -> None:
    found = messages(dv(**annotations))
    assert len(found) == 1 and found[0].startswith(expected), found


def test_asking_above_the_admins_cap_is_refused_with_the_cap() -> None:
    found = messages(dv(**{RESOURCES: {"requests": {"memory": "1Gi"}, "limits": {"memory": "4Gi", "cpu": "2"}}}),
                     cap={"memory": "2Gi", "cpu": "4"})
    assert found == [f"{RESOURCES}: limits.memory 4Gi above the cap {CAP} on CDIConfig: cpu 4, memory 2Gi"]


def test_a_malformed_cap_refuses_resource_overrides() -> None:
    found = messages(dv(**{RESOURCES: {"limits": {"memory": "1Gi"}}}), cap='{"memory": "-1"}')
    assert found == [f"{RESOURCES}: refused while CDIConfig's cap is malformed: {CAP}: cap.memory -1 must not "
                     "be negative"]


def test_an_update_that_keeps_the_annotation_is_not_refused_for_a_lowered_cap() -> None:
    old = dv(**{RESOURCES: {"limits": {"memory": "4Gi"}}})
    labelled = json.loads(json.dumps(old))
    labelled["metadata"]["labels"] = {"team": "a"}
    assert messages(labelled, cap={"memory": "2Gi"}, old=old) == []
    raised = dv(**{RESOURCES: {"limits": {"memory": "8Gi"}}})
    assert messages(raised, cap={"memory": "2Gi"}, old=old) == [
        f"{RESOURCES}: limits.memory 8Gi above the cap {CAP} on CDIConfig: memory 2Gi"]


def test_resources_merge_per_name_over_the_defaults_and_never_leave_a_request_above_its_limit() -> None:
    default = {"requests": {"cpu": "100m", "memory": "60M"}, "limits": {"cpu": "750m", "memory": "600M"}}
    assert effective_resources(default, {"limits": {"memory": "4Gi"}}) == {
        "requests": {"cpu": "100m", "memory": "60M"}, "limits": {"cpu": "750m", "memory": "4Gi"}}
    # a request raised above the default limit takes the limit with it; a limit lowered below the default
    # request takes the request down
    assert effective_resources(default, {"requests": {"memory": "2Gi"}, "limits": {"cpu": "50m"}}) == {
        "requests": {"cpu": "50m", "memory": "2Gi"}, "limits": {"cpu": "50m", "memory": "2Gi"}}


def test_placement_adds_to_the_workload_and_never_undoes_it() -> None:
    workload = {"nodeSelector": {"zone": "a"}, "tolerations": [{"key": "infra", "operator": "Exists"}],
                "affinity": {"nodeAffinity": {"x": 1}}}
    override = {"nodeSelector": {"zone": "b", "disk": "fast"},
                "tolerations": [{"key": "infra", "operator": "Exists"}, {"key": "gpu", "operator": "Exists"}],
                "affinity": {"nodeAffinity": {"y": 2}, "podAntiAffinity": {"z": 3}}}
    assert merged_placement(workload, override) == {
        "nodeSelector": {"zone": "a", "disk": "fast"},
        "tolerations": [{"key": "infra", "operator": "Exists"}, {"key": "gpu", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"x": 1}, "podAntiAffinity": {"z": 3}}}
