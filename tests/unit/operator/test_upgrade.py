"""Upgrading cdi in place (issue 29 item 2), the operator's part, against the in-memory fake client: one version
of the operator installs, another takes over the same `CDI` resource, as when `cdi manifests` of a new build is
applied over an old one. Each test names the behaviour of CDI's operator it mirrors (its reconciler is
kubevirt/controller-lifecycle-operator-sdk's `pkg/sdk/reconciler`, with CDI's hooks in
`pkg/operator/controller`), or says where cdi's differs and why.

The rollout itself is the Deployment controller's: here the tests write the Deployments' status as it reports
a rolling update (old pods ready, new ones coming), which is all the operator reads of it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cdi.api import groups
from cdi.kube import LeaderElectionConfig
from cdi.operator import versions
from cdi.operator.main import images_from_env, run_elected, version_from_env
from cdi.operator.reconciler import Operator
from cdi.operator.resources import DEPLOYMENTS, Images
from tests.support.fakekube import FakeKube

Obj = dict[str, Any]
NS = "cdi"
WORK = "work"
COMPONENTS = ("cdi-deployment", "cdi-apiserver", "cdi-uploadproxy")
CLUSTER_ROLES = groups.GVR("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False)
UPDATE_VERSION = "operator.cdi.kubevirt.io/updateVersion"
CREATE_VERSION = "operator.cdi.kubevirt.io/createVersion"


def operator(kube: FakeKube, version: str) -> Operator:
    """The operator of one build: its images tagged with its version, as `cdi manifests --tag` makes it."""
    op = Operator(kube, NS, Images(tag=version))
    op.deployments = kube.informer(DEPLOYMENTS)  # what the running operator's informer would hold
    return op


def rollout(kube: FakeKube, name: str, *, replicas: int, ready: int, updated: int) -> None:
    """Write a component Deployment's status as the Deployment controller reports it."""
    deployment = kube.object(DEPLOYMENTS, name, NS)
    assert deployment is not None
    deployment["status"] = {"observedGeneration": deployment["metadata"].get("generation", 1),
                            "replicas": replicas, "readyReplicas": ready, "updatedReplicas": updated}
    kube.add(DEPLOYMENTS, deployment)


def rolled_out(kube: FakeKube) -> None:
    for name in COMPONENTS:
        want = (kube.object(DEPLOYMENTS, name, NS) or {})["spec"]["replicas"]
        rollout(kube, name, replicas=want, ready=want, updated=want)


def rolling(kube: FakeKube) -> None:
    """Mid rolling update (maxSurge 1, maxUnavailable 0): every old pod still ready, one new pod not yet."""
    for name in COMPONENTS:
        want = (kube.object(DEPLOYMENTS, name, NS) or {})["spec"]["replicas"]
        rollout(kube, name, replicas=want + 1, ready=want, updated=1)


def cdi(kube: FakeKube) -> Obj:
    cr = kube.object(groups.CDIS, "cdi")
    assert cr is not None
    return cr


def condition(cr: Obj, kind: str) -> Obj:
    return next(c for c in cr["status"]["conditions"] if c["type"] == kind)


def conditions(cr: Obj) -> tuple[str, str, str]:
    return (condition(cr, "Available")["status"], condition(cr, "Progressing")["status"],
            condition(cr, "Degraded")["status"])


def image(kube: FakeKube, name: str) -> str:
    deployment = kube.object(DEPLOYMENTS, name, NS)
    assert deployment is not None
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


async def events(op: Operator, kube: FakeKube) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the events on the CDI resource, oldest first."""
    await op.recorder.flush(5)
    return [(e["type"], e["reason"], e["message"]) for e in kube.objects(groups.EVENTS, "default")
            if e["involvedObject"]["kind"] == "CDI"]


async def installed(kube: FakeKube, version: str) -> Operator:
    """`cdi manifests --tag VERSION` and `--cr` applied, the components rolled out: Deployed at VERSION."""
    kube.add(groups.CDIS, {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI", "metadata": {"name": "cdi"},
                           "spec": {"imagePullPolicy": "IfNotPresent"}})
    op = operator(kube, version)
    await op.reconcile()
    rolled_out(kube)
    await op.reconcile()
    cr = cdi(kube)
    assert (cr["status"]["phase"], cr["status"]["observedVersion"]) == ("Deployed", version)
    return op


def work_in_flight(kube: FakeKube) -> dict[tuple[str, str], str]:
    """An import, an upload and a host-assisted clone running, and a DataImportCron: their worker pods and
    Services, claims and DataVolumes, by (kind, name) -> resourceVersion."""
    made: list[tuple[groups.GVR, Obj]] = []
    for name, component in (("importer-dv1", "importer"), ("cdi-upload-up1", "cdi-upload-server"),
                            ("clone-source-pod", "cdi-clone-source")):
        made.append((groups.PODS, {"metadata": {"name": name, "namespace": WORK,
                                                "labels": {"cdi.kubevirt.io": component}},
                                   "spec": {"containers": [{"name": "w", "image": "localhost/cdi/cdi-importer:old"}]},
                                   "status": {"phase": "Running"}}))
    made.append((groups.SERVICES, {"metadata": {"name": "cdi-upload-up1", "namespace": WORK,
                                                "labels": {"cdi.kubevirt.io": "cdi-upload-server"}}}))
    for name in ("dv1", "up1", "clone1"):
        made.append((groups.DATAVOLUMES, {"metadata": {"name": name, "namespace": WORK}, "spec": {},
                                          "status": {"phase": "ImportInProgress", "progress": "45.00%"}}))
        made.append((groups.PVCS, {"metadata": {"name": name, "namespace": WORK}, "spec": {}}))
    made.append((groups.DATAIMPORTCRONS, {"metadata": {"name": "cron", "namespace": WORK},
                                          "spec": {"schedule": "0 */12 * * *"}}))
    return {(gvr.kind, obj["metadata"]["name"]): kube.add(gvr, obj)["metadata"]["resourceVersion"]
            for gvr, obj in made}


def untouched(kube: FakeKube, before: dict[tuple[str, str], str]) -> None:
    kinds = {g.kind: g for g in (groups.PODS, groups.SERVICES, groups.DATAVOLUMES, groups.PVCS,
                                 groups.DATAIMPORTCRONS)}
    for (kind, name), version in before.items():
        now = kube.object(kinds[kind], name, WORK)
        assert now is not None, f"{kind} {name} was deleted"
        assert now["metadata"]["resourceVersion"] == version, f"{kind} {name} was written"
    assert not [w for w in kube.writes if w.namespace == WORK]


# -- versions -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("previous", "new", "upgrade", "refused"), [
    # the table of CDI's controller_test.go "check detects upgrade correctly"
    ("v1.9.5", "v1.10.0", True, False), ("v1.10.0", "v1.9.5", False, True), ("v1.10.0", "v1.10.0", False, False),
    ("devel", "v1.9.5", True, False), ("1.9.5", "1.10.0", True, False), ("1.10.0", "1.9.5", False, True),
    ("1.10.0", "1.10.0", False, False), ("devel1.9.5", "devel1.9.5", False, False), ("devel", "1.9.5", True, False),
    # CDI's "check detects upgrade w/o prev version"
    ("", "v1.2.3", True, False),
    # scripts/build-version's: ordered by commit count, numerically; a release above its dev builds
    ("0.1.0-dev.540.gaaaaaaa", "0.1.0-dev.541.gbbbbbbb", True, False),
    ("0.1.0-dev.99.gaaaaaaa", "0.1.0-dev.100.gbbbbbbb", True, False),
    ("0.1.0-dev.541.gbbbbbbb", "0.1.0", True, False), ("0.1.0", "0.1.0-dev.541.gbbbbbbb", False, True),
])
def test_versions_are_ordered_as_cdis_operator_orders_them(previous: str, new: str, upgrade: bool,
                                                           refused: bool) -> None:
    """CDI's `ShouldTakeUpdatePath` (semver, `v` optional; what is not semver is an upgrade when it differs)."""
    if refused:
        with pytest.raises(versions.Downgrade):
            versions.should_take_update_path(new, previous, deploying=False)
    else:
        assert versions.should_take_update_path(new, previous, deploying=False) is upgrade
    assert versions.should_take_update_path(new, previous, deploying=True) is False  # never while deploying


def test_only_label_values_can_be_versions() -> None:
    assert versions.label_safe("0.1.0-dev.541.g3fcd25e") and versions.label_safe("v1.62.0")
    assert not versions.label_safe("0.1.0+build.5") and not versions.label_safe("x" * 64)
    assert not versions.label_safe("")


# -- a first install ----------------------------------------------------------------------------------------

async def test_a_first_install_deploys_and_observes_its_version_once_ready() -> None:
    """CDI's `CrInit` (phase Deploying, operatorVersion and targetVersion, DeployStarted) and, once every
    Deployment is ready, `Deployed` with observedVersion (DeployCompleted): a first install is no upgrade."""
    kube = FakeKube(NS)
    kube.add(groups.CDIS, {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI", "metadata": {"name": "cdi"},
                           "spec": {}})
    op = operator(kube, "1.0.0")
    await op.reconcile()
    cr = cdi(kube)
    assert cr["status"]["phase"] == "Deploying" and "observedVersion" not in cr["status"]
    assert (cr["status"]["operatorVersion"], cr["status"]["targetVersion"]) == ("1.0.0", "1.0.0")
    assert conditions(cr) == ("False", "True", "False")
    assert condition(cr, "Progressing")["reason"] == "DeployStarted"
    rolled_out(kube)
    await op.reconcile()
    cr = cdi(kube)
    assert (cr["status"]["phase"], cr["status"]["observedVersion"]) == ("Deployed", "1.0.0")
    assert conditions(cr) == ("True", "False", "False")
    assert condition(cr, "Available")["reason"] == "DeployCompleted"
    assert await events(op, kube) == [("Normal", "DeployStarted", "Started Deployment"),
                                      ("Normal", "DeployCompleted", "Deployment Completed")]
    deployment = kube.object(DEPLOYMENTS, "cdi-deployment", NS)
    assert deployment is not None and deployment["metadata"]["labels"][UPDATE_VERSION] == "1.0.0"


async def test_a_first_install_makes_cdis_operator_config_controlled_by_the_cdi_resource() -> None:
    """CDI's `cdi-config` ConfigMap (how CDI's operator knows the installed resource), owned as the controller
    owns what it makes (`cdi.api.owners.owner_reference`): a foreground delete of the resource waits for it."""
    kube = FakeKube(NS)
    kube.add(groups.CDIS, {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI", "metadata": {"name": "cdi"},
                           "spec": {}})
    await operator(kube, "1.0.0").reconcile()
    config = kube.object(groups.CONFIGMAPS, "cdi-config", NS)
    assert config is not None
    assert config["metadata"]["ownerReferences"] == [
        {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI", "name": "cdi", "uid": cdi(kube)["metadata"]["uid"],
         "controller": True, "blockOwnerDeletion": True}]


# -- an upgrade ---------------------------------------------------------------------------------------------

async def test_a_new_operator_upgrades_in_place_while_work_is_in_flight() -> None:
    """CDI's `CheckUpgrade` and `completeUpgrade`: operatorVersion and targetVersion are the new version's from the
    first write of the pass, before anything is applied; the phase is Upgrading, Available stays True while the
    old pods serve and Progressing is True, until every component of the new version is ready; only then
    observedVersion is the new one and the phase Deployed. What the workers do (an import, an upload, a clone,
    a cron) is not the operator's to touch: no pod, Service, claim or DataVolume is written or deleted."""
    kube = FakeKube(NS)
    old = await installed(kube, "1.0.0")
    await old.recorder.close()
    before = work_in_flight(kube)
    writes = len(kube.writes)

    new = operator(kube, "1.1.0")
    await new.reconcile()
    first = kube.writes[writes]
    assert (first.gvr, first.subresource) == (groups.CDIS, "status")  # the versions, before any apply
    cr = cdi(kube)
    assert cr["status"]["phase"] == "Upgrading"
    assert (cr["status"]["operatorVersion"], cr["status"]["targetVersion"], cr["status"]["observedVersion"]) == \
        ("1.1.0", "1.1.0", "1.0.0")
    assert conditions(cr) == ("True", "True", "False")
    progressing = condition(cr, "Progressing")
    assert (progressing["reason"], progressing["message"]) == ("UpgradeStarted", "Started upgrade to version 1.1.0")
    assert all(image(kube, name).endswith(":1.1.0") for name in COMPONENTS)
    assert (await events(new, kube))[-1] == ("Normal", "UpgradeStarted", "Started upgrade to version 1.1.0")

    # the components roll: the old pods serve, the new ones come; nothing changes on the resource
    rolling(kube)
    status = cdi(kube)["status"]
    await new.reconcile()
    assert cdi(kube)["status"] == status

    # every component of the new version ready: Deployed at 1.1.0
    rolled_out(kube)
    await new.reconcile()
    cr = cdi(kube)
    assert (cr["status"]["phase"], cr["status"]["observedVersion"]) == ("Deployed", "1.1.0")
    assert conditions(cr) == ("True", "False", "False")
    assert condition(cr, "Available")["reason"] == "DeployCompleted"
    assert (await events(new, kube))[-1] == ("Normal", "DeployCompleted", "Deployment Completed")
    untouched(kube, before)
    assert not [w for w in kube.writes[writes:] if w.verb == "delete"]  # nothing of 1.1.0's removed or remade


async def test_the_new_version_is_observed_only_when_all_its_pods_are_ready() -> None:
    """CDI's `CheckDeploymentReady` wants `status.replicas` pods, all ready; with an old pod still ready and a new
    one ready beside it, that count is met while half the controller still runs the old version. cdi also wants
    every pod updated (`kubectl rollout status`): observedVersion waits."""
    kube = FakeKube(NS)
    await (await installed(kube, "1.0.0")).recorder.close()
    new = operator(kube, "1.1.0")
    await new.reconcile()
    rolled_out(kube)
    rollout(kube, "cdi-deployment", replicas=2, ready=2, updated=1)  # one old pod, one new
    await new.reconcile()
    cr = cdi(kube)
    assert (cr["status"]["phase"], cr["status"]["observedVersion"]) == ("Upgrading", "1.0.0")
    rollout(kube, "cdi-deployment", replicas=2, ready=2, updated=2)
    await new.reconcile()
    assert cdi(kube)["status"]["observedVersion"] == "1.1.0"


async def test_available_says_whether_a_pod_of_each_component_serves_during_the_upgrade() -> None:
    """CDI's operator keeps Available=True for the whole upgrade (`MarkCrUpgradeHealingDegraded`), whatever the pods
    do. In a rolling update the old pods serve until the new ones are ready, and cdi says True then too; when a
    component has no ready pod at all, cdi says False rather than claim a service nobody provides."""
    kube = FakeKube(NS)
    await (await installed(kube, "1.0.0")).recorder.close()
    new = operator(kube, "1.1.0")
    await new.reconcile()
    rolling(kube)
    rollout(kube, "cdi-apiserver", replicas=1, ready=0, updated=1)  # the old pod gone, the new one not ready
    await new.reconcile()
    cr = cdi(kube)
    assert cr["status"]["phase"] == "Upgrading" and conditions(cr) == ("False", "True", "False")
    rollout(kube, "cdi-apiserver", replicas=1, ready=1, updated=1)
    await new.reconcile()
    assert conditions(cdi(kube)) == ("True", "True", "False")


async def test_what_the_previous_version_applied_and_this_one_does_not_goes_when_the_upgrade_completes() -> None:
    """CDI's `CleanupUnusedResources`, run by `completeUpgrade` only: left in place while the new components roll
    out (CDI's "verify unused exists before upgrade is done"), removed once they are ready. cdi's rule for what is
    its own: what it applied (updateVersion) and not CDI's operator (which stamps createVersion); a CDI leftover
    and an object nobody's operator applied stay."""
    kube = FakeKube(NS)
    await (await installed(kube, "1.0.0")).recorder.close()
    applied_by_old = {"app.kubernetes.io/managed-by": "cdi-operator", UPDATE_VERSION: "1.0.0"}
    kube.add(groups.SERVICEACCOUNTS, {"metadata": {"name": "cdi-retired", "namespace": NS, "labels": applied_by_old}})
    kube.add(CLUSTER_ROLES, {"metadata": {"name": "cdi.kubevirt.io:retired", "labels": applied_by_old}, "rules": []})
    kube.add(groups.VALIDATING_WEBHOOKS, {"metadata": {"name": "cdi-api-retired-validate", "labels": applied_by_old},
                                          "webhooks": []})
    kube.add(groups.SERVICEACCOUNTS, {"metadata": {"name": "cdi-cronjob", "namespace": NS, "labels": {
        **applied_by_old, CREATE_VERSION: "v1.62.0", UPDATE_VERSION: "v1.62.0"}}})  # CDI's operator's
    kube.add(groups.SERVICEACCOUNTS, {"metadata": {"name": "someone-elses", "namespace": NS}})

    new = operator(kube, "1.1.0")
    await new.reconcile()
    rolling(kube)
    await new.reconcile()
    assert kube.object(groups.SERVICEACCOUNTS, "cdi-retired", NS) is not None
    assert kube.object(CLUSTER_ROLES, "cdi.kubevirt.io:retired") is not None
    rolled_out(kube)
    await new.reconcile()
    assert cdi(kube)["status"]["phase"] == "Deployed"
    assert kube.object(groups.SERVICEACCOUNTS, "cdi-retired", NS) is None
    assert kube.object(CLUSTER_ROLES, "cdi.kubevirt.io:retired") is None
    assert kube.object(groups.VALIDATING_WEBHOOKS, "cdi-api-retired-validate") is None
    assert kube.object(groups.SERVICEACCOUNTS, "cdi-cronjob", NS) is not None
    assert kube.object(groups.SERVICEACCOUNTS, "someone-elses", NS) is not None
    for name in COMPONENTS:  # and nothing of this version's
        assert kube.object(DEPLOYMENTS, name, NS) is not None
    assert kube.object(groups.SERVICEACCOUNTS, "cdi-sa", NS) is not None
    assert ("Normal", "DeleteResourceSuccess", "Successfully deleted resource ServiceAccount cdi-retired") in \
        await events(new, kube)


async def test_a_component_whose_selector_changed_is_made_again_and_the_workers_stay() -> None:
    """CDI's `reconcileUpdateControllerDeploymentSelector`: a Deployment's selector cannot change, so one whose
    selector is not this version's is deleted (foreground) and made again; CDI leaves the worker pods running."""
    kube = FakeKube(NS)
    await (await installed(kube, "1.0.0")).recorder.close()
    before = work_in_flight(kube)
    controller = kube.object(DEPLOYMENTS, "cdi-deployment", NS)
    assert controller is not None
    controller["spec"]["selector"] = {"matchLabels": {"cdi.kubevirt.io": "cdi-deployment", "tier": "old"}}
    kube.add(DEPLOYMENTS, controller)
    new = operator(kube, "1.1.0")
    assert await new.reconcile() == 1.0
    assert kube.object(DEPLOYMENTS, "cdi-deployment", NS) is None
    await new.reconcile()
    remade = kube.object(DEPLOYMENTS, "cdi-deployment", NS)
    assert remade is not None and remade["metadata"]["uid"] != controller["metadata"]["uid"]
    assert remade["spec"]["selector"]["matchLabels"] == {"cdi.kubevirt.io": "cdi-deployment"}
    untouched(kube, before)


async def test_an_upgrade_from_a_build_before_version_labels_goes_by_observed_version() -> None:
    """Components a cdi operator applied before it labelled them with its version: their version is the
    resource's observedVersion, so an upgrade from such a build is one, and a downgrade to it is refused."""
    kube = FakeKube(NS)
    await (await installed(kube, "0.1.0-dev.540.gaaaaaaa")).recorder.close()
    for name in COMPONENTS:
        deployment = kube.object(DEPLOYMENTS, name, NS)
        assert deployment is not None
        del deployment["metadata"]["labels"][UPDATE_VERSION]
        kube.add(DEPLOYMENTS, deployment)
    older = operator(kube, "0.1.0-dev.539.gccccccc")
    await older.reconcile()
    assert cdi(kube)["status"]["phase"] == "Deployed" and image(kube, "cdi-deployment").endswith("540.gaaaaaaa")
    newer = operator(kube, "0.1.0-dev.542.gbbbbbbb")
    await newer.reconcile()
    assert cdi(kube)["status"]["phase"] == "Upgrading" and image(kube, "cdi-deployment").endswith("542.gbbbbbbb")


# -- a downgrade --------------------------------------------------------------------------------------------

async def test_a_downgrade_is_refused_and_touches_nothing() -> None:
    """CDI's `CheckUpgrade`: operatorVersion and targetVersion become the older operator's, then
    `ShouldTakeUpdatePath` fails ("operator downgraded, will not reconcile") and nothing else is done: the phase,
    conditions and observedVersion stay, the newer components keep running. CDI only logs it; cdi also says it
    once in a Warning event on the resource. The newer operator back, all is as before."""
    kube = FakeKube(NS)
    newer = await installed(kube, "1.1.0")
    await newer.recorder.close()
    deployments = {name: kube.object(DEPLOYMENTS, name, NS) for name in COMPONENTS}
    before = cdi(kube)["status"]
    writes = len(kube.writes)

    older = operator(kube, "1.0.0")
    assert await older.reconcile() == older.resync
    await older.reconcile()
    cr = cdi(kube)
    assert (cr["status"]["operatorVersion"], cr["status"]["targetVersion"], cr["status"]["observedVersion"]) == \
        ("1.0.0", "1.0.0", "1.1.0")
    assert cr["status"]["phase"] == "Deployed" and cr["status"]["conditions"] == before["conditions"]
    assert [(w.verb, w.gvr.kind, w.subresource) for w in kube.writes[writes:]] == [("replace", "CDI", "status")]
    assert {name: kube.object(DEPLOYMENTS, name, NS) for name in COMPONENTS} == deployments
    message = "operator downgraded from 1.1.0 to 1.0.0, will not reconcile: the components in place are version 1.1.0"
    assert [e for e in await events(older, kube) if e[0] == "Warning"] == [("Warning", "UpgradeRefused", message)]
    [refused] = [e for e in kube.objects(groups.EVENTS, "default") if e["reason"] == "UpgradeRefused"]
    assert refused["count"] == 1  # said once, not at every pass

    again = operator(kube, "1.1.0")
    await again.reconcile()
    cr = cdi(kube)
    assert (cr["status"]["phase"], cr["status"]["operatorVersion"], cr["status"]["observedVersion"]) == \
        ("Deployed", "1.1.0", "1.1.0")


async def test_a_downgrade_during_an_upgrade_is_refused_too() -> None:
    """An operator rolled back while its successor's upgrade is under way (1.0.0 observed, 1.2.0's components
    rolling, 1.1.0 started): CDI's compares with observedVersion and would apply 1.1.0's components over 1.2.0's;
    cdi compares with the version of the components in place and refuses, as it refuses any downgrade."""
    kube = FakeKube(NS)
    await (await installed(kube, "1.0.0")).recorder.close()
    await operator(kube, "1.2.0").reconcile()
    rolling(kube)
    middle = operator(kube, "1.1.0")
    await middle.reconcile()
    cr = cdi(kube)
    assert (cr["status"]["phase"], cr["status"]["observedVersion"]) == ("Upgrading", "1.0.0")
    assert all(image(kube, name).endswith(":1.2.0") for name in COMPONENTS)


# -- two operators during the operator's own rollout ----------------------------------------------------------

async def test_only_one_operator_reconciles_while_the_operator_itself_rolls() -> None:
    """CDI's operator runs under controller-runtime's leader election (Lease
    `cdi-operator-leader-election-helper`): the old operator pod and the new one run side by side while the
    operator's Deployment rolls, and only the leader reconciles. When the old one stops it releases the Lease and
    the new one starts at once."""
    kube = FakeKube(NS)
    retry = 0.05
    running: list[str] = []
    stops = {"old": asyncio.Event(), "new": asyncio.Event()}

    def work(name: str) -> Any:
        async def reconcile() -> None:
            running.append(name)
            await stops[name].wait()
        return reconcile

    def elect(name: str) -> asyncio.Task[bool]:
        mine = LeaderElectionConfig("cdi-operator-leader-election-helper", NS, name, lease_duration=3.0,
                                    renew_deadline=2.0, retry_period=retry)
        return asyncio.create_task(run_elected(kube, NS, name, work(name), stops[name], mine))

    async def until(predicate: Any, timeout: float, message: str) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.01)

    old = elect("old")
    await until(lambda: running == ["old"], 5, "the old operator leading")
    new = elect("new")
    for _ in range(5):  # five of its tries: the new one stands while the old one leads
        await asyncio.sleep(retry)
    assert running == ["old"]
    stops["old"].set()
    assert await old is True
    # well within the Lease's 3 s: released, not expired
    await until(lambda: running == ["old", "new"], 2, "the new operator leading")
    stops["new"].set()
    assert await new is True
    lease = kube.object(groups.LEASES, "cdi-operator-leader-election-helper", NS)
    assert lease is not None and not lease["spec"].get("holderIdentity")


# -- nothing left behind ------------------------------------------------------------------------------------

async def test_an_uninstall_after_an_upgrade_cut_short_leaves_nothing_of_either_version() -> None:
    """CDI's uninstall deletes what its operator manages by name; an upgrade deleted before it completed leaves
    what the earlier version applied and the new one does not, which cdi's uninstall finds by its label."""
    kube = FakeKube(NS)
    await (await installed(kube, "1.0.0")).recorder.close()
    applied_by_old = {"app.kubernetes.io/managed-by": "cdi-operator", UPDATE_VERSION: "1.0.0"}
    kube.add(groups.SERVICEACCOUNTS, {"metadata": {"name": "cdi-retired", "namespace": NS, "labels": applied_by_old}})
    new = operator(kube, "1.1.0")
    await new.reconcile()
    assert cdi(kube)["status"]["phase"] == "Upgrading"
    await kube.delete(groups.CDIS, "cdi")
    await new.reconcile()
    assert kube.object(groups.CDIS, "cdi") is None
    assert kube.object(groups.SERVICEACCOUNTS, "cdi-retired", NS) is None
    assert kube.object(DEPLOYMENTS, "cdi-deployment", NS) is None


def test_the_operator_takes_its_version_from_operator_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """CDI's operator reads `OPERATOR_VERSION` (required there); cdi's falls back to its images' tag."""
    monkeypatch.setenv("CONTROLLER_IMAGE", "registry.example/cdi/cdi-controller:0.1.0-dev.541.g3fcd25e")
    monkeypatch.delenv("OPERATOR_VERSION", raising=False)
    images = images_from_env()
    assert (images.registry, images.tag) == ("registry.example/cdi", "0.1.0-dev.541.g3fcd25e")
    assert version_from_env(images) == "0.1.0-dev.541.g3fcd25e"
    monkeypatch.setenv("OPERATOR_VERSION", "0.1.1")
    assert version_from_env(images_from_env()) == "0.1.1"
