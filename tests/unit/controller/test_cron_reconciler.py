"""The DataImportCron reconciler against the in-memory fake client (issue 27): the states a user cannot
easily make on a live cluster (a schedule stored before admission refused it, a poller pod stuck for
longer than its timeout) and the pod a node-pull cron's run is, in milliseconds. The end-to-end tests
(tests/e2e/test_dataimportcron.py) show the same against `cdi up` where it can be made there."""

from __future__ import annotations

import datetime
import json
from typing import Any

from cdi.api import groups
from cdi.controller.dataimportcron import DataImportCronReconciler, dv_name, poller_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.conftest import NAMESPACE, events_of, reconciled

Obj = dict[str, Any]
A = "cdi.kubevirt.io/storage.import."
DIGEST = "sha256:" + "c0ffee" * 10 + "abcd"
REGISTRY = "docker://registry.example:5000/golden/fedora:latest"


def cron(name: str, source: Obj, schedule: str = "0 0 1 1 *", annotations: dict[str, str] | None = None) -> Obj:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": dict(annotations or {})},
            "spec": {"schedule": schedule, "managedDataSource": f"{name}-ds",
                     "template": {"spec": {"source": source,
                                           "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}}}


def finish(kube: FakeKube, pod: Obj, status: Obj) -> None:
    pod["status"] = status
    kube.add(groups.PODS, pod)


def poller(kube: FakeKube, c: Obj) -> Obj:
    pod = kube.object(groups.PODS, poller_name(c), NAMESPACE)
    assert pod is not None, kube.created(groups.PODS)
    return pod


def reported(digest: str) -> Obj:
    return {"phase": "Succeeded", "containerStatuses": [{"name": "importer", "state": {"terminated": {
        "exitCode": 0, "reason": "Completed", "message": json.dumps({"sourceDigest": digest})}}}]}


def up_to_date(kube: FakeKube, name: str) -> dict[str, str]:
    obj = kube.object(groups.DATAIMPORTCRONS, name, NAMESPACE)
    assert obj is not None
    return next(c for c in obj["status"]["conditions"] if c["type"] == "UpToDate")


async def test_a_schedule_that_never_fires_polls_once_and_says_why(kube: FakeKube, ctx: Context) -> None:
    """`0 0 31 2 *` (stored before admission refused it) made every reconcile raise CroniterBadDateError."""
    c = kube.add(groups.DATAIMPORTCRONS, cron("feb31", {"registry": {"url": REGISTRY}}, schedule="0 0 31 2 *"))
    reconciler = DataImportCronReconciler(ctx)
    await reconciled(reconciler, "feb31")  # created: polled once
    finish(kube, poller(kube, c), reported(DIGEST))
    await reconciled(reconciler, "feb31")
    stored = kube.object(groups.DATAIMPORTCRONS, "feb31", NAMESPACE)
    assert stored is not None
    assert stored["metadata"]["annotations"][A + "sourceDesiredDigest"] == DIGEST
    assert A + "nextCronTime" not in stored["metadata"]["annotations"]
    assert await reconciled(reconciler, "feb31") is None  # imports, and waits for nothing
    assert kube.object(groups.DATAVOLUMES, str(dv_name("feb31-ds", DIGEST)), NAMESPACE) is not None
    assert await reconciled(reconciler, "feb31") is None
    warnings = [e for e in await events_of(ctx, "feb31") if e[0] == "Warning"]
    assert ("Warning", "NoScheduledRun", "schedule '0 0 31 2 *' names no time that ever comes: the source is "
            "polled only when the cron is created and on cdi.kubevirt.io/refreshNow") in warnings


async def test_a_poller_that_cannot_start_is_given_up_on_and_the_cron_says_why(kube: FakeKube, ctx: Context) -> None:
    """A poller mounting a ConfigMap that is gone stays Pending: it blocked every later run while UpToDate
    stayed True. After the poller timeout it goes, the cron is not UpToDate and says why, the next run
    starts a new poller."""
    now = [datetime.datetime.now(datetime.UTC)]
    reconciler = DataImportCronReconciler(ctx, clock=lambda: now[0])
    source = {"http": {"url": "https://images.example/disk.img", "certConfigMap": "gone-ca"}}
    c = kube.add(groups.DATAIMPORTCRONS, cron("stuck", source, annotations={
        A + "sourceDesiredDigest": DIGEST, A + "lastCronTime": "2026-01-01T00:00:00Z",
        A + "nextCronTime": "2026-01-01T00:00:00Z"}))  # it ran before; its next run is due
    kube.add(groups.PVCS, {"metadata": {"name": str(dv_name("stuck-ds", DIGEST)), "namespace": NAMESPACE,
                                        "labels": {"cdi.kubevirt.io/dataImportCron": "stuck"}},
                           "spec": {}, "status": {"phase": "Bound"}})
    stored = kube.object(groups.DATAIMPORTCRONS, "stuck", NAMESPACE)
    assert stored is not None
    stored["status"] = {"currentImports": [{"DataVolumeName": dv_name("stuck-ds", DIGEST), "Digest": DIGEST}]}
    kube.add(groups.DATAIMPORTCRONS, stored)
    await reconciled(reconciler, "stuck")
    pod = poller(kube, c)
    assert {"name": "cdi-cert-vol", "configMap": {"name": "gone-ca"}} in pod["spec"]["volumes"]
    finish(kube, pod, {"phase": "Pending", "containerStatuses": [
        {"name": "importer", "state": {"waiting": {"reason": "ContainerCreating"}}}]})
    kube.add(groups.EVENTS, {"metadata": {"name": "p.1", "namespace": NAMESPACE}, "type": "Warning",
                             "reason": "FailedMount", "message": 'MountVolume.SetUp failed: configmap "gone-ca" '
                             "not found", "involvedObject": {"kind": "Pod", "name": poller_name(c)}})

    now[0] += datetime.timedelta(seconds=60)
    assert await reconciled(reconciler, "stuck") == 1.0  # still within its time (600s by default: --poller-timeout)
    assert kube.object(groups.PODS, poller_name(c), NAMESPACE) is not None

    now[0] += datetime.timedelta(seconds=600)
    await reconciled(reconciler, "stuck")
    assert kube.object(groups.PODS, poller_name(c), NAMESPACE) is None
    await reconciled(reconciler, "stuck")
    condition = up_to_date(kube, "stuck")
    assert (condition["status"], condition["reason"]) == ("False", "PollFailed")
    assert "did not finish within 600s" in condition["message"]
    assert 'configmap "gone-ca" not found' in condition["message"]
    assert any(e[1] == "PollerTimedOut" for e in await events_of(ctx, "stuck"))

    # the next run (refreshNow here) starts a new poller; a version reported clears the failure
    stored = kube.object(groups.DATAIMPORTCRONS, "stuck", NAMESPACE)
    assert stored is not None
    stored["metadata"]["annotations"]["cdi.kubevirt.io/refreshNow"] = ""
    kube.add(groups.DATAIMPORTCRONS, stored)
    await reconciled(reconciler, "stuck")
    finish(kube, poller(kube, c), reported(DIGEST))
    await reconciled(reconciler, "stuck")
    await reconciled(reconciler, "stuck")
    assert (up_to_date(kube, "stuck")["status"], up_to_date(kube, "stuck")["reason"]) == ("True", "UpToDate")


async def test_a_node_pull_cron_is_polled_by_the_node_as_cdi_does(kube: FakeKube, ctx: Context) -> None:
    """The poller runs the user's image (pulled Always) and the version is the digest the node pulled;
    before, the importer asked the image's own file server for a file that is not there (404)."""
    source = {"registry": {"url": REGISTRY, "pullMethod": "node"}}
    c = kube.add(groups.DATAIMPORTCRONS, cron("nodepull", source))
    reconciler = DataImportCronReconciler(ctx)
    await reconciled(reconciler, "nodepull")
    pod = poller(kube, c)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["init"]
    [container] = pod["spec"]["containers"]
    assert container["name"] == "image-container"
    assert container["image"] == "registry.example:5000/golden/fedora:latest"
    assert container["imagePullPolicy"] == "Always"
    assert container["command"] == ["/shared/server", "-h"]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DataImportCron"
    assert pod["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"] == "nodepull"

    finish(kube, pod, {"phase": "Succeeded", "containerStatuses": [{
        "name": "image-container", "image": container["image"],
        "imageID": f"registry.example:5000/golden/fedora@{DIGEST}",
        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]})
    await reconciled(reconciler, "nodepull")
    await reconciled(reconciler, "nodepull")
    dv = kube.object(groups.DATAVOLUMES, str(dv_name("nodepull-ds", DIGEST)), NAMESPACE)
    assert dv is not None
    assert dv["spec"]["source"]["registry"] == {"url": f"docker://registry.example:5000/golden/fedora@{DIGEST}",
                                                "pullMethod": "node"}


async def test_a_node_pull_image_that_cannot_be_pulled_fails_the_run(kube: FakeKube, ctx: Context) -> None:
    c = kube.add(groups.DATAIMPORTCRONS, cron("nopull", {"registry": {"url": REGISTRY, "pullMethod": "node"}}))
    reconciler = DataImportCronReconciler(ctx)
    await reconciled(reconciler, "nopull")
    finish(kube, poller(kube, c), {"phase": "Pending", "containerStatuses": [{
        "name": "image-container", "image": "registry.example:5000/golden/fedora:latest",
        "state": {"waiting": {"reason": "ImagePullBackOff"}}}]})
    await reconciled(reconciler, "nopull")
    assert kube.object(groups.PODS, poller_name(c), NAMESPACE) is None
    await reconciled(reconciler, "nopull")
    condition = up_to_date(kube, "nopull")
    assert (condition["status"], condition["reason"]) == ("False", "PollFailed")
    assert "failed to pull image: registry.example:5000/golden/fedora:latest" in condition["message"]
