"""The pure parts of the local node: image mapping, $(VAR) expansion, environment, pod IPs,
sandbox layout, pod phase and conditions, scheduling predicates, endpoints."""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import pytest

from cdi.embedded.node.environment import ConfigError, build_env, field_value
from cdi.embedded.node.expansion import expand
from cdi.embedded.node.images import ImagePullError, base_name, entrypoint
from cdi.embedded.node.logs import keep_terminated
from cdi.embedded.node.podips import PodIPs
from cdi.embedded.node.podstatus import pod_conditions, pod_phase
from cdi.embedded.node.sandbox import Mount, SandboxSpec, bwrap_argv, layout
from cdi.embedded.node.scheduler import node_matches
from cdi.embedded.node.services import endpoint_subsets


@pytest.mark.parametrize(("image", "name"), [
    ("cdi-importer", "cdi-importer"), ("quay.io/kubevirt/cdi-importer:v1.60.0", "cdi-importer"),
    ("registry:5000/x/cdi-cloner@sha256:abc", "cdi-cloner"), ("busybox", "busybox"),
])
def test_image_base_name(image: str, name: str) -> None:
    assert base_name(image) == name


def test_entrypoint_maps_component_images_and_honours_command() -> None:
    assert entrypoint("quay.io/kubevirt/cdi-importer:v1", None, ["-v=1"], "/py").argv == \
        ["/py", "-m", "cdi.importer", "-v=1"]
    assert entrypoint("cdi-uploadproxy", None, None, "/py").argv == ["/py", "-m", "cdi.cli.main", "uploadproxy"]
    assert entrypoint("busybox", ["sh", "-c"], ["echo hi"]).argv == ["sh", "-c", "echo hi"]
    with pytest.raises(ImagePullError, match="busybox"):
        entrypoint("busybox", None, ["x"])


@pytest.mark.parametrize(("text", "expected"), [
    ("$(A)-$(B)", "1-$(B)"), ("$$(A)", "$(A)"), ("$$$(A)", "$1"), ("a$", "a$"), ("$(A", "$(A"),
    ("$x$(A)", "$x1"), ("$()", "$()"), ("no vars", "no vars"),
])
def test_expand_like_the_kubelet(text: str, expected: str) -> None:
    assert expand(text, {"A": "1"}.get) == expected


def _pod() -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "default"},
            "status": {"podIP": "127.10.0.9", "podIPs": [{"ip": "127.10.0.9"}], "hostIP": "127.0.0.1"}}


def test_environment_from_everything() -> None:
    secret = {"data": {"k": base64.b64encode(b"secret-value").decode()}}
    configmap = {"data": {"c": "config-value", "bad-name!": "x"}}
    container = {"envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}], "env": [
        {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "COMBO", "value": "$(IP):$(S):$(MISSING)"},
        {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "none", "key": "k", "optional": True}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
    ], "resources": {"limits": {"memory": "512Mi"}}}
    env = build_env(_pod(), container, lambda ns, n: secret if n == "s" else None,
                    lambda ns, n: configmap if n == "cm" else None, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "CM_c": "config-value", "S": "secret-value", "IP": "127.10.0.9", "LBL": "x",
                   "COMBO": "127.10.0.9:secret-value:$(MISSING)", "MEM": "512"}


def test_environment_missing_references_are_config_errors() -> None:
    none = lambda ns, n: None  # noqa: E731
    with pytest.raises(ConfigError, match='secret "s" not found'):
        build_env(_pod(), {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
                  none, none)
    with pytest.raises(ConfigError, match="couldn't find key k in ConfigMap ns/c"):
        build_env(_pod(), {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]},
                  none, lambda ns, n: {"data": {}})
    assert field_value(_pod(), "metadata.uid") == "u-1"
    with pytest.raises(ConfigError):
        field_value(_pod(), "spec.nope")


def test_pod_ips_are_stable_reused_and_outside_the_service_range() -> None:
    ips = PodIPs()
    a, b = ips.allocate("a"), ips.allocate("b")
    assert a != b and a.startswith("127.10.") and b.startswith("127.10.")
    assert ips.allocate("a") == a
    ips.release("a")
    assert ips.get("a") is None
    again = PodIPs()
    assert again.reserve("b", b) and not again.reserve("c", b) and not again.reserve("c", "127.20.0.1")
    assert again.allocate("c") != b


def test_layout_explodes_read_only_directories_where_mount_points_are_missing(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "etc" / "ssl").mkdir(parents=True)
    (tmp_path / "etc" / "hosts").write_text("x")
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "proc").mkdir()
    args = layout(["/data", "/etc/cdi/certs", "/usr/bin"], tmp_path)
    pairs, i = [], 0
    while i < len(args):
        width = 2 if args[i] == "--dir" else 3
        pairs.append(tuple(args[i:i + width]))
        i += width
    assert ("--symlink", "usr/bin", "/bin") in pairs
    assert ("--ro-bind", str(tmp_path / "usr"), "/usr") in pairs  # exists all the way: bound whole
    assert ("--ro-bind", str(tmp_path / "etc" / "ssl"), "/etc/ssl") in pairs  # /etc exploded entry by entry
    assert ("--ro-bind", str(tmp_path / "etc" / "hosts"), "/etc/hosts") in pairs
    assert ("--dir", "/etc") in pairs
    assert "/proc" not in args


def test_bwrap_argv_binds_volumes_devices_and_environment() -> None:
    spec = SandboxSpec(["prog", "arg"], {"A": "1"}, [Mount(Path("/v/d"), "/data"),
                                                      Mount(Path("/v/b.img"), "/dev/cdi-block-volume", device=True),
                                                      Mount(Path("/v/s"), "/secret", read_only=True)],
                       working_dir="/data", hostname="pod")
    argv = bwrap_argv(spec)
    assert argv[-3:] == ["--", "prog", "arg"]
    text = " ".join(argv)
    for part in ("--unshare-pid", "--die-with-parent", "--new-session", "--bind /v/d /data",
                 "--dev-bind /v/b.img /dev/cdi-block-volume", "--ro-bind /v/s /secret", "--chdir /data",
                 "--clearenv", "--setenv A 1", "--hostname pod"):
        assert part in text
    assert text.index("--dev /dev") < text.index("/dev/cdi-block-volume")


def _status(name: str, state: dict, last: dict | None = None, ready: bool = False) -> dict:  # type: ignore[type-arg]
    return {"name": name, "state": state, "lastState": last or {}, "ready": ready}


RUNNING = {"running": {}}
OK = {"terminated": {"exitCode": 0}}
BAD = {"terminated": {"exitCode": 1}}
WAITING = {"waiting": {"reason": "ContainerCreating"}}


@pytest.mark.parametrize(("policy", "statuses", "phase"), [
    ("Never", [_status("a", WAITING)], "Pending"),
    ("Never", [_status("a", RUNNING), _status("b", OK)], "Running"),
    ("Never", [_status("a", OK), _status("b", OK)], "Succeeded"),
    ("Never", [_status("a", OK), _status("b", BAD)], "Failed"),
    ("OnFailure", [_status("a", BAD)], "Running"),
    ("OnFailure", [_status("a", {"waiting": {"reason": "CrashLoopBackOff"}}, BAD)], "Running"),
    ("OnFailure", [_status("a", OK)], "Succeeded"),
    ("Always", [_status("a", OK)], "Running"),
])
def test_pod_phase(policy: str, statuses: list, phase: str) -> None:  # type: ignore[type-arg]
    assert pod_phase(policy, [], statuses, False) == phase


def test_pod_phase_with_init_containers() -> None:
    assert pod_phase("Never", [_status("i", RUNNING)], [_status("a", WAITING)], False) == "Pending"
    assert pod_phase("Never", [_status("i", BAD)], [_status("a", WAITING)], True) == "Failed"


def test_pod_conditions() -> None:
    conditions = {c["type"]: c for c in pod_conditions("Running", None, True, [],
                                                       [_status("a", RUNNING, ready=True),
                                                        _status("b", RUNNING)])}
    assert conditions["Ready"]["status"] == "False" and "[b]" in conditions["Ready"]["message"]
    assert conditions["PodScheduled"]["status"] == "True" and conditions["Initialized"]["status"] == "True"
    done = {c["type"]: c for c in pod_conditions("Succeeded", None, True, [], [_status("a", OK)])}
    assert done["ContainersReady"]["reason"] == "PodCompleted"


def test_node_selection() -> None:
    node = {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", "kubernetes.io/os": "linux"}}}
    assert node_matches({"spec": {"nodeSelector": {"kubernetes.io/os": "linux"}}}, node)
    assert not node_matches({"spec": {"nodeSelector": {"disk": "ssd"}}}, node)
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["other"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}
    assert node_matches({"spec": {"affinity": affinity}}, node)


def test_endpoint_subsets_split_ready_and_resolve_named_ports() -> None:
    def pod(name: str, ip: str, ready: bool) -> dict:  # type: ignore[type-arg]
        return {"metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"app": "x"}},
                "spec": {"nodeName": "n", "containers": [{"ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"podIP": ip, "phase": "Running",
                           "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}

    service = {"spec": {"selector": {"app": "x"}, "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}}
    other = pod("c", "127.10.0.3", True)
    other["metadata"]["labels"] = {"app": "y"}
    subsets = endpoint_subsets(service, [pod("a", "127.10.0.1", True), pod("b", "127.10.0.2", False), other])
    assert len(subsets) == 1
    assert [a["ip"] for a in subsets[0]["addresses"]] == ["127.10.0.1"]
    assert [a["ip"] for a in subsets[0]["notReadyAddresses"]] == ["127.10.0.2"]
    assert subsets[0]["ports"] == [{"name": "web", "port": 8080, "protocol": "TCP"}]


def test_python_of_mapped_images_is_this_interpreter() -> None:
    assert entrypoint("cdi-cloner", None, None).argv[0] == sys.executable


def test_a_removed_pods_logs_are_kept_for_the_newest_pods_only(tmp_path: Path) -> None:
    kept = tmp_path / "terminated"
    for i, pod in enumerate(("ns_a_1", "ns_b_2", "ns_c_3")):
        containers = tmp_path / pod / "containers"
        for name, text in (("importer/0.log", "first start"), ("importer/1.log", "second start"),
                           ("importer/termination-log", "{}")):
            (containers / name).parent.mkdir(parents=True, exist_ok=True)
            (containers / name).write_text(text)
        keep_terminated(containers, kept, pod, keep=2)
        os.utime(kept / pod, ns=(i * 10**9, i * 10**9))  # the order of removal, whatever the clock's resolution
    assert sorted(p.name for p in kept.iterdir()) == ["ns_b_2", "ns_c_3"]
    assert sorted(p.name for p in (kept / "ns_c_3").iterdir()) == ["importer-0.log", "importer-1.log"]
    assert (kept / "ns_c_3" / "importer-1.log").read_text() == "second start"
    keep_terminated(tmp_path / "no-such-pod" / "containers", kept, "ns_d_4", keep=2)  # no logs: nothing kept
    assert sorted(p.name for p in kept.iterdir()) == ["ns_b_2", "ns_c_3"]
