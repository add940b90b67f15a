"""DataVolume imports end to end (issue #5): real kubectl against `cdi up` with the controller,
importer pods on the local node, real HTTP(S), S3 (moto) and registry (docker-registry) servers,
and the bytes read back through a pod."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdi.common import pki
from tests.e2e.importing import (
    condition,
    datavolume,
    phase,
    read_back,
    recorded,
    set_import_proxy,
    wait_phase,
    with_record,
)
from tests.e2e.target import TARGET, External, own_cluster
from tests.e2e.workloads import new_namespace, pod
from tests.support import oci
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import Fault, FileServer
from tests.support.sourceservers import PASSWORD, S3_KEY, S3_SECRET, USER


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp | External]:
    yield from own_cluster(tmp_path_factory, "import", "--retry-backoff", "0.5", "--import-retries", "3")


@pytest.fixture(scope="module")
def k(cluster: CdiUp | External, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    kubectl = Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("kc"))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
              "stringData": {"accessKeyId": USER, "secretKey": PASSWORD}}
    s3_secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"},
                 "stringData": {"accessKeyId": S3_KEY, "secretKey": S3_SECRET}}
    kubectl.apply(secret)
    kubectl.apply(s3_secret)
    return kubectl


LEGACY = {"cdi.kubevirt.io/storage.usePopulator": "false"}  # CDI's opt-out of the populator path


def expect_bytes(k: Kubectl, name: str, image: Image, *, block: bool = False) -> None:
    assert read_back(k, name, image.virtual_size, block=block) == image.sha256


@pytest.mark.anycluster
@pytest.mark.parametrize("name", ["qcow2.qcow2", "raw.img"])
def test_http_import_into_a_filesystem_volume_with_the_storage_api(
        k: Kubectl, range_server: FileServer, images: dict[str, Image], name: str) -> None:
    image = images[name]
    dv_name = f"http-{name.split('.', maxsplit=1)[0]}"
    source = {"http": {"url": f"{range_server.url}/{image.name}", "checksum": f"sha256:{image.file_sha256}"}}
    k.apply(datavolume(dv_name, source, "64Mi"))
    dv = wait_phase(k, dv_name, "Succeeded")
    assert dv["status"]["progress"] == "100.0%" and dv["status"].get("restartCount", 0) == 0
    assert condition(dv, "Ready")["status"] == "True" and condition(dv, "Bound")["status"] == "True"
    columns = k("get", "dv", dv_name).stdout.splitlines()
    assert columns[0].split()[:4] == ["NAME", "PHASE", "PROGRESS", "RESTARTS"]
    assert columns[1].split()[:4] == [dv_name, "Succeeded", "100.0%", "0"]
    expect_bytes(k, dv_name, image)
    pvc = k.get("pvc", dv_name)
    assert pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.requiresScratch"] == "false"
    assert image.file_sha256 in pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.verifiedChecksum"]
    assert not k.exists("pod", f"importer-{dv_name}")  # cleaned up after success


@pytest.mark.anycluster
@pytest.mark.parametrize("name", ["qcow2.qcow2", "raw.img"])
def test_http_import_into_a_block_volume(k: Kubectl, range_server: FileServer, images: dict[str, Image],
                                         name: str) -> None:
    if not TARGET.block:
        pytest.skip("the target's runtime gives non-root pods no block devices (CDI_E2E_BLOCK=0)")
    image = images[name]
    dv_name = f"http-{name.split('.', maxsplit=1)[0]}-block"
    k.apply(datavolume(dv_name, {"http": {"url": f"{range_server.url}/{image.name}"}}, "64Mi", volume_mode="Block"))
    wait_phase(k, dv_name, "Succeeded")
    expect_bytes(k, dv_name, image, block=True)


@pytest.mark.anycluster
def test_https_raw_xz_into_a_block_volume_with_the_pvc_api(
        k: Kubectl, https_server: FileServer, images: dict[str, Image], ca: pki.KeyPair) -> None:
    if not TARGET.block:
        pytest.skip("the target's runtime gives non-root pods no block devices (CDI_E2E_BLOCK=0)")
    image = images["raw.img.xz"]
    k.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "test-ca"},
             "data": {"ca.pem": ca.cert_pem.decode()}})
    source = {"http": {"url": f"{https_server.url}/{image.name}", "secretRef": "creds", "certConfigMap": "test-ca"}}
    k.apply(datavolume("https-xz", source, "32Mi", api="pvc", volume_mode="Block"))
    wait_phase(k, "https-xz", "Succeeded")
    expect_bytes(k, "https-xz", image, block=True)


def test_s3_qcow2_with_credentials(k: Kubectl, s3: Any, images: dict[str, Image]) -> None:
    image = images["qcow2.qcow2"]
    k.apply(datavolume("s3-disk", {"s3": {"url": s3.endpoint(image.name), "secretRef": "s3-creds"}}, "64Mi",
                       api="pvc"))
    wait_phase(k, "s3-disk", "Succeeded")
    expect_bytes(k, "s3-disk", image)


def test_registry_image_into_a_block_volume(
        k: Kubectl, registries: Any, images: dict[str, Image]) -> None:
    image = images["qcow2.qcow2"]
    registry = registries.basic

    def build(layout: Path) -> None:
        oci.build(layout, [oci.Layer({f"disk/{image.name}": image.path}, compression="gzip")],
                  env=["INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora"])

    url = registries.push(registry, "e2e/disk", build)
    k("patch", "cdi", "cdi", "--type", "merge",
      "-p", json.dumps({"spec": {"config": {"insecureRegistries": [registry.host]}}}))
    wait_for(lambda: registry.host in k("get", "cdiconfig", "config", "-o", "jsonpath={.spec}").stdout, 30,
             message="CDIConfig picked up insecureRegistries")
    k.apply(datavolume("from-registry", {"registry": {"url": url, "secretRef": "creds"}}, "64Mi",
                       volume_mode="Block"))
    wait_phase(k, "from-registry", "Succeeded")
    expect_bytes(k, "from-registry", image, block=True)
    # what it received, for an audit: the disk file in the layer, as `sha256sum` of the file built in says
    assert recorded(with_record(k, "from-registry")) == {"source.sha256": image.file_sha256, "source.format": "qcow2"}
    labels = k.get("pvc", "from-registry")["metadata"].get("labels", {})
    assert labels.get("instancetype.kubevirt.io/default-preference") == "fedora"


@pytest.mark.anycluster
@pytest.mark.parametrize(("name", "api", "mode"), [("blank-fs", "storage", None), ("blank-block", "pvc", "Block")])
def test_blank_disks(k: Kubectl, name: str, api: str, mode: str | None) -> None:
    if mode == "Block" and not TARGET.block:
        pytest.skip("the target's runtime gives non-root pods no block devices (CDI_E2E_BLOCK=0)")
    k.apply(datavolume(name, {"blank": {}}, "16Mi", api=api, volume_mode=mode))
    wait_phase(k, name, "Succeeded")
    zeros = "080acf35a507ac9849cfcba47dc2ad83e01b75663a516279c8b9d243b719643e"  # sha256 of 16 MiB of zeros
    assert read_back(k, name, 16 << 20, block=mode == "Block") == zeros


@pytest.mark.parametrize(("name", "source", "size", "reason"), [
    ("missing", {"http": {"url": "{base}/no-such-file.img"}}, "64Mi", "NotFound"),
    ("bad-sum", {"http": {"url": "{base}/raw.img", "checksum": "sha256:" + "0" * 64}}, "64Mi", "ChecksumMismatch"),
    ("too-small", {"http": {"url": "{base}/qcow2.qcow2"}}, "4Mi", "ImageTooLarge"),
])
@pytest.mark.anycluster
def test_permanent_failures_end_at_once_without_retries(
        k: Kubectl, range_server: FileServer, name: str, source: dict[str, Any], size: str, reason: str) -> None:
    source = json.loads(json.dumps(source).replace("{base}", range_server.url))
    k.apply(datavolume(name, source, size))
    dv = wait_phase(k, name, "Failed", timeout=60)
    assert dv["status"].get("restartCount", 0) == 0
    running = condition(dv, "Running")
    assert running["reason"] == reason and running["message"]
    described = k("describe", "dv", name).stdout
    assert reason in described and "ImportFailed" in described
    assert phase(k, name) == "Failed"


def test_a_server_that_fails_twice_then_recovers(
        k: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    image = images["raw.img"]
    range_server.fail_next(image.name, Fault(503), Fault(503))
    k.apply(datavolume("flaky", {"http": {"url": f"{range_server.url}/{image.name}"}}, "64Mi"))
    dv = wait_phase(k, "flaky", "Succeeded")
    # retried inside the pod: no pod restarted, so restartCount stays 0 (CDI's meaning); the retries are noted
    assert dv["status"].get("restartCount", 0) == 0
    assert k.get("pvc", "flaky")["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.retries"] == "2"
    expect_bytes(k, "flaky", image)


def test_scratch_only_where_the_format_needs_it(
        k: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    """A compressed vmdk must be staged for qemu-img; a compressed qcow2 converts as it streams."""
    compressed_vmdk, qcow2_gz = images["vmdk.vmdk.gz"], images["qcow2.qcow2.gz"]
    # the legacy path, where the scratch claim is named after the DataVolume's (a populator's is the prime's)
    k.apply(datavolume("needs-scratch", {"http": {"url": f"{range_server.url}/{compressed_vmdk.name}"}}, "64Mi",
                       annotations=LEGACY))
    k.apply(datavolume("no-scratch", {"http": {"url": f"{range_server.url}/{qcow2_gz.name}"}}, "64Mi",
                       annotations=LEGACY))
    wait_phase(k, "needs-scratch", "Succeeded")
    wait_phase(k, "no-scratch", "Succeeded")
    expect_bytes(k, "needs-scratch", compressed_vmdk)
    expect_bytes(k, "no-scratch", qcow2_gz)
    annotation = "cdi.kubevirt.io/storage.import.requiresScratch"
    assert k.get("pvc", "needs-scratch")["metadata"]["annotations"][annotation] == "true"
    assert k.get("pvc", "no-scratch")["metadata"]["annotations"][annotation] == "false"
    events = k("get", "events", "--field-selector", "involvedObject.kind=PersistentVolumeClaim",
               "-o", "jsonpath={.items[*].involvedObject.name}").stdout.split()
    assert "needs-scratch-scratch" in events and "no-scratch-scratch" not in events
    wait_for(lambda: not k.exists("pvc", "needs-scratch-scratch"), 30, message="scratch claim removed")


def test_scratch_is_the_importers_call_and_the_controller_never_fetches_the_source(
        k: Kubectl, served_dir: Path, images: dict[str, Image]) -> None:
    """The controller never connects to the URL a DataVolume names (from a cluster-wide controller that
    is a path into any network it can reach, and it would ignore importProxy): here the server behind
    the URL sees no connection at all, and every byte goes through CDIConfig's importProxy to the
    importer. The first importer pod reads the head of the compressed vmdk and asks for scratch; the
    next one gets a scratch claim and imports it, and that second pod is not a restart."""
    image = images["vmdk.vmdk.gz"]
    origin = FileServer(served_dir)  # what the URL names: no one may connect to it directly
    proxy = FileServer(served_dir)  # answers absolute-form requests: a plain-HTTP proxy to the same files
    try:
        set_import_proxy(k, {"HTTPProxy": proxy.url})
        k.apply(datavolume("proxied-vmdk", {"http": {"url": f"{origin.url}/{image.name}"}}, "64Mi",
                           annotations=LEGACY))
        dv = wait_phase(k, "proxied-vmdk", "Succeeded")
    finally:
        set_import_proxy(k, None)
        origin.close()
        proxy.close()
    expect_bytes(k, "proxied-vmdk", image)
    assert dv["status"].get("restartCount", 0) == 0
    assert origin.agents == []
    assert proxy.agents and {agent for _, agent in proxy.agents} == {"cdi-importer"}
    assert k.get("pvc", "proxied-vmdk")["metadata"]["annotations"][
        "cdi.kubevirt.io/storage.import.requiresScratch"] == "true"
    events = k("get", "events", "--field-selector", "involvedObject.name=proxied-vmdk-scratch",
               "-o", "jsonpath={.items[*].reason}").stdout.split()
    assert events, "the scratch claim was created (and provisioned)"
    warnings = k("get", "events", "--field-selector", "involvedObject.name=proxied-vmdk,type=Warning",
                 "-o", "jsonpath={.items[*].reason}").stdout.split()
    assert warnings == []  # asking for scratch is no failure (as in CDI, no Warning for it)
    wait_for(lambda: not k.exists("pvc", "proxied-vmdk-scratch"), 30, message="scratch claim removed")


@pytest.mark.anycluster
def test_wait_for_first_consumer(k: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    image = images["raw.img"]
    url = f"{range_server.url}/{image.name}"
    k.apply(datavolume("wffc-waits", {"http": {"url": url}}, "64Mi", storage_class=TARGET.wffc_class))
    k.apply(datavolume("wffc-now", {"http": {"url": url}}, "64Mi", storage_class=TARGET.wffc_class,
                       annotations={"cdi.kubevirt.io/storage.bind.immediate.requested": "true"}))
    wait_phase(k, "wffc-now", "Succeeded")
    assert phase(k, "wffc-waits") == "PendingPopulation"  # CSI storage: the import populator's phase, as CDI
    assert k.get("pvc", "wffc-waits")["status"]["phase"] == "Pending"
    k.apply(pod("first-consumer", "true", "wffc-waits"))
    wait_phase(k, "wffc-waits", "Succeeded")
    expect_bytes(k, "wffc-waits", image)


@pytest.mark.anycluster
def test_a_datavolume_over_its_namespaces_quota_goes_on_once_the_quota_is_raised(
        k: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    """CDI's ErrExceededQuota: the claim a ResourceQuota refuses keeps the DataVolume Pending with the API
    server's words, and raising the quota with kubectl is all it takes for the import to finish."""
    image = images["qcow2.qcow2"]
    ns = new_namespace(k, "quota")
    k("create", "quota", "storage", "-n", ns, "--hard=requests.storage=16Mi")
    # enforced once the quota controller has copied `hard` into the status, on any cluster
    wait_for(lambda: k.get("quota", "storage", ns).get("status", {}).get("used"), 30, message="quota status")
    source = {"http": {"url": f"{range_server.url}/{image.name}", "checksum": f"sha256:{image.file_sha256}"}}
    k.apply(datavolume("over-quota", source, "64Mi"), "-n", ns)

    def refused() -> dict[str, Any] | None:
        dv: dict[str, Any] = k.get("dv", "over-quota", ns)
        conditions = {c["type"]: c for c in dv.get("status", {}).get("conditions") or []}
        return conditions if conditions.get("Bound", {}).get("reason") == "ErrExceededQuota" else None
    conditions = wait_for(refused, 60, message="ErrExceededQuota on the DataVolume")
    message = conditions["Bound"]["message"]
    assert message.startswith('persistentvolumeclaims "over-quota" is forbidden: exceeded quota: storage, '
                              "requested: requests.storage=")
    assert message.endswith("used: requests.storage=0, limited: requests.storage=16Mi")
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "ErrExceededQuota")
    assert phase(k, "over-quota", ns) == "Pending" and not k.exists("pvc", "over-quota", ns)
    events = k.json("get", "events", "-n", ns, "--field-selector",
                    "involvedObject.kind=DataVolume,involvedObject.name=over-quota,reason=ErrExceededQuota")
    assert ("Warning", message) in [(e["type"], e["message"]) for e in events["items"]]

    k("patch", "quota", "storage", "-n", ns, "--type", "merge", "-p",
      json.dumps({"spec": {"hard": {"requests.storage": "1Gi"}}}))
    wait_phase(k, "over-quota", "Succeeded", namespace=ns)
    assert read_back(k, "over-quota", image.virtual_size, namespace=ns) == image.sha256
    described = k("describe", "quota", "storage", "-n", ns).stdout
    assert any(line.split()[:1] == ["requests.storage"] and line.split()[-1] == "1Gi"
               for line in described.splitlines()), described


def test_secret_passed_as_base64_works_too(k: Kubectl) -> None:
    """Credentials secrets written by hand are base64 in `data` (the common case in CDI's docs)."""
    encoded = {"accessKeyId": base64.b64encode(USER.encode()).decode(),
               "secretKey": base64.b64encode(PASSWORD.encode()).decode()}
    k.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds-b64"}, "data": encoded})
    assert k.get("secret", "creds-b64")["data"]["accessKeyId"] == encoded["accessKeyId"]
