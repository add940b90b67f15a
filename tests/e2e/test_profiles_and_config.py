"""StorageProfiles follow StorageClasses, CDIConfig reflects the CDI resource, and the controller's
metrics carry CDI's names."""

from __future__ import annotations

import json
import re
import urllib.request

from tests.support.cluster import CdiUp, Kubectl, wait_for


def test_a_profile_per_storage_class(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    wait_for(lambda: k.exists("storageprofile", "local", "") and k.exists("storageprofile", "local-nosnap", ""),
             30, message="profiles for the local classes")
    local = k.json("get", "storageprofile", "local")
    assert local["status"]["provisioner"] == "local.storage.cdi.kubevirt.io"
    assert local["status"]["cloneStrategy"] == "csi-clone"
    assert local["status"]["snapshotClass"] == "local"
    assert local["status"]["claimPropertySets"][0] == {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}
    recognized = local["status"]["conditions"][0]
    assert (recognized["type"], recognized["status"], recognized["reason"]) == \
        ("Recognized", "True", "RecognizedProvisioner")
    assert k.json("get", "storageprofile", "local-nosnap")["status"]["cloneStrategy"] == "copy"
    k.apply({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "mystery"},
             "provisioner": "example.com/unknown"})
    wait_for(lambda: k.exists("storageprofile", "mystery", ""), 30, message="profile for a new class")
    mystery = k.json("get", "storageprofile", "mystery")
    assert mystery["status"]["conditions"][0]["reason"] == "UnrecognizedProvisioner"
    assert "claimPropertySets" not in mystery["status"]
    k("patch", "storageprofile", "mystery", "--type", "merge", "-p", json.dumps(
        {"spec": {"claimPropertySets": [{"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}]}}))
    wait_for(lambda: k.json("get", "storageprofile", "mystery")["status"].get("claimPropertySets") ==
             [{"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}], 30, message="spec overrides the table")
    k("delete", "storageclass", "mystery")
    wait_for(lambda: not k.exists("storageprofile", "mystery", ""), 30, message="profile deleted with its class")


def test_cdiconfig_follows_the_cdi_resource(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    wait_for(lambda: k.exists("cdiconfig", "config", ""), 30, message="CDIConfig")
    status = k.json("get", "cdiconfig", "config")["status"]
    assert status["filesystemOverhead"]["global"] == "0.06"
    assert status["filesystemOverhead"]["storageClass"]["local"] == "0.06"
    assert status["defaultPodResourceRequirements"]["limits"]["memory"] == "600M"
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": {"config": {
        "filesystemOverhead": {"global": "0.1", "storageClass": {"local-wffc": "0.2"}},
        "scratchSpaceStorageClass": "local-wffc", "uploadProxyURLOverride": "https://upload.example.com"}}}))

    def updated() -> bool:
        current = k.json("get", "cdiconfig", "config")["status"]
        return current["filesystemOverhead"]["global"] == "0.1"
    wait_for(updated, 30, message="CDIConfig status from the CDI resource")
    status = k.json("get", "cdiconfig", "config")["status"]
    assert status["filesystemOverhead"]["storageClass"] == {"local": "0.1", "local-wffc": "0.2", "local-nosnap": "0.1"}
    assert status["scratchSpaceStorageClass"] == "local-wffc"
    assert status["uploadProxyURL"] == "https://upload.example.com"
    assert k.json("get", "cdi", "cdi")["status"]["phase"] == "Deployed"
    k("patch", "cdi", "cdi", "--type", "merge", "-p", '{"spec":{"config":{}}}')


def test_controller_metrics_carry_cdis_names(shared_cdi_up: CdiUp, shared_kubectl: Kubectl) -> None:
    url = re.search(r"controller metrics (\S+)", shared_cdi_up.log_path.read_text())
    assert url, "cdi up prints where the controller's metrics are"

    def scrape() -> str:
        with urllib.request.urlopen(url.group(1), timeout=5) as resp:
            text: str = resp.read().decode()
            return text
    wait_for(lambda: 'storageclass="local"' in scrape(), 30, message="storageprofile_info for local")
    text = scrape()
    local = next(line for line in text.splitlines()
                 if line.startswith("kubevirt_cdi_storageprofile_info{") and 'storageclass="local"' in line)
    assert 'smartclone="true"' in local and 'default="true"' in local
    assert 'degraded="false"' in local  # one node: no RWX needed for live migration
    assert "kubevirt_cdi_datavolume_pending 0.0" in text
    assert 'cdi_controller_reconciles_total{controller="storageprofile",outcome="success"}' in text
    assert "cdi_controller_workqueue_depth" in text
