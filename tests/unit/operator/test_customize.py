"""`spec.customizeComponents` (CDI's patches and flags) applied to what the operator renders."""

from __future__ import annotations

import json

import pytest

from cdi.api import annotations as ann
from cdi.operator import resources
from cdi.operator.customize import CustomizeError, customize
from cdi.operator.resources import Images


def rendered(custom: dict) -> dict[tuple[str, str], dict]:
    cr = {"metadata": {"name": "cdi"}, "spec": {"customizeComponents": custom}}
    objects = [*resources.components(cr, "cdi", Images(), {}), *resources.webhooks_and_apiservice("cdi", "")]
    return {(o["kind"], o["metadata"]["name"]): o for o in customize(objects, custom)}


def container(objects: dict, deployment: str) -> dict:
    pod = objects[("Deployment", deployment)]["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == deployment)


def test_no_customizations_leave_everything_as_rendered() -> None:
    assert rendered({}) == rendered({"patches": [], "flags": {}})
    assert all(ann.CUSTOMIZER_IDENTIFIER not in (o["metadata"].get("annotations") or {}) for o in rendered({}).values())


def test_strategic_merge_json_and_merge_patches_reach_their_resources_only() -> None:
    custom = {"patches": [
        {"resourceName": "cdi-uploadproxy", "resourceType": "Deployment", "type": "strategic",
         "patch": json.dumps({"spec": {"template": {"spec": {"containers": [
             {"name": "cdi-uploadproxy", "env": [{"name": "EXTRA", "value": "1"}]}]}}}})},
        {"resourceName": "cdi-apiserver", "resourceType": "deployment", "type": "json",
         "patch": json.dumps([{"op": "add", "path": "/spec/template/metadata/annotations/team", "value": "storage"},
                              {"op": "remove", "path": "/spec/template/spec/nowhere"}])},
        {"resourceName": "*", "resourceType": "Service", "type": "merge",
         "patch": json.dumps({"metadata": {"labels": {"patched": "yes"}}})},
        {"resourceName": "cdi", "resourceType": "ClusterRole", "type": "merge",  # CDI patches no RBAC
         "patch": json.dumps({"metadata": {"labels": {"patched": "yes"}}})},
    ]}
    objects = rendered(custom)
    proxy = container(objects, "cdi-uploadproxy")
    assert {"name": "EXTRA", "value": "1"} in proxy["env"]
    assert any(e["name"] == "POD_NAMESPACE" for e in proxy["env"])  # merged by name, not replaced
    assert proxy["args"] == container(rendered({}), "cdi-uploadproxy")["args"]
    assert objects[("Deployment", "cdi-apiserver")]["spec"]["template"]["metadata"]["annotations"]["team"] == "storage"
    for name in ("cdi-api", "cdi-uploadproxy", "cdi-prometheus-metrics"):
        assert objects[("Service", name)]["metadata"]["labels"]["patched"] == "yes"
        assert objects[("Service", name)]["metadata"]["annotations"][ann.CUSTOMIZER_IDENTIFIER]
    assert "patched" not in objects[("ClusterRole", "cdi")]["metadata"]["labels"]
    controller = objects[("Deployment", "cdi-deployment")]
    assert ann.CUSTOMIZER_IDENTIFIER not in (controller["metadata"].get("annotations") or {})


def test_flags_reach_the_component_command_lines_and_change_the_identifier() -> None:
    objects = rendered({"flags": {"api": {"v": "3"}, "controller": {"import-retries": "2"}}})
    assert container(objects, "cdi-apiserver")["args"][-2:] == ["--v", "3"]
    assert container(objects, "cdi-deployment")["args"][-2:] == ["--import-retries", "2"]
    assert container(objects, "cdi-uploadproxy")["args"] == container(rendered({}), "cdi-uploadproxy")["args"]
    other = rendered({"flags": {"api": {"v": "4"}}})
    assert (objects[("Deployment", "cdi-apiserver")]["metadata"]["annotations"][ann.CUSTOMIZER_IDENTIFIER]
            != other[("Deployment", "cdi-apiserver")]["metadata"]["annotations"][ann.CUSTOMIZER_IDENTIFIER])


def test_a_patch_that_is_not_json_is_an_error() -> None:
    with pytest.raises(CustomizeError):
        rendered({"patches": [{"resourceName": "cdi-api", "resourceType": "Service", "type": "merge",
                               "patch": "{not json"}]})


def test_the_components_take_cdis_verbosity_flag() -> None:
    """A `v` flag is what users pass most; every component's command line accepts it."""
    from cdi.cli.main import build_parser
    for command in ("controller", "apiserver", "uploadproxy"):
        args = build_parser(command).parse_args([command, "--v", "3"])
        assert args.klog_v == 3
