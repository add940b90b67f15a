"""Two `cdi up` on one host stay apart, and each keeps its secrets to itself (issue #14, points 2 and 4).

Every instance shares the machine's loopback: its pods' IPs and its Services' cluster IPs come from a
range of its own (derived from its data directory, checked free, kept across restarts), so one's
Service address never answers with the other's upload server. Its data directory, which holds every
Secret and key of the cluster, is 0700 and the files with secrets in it 0600, also when a data
directory an older version left readable is started again."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import random
import re
import socket
import ssl
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.importing import read_back, wait_phase
from tests.e2e.uploading import curl, token, upload_dv, wait_ready
from tests.e2e.workloads import pod as pod_manifest
from tests.e2e.workloads import run_to_completion
from tests.support.cluster import CdiUp, Kubectl, wait_for

IMAGE_SIZE = 4 << 20


def legacy_upload_dv(name: str) -> dict[str, Any]:
    """The legacy path: the upload server and its Service are named after the claim (a populator's after
    its prime claim)."""
    dv = upload_dv(name)
    dv["metadata"]["annotations"] = {"cdi.kubevirt.io/storage.usePopulator": "false"}
    return dv


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[CdiUp, Kubectl]]]:
    """Two instances on this host, side by side."""
    instances = []
    for name in ("first", "second"):
        directory = tmp_path_factory.mktemp(name)
        instances.append((CdiUp(directory / "cdi"), Kubectl(directory / "cdi" / "kubeconfig", directory / "kc")))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda item: item[0].start(), instances))
    yield instances
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda item: item[0].stop(), instances))


def cluster_ip(k: Kubectl, service: str, namespace: str = "default") -> str:
    return str(k.get("service", service, namespace)["spec"]["clusterIP"])


def pod_cidr(k: Kubectl) -> str:
    return str(k.json("get", "nodes")["items"][0]["spec"]["podCIDR"])


def announced_service_range(up: CdiUp) -> ipaddress.IPv4Network:
    """The Service range the last start of `cdi up` printed."""
    found = re.findall(r"service cluster IPs (\S+)", up.log_path.read_text())
    assert found, f"cdi up did not say its service range:\n{up.log_path.read_text()}"
    return ipaddress.IPv4Network(found[-1])


def served_certificate(ip: str, port: int) -> bytes | None:
    """The certificate whatever answers TLS on ip:port presents (DER), or None while nothing does."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((ip, port), timeout=10) as sock, \
                context.wrap_socket(sock) as tls:
            return tls.getpeercert(binary_form=True)
    except OSError:
        return None


def upload_server_certificate(k: Kubectl, pvc: str) -> bytes:
    pem = base64.b64decode(k.get("secret", f"cdi-upload-{pvc}")["data"]["tls.crt"]).decode()
    return ssl.PEM_cert_to_DER_cert(pem)


def assert_service_reaches_own_upload_server(k: Kubectl, pvc: str) -> None:
    """The upload Service's cluster IP answers with this instance's upload server (its certificate)."""
    service = k.get("service", f"cdi-upload-{pvc}")
    ip, port = service["spec"]["clusterIP"], int(service["spec"]["ports"][0]["port"])
    served = wait_for(lambda: served_certificate(ip, port), 30, 0.2, message=f"TLS on {ip}:{port}")
    assert served == upload_server_certificate(k, pvc), f"{ip}:{port} answers with another upload server"


def test_two_instances_keep_their_addresses_and_uploads_apart_across_restarts(
        pair: list[tuple[CdiUp, Kubectl]], tmp_path: Path) -> None:
    # the same DataVolume name in both: the same Service and pod names, as two users' clusters would have
    images = []
    for index, (_, k) in enumerate(pair):
        image = tmp_path / f"image-{index}.raw"
        image.write_bytes(random.Random(index).randbytes(IMAGE_SIZE))
        images.append(image)
        k.apply(legacy_upload_dv("disk"))
    for _, k in pair:
        wait_ready(k, "disk")

    for _, k in pair:
        assert_service_reaches_own_upload_server(k, "disk")
    ips = [cluster_ip(k, "cdi-upload-disk") for _, k in pair]
    assert ips[0] != ips[1], f"both instances gave their upload Service {ips[0]}"
    api_ips = [cluster_ip(k, "cdi-api", "cdi") for _, k in pair]
    assert api_ips[0] != api_ips[1]
    cidrs = [pod_cidr(k) for _, k in pair]
    assert not ipaddress.IPv4Network(cidrs[0]).overlaps(ipaddress.IPv4Network(cidrs[1])), cidrs
    ranges = [announced_service_range(up) for up, _ in pair]
    assert not ranges[0].overlaps(ranges[1])
    for (_, k), ip, cidr, service_range in zip(pair, ips, cidrs, ranges, strict=True):
        assert ipaddress.IPv4Address(ip) in service_range
        upload_pod = k.get("pod", "cdi-upload-disk")
        assert ipaddress.IPv4Address(upload_pod["status"]["podIP"]) in ipaddress.IPv4Network(cidr)

    for (up, k), image in zip(pair, images, strict=True):
        status, body, _ = curl(up, k, "/v1beta1/upload", "-X", "POST", "-T", str(image), bearer=token(k, "disk"))
        assert (status, body) == (200, "")
    for _, k in pair:
        wait_phase(k, "disk", "Succeeded", 90)
    for (_, k), image in zip(pair, images, strict=True):
        assert read_back(k, "disk", IMAGE_SIZE) == hashlib.sha256(image.read_bytes()).hexdigest()

    for up, _ in pair:
        up.restart()
    assert [pod_cidr(k) for _, k in pair] == cidrs
    assert [announced_service_range(up) for up, _ in pair] == ranges
    assert [cluster_ip(k, "cdi-api", "cdi") for _, k in pair] == api_ips
    for (_, k), service_range in zip(pair, ranges, strict=True):
        k.apply(legacy_upload_dv("after-restart"))
        wait_ready(k, "after-restart")
        assert ipaddress.IPv4Address(cluster_ip(k, "cdi-upload-after-restart")) in service_range
        assert_service_reaches_own_upload_server(k, "after-restart")


def test_a_service_asking_for_an_address_outside_the_range_or_taken_is_refused(
        pair: list[tuple[CdiUp, Kubectl]]) -> None:
    """As kube-apiserver: a cluster IP must be in the instance's range and free."""
    up, k = pair[0]
    service_range = announced_service_range(up)
    taken = cluster_ip(k, "cdi-api", "cdi")

    def service(name: str, ip: str) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"clusterIP": ip, "ports": [{"port": 80}]}}

    outside = str(next(n for n in ipaddress.IPv4Network("127.20.0.0/16").subnets(new_prefix=24)
                       if n != service_range).network_address + 7)
    refused = k.apply(service("outside", outside), check=False)
    assert refused.returncode != 0
    assert f"the provided IP ({outside}) is not in the valid range" in refused.stderr
    refused = k.apply(service("twice", taken), check=False)
    assert refused.returncode != 0 and "provided IP is already allocated" in refused.stderr
    free = str(service_range.network_address + 250)
    k.apply(service("chosen", free))
    assert cluster_ip(k, "chosen") == free


# -- secrets at rest -----------------------------------------------------------------------------------
KEYS = ("ca.key", "serving/tls.key", "front-proxy-ca.key", "front-proxy-client.key", "cdi-apiserver/ca.key",
        "cdi-apiserver/serving/tls.key", "uploadproxy/serving/tls.key")
SECRETS = ("state.db", "state.db-wal", "state.db-shm", "token", "kubeconfig", *KEYS)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def container_logs(data_dir: Path) -> list[Path]:
    node = data_dir / "node"
    return [*node.glob("pods/*/containers/*/*.log"), *node.glob("terminated/*/*.log")]


def assert_private(data_dir: Path) -> None:
    assert mode(data_dir) == 0o700, oct(mode(data_dir))
    wait_for(lambda: (data_dir / "state.db-wal").exists() and (data_dir / "state.db-shm").exists(), 30,
             message="the database's journal files")
    modes = {name: oct(mode(data_dir / name)) for name in SECRETS}
    assert modes == dict.fromkeys(SECRETS, oct(0o600))
    pods_own = {data_dir / "storage", data_dir / "node"}  # volumes: the kubelet's modes (a secret volume 0644)
    for path in [*(p for p in data_dir.rglob("*.key") if not pods_own & set(p.parents)), *container_logs(data_dir)]:
        assert mode(path) == 0o600, f"{path} is {oct(mode(path))}"
    for directory in ("serving", "cdi-apiserver", "uploadproxy"):
        assert mode(data_dir / directory) == 0o700, directory


def loosen(data_dir: Path) -> None:
    """What a data directory written before this fix looked like: 0755 directories, 0644 files."""
    for root, dirs, files in os.walk(data_dir):
        here = Path(root)
        if here == data_dir:
            dirs[:] = [d for d in dirs if d != "storage"]
        os.chmod(here, 0o755)
        for name in files:
            os.chmod(here / name, 0o644)


def test_data_dir_and_its_secrets_are_private_also_after_an_older_version(cdi_up: CdiUp, kubectl: Kubectl) -> None:
    assert_private(cdi_up.data_dir)
    out = run_to_completion(kubectl, "default", pod_manifest("talker", "echo a line a container printed"))
    assert out.strip() == "a line a container printed"
    logs = container_logs(cdi_up.data_dir)
    assert logs and all(mode(path) == 0o600 for path in logs), [(p, oct(mode(p))) for p in logs]

    cdi_up.stop()
    loosen(cdi_up.data_dir)
    assert mode(cdi_up.data_dir / "state.db") == 0o644 and mode(cdi_up.data_dir) == 0o755
    cdi_up.start()
    assert_private(cdi_up.data_dir)
    assert kubectl.get("pod", "talker")["status"]["phase"] == "Succeeded"  # the state is still readable
