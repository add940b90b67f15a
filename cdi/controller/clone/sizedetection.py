"""CDI's size-detection pod: `size-detection-<source claim uid>` in the source's namespace, the importer
image running `cdi-image-size-detection -image-path /data/disk.img` on the source claim, which ends with
the disk image's virtual size as its termination message (see `cdi.importer.sizedetection`). Events on
the DataVolume as CDI: `ImportPVCNotReady` while the source is still being filled, then
`SizeDetectionPodCreated`, `SizeDetectionPodNotReady`, and on failure a Warning named by the exit code
("Size-detection pod failed due to ErrInvalidFile").

Unlike CDI the pod is `restartPolicy: Never` and is deleted as soon as its answer is read (CDI keeps it
until the DataVolume succeeds, and an `OnFailure` pod that fails restarts without a word)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.owners import owner_reference
from cdi.api.views import ClaimView, DataVolumeView, PodView
from cdi.controller.workerpod import PodSettings, worker_pod

Obj = dict[str, Any]
Body = Mapping[str, Any]

CONTAINER = "size-detection-volume"
COMMAND = "cdi-image-size-detection"
IMAGE_PATH = "/data/disk.img"  # CDI's ImporterWritePath, on the claim mounted at /data
COMPONENT = "importer"  # CDI labels the pod as an importer pod

SIZE_DETECTION_POD_CREATED = ("SizeDetectionPodCreated", "Size-detection pod created")
SIZE_DETECTION_POD_NOT_READY = ("SizeDetectionPodNotReady", "The size detection pod is not finished yet")
IMPORT_PVC_NOT_READY = ("ImportPVCNotReady", "The source PVC is not fully imported")
MESSAGE_POD_FAILED = "Size-detection pod failed due to {}"
EXIT_REASONS = {1: "ErrBadArguments", 2: "ErrInvalidFile", 3: "ErrInvalidPath", 4: "ErrBadTermFile"}


def pod_name(source: Body) -> str:
    return f"size-detection-{ClaimView(source).uid}"


def size_detection_pod(source: Body, dv: Body, image: str, settings: PodSettings) -> Obj:
    """The pod for `source` (a claim), owned by the DataVolume in its namespace, else annotated with it."""
    claim, owner_dv = ClaimView(source), DataVolumeView(dv)
    namespace = claim.namespace
    container: Obj = {"name": CONTAINER, "image": image, "command": [COMMAND], "args": ["-image-path", IMAGE_PATH],
                      "volumeMounts": [{"name": "cdi-data-vol", "mountPath": "/data", "readOnly": True}]}
    pod = worker_pod(name=pod_name(source), namespace=namespace, component=COMPONENT, annotated=dv,
                     owner=owner_reference(groups.DATAVOLUMES, dv),
                     containers=[container], restart_policy="Never", settings=settings,
                     volumes=[{"name": "cdi-data-vol", "persistentVolumeClaim": {
                         "claimName": claim.name, "readOnly": True}}])
    if owner_dv.namespace != namespace:  # no owner reference across namespaces
        del pod["metadata"]["ownerReferences"]
        pod["metadata"]["annotations"].update({
            ann.OWNED_BY_DATAVOLUME: owner_dv.key, ann.OWNER_UID: owner_dv.uid})
    return pod


def terminated(pod: Body) -> Body | None:
    return PodView(pod).first_terminated


def result(pod: Body) -> int | None:
    """The virtual size a succeeded pod reported."""
    if PodView(pod).phase != "Succeeded":
        return None
    try:
        return int(str((terminated(pod) or {}).get("message") or "").strip())
    except ValueError:
        return None


def failure(pod: Body) -> str | None:
    """The event reason of a pod that failed (or succeeded without a number), else None."""
    phase = PodView(pod).phase
    if phase == "Failed" or (phase == "Succeeded" and result(pod) is None):
        code = int((terminated(pod) or {}).get("exitCode") or 0)
        return EXIT_REASONS.get(code, "ErrUnknown")
    return None
