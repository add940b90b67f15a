"""The real kubectl, given only --kubeconfig, against `cdi up`: every command a user of the embedded
control plane relies on (issue #2)."""

from __future__ import annotations

import json
import signal
import textwrap
from collections.abc import Iterator

import pytest
import yaml

from tests.support.cluster import CdiUp, Kubectl, wait_for


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp]:
    """The Kubernetes-compatible control plane alone (`--no-cdi`): these tests play the controller's part
    themselves, writing DataVolume status by hand."""
    up = CdiUp(tmp_path_factory.mktemp("kubectl") / "cdi", "--no-cdi")
    up.start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def shared_kubectl(control_plane: CdiUp, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(control_plane.kubeconfig, tmp_path_factory.mktemp("kubectl-cache"))


@pytest.fixture
def ns(shared_kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    name = request.node.name.replace("_", "-")[:50].strip("-").lower()
    shared_kubectl("create", "namespace", name)
    yield name
    shared_kubectl("delete", "namespace", name, "--wait=false", check=False)


def dv_manifest(name: str, size: str = "1Gi", url: str = "http://images.example.com/disk.qcow2") -> str:
    return textwrap.dedent(f"""\
        apiVersion: cdi.kubevirt.io/v1beta1
        kind: DataVolume
        metadata:
          name: {name}
        spec:
          source:
            http:
              url: {url}
          storage:
            resources:
              requests:
                storage: {size}
        """)


def test_apply_creates_then_reapplies_a_changed_file(shared_kubectl: Kubectl, ns: str) -> None:
    k = shared_kubectl
    assert "created" in k("apply", "-n", ns, "-f", "-", input=dv_manifest("disk")).stdout
    assert "unchanged" in k("apply", "-n", ns, "-f", "-", input=dv_manifest("disk")).stdout
    assert "configured" in k("apply", "-n", ns, "-f", "-", input=dv_manifest("disk", size="2Gi")).stdout
    dv = k.get("dv", "disk", ns)
    assert dv["spec"]["storage"]["resources"]["requests"]["storage"] == "2Gi"
    assert dv["metadata"]["generation"] == 2
    assert "kubectl.kubernetes.io/last-applied-configuration" in dv["metadata"]["annotations"]


def test_get_output_formats_selectors_and_all_namespaces(shared_kubectl: Kubectl, ns: str) -> None:
    k = shared_kubectl
    k("apply", "-n", ns, "-f", "-", input=dv_manifest("one"))
    k("apply", "-n", ns, "-f", "-", input=dv_manifest("two"))
    k("label", "-n", ns, "dv", "one", "tier=gold")
    k("patch", "-n", ns, "dv", "one", "--subresource", "status", "--type", "merge",
      "-p", '{"status":{"phase":"ImportInProgress","progress":"45.67%","restartCount":1}}')
    table = k("get", "dv", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "PROGRESS", "RESTARTS", "AGE"]
    assert table[1].split()[:4] == ["one", "ImportInProgress", "45.67%", "1"]
    assert table[2].split()[0] == "two"
    assert k("get", "dv", "-n", ns, "-o", "wide").stdout.splitlines()[0].split()[:4] == \
        ["NAME", "PHASE", "PROGRESS", "RESTARTS"]
    assert yaml.safe_load(k("get", "dv", "one", "-n", ns, "-o", "yaml").stdout)["kind"] == "DataVolume"
    as_json = json.loads(k("get", "dvs", "-n", ns, "-o", "json").stdout)
    assert [i["metadata"]["name"] for i in as_json["items"]] == ["one", "two"]
    assert k("get", "dv", "-n", ns, "-l", "tier=gold", "-o", "name").stdout.split() == \
        ["datavolume.cdi.kubevirt.io/one"]
    everywhere = k("get", "dv", "-A").stdout.splitlines()
    assert everywhere[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert any(line.split()[:2] == [ns, "one"] for line in everywhere)


def test_get_watch_prints_changes(shared_kubectl: Kubectl, ns: str) -> None:
    k = shared_kubectl
    k("apply", "-n", ns, "-f", "-", input=dv_manifest("watched"))
    watcher = k.popen("get", "dv", "-n", ns, "--watch", "--request-timeout=20s")
    try:
        assert watcher.stdout is not None
        header = watcher.stdout.readline()
        assert header.split()[:2] == ["NAME", "PHASE"]
        assert watcher.stdout.readline().split()[0] == "watched"
        k("patch", "-n", ns, "dv", "watched", "--subresource", "status", "--type", "merge",
          "-p", '{"status":{"phase":"Succeeded","progress":"100.0%"}}')
        line = watcher.stdout.readline().split()
        assert line[:3] == ["watched", "Succeeded", "100.0%"]
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.wait(10)


def test_describe_shows_fields_and_events(shared_kubectl: Kubectl, ns: str) -> None:
    k = shared_kubectl
    k("apply", "-n", ns, "-f", "-", input=dv_manifest("described"))
    dv = k.get("dv", "described", ns)
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "described.1", "namespace": ns},
             "involvedObject": {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": "described",
                                "namespace": ns, "uid": dv["metadata"]["uid"]},
             "reason": "ImportScheduled", "message": "Import into described scheduled", "type": "Normal",
             "source": {"component": "datavolume-import-controller"}, "count": 1,
             "firstTimestamp": dv["metadata"]["creationTimestamp"],
             "lastTimestamp": dv["metadata"]["creationTimestamp"]}
    k.apply(event, "-n", ns)
    text = k("describe", "dv", "described", "-n", ns).stdout
    assert "Name:         described" in text
    assert "http://images.example.com/disk.qcow2" in text
    assert "ImportScheduled" in text and "Import into described scheduled" in text


def test_label_annotate_patch_and_replace(shared_kubectl: Kubectl, ns: str) -> None:
    k = shared_kubectl
    k("apply", "-n", ns, "-f", "-", input=dv_manifest("edited"))
    k("label", "-n", ns, "dv", "edited", "a=1")
    k("annotate", "-n", ns, "dv", "edited", "note=hello")
    k("patch", "-n", ns, "dv", "edited", "--type", "merge", "-p", '{"spec":{"contentType":"kubevirt"}}')
    k("patch", "-n", ns, "dv", "edited", "--type", "json",
      "-p", '[{"op":"replace","path":"/spec/source/http/url","value":"http://other/disk.img"}]')
    k("patch", "-n", ns, "dv", "edited", "--subresource", "status", "--type", "merge",
      "-p", '{"status":{"phase":"Pending"}}')
    dv = k.get("dv", "edited", ns)
    assert dv["metadata"]["labels"] == {"a": "1"}
    assert dv["metadata"]["annotations"]["note"] == "hello"
    assert dv["spec"]["contentType"] == "kubevirt"
    assert dv["spec"]["source"]["http"]["url"] == "http://other/disk.img"
    assert dv["status"]["phase"] == "Pending"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
           "spec": {"containers": [{"name": "a", "image": "cdi-importer"}, {"name": "b", "image": "cdi-importer"}]}}
    k.apply(pod)
    k("patch", "-n", ns, "pod", "p", "--type", "strategic",
      "-p", '{"spec":{"containers":[{"name":"b","image":"cdi-importer:v2"}]}}')
    images = [(c["name"], c["image"]) for c in k.get("pod", "p", ns)["spec"]["containers"]]
    assert images == [("a", "cdi-importer"), ("b", "cdi-importer:v2")]
    dv["metadata"]["labels"] = {"replaced": "yes"}
    del dv["status"]
    k("replace", "-f", "-", input=json.dumps(dv))
    assert k.get("dv", "edited", ns)["metadata"]["labels"] == {"replaced": "yes"}


def test_delete_cascades_to_owned_objects(shared_kubectl: Kubectl, ns: str) -> None:
    k = shared_kubectl
    k("apply", "-n", ns, "-f", "-", input=dv_manifest("owner"))
    owner = k.get("dv", "owner", ns)
    k.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "owned", "namespace": ns, "ownerReferences": [{
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": "owner",
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]}})
    k("delete", "dv", "owner", "-n", ns)
    wait_for(lambda: not k.exists("configmap", "owned", ns), message="owned configmap deleted")


def test_wait_for_condition_jsonpath_and_delete(shared_kubectl: Kubectl, ns: str) -> None:
    k = shared_kubectl
    k("apply", "-n", ns, "-f", "-", input=dv_manifest("waited"))
    waiter = k.popen("wait", "-n", ns, "--for=condition=Ready", "dv/waited", "--timeout=30s")
    status = {"status": {"phase": "Succeeded", "conditions": [
        {"type": "Ready", "status": "True", "reason": "Completed", "message": ""}]}}
    k("patch", "-n", ns, "dv", "waited", "--subresource", "status", "--type", "merge", "-p", json.dumps(status))
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    assert "condition met" in out
    k("wait", "-n", ns, "--for=jsonpath={.status.phase}=Succeeded", "dv/waited", "--timeout=10s")
    deleter = k.popen("wait", "-n", ns, "--for=delete", "dv/waited", "--timeout=30s")
    k("delete", "dv", "waited", "-n", ns, "--wait=false")
    deleter.communicate(timeout=30)
    assert deleter.returncode == 0


def test_invalid_objects_are_refused_with_the_field_named(shared_kubectl: Kubectl, ns: str) -> None:
    bad = dv_manifest("bad").replace("spec:\n", "spec:\n  contentType: zip\n")
    result = shared_kubectl("apply", "-n", ns, "-f", "-", input=bad, check=False)
    assert result.returncode != 0
    assert 'spec.contentType: Unsupported value: "zip"' in result.stderr


def test_unknown_fields_are_warned_about_under_validate_warn(shared_kubectl: Kubectl, ns: str) -> None:
    """The server keeps the object and says which field it dropped; kubectl prints that as a warning."""
    typo = dv_manifest("typo").replace("spec:\n", "spec:\n  workloads: 3\n")
    result = shared_kubectl("apply", "--validate=warn", "-n", ns, "-f", "-", input=typo)
    assert 'Warning: unknown field "spec.workloads"' in result.stderr
    assert "datavolume.cdi.kubevirt.io/typo created" in result.stdout


def test_api_resources_lists_cdi_kinds_with_short_names(shared_kubectl: Kubectl) -> None:
    lines = shared_kubectl("api-resources").stdout.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["datavolumes"][1] == "dv,dvs" and rows["datavolumes"][3] == "true"
    assert rows["dataimportcrons"][1] == "dic,dics"
    assert rows["storageprofiles"][2] == "false" or rows["storageprofiles"][-2] == "false"
    assert "volumesnapshots" in rows and "persistentvolumeclaims" in rows


def test_acknowledged_writes_survive_kill_9(cdi_up: CdiUp, kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", input=dv_manifest("durable"))
    kubectl("label", "dv", "durable", "after=label")
    cdi_up.stop(signal.SIGKILL)
    cdi_up.start()
    dv = kubectl.get("dv", "durable")
    assert dv["metadata"]["labels"] == {"after": "label"}


def test_apply_of_a_list_validates_on_the_client_and_applies_each_item(shared_kubectl: Kubectl, ns: str) -> None:
    items = [yaml.safe_load(dv_manifest(f"listed-{i}")) for i in range(2)]
    listing = {"apiVersion": "v1", "kind": "List", "items": items}
    out = shared_kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(listing)).stdout
    assert "listed-0 created" in out and "listed-1 created" in out
    exported = shared_kubectl("get", "dv", "-n", ns, "-o", "yaml").stdout  # a List, as exported
    out = shared_kubectl("apply", "-n", ns, "-f", "-", input=exported).stdout
    assert "listed-0 configured" in out and "listed-1 configured" in out
