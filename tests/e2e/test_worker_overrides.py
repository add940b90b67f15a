"""Per-DataVolume worker overrides (issue 30 point 4, an extension): a DataVolume that asks for more memory
for its importer gets importer pods with those resources, whichever path fills it (its own claim, or a
populator's prime claim), and still succeeds with the right bytes; a malformed override, or one above the cap
an admin put on CDIConfig, is refused at admission with a message naming the annotation (and the cap)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.importing import datavolume, read_back, wait_phase
from tests.e2e.workloads import new_namespace
from tests.support.cluster import Kubectl
from tests.support.images import Image
from tests.support.servers import FileServer

pytestmark = pytest.mark.anycluster

RESOURCES = "extensions.cdi.dev/worker.resources"
PLACEMENT = "extensions.cdi.dev/worker.placement"
CAP = "extensions.cdi.dev/worker.maxResources"
RETAIN = "cdi.kubevirt.io/storage.pod.retainAfterCompletion"
USE_POPULATOR = "cdi.kubevirt.io/storage.usePopulator"
DENIED = 'admission webhook "datavolume-validate.cdi.kubevirt.io" denied the request:  '
ASKED = {"requests": {"memory": "200Mi"}, "limits": {"memory": "1536Mi"}}


def importer_pods(k: Kubectl, namespace: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = k.json("get", "pods", "-n", namespace, "-l", "cdi.kubevirt.io=importer")["items"]
    return pods


def test_a_memory_override_reaches_the_importers_and_the_import_succeeds(
        k: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    """One DataVolume filled through its own claim, one through a populator's prime claim (where the
    cluster's storage has one): every importer pod they get (kept after completion to be looked at) has the
    memory the DataVolume asked for, the rest of CDIConfig's defaults, and the bytes arrive."""
    image = images["qcow2.qcow2"]
    ns = new_namespace(k, "overrides")
    source = {"http": {"url": f"{range_server.url}/{image.name}"}}
    names = ("own-claim", "populated")
    for name, populator in zip(names, ("false", "true"), strict=True):
        dv = datavolume(name, source, "64Mi", annotations={
            RESOURCES: json.dumps(ASKED), RETAIN: "true", USE_POPULATOR: populator})
        k.apply(dv, "-n", ns)
    for name in names:
        wait_phase(k, name, "Succeeded", namespace=ns)
        assert read_back(k, name, image.virtual_size, namespace=ns) == image.sha256
    pods = importer_pods(k, ns)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]  # one per path, kept after completion
    defaults = k.get("cdiconfig", "config").get("status", {}).get("defaultPodResourceRequirements") or {}
    for pod in pods:
        for container in pod["spec"]["containers"]:
            resources = container["resources"]
            assert resources["limits"]["memory"] == "1536Mi", pod["metadata"]["name"]
            assert resources["requests"]["memory"] == "200Mi", pod["metadata"]["name"]
            if "cpu" in (defaults.get("limits") or {}):
                assert resources["limits"]["cpu"] == defaults["limits"]["cpu"]  # the rest stays the cluster's


@pytest.mark.parametrize(("annotations", "message"), [
    ({RESOURCES: '{"limits": {"memory": "1Gi"'}, f"{RESOURCES}: not valid JSON"),
    ({RESOURCES: '{"limits": {"memory": "-1Gi"}}'}, f"{RESOURCES}: limits.memory -1Gi must not be negative"),
    ({RESOURCES: '{"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}'},
     f"{RESOURCES}: limits.memory 1Gi is below requests.memory 2Gi"),
    ({PLACEMENT: '{"nodeselector": {"disk": "nvme"}}'}, f"{PLACEMENT}: unknown field 'nodeselector'"),
])
def test_a_malformed_override_is_refused_naming_the_annotation(k: Kubectl, annotations: dict[str, str],
                                                               message: str) -> None:
    ns = new_namespace(k, "overrides")
    result = k.apply(datavolume("refused", {"blank": {}}, "16Mi", annotations=annotations), "-n", ns, check=False)
    assert result.returncode != 0
    assert DENIED + message in result.stderr
    assert not k.exists("dv", "refused", ns)


def test_an_override_above_the_admins_cap_is_refused_with_the_cap(k: Kubectl) -> None:
    """The cap is an annotation on CDIConfig `config`: asking above it is refused and the message says the
    cap; asking within it is admitted and the DataVolume succeeds."""
    ns = new_namespace(k, "overrides")
    k("annotate", "cdiconfig", "config", f'{CAP}={{"memory": "1Gi"}}', "--overwrite")
    try:
        over = datavolume("over-cap", {"blank": {}}, "16Mi",
                          annotations={RESOURCES: '{"limits": {"memory": "4Gi"}}'})
        result = k.apply(over, "-n", ns, check=False)
        assert result.returncode != 0
        assert DENIED + f"{RESOURCES}: limits.memory 4Gi above the cap {CAP} on CDIConfig: memory 1Gi" in result.stderr
        assert not k.exists("dv", "over-cap", ns)
        within = datavolume("within-cap", {"blank": {}}, "16Mi",
                            annotations={RESOURCES: '{"limits": {"memory": "1Gi"}}'})
        k.apply(within, "-n", ns)
        wait_phase(k, "within-cap", "Succeeded", namespace=ns)
    finally:
        k("annotate", "cdiconfig", "config", f"{CAP}-")
