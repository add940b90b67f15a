"""DataImportCron end to end (issue #18): golden images kept fresh from Debian's docker-registry, an
HTTP server and moto's S3 on `cdi up`. Runs are triggered with `cdi.kubevirt.io/refreshNow`, never by
waiting for the schedule; the schedule names a minute that does not come during the test."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdi.common import pki
from cdi.controller.dataimportcron import dv_name
from tests.e2e.importing import datavolume, read_back, wait_phase
from tests.e2e.target import External, own_cluster
from tests.e2e.test_clone import clone_dv
from tests.e2e.test_controller_metrics import metrics, value
from tests.e2e.workloads import pod
from tests.support import oci
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.servers import FileServer
from tests.support.sourceservers import PASSWORD, S3_KEY, S3_SECRET, USER

NEVER = "0 0 1 1 *"  # midnight on 1 January: not during this test
DISK_SIZE = 1 << 20
POLLER_TIMEOUT = 20  # seconds (the module's `cdi up`); the default is 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp | External]:
    yield from own_cluster(tmp_path_factory, "cron", "--retry-backoff", "0.5", "--import-retries", "1",
                           "--poller-timeout", str(POLLER_TIMEOUT))


@pytest.fixture(scope="module")
def k(cluster: CdiUp | External, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    kubectl = Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("kc"))
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                   "stringData": {"accessKeyId": USER, "secretKey": PASSWORD}})
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"},
                   "stringData": {"accessKeyId": S3_KEY, "secretKey": S3_SECRET}})
    return kubectl


def disk(directory: Path, seed: int) -> tuple[Path, str]:
    """A raw disk of distinct bytes; returns it and the sha256 of its contents."""
    path = directory / f"disk-{seed}.img"
    data = hashlib.sha256(str(seed).encode()).digest() * (DISK_SIZE // 32)
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def cron(name: str, source: dict[str, Any], data_source: str, *, keep: int | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedule": NEVER, "managedDataSource": data_source,
                            "template": {"spec": {"source": source,
                                                  "storage": {"resources": {"requests": {"storage": "16Mi"}}}}}}
    if keep is not None:
        spec["importsToKeep"] = keep
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron", "metadata": meta, "spec": spec}


def outdated(up: CdiUp, name: str) -> float | None:
    return value(metrics(up), f'kubevirt_cdi_dataimportcron_outdated{{cron_name="{name}",namespace="default",'
                              'pending="false"}')


def maybe(k: Kubectl, kind: str, name: str) -> dict[str, Any]:
    """The object, or {} while it does not exist (it may go between two kubectl calls)."""
    result = k("get", kind, name, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def wait_ready(k: Kubectl, data_source: str, timeout: float = 60.0) -> None:
    """The DataSource controller says what it names can be cloned (CDI's Ready condition and reason)."""
    def ready() -> bool:
        cond = condition(maybe(k, "datasource", data_source), "Ready")
        return cond.get("status") == "True" and cond.get("reason") == "Ready"
    wait_for(ready, timeout, interval=0.3, message=f"DataSource {data_source} Ready")


def refresh(k: Kubectl, name: str) -> None:
    k("annotate", "dataimportcron", name, "cdi.kubevirt.io/refreshNow=", "--overwrite")


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def wait_source(k: Kubectl, data_source: str, claim: str, kind: str = "pvc", timeout: float = 120.0) -> None:
    def points() -> bool:
        ds = k.get("datasource", data_source) if k.exists("datasource", data_source) else {}
        return ((ds.get("spec") or {}).get("source") or {}).get(kind, {}).get("name") == claim
    wait_for(points, timeout, interval=0.3, message=f"DataSource {data_source} -> {kind} {claim}")


def wait_up_to_date(k: Kubectl, name: str, claim: str, timeout: float = 120.0) -> dict[str, Any]:
    def done() -> bool:
        c = k.get("dataimportcron", name)
        return (c.get("status") or {}).get("lastImportedPVC", {}).get("name") == claim and \
            condition(c, "UpToDate").get("status") == "True"
    wait_for(done, timeout, interval=0.3, message=f"DataImportCron {name} up to date with {claim}")
    result: dict[str, Any] = k.get("dataimportcron", name)
    return result


class GoldenRegistry:
    """One repository of the htpasswd registry; each push puts a new image under `:latest`."""

    def __init__(self, registries: Any, workdir: Path) -> None:
        self.registry = registries.basic
        self.workdir = workdir
        self.pushes = 0

    @property
    def url(self) -> str:
        return f"docker://{self.registry.host}/e2e/golden:latest"

    def push(self, image: Path | None) -> str:
        self.pushes += 1
        layout = self.workdir / f"layout-{self.pushes}"
        shutil.rmtree(layout, ignore_errors=True)
        files = {"disk/disk.img": image} if image else {"notadisk/readme.txt": self._readme()}
        oci.build(layout, [oci.Layer(files, compression="gzip")], tag="latest", env=[f"PUSH={self.pushes}"])
        oci.push(layout, f"{self.registry.host}/e2e/golden:latest", tag="latest", creds=f"{USER}:{PASSWORD}",
                 tls_verify=False)
        return oci.digest_of(layout)

    def _readme(self) -> Path:
        path = self.workdir / "readme.txt"
        path.write_text("no disk here\n")
        return path


@pytest.fixture(scope="module")
def golden(registries: Any, k: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> GoldenRegistry:
    reg = GoldenRegistry(registries, tmp_path_factory.mktemp("golden"))
    k("patch", "cdi", "cdi", "--type", "merge",
      "-p", json.dumps({"spec": {"config": {"insecureRegistries": [reg.registry.host]}}}))
    wait_for(lambda: reg.registry.host in k("get", "cdiconfig", "config", "-o", "jsonpath={.spec}").stdout, 30,
             message="CDIConfig picked up insecureRegistries")
    return reg


def test_registry_cron_imports_repoints_collects_and_survives_a_broken_image(
        k: Kubectl, cluster: CdiUp, golden: GoldenRegistry, tmp_path: Path) -> None:
    first, first_sha = disk(tmp_path, 1)
    digest = golden.push(first)
    k.apply(cron("golden", {"registry": {"url": golden.url, "secretRef": "creds"}}, "golden-ds", keep=2,
                 labels={"instancetype.kubevirt.io/default-preference": "fedora"}))
    claim1 = dv_name("golden-ds", digest)
    assert claim1 == f"golden-ds-{digest[7:19]}"
    status = wait_up_to_date(k, "golden", claim1)
    wait_source(k, "golden-ds", claim1)
    assert status["status"]["currentImports"] == [{"DataVolumeName": claim1, "Digest": digest}]
    assert status["status"]["sourceFormat"] == "pvc" and status["status"].get("lastExecutionTimestamp")
    assert read_back(k, claim1, DISK_SIZE) == first_sha
    dv = k.get("dv", claim1)
    assert dv["spec"]["source"]["registry"]["url"] == f"docker://{golden.registry.host}/e2e/golden@{digest}"
    assert dv["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"] == "golden"
    assert dv["metadata"]["labels"]["instancetype.kubevirt.io/default-preference"] == "fedora"
    assert dv["metadata"]["annotations"]["cdi.kubevirt.io/storage.bind.immediate.requested"] == "true"
    ds = k.get("datasource", "golden-ds")
    assert ds["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"] == "golden"
    assert not k.exists("pod", f"poller-golden-{k.get('dataimportcron', 'golden')['metadata']['uid'][:8]}")
    assert outdated(cluster, "golden") == 0

    # a new image under the same tag: imported again, the DataSource repointed
    second, second_sha = disk(tmp_path, 2)
    claim2 = dv_name("golden-ds", golden.push(second))
    refresh(k, "golden")
    wait_up_to_date(k, "golden", claim2)
    wait_source(k, "golden-ds", claim2)
    assert read_back(k, claim2, DISK_SIZE) == second_sha
    assert "cdi.kubevirt.io/refreshNow" not in k.get("dataimportcron", "golden")["metadata"]["annotations"]
    wait_ready(k, "golden-ds")
    # a VM's DataVolume names the DataSource, not the image: it clones the current one
    k.apply(clone_dv("vm-root", source_ref={"kind": "DataSource", "name": "golden-ds"}))
    wait_phase(k, "vm-root", "Succeeded", timeout=180)
    assert read_back(k, "vm-root", DISK_SIZE) == second_sha

    # a third: importsToKeep 2 collects the oldest
    third, _ = disk(tmp_path, 3)
    claim3 = dv_name("golden-ds", golden.push(third))
    refresh(k, "golden")
    wait_up_to_date(k, "golden", claim3)
    wait_for(lambda: not k.exists("pvc", claim1) and not k.exists("dv", claim1), 60, message=f"{claim1} collected")
    assert k.exists("pvc", claim2) and k.exists("pvc", claim3)

    # a broken image: its import fails with a reason, the DataSource keeps the last good image
    broken = dv_name("golden-ds", golden.push(None))
    refresh(k, "golden")
    wait_for(lambda: k.exists("dv", broken) and
             (k.get("dv", broken).get("status") or {}).get("phase") == "Failed", 120, message=f"{broken} Failed")
    assert "disk" in condition(k.get("dv", broken), "Running").get("message", "")
    wait_for(lambda: condition(k.get("dataimportcron", "golden"), "Progressing").get("reason") == "Failed", 30,
             message="Progressing says the import failed")
    c = k.get("dataimportcron", "golden")
    assert condition(c, "UpToDate")["status"] == "False"
    assert c["status"]["lastImportedPVC"]["name"] == claim3
    wait_source(k, "golden-ds", claim3)
    assert k.exists("pvc", claim3)
    assert outdated(cluster, "golden") == 1

    # the next good push recovers
    fifth, fifth_sha = disk(tmp_path, 5)
    claim5 = dv_name("golden-ds", golden.push(fifth))
    refresh(k, "golden")
    wait_up_to_date(k, "golden", claim5)
    wait_source(k, "golden-ds", claim5)
    assert read_back(k, claim5, DISK_SIZE) == fifth_sha
    wait_for(lambda: not k.exists("dv", broken), 60, message="the failed import replaced")
    assert outdated(cluster, "golden") == 0
    events = k("get", "events", "--field-selector", "involvedObject.name=golden", "-o", "json").stdout
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"ImportCreated", "ImportSucceeded", "DataSourceUpdated", "GarbageCollected"} <= reasons


def test_cron_spec_is_immutable_and_a_data_source_has_one_cron(k: Kubectl, golden: GoldenRegistry) -> None:
    k.apply(cron("owner", {"registry": {"url": golden.url, "secretRef": "creds"}}, "shared-ds"))
    result = k("patch", "dataimportcron", "owner", "--type", "merge", "-p",
               json.dumps({"spec": {"importsToKeep": 5}}), check=False)
    assert result.returncode != 0 and "Cannot update DataImportCron Spec" in result.stderr
    k("annotate", "dataimportcron", "owner", "some=thing")  # metadata stays editable
    wait_for(lambda: k.exists("datasource", "shared-ds"), 60, message="the DataSource created")
    result = k.apply(cron("intruder", {"registry": {"url": golden.url, "secretRef": "creds"}}, "shared-ds"),
                     check=False)
    assert result.returncode != 0
    assert "DataSource shared-ds is already managed by DataImportCron owner" in result.stderr
    bad = cron("bad-schedule", {"registry": {"url": golden.url}}, "other-ds")
    bad["spec"]["schedule"] = "every day"
    result = k.apply(bad, check=False)
    assert result.returncode != 0 and "Illegal cron schedule" in result.stderr


Serve = Callable[[str, bytes], None]


@pytest.mark.anycluster
def test_http_cron_follows_a_changed_object(k: Kubectl, tmp_path: Path, served_dir: Path,
                                            range_server: FileServer) -> None:
    target = served_dir / "cron-golden.img"
    first, first_sha = disk(tmp_path, 11)
    shutil.copy(first, target)
    k.apply(cron("web", {"http": {"url": f"{range_server.url}/{target.name}"}}, "web-ds"))
    wait_for(lambda: (k.get("dataimportcron", "web").get("status") or {}).get("lastImportedPVC"), 120,
             interval=0.3, message="the first HTTP import")
    claim1 = k.get("dataimportcron", "web")["status"]["lastImportedPVC"]["name"]
    assert claim1.startswith("web-ds-")
    wait_source(k, "web-ds", claim1)
    assert read_back(k, claim1, DISK_SIZE) == first_sha

    refresh(k, "web")  # unchanged: no new import
    wait_for(lambda: "cdi.kubevirt.io/refreshNow" not in k.get("dataimportcron", "web")["metadata"]["annotations"],
             60, message="the refresh ran")
    assert k.get("dataimportcron", "web")["status"]["currentImports"][0]["DataVolumeName"] == claim1

    # a run missed while the controller was down (its next time long past) runs once, then waits for the schedule
    # (CDI stamps lastCronTime to the second, like the refresh just before: an old stamp makes the run visible)
    before = "2020-01-01T00:00:00Z"
    k("annotate", "dataimportcron", "web", f"cdi.kubevirt.io/storage.import.nextCronTime={before}",
      f"cdi.kubevirt.io/storage.import.lastCronTime={before}", "--overwrite")

    def ran_once() -> bool:
        annotations = k.get("dataimportcron", "web")["metadata"]["annotations"]
        return annotations["cdi.kubevirt.io/storage.import.lastCronTime"] > before and \
            annotations["cdi.kubevirt.io/storage.import.nextCronTime"] > "2026-12-31T00:00:00Z"
    wait_for(ran_once, 60, message="the missed run ran and the next one is on the schedule")

    second, second_sha = disk(tmp_path, 12)
    shutil.copy(second, target)
    stat = os.stat(target)
    os.utime(target, (stat.st_atime, stat.st_mtime + 10))  # a new Last-Modified even within the same second
    refresh(k, "web")
    wait_for(lambda: k.get("dataimportcron", "web")["status"].get("lastImportedPVC", {}).get("name") != claim1,
             120, interval=0.3, message="the changed object imported")
    claim2 = k.get("dataimportcron", "web")["status"]["lastImportedPVC"]["name"]
    wait_source(k, "web-ds", claim2)
    assert read_back(k, claim2, DISK_SIZE) == second_sha


@pytest.mark.anycluster
def test_http_cron_follows_a_published_checksum_file(k: Kubectl, tmp_path: Path, served_dir: Path,
                                                     range_server: FileServer) -> None:
    """A `<image>.sha256` next to the image names the version by its content: the DataVolume is named after
    the image's own sha256, and a new checksum file is a new version."""
    target = served_dir / "cron-sums.img"
    first, first_sha = disk(tmp_path, 41)
    shutil.copy(first, target)
    (served_dir / "cron-sums.img.sha256").write_text(f"{first_sha}  cron-sums.img\n")
    k.apply(cron("sums", {"http": {"url": f"{range_server.url}/{target.name}"}}, "sums-ds"))
    wait_up_to_date(k, "sums", f"sums-ds-{first_sha[:12]}")
    wait_source(k, "sums-ds", f"sums-ds-{first_sha[:12]}")

    second, second_sha = disk(tmp_path, 42)
    shutil.copy(second, target)
    (served_dir / "cron-sums.img.sha256").write_text(f"{second_sha}  cron-sums.img\n")
    refresh(k, "sums")
    wait_up_to_date(k, "sums", f"sums-ds-{second_sha[:12]}")
    assert read_back(k, f"sums-ds-{second_sha[:12]}", DISK_SIZE) == second_sha


def test_s3_cron_follows_a_changed_object(k: Kubectl, tmp_path: Path, s3: Any) -> None:
    first, first_sha = disk(tmp_path, 21)
    s3.put("cron-golden.img", first)
    k.apply(cron("bucket", {"s3": {"url": s3.endpoint("cron-golden.img"), "secretRef": "s3-creds"}}, "bucket-ds"))
    wait_for(lambda: (k.get("dataimportcron", "bucket").get("status") or {}).get("lastImportedPVC"), 120,
             interval=0.3, message="the first S3 import")
    claim1 = k.get("dataimportcron", "bucket")["status"]["lastImportedPVC"]["name"]
    assert read_back(k, claim1, DISK_SIZE) == first_sha

    second, second_sha = disk(tmp_path, 22)
    s3.put("cron-golden.img", second)
    refresh(k, "bucket")
    wait_for(lambda: k.get("dataimportcron", "bucket")["status"].get("lastImportedPVC", {}).get("name") != claim1,
             120, interval=0.3, message="the changed object imported")
    claim2 = k.get("dataimportcron", "bucket")["status"]["lastImportedPVC"]["name"]
    wait_source(k, "bucket-ds", claim2)
    assert read_back(k, claim2, DISK_SIZE) == second_sha


def test_snapshot_source_format(k: Kubectl, golden: GoldenRegistry, tmp_path: Path) -> None:
    classes = k.json("get", "storageclass", "-o", "json")["items"]
    default = next(c["metadata"]["name"] for c in classes
                   if c["metadata"].get("annotations", {}).get("storageclass.kubernetes.io/is-default-class") == "true")
    k("patch", "storageprofile", default, "--type", "merge", "-p",
      json.dumps({"spec": {"dataImportCronSourceFormat": "snapshot"}}))
    try:
        wait_for(lambda: k.get("storageprofile", default, "")["status"].get("dataImportCronSourceFormat") == "snapshot",
                 30, message="the profile says snapshot")
        image, sha = disk(tmp_path, 31)
        digest = golden.push(image)
        k.apply(cron("snap", {"registry": {"url": golden.url, "secretRef": "creds"}}, "snap-ds"))
        name = dv_name("snap-ds", digest)
        wait_source(k, "snap-ds", name, kind="snapshot")
        wait_ready(k, "snap-ds")
        status = wait_up_to_date(k, "snap", name)
        assert status["status"]["sourceFormat"] == "snapshot"
        snapshot = k.get("volumesnapshot", name)
        assert snapshot["status"]["readyToUse"] is True
        assert snapshot["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"] == "snap"
        assert snapshot["spec"]["source"]["persistentVolumeClaimName"] == name
        wait_for(lambda: not k.exists("dv", name) and not k.exists("pvc", name), 60,
                 message="the imported DataVolume and claim go once the snapshot is ready")
        k.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "from-golden"},
                 "spec": {"accessModes": ["ReadWriteOnce"],
                          "resources": {"requests": {"storage": snapshot["status"]["restoreSize"]}},
                          "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                                         "name": name}}})
        assert read_back(k, "from-golden", DISK_SIZE) == sha
    finally:
        k("patch", "storageprofile", default, "--type", "merge", "-p",
          json.dumps({"spec": {"dataImportCronSourceFormat": None}}))
    # back to pvc: as CDI, the snapshot goes and the image is imported again as a claim
    wait_source(k, "snap-ds", name)
    wait_for(lambda: not k.exists("volumesnapshot", name) and
             (maybe(k, "dv", name).get("status") or {}).get("phase") == "Succeeded", 120,
             message="the image imported again as a claim")
    assert read_back(k, name, DISK_SIZE) == sha


def test_a_new_default_storage_class_imports_again_onto_it(k: Kubectl, golden: GoldenRegistry, tmp_path: Path) -> None:
    default = "storageclass.kubernetes.io/is-default-class"
    image, sha = disk(tmp_path, 51)
    name = dv_name("moving-ds", golden.push(image))
    k.apply(cron("moving", {"registry": {"url": golden.url, "secretRef": "creds"}}, "moving-ds"))
    wait_up_to_date(k, "moving", name)
    old_class = k.get("pvc", name)["spec"]["storageClassName"]
    new_class = next(c["metadata"]["name"] for c in k.json("get", "storageclass", "-o", "json")["items"]
                     if c["metadata"]["name"] != old_class)
    assert k.get("dataimportcron", "moving")["metadata"]["annotations"][
        "cdi.kubevirt.io/storage.import.storageClass"] == old_class
    k("annotate", "storageclass", old_class, f"{default}=false", "--overwrite")
    k("annotate", "storageclass", new_class, f"{default}=true", "--overwrite")
    try:
        def moved() -> bool:
            c = k.get("dataimportcron", "moving")
            # the claim on the new class, its DataVolume done (the cron's UpToDate may still be the old one's)
            return (maybe(k, "pvc", name).get("spec") or {}).get("storageClassName") == new_class and \
                (maybe(k, "dv", name).get("status") or {}).get("phase") == "Succeeded" and \
                condition(c, "UpToDate").get("status") == "True" and \
                c["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.storageClass"] == new_class
        wait_for(moved, 120, interval=0.3, message=f"the image imported again onto {new_class}")
        wait_source(k, "moving-ds", name)
        assert read_back(k, name, DISK_SIZE) == sha
    finally:
        k("annotate", "storageclass", new_class, f"{default}-")
        k("annotate", "storageclass", old_class, f"{default}=true", "--overwrite")


def events_of(k: Kubectl, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the events about the cron."""
    found = k.json("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")["items"]
    return [(e["reason"], e["message"]) for e in found]


def set_insecure_registries(k: Kubectl, hosts: list[str]) -> None:
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": {"config": {"insecureRegistries": hosts}}}))
    wait_for(lambda: all(h in k("get", "cdiconfig", "config", "-o", "jsonpath={.spec}").stdout for h in hosts), 30,
             message="CDIConfig picked up insecureRegistries")


@pytest.mark.anycluster
def test_a_schedule_that_never_fires_is_refused(k: Kubectl) -> None:
    """`0 0 31 2 *` parses but names no day: CDI admits it and its cron never imports (issue 27, point 4)."""
    bad = cron("feb31", {"registry": {"url": "docker://registry.example/disk:latest"}}, "feb31-ds")
    bad["spec"]["schedule"] = "0 0 31 2 *"
    result = k.apply(bad, check=False)
    assert result.returncode != 0
    assert "Illegal cron schedule: spec.schedule '0 0 31 2 *' names no time that ever comes" in result.stderr
    assert not k.exists("dataimportcron", "feb31")
    leap = cron("leapday", {"registry": {"url": "docker://registry.example/disk:latest"}}, "leapday-ds")
    leap["spec"]["schedule"] = "0 0 29 2 *"  # rare, but it comes
    k.apply(leap)
    k("delete", "dataimportcron", "leapday")


@pytest.mark.anycluster
def test_a_registry_answering_garbage_is_not_a_new_version(k: Kubectl, golden: GoldenRegistry, served_dir: Path,
                                                           range_server: FileServer) -> None:
    """A "registry" whose manifest answer is not a manifest (here a file server, as a misconfigured proxy
    would answer) was polled as a new digest every run, and each one imported (issue 27, point 4)."""
    manifest = served_dir / "v2" / "e2e" / "junk" / "manifests" / "latest"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_bytes(b"<html><body>Service Unavailable</body></html>\n")
    host = range_server.url.removeprefix("http://")
    set_insecure_registries(k, [golden.registry.host, host])
    k.apply(cron("junk", {"registry": {"url": f"docker://{host}/e2e/junk:latest"}}, "junk-ds"))

    def says_why() -> dict[str, Any] | None:
        up = condition(maybe(k, "dataimportcron", "junk"), "UpToDate")
        return up if up.get("reason") == "PollFailed" else None
    up = wait_for(says_why, 90, interval=0.5, message="the cron says its poll failed")
    assert up["status"] == "False"
    assert f"{host}/e2e/junk:latest is not an image manifest: not a JSON object" in up["message"]
    wait_for(lambda: any(reason == "PollFailed" and "not an image manifest" in message
                         for reason, message in events_of(k, "junk")), 30, message="a PollFailed event")
    c = k.get("dataimportcron", "junk")
    assert "cdi.kubevirt.io/storage.import.sourceDesiredDigest" not in c["metadata"]["annotations"]
    assert not c["status"].get("currentImports")
    assert k("get", "dv", "-l", "cdi.kubevirt.io/dataImportCron=junk", "-o", "name").stdout.strip() == ""
    k("delete", "dataimportcron", "junk")


def holder(name: str, claim: str) -> dict[str, Any]:
    """A pod that keeps the claim mounted, as a running VM keeps its disk."""
    return pod(name, "sleep 600", claim)


def test_garbage_collection_never_takes_an_image_in_use(k: Kubectl, golden: GoldenRegistry, tmp_path: Path) -> None:
    """importsToKeep 1: GC deleted the claim a running pod had mounted and the one a user's own DataSource
    named (Ready=False, PVC not found). Both are kept past the limit, the cron says why, and each is
    collected once released (issue 27, point 5)."""
    first, first_sha = disk(tmp_path, 61)
    claim1 = dv_name("kept-ds", golden.push(first))
    k.apply(cron("kept", {"registry": {"url": golden.url, "secretRef": "creds"}}, "kept-ds", keep=1))
    wait_up_to_date(k, "kept", claim1)
    k.apply(holder("vm-1", claim1))
    wait_for(lambda: (maybe(k, "pod", "vm-1").get("status") or {}).get("phase") == "Running", 60,
             message="the pod holding the first image runs")

    second, second_sha = disk(tmp_path, 62)
    claim2 = dv_name("kept-ds", golden.push(second))
    refresh(k, "kept")
    wait_up_to_date(k, "kept", claim2)
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource", "metadata": {"name": "pinned"},
             "spec": {"source": {"pvc": {"name": claim2, "namespace": "default"}}}})
    wait_ready(k, "pinned")

    third, third_sha = disk(tmp_path, 63)
    claim3 = dv_name("kept-ds", golden.push(third))
    refresh(k, "kept")
    wait_up_to_date(k, "kept", claim3)
    wait_source(k, "kept-ds", claim3)

    def said(claim: str, user: str) -> bool:
        return any(reason == "OutdatedImportInUse" and claim in message and user in message
                   for reason, message in events_of(k, "kept"))

    def in_use_says(*kept: str) -> dict[str, Any] | None:
        """The cron's OutdatedImportsInUse condition when it names exactly `kept` (each "claim (used by ...)")."""
        found = condition(maybe(k, "dataimportcron", "kept"), "OutdatedImportsInUse")
        _, _, listed = str(found.get("message", "")).partition("while in use: ")
        return found if sorted(listed.split("; ")) == sorted(kept) else None
    wait_for(lambda: said(claim1, "Pod default/vm-1") and said(claim2, "DataSource default/pinned"), 60,
             message="the cron says which outdated imports it keeps and why")
    # and its status says so, for whoever reads the cron rather than its events
    kept = wait_for(lambda: in_use_says(f"{claim1} (used by Pod default/vm-1)",
                                        f"{claim2} (used by DataSource default/pinned)"), 60,
                    message="the cron's status names the kept imports and their users")
    assert (kept["status"], kept["reason"]) == ("True", "OutdatedImportInUse")
    assert kept["message"].startswith("Keeping outdated imports beyond importsToKeep (1) while in use: ")
    up = condition(k.get("dataimportcron", "kept"), "UpToDate")
    assert (up["status"], up["reason"]) == ("True", "UpToDate")  # the image is current all the same
    for claim in (claim1, claim2):
        pvc = maybe(k, "pvc", claim)
        assert pvc and not pvc["metadata"].get("deletionTimestamp"), f"{claim} kept"
        assert k.exists("dv", claim)
    wait_ready(k, "pinned")  # still Ready: its image is there
    assert (maybe(k, "pod", "vm-1").get("status") or {}).get("phase") == "Running"
    assert read_back(k, claim2, DISK_SIZE) == second_sha

    # released: collected, without anything else happening to the cron
    k("delete", "pod", "vm-1", "--wait=false")
    wait_for(lambda: not k.exists("pvc", claim1) and not k.exists("dv", claim1), 90,
             message=f"{claim1} collected once the pod is gone")
    assert k.exists("pvc", claim2)
    wait_for(lambda: in_use_says(f"{claim2} (used by DataSource default/pinned)"), 30,
             message=f"the cron's status names {claim2} alone")
    k("delete", "datasource", "pinned")
    wait_for(lambda: not k.exists("pvc", claim2) and not k.exists("dv", claim2), 90,
             message=f"{claim2} collected once no DataSource names it")

    def cleared() -> dict[str, Any] | None:
        found = condition(maybe(k, "dataimportcron", "kept"), "OutdatedImportsInUse")
        return found if found.get("status") == "False" else None
    gone = wait_for(cleared, 30, message="the cron's status says nothing is kept any more")
    assert (gone["reason"], gone["message"]) == ("OutdatedImportsCollected",
                                                 "No outdated import is kept beyond importsToKeep (1)")
    assert read_back(k, claim3, DISK_SIZE) == third_sha
    assert first_sha != third_sha


def test_a_node_pull_cron_imports(k: Kubectl, registries: Any, tmp_path: Path) -> None:
    """The documentation's own example (registry `pullMethod: node`) never imported: its poller asked the
    image's file server for a file that is not there. As CDI, the node pulls the image and reports its
    digest; the import pulls that digest by the node (issue 27, point 6)."""
    image, sha = disk(tmp_path, 71)

    def build(layout: Path) -> None:
        oci.build(layout, [oci.Layer({"disk/disk.img": image}, compression="gzip")])
    url = registries.push(registries.tls, "e2e/node-golden", build)
    digest = registries.digest(registries.tls, "e2e/node-golden")
    k.apply(cron("nodecron", {"registry": {"url": url, "pullMethod": "node"}}, "nodecron-ds"))
    claim = dv_name("nodecron-ds", digest)
    wait_up_to_date(k, "nodecron", claim, timeout=240)
    wait_source(k, "nodecron-ds", claim)
    wait_ready(k, "nodecron-ds")
    assert read_back(k, claim, DISK_SIZE) == sha
    registry = k.get("dv", claim)["spec"]["source"]["registry"]
    assert registry == {"url": f"docker://{registries.tls.host}/e2e/node-golden@{digest}", "pullMethod": "node"}
    up = condition(k.get("dataimportcron", "nodecron"), "UpToDate")
    assert (up["status"], up["reason"]) == ("True", "UpToDate")


def test_a_poller_that_cannot_start_is_replaced_and_the_cron_says_why(
        k: Kubectl, https_server: FileServer, served_dir: Path, ca: pki.KeyPair, tmp_path: Path) -> None:
    """The template's certConfigMap deleted: the poller pod mounting it never starts. It blocked the cron for
    good while UpToDate stayed True; now it is given up on after the poller timeout, the cron says why, and
    the next run (here refreshNow, once the ConfigMap is back) has a new poller (issue 27, point 9)."""
    image, sha = disk(tmp_path, 81)
    shutil.copy(image, served_dir / "cron-ca.img")
    ca_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cron-ca"},
              "data": {"ca.pem": ca.cert_pem.decode()}}
    k.apply(ca_map)
    source = {"http": {"url": f"{https_server.url}/cron-ca.img", "secretRef": "creds", "certConfigMap": "cron-ca"}}
    k.apply(cron("tls", source, "tls-ds"))
    wait_for(lambda: condition(maybe(k, "dataimportcron", "tls"), "UpToDate").get("status") == "True", 120,
             interval=0.3, message="the first import")
    claim = k.get("dataimportcron", "tls")["status"]["lastImportedPVC"]["name"]
    assert read_back(k, claim, DISK_SIZE) == sha

    k("delete", "configmap", "cron-ca")
    refresh(k, "tls")
    poller = f"poller-tls-{k.get('dataimportcron', 'tls')['metadata']['uid'][:8]}"
    wait_for(lambda: k.exists("pod", poller), 30, message="the run's poller pod")

    def says_why() -> dict[str, Any] | None:
        up = condition(maybe(k, "dataimportcron", "tls"), "UpToDate")
        return up if up.get("reason") == "PollFailed" else None
    up = wait_for(says_why, POLLER_TIMEOUT + 60, interval=0.5, message="the cron gives the stuck poller up")
    assert up["status"] == "False"
    assert f"poller pod {poller} did not finish within {POLLER_TIMEOUT}s" in up["message"]
    assert 'configmap "cron-ca" not found' in up["message"]
    wait_for(lambda: any(reason == "PollerTimedOut" for reason, _ in events_of(k, "tls")), 30,
             message="a PollerTimedOut event")
    wait_for(lambda: not k.exists("pod", poller), 30, message="the stuck poller deleted")
    assert "cdi.kubevirt.io/refreshNow" not in k.get("dataimportcron", "tls")["metadata"]["annotations"]

    k.apply(ca_map)
    refresh(k, "tls")
    wait_for(lambda: condition(maybe(k, "dataimportcron", "tls"), "UpToDate").get("reason") == "UpToDate", 120,
             interval=0.3, message="the next run's poller answers")
    assert k.get("dataimportcron", "tls")["status"]["lastImportedPVC"]["name"] == claim


@pytest.mark.anycluster
def test_a_cron_cloning_a_claim_as_cdi_does(k: Kubectl, tmp_path: Path, served_dir: Path,
                                            range_server: FileServer) -> None:
    """CDI admits a cron whose template clones a PVC and takes the claim's uid as its version; here it was
    admitted and then failed every poll (`unknown IMPORTER_SOURCE ''`). The clone is made only when the
    cron's service account may clone the claim, as CDI asks (issue 27, point 9)."""
    image, sha = disk(tmp_path, 91)
    shutil.copy(image, served_dir / "cron-pvc-source.img")
    k.apply(datavolume("golden-src", {"http": {"url": f"{range_server.url}/cron-pvc-source.img"}}, "16Mi"))
    wait_phase(k, "golden-src", "Succeeded")
    uid = k.get("pvc", "golden-src")["metadata"]["uid"]
    source = {"pvc": {"namespace": "default", "name": "golden-src"}}

    # a service account that may not clone it: no DataVolume, and the cron says why
    stranger = cron("stranger", source, "stranger-ds")
    stranger["spec"]["serviceAccountName"] = "nobody"
    k.apply(stranger)

    def refused() -> dict[str, Any] | None:
        progressing = condition(maybe(k, "dataimportcron", "stranger"), "Progressing")
        return progressing if progressing.get("reason") == "NotAuthorized" else None
    progressing = wait_for(refused, 60, interval=0.5, message="the cron says it may not clone")
    assert "system:serviceaccount:default:nobody may not clone PVC default/golden-src" in progressing["message"]
    assert not k.exists("dv", dv_name("stranger-ds", f"uid:{uid}"))
    k("delete", "dataimportcron", "stranger")

    # the default service account may (CDI's datavolumes/source): cloned, the DataSource points at it
    k.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "clone-source"},
             "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes/source"], "verbs": ["create"]}]})
    k.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "clone-source"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "clone-source"},
             "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]})
    k.apply(cron("cloned", source, "cloned-ds"))
    claim = dv_name("cloned-ds", f"uid:{uid}")
    assert claim == f"cloned-ds-{uid[:12]}"  # CDI's createDvName
    wait_up_to_date(k, "cloned", claim)
    wait_source(k, "cloned-ds", claim)
    wait_ready(k, "cloned-ds")
    assert k.get("dataimportcron", "cloned")["metadata"]["annotations"][
        "cdi.kubevirt.io/storage.import.sourceDesiredDigest"] == f"uid:{uid}"
    assert k.get("dv", claim)["spec"]["source"] == source
    assert read_back(k, claim, DISK_SIZE) == sha
