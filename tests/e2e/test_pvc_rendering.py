"""CDI's PVC mutating webhook on `cdi up`: a bare PVC labelled `cdi.kubevirt.io/applyStorageProfile:
"true"` gets the access modes, volume mode and size its StorageProfile gives a DataVolume's claim;
CDIConfig `webhookPvcRendering: Disabled` removes the webhook and claims are left as written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.importing import datavolume, wait_phase
from tests.support.cluster import Kubectl, wait_for

LABEL = "cdi.kubevirt.io/applyStorageProfile"
CONFIGURATION = "cdi-api-pvc-mutate"
DENIED = 'admission webhook "pvc-mutate.cdi.kubevirt.io" denied the request: '


def claim(name: str, size: str | None = "100Mi", *, labelled: bool = True, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                            "metadata": {"name": name, "labels": {LABEL: "true"} if labelled else {}},
                            "spec": {**spec, "resources": {"requests": {"storage": size} if size else {}}}}
    return body


def stored_spec(k: Kubectl, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = k.get("pvc", name)["spec"]
    return spec


def requested(spec: dict[str, Any]) -> str:
    return str(spec["resources"]["requests"]["storage"])


def twin_claim(k: Kubectl, name: str, size: str, **labels: str) -> dict[str, Any]:
    """The claim CDI's DataVolume controller renders for the same request (a blank `storage` DataVolume)."""
    dv = datavolume(name, {"blank": {}}, size, storage_class="local")
    dv["metadata"]["labels"] = labels
    k.apply(dv)
    wait_for(lambda: k.exists("pvc", name), 60, message=f"claim of DataVolume {name}")
    return stored_spec(k, name)


def set_cdi_config(k: Kubectl, config: dict[str, Any]) -> None:
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": {"config": None}}))
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": {"config": config}}))


@pytest.fixture(scope="module")
def webhook(shared_kubectl: Kubectl) -> Kubectl:
    wait_for(lambda: shared_kubectl.exists("mutatingwebhookconfiguration", CONFIGURATION, ""), 60,
             message="the PVC mutating webhook registered (enabled by default, as CDI)")
    return shared_kubectl


def test_the_webhook_is_registered_as_cdis(webhook: Kubectl) -> None:
    hook = webhook.json("get", "mutatingwebhookconfiguration", CONFIGURATION)["webhooks"][0]
    assert hook["name"] == "pvc-mutate.cdi.kubevirt.io"
    assert hook["objectSelector"] == {"matchLabels": {LABEL: "true"}}
    assert hook["rules"][0]["operations"] == ["CREATE"]
    assert hook["rules"][0]["resources"] == ["persistentvolumeclaims"]
    assert hook["clientConfig"]["service"]["path"] == "/pvc-mutate"
    assert hook["failurePolicy"] == "Fail"


def test_a_labelled_claim_is_completed_as_a_datavolumes_would_be(webhook: Kubectl) -> None:
    k = webhook
    twin = twin_claim(k, "twin", "100Mi")
    assert int(requested(twin)) > 100 << 20  # the filesystem overhead is added

    k.apply(claim("bare-filesystem", storageClassName="local"))
    spec = stored_spec(k, "bare-filesystem")
    assert spec["accessModes"] == twin["accessModes"] == ["ReadWriteOnce"]
    assert spec["volumeMode"] == "Filesystem"
    assert requested(spec) == requested(twin)

    k.apply(claim("bare-default-class"))
    spec = stored_spec(k, "bare-default-class")
    assert (spec["storageClassName"], spec["accessModes"], requested(spec)) == \
        ("local", ["ReadWriteOnce"], requested(twin))
    wait_for(lambda: k.get("pvc", "bare-default-class")["status"].get("phase") == "Bound", 60,
             message="the rendered claim is provisioned")


def test_from_storage_profile_takes_the_profiles_volume_mode(webhook: Kubectl) -> None:
    k = webhook
    k.apply({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "rendered-block"},
             "provisioner": "local.storage.cdi.kubevirt.io", "volumeBindingMode": "Immediate"})
    wait_for(lambda: k.exists("storageprofile", "rendered-block", ""), 60, message="profile of the new class")
    wanted = [{"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}]
    k("patch", "storageprofile", "rendered-block", "--type", "merge", "-p",
      json.dumps({"spec": {"claimPropertySets": wanted}}))
    wait_for(lambda: k.json("get", "storageprofile", "rendered-block")["status"].get("claimPropertySets") == wanted,
             60, message="the profile's claim properties")

    k.apply(claim("bare-block", storageClassName="rendered-block", volumeMode="FromStorageProfile"))
    spec = stored_spec(k, "bare-block")
    assert (spec["accessModes"], spec["volumeMode"]) == (["ReadWriteMany"], "Block")
    assert requested(spec) == str(100 << 20)  # a block volume needs no room for a filesystem


def test_a_claim_that_cannot_be_rendered_is_refused_with_cdis_words(webhook: Kubectl) -> None:
    result = webhook.apply(claim("bare-sizeless", None, storageClassName="local"), check=False)
    assert result.returncode != 0
    assert DENIED + "PVC Spec is not valid - missing storage size" in result.stderr
    assert not webhook.exists("pvc", "bare-sizeless")


def test_an_unlabelled_claim_is_not_touched(webhook: Kubectl) -> None:
    k = webhook
    result = k.apply(claim("plain-no-modes", labelled=False, storageClassName="local"), check=False)
    assert result.returncode != 0 and "at least 1 access mode is required" in result.stderr
    k.apply(claim("plain", labelled=False, storageClassName="local", accessModes=["ReadWriteOnce"]))
    assert requested(stored_spec(k, "plain")) == "100Mi"


def test_a_labelled_datavolume_is_rendered_once_by_the_webhook(webhook: Kubectl) -> None:
    k = webhook
    plain = twin_claim(k, "dv-plain", "100Mi")
    labelled = twin_claim(k, "dv-labelled", "100Mi", **{LABEL: "true"})
    assert (labelled["accessModes"], labelled["volumeMode"], requested(labelled)) == \
        (plain["accessModes"], plain["volumeMode"], requested(plain))
    wait_phase(k, "dv-labelled", "Succeeded")


def test_disabled_the_webhook_is_removed_and_claims_are_left_alone(webhook: Kubectl) -> None:
    k = webhook
    try:
        set_cdi_config(k, {"webhookPvcRendering": "Disabled"})
        wait_for(lambda: not k.exists("mutatingwebhookconfiguration", CONFIGURATION, ""), 60,
                 message="the webhook configuration removed")
        k.apply(claim("left-alone", storageClassName="local", accessModes=["ReadWriteOnce"]))
        spec = stored_spec(k, "left-alone")
        assert (spec["volumeMode"], requested(spec)) == ("Filesystem", "100Mi")
        result = k.apply(claim("left-unrendered", storageClassName="local", volumeMode="FromStorageProfile"),
                         check=False)
        assert result.returncode != 0 and "at least 1 access mode is required" in result.stderr

        # the old feature gate is still accepted and changes nothing: rendering is on unless Disabled
        set_cdi_config(k, {"featureGates": ["WebhookPvcRendering"]})
        wait_for(lambda: k.exists("mutatingwebhookconfiguration", CONFIGURATION, ""), 60,
                 message="the webhook configuration back")
        k.apply(claim("rendered-again", storageClassName="local"))
        assert stored_spec(k, "rendered-again")["accessModes"] == ["ReadWriteOnce"]
    finally:
        set_cdi_config(k, {})
