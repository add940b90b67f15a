"""The worker-pod builder's rules that the end-to-end tests cannot reach on one node: CDI's defaults for
the pass-through annotations, fsGroup only for pods that mount something, every container restricted,
and a populator's pod pinned to its claim's selected node."""

from __future__ import annotations

from typing import Any

from cdi.controller.workerpod import PodSettings, worker_pod

OWNER = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "target", "uid": "u1", "controller": True}


def claim(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "target", "namespace": "ns", "uid": "u1", "annotations": annotations}}


def build(annotated: dict[str, Any], *containers: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return worker_pod(name="p", namespace="ns", component="cdi-clone-source", annotated=annotated, owner=OWNER,
                      containers=list(containers) or [{"name": "c", "image": "i"}], volumes=[],
                      restart_policy="OnFailure", settings=kwargs.pop("settings", PodSettings()), **kwargs)


def test_pass_through_annotations_take_cdis_defaults_and_win_over_the_callers() -> None:
    pod = build(claim(**{"sidecar.istio.io/inject": "true", "unrelated/key": "x"}),
                annotations={"sidecar.istio.io/inject": "false", "k8s.ovn.org/open-default-ports": "[]"})
    assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "true", "linkerd.io/inject": "disabled",
                                              "k8s.ovn.org/open-default-ports": "[]"}
    assert "serviceAccountName" not in pod["spec"] and "priorityClassName" not in pod["spec"]


def test_every_container_is_restricted_and_fs_group_only_where_something_is_mounted() -> None:
    resources = {"requests": {"cpu": "10m"}}
    pod = build(claim(), {"name": "a", "image": "i", "securityContext": {"readOnlyRootFilesystem": True}},
                init_containers=[{"name": "init", "image": "i"}], settings=PodSettings(resources=resources))
    for container in (*pod["spec"]["initContainers"], *pod["spec"]["containers"]):
        assert container["resources"] == resources
        assert container["securityContext"]["runAsUser"] == 107
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert "fsGroup" not in pod["spec"]["securityContext"]
    mounted = build(claim(), {"name": "a", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v"}]})
    assert mounted["spec"]["securityContext"]["fsGroup"] == 107


def test_a_populators_pod_runs_on_the_selected_node() -> None:
    selected = {"volume.kubernetes.io/selected-node": "node-2"}
    populated = build(claim(**selected, **{"cdi.kubevirt.io/storage.populator.kind": "VolumeImportSource"}))
    assert populated["spec"]["nodeName"] == "node-2"
    assert "nodeName" not in build(claim(**selected))["spec"]
