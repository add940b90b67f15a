"""The local node of `cdi up`, driven through the real kubectl: pods run as sandboxed processes with
their volumes, environment and IP; restart policies, probes, logs, deletion and services behave
as on a real node."""

from __future__ import annotations

import base64
import json
import uuid

from tests.e2e.workloads import (
    get,
    logs,
    new_namespace,
    pod,
    processes_mentioning,
    pvc,
    run_to_completion,
    wait_bound,
    wait_phase,
)
from tests.support.cluster import CdiUp, Kubectl, wait_for

WRITE = """
import hashlib, os, random
data = random.Random(7).randbytes(3 * 1024 * 1024 + 17)
with open("/data/payload.bin", "wb") as f:
    f.write(data)
    os.fsync(f.fileno())
print("wrote", hashlib.sha256(data).hexdigest(), os.environ["POD_IP"])
open("/dev/termination-log", "w").write('{"message": "wrote payload"}')
"""

READ = """
import hashlib
print("read", hashlib.sha256(open("/data/payload.bin", "rb").read()).hexdigest())
"""


def _status(obj: dict) -> dict:  # type: ignore[type-arg]
    return obj["status"]["containerStatuses"][0]  # type: ignore[no-any-return]


def test_node_is_ready(shared_kubectl: Kubectl) -> None:
    nodes = shared_kubectl.json("get", "nodes")["items"]
    assert len(nodes) == 1
    ready = {c["type"]: c["status"] for c in nodes[0]["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert nodes[0]["metadata"]["labels"]["kubernetes.io/hostname"] == nodes[0]["metadata"]["name"]


def test_pod_writes_a_claim_and_another_reads_the_same_bytes(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "rw")
    k.apply(pvc("shared"), "-n", ns)
    writer = pod("writer", WRITE, "shared", python=True, extra={
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]})
    out = run_to_completion(k, ns, writer)
    _, digest, ip = out.split()
    status = get(k, "pod", "writer", ns)["status"]
    assert status["podIP"] == ip and ip.startswith("127.10.")
    assert status["podIPs"] == [{"ip": ip}]
    terminated = _status(get(k, "pod", "writer", ns))["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    assert json.loads(terminated["message"]) == {"message": "wrote payload"}
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["PodScheduled"]["status"] == "True"
    assert conditions["Initialized"]["status"] == "True"
    assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "PodCompleted"

    assert run_to_completion(k, ns, pod("reader", READ, "shared", python=True)).split() == ["read", digest]
    reader_ip = get(k, "pod", "reader", ns)["status"]["podIP"]
    assert reader_ip != ip  # every pod its own address


def test_failing_container_restarts_under_on_failure(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "crash")
    k.apply(pod("crasher", "echo attempt; echo 'disk on fire' > /dev/termination-log; exit 3",
                restart="OnFailure"), "-n", ns)

    def restarted_twice() -> dict | None:  # type: ignore[type-arg]
        obj = get(k, "pod", "crasher", ns)
        statuses = (obj or {}).get("status", {}).get("containerStatuses") or []
        return statuses[0] if statuses and statuses[0]["restartCount"] >= 2 else None

    status = wait_for(restarted_twice, 60, 0.2, message="restartCount >= 2")
    last = status["lastState"]["terminated"]
    assert last["exitCode"] == 3 and last["reason"] == "Error"
    assert last["message"] == "disk on fire\n"
    obj = get(k, "pod", "crasher", ns)
    assert obj["status"]["phase"] == "Running"  # OnFailure keeps trying
    assert logs(k, ns, "crasher", "--previous").strip() == "attempt"
    assert obj["status"]["containerStatuses"][0]["restartCount"] >= status["restartCount"]


def test_never_failed_pod_and_image_without_program(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "fail")
    k.apply(pod("fails", "exit 7"), "-n", ns)
    obj = wait_phase(k, ns, "fails", "Failed")
    assert _status(obj)["state"]["terminated"]["exitCode"] == 7
    assert _status(obj)["restartCount"] == 0
    k.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "noprogram"},
             "spec": {"containers": [{"name": "main", "image": "docker.io/library/busybox:1.36"}]}}, "-n", ns)

    def waiting() -> dict | None:  # type: ignore[type-arg]
        statuses = ((get(k, "pod", "noprogram", ns) or {}).get("status") or {}).get("containerStatuses") or []
        state = statuses[0]["state"] if statuses else {}
        return state.get("waiting") if (state.get("waiting") or {}).get("reason") == "ErrImagePull" else None

    assert "busybox" in wait_for(waiting, 30, 0.1, message="ErrImagePull")["message"]


def test_environment_volumes_and_expansion(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "env")
    k.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
             "data": {"user": base64.b64encode(b"alice").decode(), "pass": base64.b64encode(b"s3cr3t").decode()}},
            "-n", ns)
    k.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "conf"},
             "data": {"endpoint": "http://example", "file.txt": "from-configmap"}}, "-n", ns)
    script = ('echo "user=$USER pass=$PASS ep=$EP uid=$UID_ name=$NAME combo=$COMBO"; pwd; '
              'cat /secret/user; echo; cat /conf/file.txt; echo; cat /info/labels; echo; cat /scratch/x; '
              'echo "$0 $1"')
    manifest = pod("envy", script, labels={"app": "envy"}, extra={
        "args": ["$(EP)", "$$(EP)"],
        "workingDir": "/scratch",
        "env": [
            {"name": "USER", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}},
            {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "pass"}}},
            {"name": "EP", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "endpoint"}}},
            {"name": "UID_", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "COMBO", "value": "$(NAME)@$(EP)"},
        ],
        "volumeMounts": [{"name": "secret", "mountPath": "/secret"}, {"name": "conf", "mountPath": "/conf"},
                         {"name": "info", "mountPath": "/info"}, {"name": "scratch", "mountPath": "/scratch"}],
    })
    manifest["spec"]["containers"][0]["command"] = ["sh", "-c", "echo scratch > /scratch/x; " + script]
    manifest["spec"]["volumes"] = [
        {"name": "secret", "secret": {"secretName": "creds"}},
        {"name": "conf", "configMap": {"name": "conf"}},
        {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        {"name": "scratch", "emptyDir": {}},
    ]
    out = run_to_completion(k, ns, manifest).splitlines()
    uid = get(k, "pod", "envy", ns)["metadata"]["uid"]
    assert out[0] == f"user=alice pass=s3cr3t ep=http://example uid={uid} name=envy combo=envy@http://example"
    assert out[1:] == ["/scratch", "alice", "from-configmap", 'app="envy"', "scratch", "http://example $(EP)"]


def test_missing_secret_is_a_config_error(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "cfg")
    k.apply(pod("needs", "echo ok", extra={"env": [
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "later", "key": "x"}}}]}), "-n", ns)

    def waiting() -> dict | None:  # type: ignore[type-arg]
        statuses = ((get(k, "pod", "needs", ns) or {}).get("status") or {}).get("containerStatuses") or []
        state = statuses[0]["state"] if statuses else {}
        return state["waiting"] if (state.get("waiting") or {}).get("reason") == "CreateContainerConfigError" \
            else None

    assert 'secret "later" not found' in wait_for(waiting, 30, 0.1, message="config error")["message"]
    k("create", "secret", "generic", "later", "--from-literal=x=1", "-n", ns)
    wait_phase(k, ns, "needs", "Succeeded")


def test_logs_follow_containers_and_probes(shared_cdi_up: CdiUp, shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "logs")
    manifest = pod("talker", "for i in 1 2 3; do echo first-$i; sleep 0.2; done")
    manifest["spec"]["containers"].append({
        "name": "second", "image": "debian",
        "command": ["sh", "-c", "touch /tmp/ready; for i in 1 2 3 4 5; do echo second-$i; sleep 0.3; done"],
        "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/ready"]}, "periodSeconds": 1}})
    k.apply(manifest, "-n", ns)
    wait_for(lambda: (get(k, "pod", "talker", ns) or {}).get("spec", {}).get("nodeName"), 30, 0.1,
             message="scheduled")
    def follow() -> str | None:
        result = k("logs", "-f", "talker", "-c", "second", "-n", ns, check=False)
        return result.stdout if result.returncode == 0 else None

    followed = wait_for(follow, 30, 0.2, message="logs -f")
    assert followed.split() == [f"second-{i}" for i in range(1, 6)]
    wait_phase(k, ns, "talker", "Succeeded")
    assert logs(k, ns, "talker", "-c", "main").split() == ["first-1", "first-2", "first-3"]
    assert logs(k, ns, "talker", "-c", "main", "--tail=1").split() == ["first-3"]
    stamped = logs(k, ns, "talker", "-c", "main", "--timestamps").splitlines()
    assert stamped[0].split(" ", 1)[1] == "first-1" and stamped[0].startswith("20")
    k("delete", "pod", "talker", "-n", ns, "--wait=true", timeout=30)  # its logs stay on the node
    kept = wait_for(lambda: list((shared_cdi_up.data_dir / "node" / "terminated").glob(f"{ns}_talker_*")), 10,
                    message="the logs of the deleted pod kept")
    assert sorted(p.name for p in kept[0].iterdir()) == ["main-0.log", "second-0.log"]
    assert (kept[0] / "main-0.log").read_text().splitlines()[0].endswith(" stdout F first-1")


def test_liveness_probe_restarts_and_readiness_gates_ready(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "probe")
    manifest = pod("sick", "touch /tmp/alive; sleep 1; rm /tmp/alive; sleep 60", restart="Always", extra={
        "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/alive"]}, "periodSeconds": 1,
                          "failureThreshold": 1},
        "readinessProbe": {"tcpSocket": {"port": 9}, "periodSeconds": 1}})
    k.apply(manifest, "-n", ns)

    def restarted() -> dict | None:  # type: ignore[type-arg]
        statuses = ((get(k, "pod", "sick", ns) or {}).get("status") or {}).get("containerStatuses") or []
        return statuses[0] if statuses and statuses[0]["restartCount"] >= 1 else None

    status = wait_for(restarted, 30, 0.2, message="liveness restart")
    assert status["ready"] is False  # nothing listens on port 9: never ready
    ready = {c["type"]: c for c in get(k, "pod", "sick", ns)["status"]["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ContainersNotReady"
    events = k.json("get", "events", "-n", ns)["items"]
    assert any(e["reason"] == "Killing" and "liveness" in e["message"] for e in events)


def test_delete_sends_sigterm_then_sigkill(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "del")
    marker = f"marker-{uuid.uuid4().hex}"
    k.apply(pvc("notes"), "-n", ns)
    polite = pod("polite", f"trap 'echo got TERM > /data/polite; exit 0' TERM; while :; do sleep 0.1; done # {marker}",
                 "notes", restart="Always")
    stubborn = pod("stubborn", f"trap 'echo ignored > /data/stubborn' TERM; while :; do sleep 0.1; done # {marker}",
                   "notes", restart="Always")
    stubborn["spec"]["terminationGracePeriodSeconds"] = 2
    for manifest in (polite, stubborn):
        k.apply(manifest, "-n", ns)
    for name in ("polite", "stubborn"):
        wait_phase(k, ns, name, "Running")
    assert len(processes_mentioning(marker)) >= 2
    k("delete", "pod", "polite", "stubborn", "-n", ns, "--wait=true", timeout=30)
    assert processes_mentioning(marker) == []
    out = run_to_completion(k, ns, pod("check", "cat /data/polite /data/stubborn", "notes"))
    assert out.split() == ["got", "TERM", "ignored"]


def test_service_cluster_ip_reaches_pod(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "svc")
    server = pod("web", "mkdir /tmp/www && echo hello-through-service > /tmp/www/index.html && "
                        "exec python3 -m http.server 8080 --bind $(POD_IP) --directory /tmp/www",
                 restart="Always", labels={"app": "web"}, extra={
                     "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                     "ports": [{"name": "http", "containerPort": 8080}],
                     "readinessProbe": {"httpGet": {"path": "/index.html", "port": "http"}, "periodSeconds": 1}})
    k.apply(server, "-n", ns)
    k.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
             "spec": {"selector": {"app": "web"}, "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}},
            "-n", ns)
    cluster_ip = get(k, "service", "web", ns)["spec"]["clusterIP"]
    pod_ip = wait_for(lambda: ((get(k, "pod", "web", ns) or {}).get("status") or {}).get("podIP"), 30, 0.1,
                      message="pod IP")

    def endpoint() -> list | None:  # type: ignore[type-arg]
        subsets = (get(k, "endpoints", "web", ns) or {}).get("subsets") or []
        addresses = [a["ip"] for s in subsets for a in s.get("addresses") or []]
        return addresses or None

    assert wait_for(endpoint, 30, 0.2, message="ready endpoint") == [pod_ip]
    client = pod("client", f"import urllib.request; print(urllib.request.urlopen('http://{cluster_ip}:80/index.html', "
                           "timeout=10).read().decode())", python=True)
    assert run_to_completion(k, ns, client).strip() == "hello-through-service"


def test_wait_for_first_consumer_claim_binds_when_used(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "wffc")
    k.apply(pvc("lazy", storage_class="local-wffc"), "-n", ns)

    def waiting_event() -> bool:
        events = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=lazy")["items"]
        return any(e["reason"] == "WaitForFirstConsumer" for e in events)

    wait_for(waiting_event, 30, 0.2, message="WaitForFirstConsumer event")
    claim = get(k, "pvc", "lazy", ns)
    assert claim["status"]["phase"] == "Pending" and not claim["spec"].get("volumeName")
    assert k.json("get", "pv")["items"] == [] or all(
        pv["spec"]["claimRef"]["namespace"] != ns for pv in k.json("get", "pv")["items"])
    run_to_completion(k, ns, pod("consumer", "echo used > /data/x", "lazy"))
    claim = wait_bound(k, ns, "lazy")
    node = k.json("get", "nodes")["items"][0]["metadata"]["name"]
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node
