"""A cluster as CDI leaves it, built object by object for the takeover tests: what cdi finds when it is
installed where KubeVirt's CDI ran (CDI's own operator removed, its CRDs and objects kept).

Everything here follows what CDI's source writes (pkg/controller/datavolume/*, populators/*,
import-controller.go, upload-controller.go, dataimportcron-controller.go, storageprofile-controller.go,
its operator's callbacks), generated from those rules, never copied. CDI's annotation and label keys are
spelled as CDI spells them, not through `cdi.api`: a key cdi misspelt would show here as state a takeover
does not recognise.

What is built, in one namespace (`CdiState.build` returns a `Left` naming all of it):

- DataVolumes in each final phase, their claims with CDI's annotations and labels:
  `imported` (HTTP, through CDI's import populator: the claim bound to the volume its prime filled, prime and
  VolumeImportSource gone), `imported-legacy` (`storage.usePopulator: "false"`: the importer wrote to the
  claim itself), `blank`, `uploaded` (upload populator), `cloned` (clone populator, CDI's clone token on the
  DataVolume), `cloned-legacy` (an older CDI's host-assisted clone, without populators), `vddk` (a source
  cdi refuses for new DataVolumes), `failed` (checksum mismatch: CDI's fatal error), `wffc` (a
  WaitForFirstConsumer claim nobody consumed yet), and `upload-waiting` (`UploadReady`: CDI's upload server
  pod, a stand-in named as CDI names it, serving the prime claim behind a headless Service).
- A DataImportCron mid-schedule (its next run half a year away) with two imports kept (`importsToKeep: 2`),
  its annotations (next and last cron time, desired digest, storage class) and status, and its DataSource
  `Ready` on the newer import.
- An admin's StorageProfile edit (`cloneStrategy`, `claimPropertySets`, the minimum size annotation).
- CDIConfig `config` with CDI's status, and the `CDI` resource as CDI's operator leaves it (`Deployed`,
  its versions, finalizer, `cdi-config` ConfigMap) when `with_cdi_resource` (a real cluster; `cdi up` makes
  its own CDI resource at its first start).

Each filled claim holds a known 1 MiB pattern written by a pod (`Left.digests`), so that a later read
proves nothing rewrote it. Statuses go through the status subresource where the CRD has one (on CDI's own
CRDs CDIConfig, DataSource, DataImportCron and CDI have none: CDI writes their status with the object).
CDI's worker pods are gone once their work is done, as CDI deletes them."""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.support.waiting import wait_for

Obj = dict[str, Any]

CDI_RELEASE = "v1.62.0"  # the CDI release that left the state (what its operator wrote in the CDI resource)
PATTERN_SIZE = 1 << 20
CLAIM_SIZE = "64Mi"
NOW = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
STAMP = (NOW - datetime.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")  # when CDI finished (conditions, cron)
OLDER_STAMP = (NOW - datetime.timedelta(days=9)).strftime("%Y-%m-%dT%H:%M:%SZ")
DIGESTS = ("sha256:" + "1" * 12 + "a" * 52, "sha256:" + "2" * 12 + "b" * 52)  # the cron's two imports, older first
CLONE_TOKEN = "eyJhbGciOiJQUzI1NiJ9.eyJvcGVyYXRpb24iOiJDbG9uZSJ9.c2lnbmVkLWJ5LWNkaQ"  # CDI's JWT, CDI's key

_A = "cdi.kubevirt.io/"
POD_PHASE, POD_READY, POD_RESTARTS = _A + "storage.pod.phase", _A + "storage.pod.ready", _A + "storage.pod.restarts"
RUNNING, RUNNING_MESSAGE, RUNNING_REASON = (_A + "storage.condition.running", _A + "storage.condition.running.message",
                                            _A + "storage.condition.running.reason")
USE_POPULATOR, PRIME_NAME = _A + "storage.usePopulator", _A + "storage.populator.pvcPrime"
CREATED_BY_UPLOAD = _A + "storage.createdByUploadController"
CRON_LABEL, LAST_USE = _A + "dataImportCron", _A + "storage.import.lastUseTime"
NEXT_CRON, LAST_CRON = _A + "storage.import.nextCronTime", _A + "storage.import.lastCronTime"
DESIRED_DIGEST, CRON_CLASS = _A + "storage.import.sourceDesiredDigest", _A + "storage.import.storageClass"
APP = {"app": "containerized-data-importer"}
RECOMMENDED = {"app.kubernetes.io/component": "storage", "app.kubernetes.io/managed-by": "cdi-controller"}
FILLING_UP = {"alerts.k8s.io/KubePersistentVolumeFillingUp": "disabled"}


class Kube(Protocol):
    """kubectl against the cluster: its stdout, an AssertionError when it fails."""

    def __call__(self, *args: str, input: str | None = None) -> str: ...


@dataclass(frozen=True)
class Classes:
    storage: str  # a CSI class binding Immediate (CDI fills it through its populators)
    wffc: str  # a CSI class binding WaitForFirstConsumer


@dataclass(frozen=True)
class Pods:
    """How this module's own pods (writers, the stand-in upload server) run on the cluster."""

    image: str = "debian"
    restricted: bool = False  # uid 107 and the `restricted` Pod Security profile (a real cluster)
    pull_policy: str | None = None


@dataclass
class Left:
    """What `CdiState.build` made: the names a takeover test looks at, and what CDI left in them."""

    namespace: str
    phases: dict[str, str] = field(default_factory=dict)  # DataVolume -> the phase CDI left it in
    digests: dict[str, str] = field(default_factory=dict)  # claim -> sha256 of the bytes written into it
    upload_waiting: str = "upload-waiting"
    upload_prime: str = ""
    upload_pod: str = ""
    cron: str = "golden-cron"
    data_source: str = "golden"
    cron_imports: tuple[str, ...] = ()
    next_cron_time: str = ""
    profile: str = ""
    profile_spec: Obj = field(default_factory=dict)
    cdi_spec: Obj = field(default_factory=dict)


def pattern(claim: str) -> bytes:
    """The bytes the writer pod puts at the start of `claim`'s disk.img (`yes LINE | head -c SIZE`)."""
    line = f"{claim} as CDI left it\n".encode()
    return (line * (PATTERN_SIZE // len(line) + 1))[:PATTERN_SIZE]


def cron_schedule(now: datetime.datetime = NOW) -> tuple[str, str]:
    """A schedule whose next run is months away (the first of the month half a year from now), and that run
    in RFC 3339 as CDI keeps it in storage.import.nextCronTime: no run falls inside a test."""
    month = (now.month + 5) % 12 + 1
    year = now.year + (1 if month <= now.month else 0)
    return f"0 0 1 {month} *", f"{year}-{month:02d}-01T00:00:00Z"


def conditions(bound: tuple[str, str, str], ready: tuple[str, str, str],
               running: tuple[str, str, str]) -> list[Obj]:
    """A DataVolume's conditions in CDI's order (Bound, Ready, Running), each (status, message, reason)."""
    return [{"type": kind, "status": status, "message": message, "reason": reason,
             "lastTransitionTime": STAMP, "lastHeartbeatTime": STAMP}
            for kind, (status, message, reason) in (("Bound", bound), ("Ready", ready), ("Running", running))]


def finished(claim: str, running_message: str, progress: str = "100.0%") -> Obj:
    """The status CDI leaves on a DataVolume whose worker succeeded."""
    return {"phase": "Succeeded", "progress": progress, "restartCount": 0, "claimName": claim,
            "conditions": conditions(("True", f"PVC {claim} Bound", "Bound"), ("True", "", ""),
                                     ("False", running_message, "Completed"))}


def datavolume(name: str, namespace: str, source: Obj, storage_class: str, *,
               annotations: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None) -> Obj:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})},
            "spec": {"source": source, "storage": {"storageClassName": storage_class,
                                                   "resources": {"requests": {"storage": CLAIM_SIZE}}}}}


def owner(kind: str, api_version: str, obj: Mapping[str, Any]) -> Obj:
    """A controller owner reference, as CDI sets them (blockOwnerDeletion too)."""
    return {"apiVersion": api_version, "kind": kind, "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def claim_of(dv: Mapping[str, Any], storage_class: str, extra: Mapping[str, str],
             data_source_ref: Obj | None = None) -> Obj:
    """CDI's newPersistentVolumeClaim: the DataVolume's labels and annotations, CDI's own, owned by it."""
    meta = dv["metadata"]
    annotations = {**meta.get("annotations", {}), POD_RESTARTS: "0", _A + "storage.contentType": "kubevirt",
                   _A + "storage.preallocation.requested": "false", _A + "createdForDataVolume": meta["uid"],
                   **extra}
    spec: Obj = {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem", "storageClassName": storage_class,
                 "resources": {"requests": {"storage": CLAIM_SIZE}}}
    if data_source_ref is not None:
        spec["dataSourceRef"] = data_source_ref
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "labels": {**APP, **FILLING_UP, **meta.get("labels", {})}, "annotations": annotations,
                         "ownerReferences": [owner("DataVolume", "cdi.kubevirt.io/v1beta1", dv)]},
            "spec": spec}


def worker_done(message: str) -> dict[str, str]:
    """What CDI's importer and upload controllers leave on a claim whose pod succeeded."""
    return {POD_PHASE: "Succeeded", POD_READY: "false", POD_RESTARTS: "0", RUNNING: "false",
            RUNNING_MESSAGE: message, RUNNING_REASON: "Completed"}


def source_ref(kind: str, name: str) -> Obj:
    return {"apiGroup": "cdi.kubevirt.io", "kind": kind, "name": name}


class CdiState:
    """Builds the state through kubectl (`kube`), so that the same steps run on `cdi up` and a real cluster.
    Nothing of cdi may be reconciling while it runs (`cdi up --no-cdi`, or before cdi's install)."""

    def __init__(self, kube: Kube, namespace: str, classes: Classes, pods: Pods | None = None, *,
                 cdi_namespace: str = "cdi", with_cdi_resource: bool = False) -> None:
        self.kube = kube
        self.namespace = namespace
        self.classes = classes
        self.pods = pods or Pods()
        self.cdi_namespace = cdi_namespace
        self.with_cdi_resource = with_cdi_resource
        self.left = Left(namespace)
        self._status_subresource: dict[str, bool] = {}
        self._cr: Obj | None = None  # the CDI resource, which CDI makes the owner of what its controller creates

    # -- kubectl --------------------------------------------------------------------------------------

    def json(self, *args: str) -> Any:
        return json.loads(self.kube(*args, "-o", "json"))

    def create(self, manifest: Mapping[str, Any]) -> Obj:
        created: Obj = json.loads(self.kube("create", "-f", "-", "-o", "json", input=json.dumps(manifest)))
        return created

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        args = ["get", kind, name, "--ignore-not-found", "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        out = self.kube(*args).strip()
        return json.loads(out) if out else None

    def has_status_subresource(self, plural: str) -> bool:
        """Whether CDI's kind `plural` has a status subresource on this cluster (CDI's own CRDs give one only to
        DataVolume, StorageProfile and ObjectTransfer; cdi's to all)."""
        if plural not in self._status_subresource:
            crd = self.json("get", "crd", f"{plural}.cdi.kubevirt.io")
            stored = next(v for v in crd["spec"]["versions"] if v.get("storage"))
            self._status_subresource[plural] = "status" in (stored.get("subresources") or {})
        return self._status_subresource[plural]

    def write_status(self, plural: str, name: str, status: Obj, namespace: str | None = None) -> Obj:
        """The status as CDI's controller writes it: through the status subresource where there is one,
        else with the object (where the CRD has none, the API server keeps what the object says)."""
        args = ["patch", f"{plural}.cdi.kubevirt.io", name, "--type=merge", "-p", json.dumps({"status": status}),
                "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        if self.has_status_subresource(plural):
            args.append("--subresource=status")
        patched: Obj = json.loads(self.kube(*args))
        return patched

    def annotate(self, kind: str, name: str, annotations: Mapping[str, str | None]) -> Obj:
        patched: Obj = json.loads(self.kube("patch", kind, name, "-n", self.namespace, "--type=merge", "-p",
                                            json.dumps({"metadata": {"annotations": dict(annotations)}}),
                                            "-o", "json"))
        return patched

    def wait_gone(self, kind: str, name: str) -> None:
        wait_for(lambda: self.get(kind, name, self.namespace) is None, 120, 0.5, message=f"{kind} {name} gone")

    def wait_bound(self, name: str) -> Obj:
        claim: Obj = wait_for(lambda: (c := self.get("pvc", name, self.namespace)) and
                              c.get("status", {}).get("phase") == "Bound" and c, 120, 0.2,
                              message=f"claim {self.namespace}/{name} Bound")
        return claim

    # -- pods -----------------------------------------------------------------------------------------

    def pod(self, name: str, claim: str, script: str, *, restart: str = "Never", container: str = "main",
            meta: Mapping[str, Any] | None = None) -> Obj:
        spec_container: Obj = {"name": container, "image": self.pods.image, "command": ["sh", "-c", script],
                               "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
        if self.pods.pull_policy:
            spec_container["imagePullPolicy"] = self.pods.pull_policy
        spec: Obj = {"restartPolicy": restart, "terminationGracePeriodSeconds": 1, "containers": [spec_container],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
        if self.pods.restricted:
            spec_container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                 "runAsNonRoot": True, "runAsUser": 107}
            spec["securityContext"] = {"runAsNonRoot": True, "fsGroup": 107,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, **(meta or {})}, "spec": spec}

    def run_pod(self, name: str, claim: str, script: str) -> str:
        """Run `script` with `claim` at /data to its end; its output."""
        self.create(self.pod(name, claim, script))
        done = wait_for(lambda: (p := self.get("pod", name, self.namespace)) and
                        p.get("status", {}).get("phase") in ("Succeeded", "Failed") and p, 180, 0.2,
                        message=f"pod {name} done")
        output = self.kube("logs", name, "-n", self.namespace)
        assert done["status"]["phase"] == "Succeeded", output
        self.kube("delete", "pod", name, "-n", self.namespace, "--wait=true")
        return output

    def read_digest(self, claim: str) -> str:
        """sha256 of the first PATTERN_SIZE bytes of the claim's disk.img, read by a pod."""
        out = self.run_pod(f"read-{claim}"[:63], claim, f"head -c {PATTERN_SIZE} /data/disk.img | sha256sum")
        return out.split()[0]

    def fill(self, volume_claim: str, target: str) -> None:
        """Write `target`'s pattern into `volume_claim` (the claim itself, or the prime that fills it)."""
        line = f"{target} as CDI left it"
        self.run_pod(f"write-{volume_claim}"[:63], volume_claim,
                     f"yes '{line}' | head -c {PATTERN_SIZE} > /data/disk.img && sync")
        self.left.digests[target] = hashlib.sha256(pattern(target)).hexdigest()

    # -- claims ---------------------------------------------------------------------------------------

    def plain_claim(self, dv: Obj, annotations: Mapping[str, str], *, fill: bool = True,
                    storage_class: str | None = None) -> Obj:
        """A claim the worker pod filled itself (CDI without populators)."""
        cls = storage_class or self.classes.storage
        created = self.create(claim_of(dv, cls, annotations))
        if fill:
            self.wait_bound(created["metadata"]["name"])
            self.fill(created["metadata"]["name"], created["metadata"]["name"])
        return created

    def populated_claim(self, dv: Obj, kind: str, source: str, annotations: Mapping[str, str], *,
                        prime_annotations: Mapping[str, str], keep_prime_name: bool = True) -> Obj:
        """A claim CDI's populator filled: its prime `prime-<uid>` bound and filled, its volume handed to the
        claim (CDI's Rebind), the prime deleted; the claim annotated as the populator leaves it."""
        name = dv["metadata"]["name"]
        target = self.create(claim_of(dv, self.classes.storage, annotations, source_ref(kind, source)))
        prime = f"prime-{target['metadata']['uid']}"
        self.create(self.prime_manifest(target, prime, prime_annotations))
        bound = self.wait_bound(prime)
        self.fill(prime, name)
        volume = bound["spec"]["volumeName"]
        self.rebind(prime, volume, name)
        # what the populator copies from the prime once it succeeded (CDI's desiredAnnotations, the progress)
        final = {**worker_done(prime_annotations.get(RUNNING_MESSAGE, "")), _A + "storage.pod.schedulable": "true"}
        progress = prime_annotations.get(_A + "storage.populator.progress")
        if progress:
            final[_A + "storage.populator.progress"] = progress
        if keep_prime_name:
            final[PRIME_NAME] = prime
        return self.annotate("pvc", name, final)

    def prime_manifest(self, target: Mapping[str, Any], name: str, annotations: Mapping[str, str]) -> Obj:
        """CDI's createPVCPrime: same class, modes and size, immediate binding, owned by the target claim."""
        spec = target["spec"]
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": {**APP, "velero.io/exclude-from-backup": "true", **RECOMMENDED},
                             "annotations": {_A + "storage.bind.immediate.requested": "", **annotations},
                             "ownerReferences": [owner("PersistentVolumeClaim", "v1", target)]},
                "spec": {"accessModes": spec["accessModes"], "resources": spec["resources"],
                         "storageClassName": spec["storageClassName"], "volumeMode": spec["volumeMode"]}}

    # -- the DataVolumes ------------------------------------------------------------------------------

    def dv(self, name: str, source: Obj, *, populated: bool = True, storage_class: str | None = None,
           annotations: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None) -> Obj:
        """A DataVolume as admitted, with the usePopulator choice CDI's controller records on it."""
        created = self.create(datavolume(name, self.namespace, source, storage_class or self.classes.storage,
                                         annotations={USE_POPULATOR: "true" if populated else "false",
                                                      **(annotations or {})}, labels=labels))
        return created

    def finish(self, dv: Obj, status: Obj) -> None:
        self.write_status("datavolumes", dv["metadata"]["name"], status, self.namespace)
        self.left.phases[dv["metadata"]["name"]] = status["phase"]

    def imported(self) -> None:
        url = "http://images.cdi-takeover.invalid/fedora.qcow2"
        dv = self.dv("imported", {"http": {"url": url}})
        prime = {_A + "storage.import.endpoint": url, _A + "storage.import.source": "http",
                 _A + "storage.populator.kind": "VolumeImportSource", RUNNING_MESSAGE: "Import Complete",
                 _A + "storage.populator.progress": "100.0%"}
        self.populated_claim(dv, "VolumeImportSource", f"volume-import-source-{dv['metadata']['uid']}", {},
                             prime_annotations=prime)
        self.finish(dv, finished("imported", "Import Complete"))

    def imported_legacy(self) -> None:
        url = "http://images.cdi-takeover.invalid/cirros.img"
        dv = self.dv("imported-legacy", {"http": {"url": url}}, populated=False)
        self.plain_claim(dv, {_A + "storage.import.endpoint": url, _A + "storage.import.source": "http",
                              _A + "storage.import.importPodName": "importer-imported-legacy",
                              _A + "storage.pod.schedulable": "true", **worker_done("Import Complete")})
        self.finish(dv, finished("imported-legacy", "Import Complete"))

    def blank(self) -> None:
        self.populated_import("blank", {"blank": {}}, "none")

    def vddk(self) -> None:
        """A VMware import CDI finished: cdi fails new ones (no VDDK library), never this one."""
        self.populated_import("vddk", {"vddk": {
            "url": "https://vcenter.cdi-takeover.invalid/sdk", "uuid": "52260566-b032-36cb-55b1",
            "backingFile": "[datastore1] vm/vm.vmdk", "thumbprint": "20:6C:8A:5D", "secretRef": "vddk"}}, "vddk")

    def rebind(self, temporary: str, volume: str, name: str) -> None:
        """CDI's Rebind: the volume a temporary claim was filled on handed to the claim `name`, the temporary
        deleted."""
        target = self.json("get", "pvc", name, "-n", self.namespace)
        self.kube("patch", "pv", volume, "--type=json", "-p", json.dumps([{
            "op": "replace", "path": "/spec/claimRef", "value": {
                "namespace": self.namespace, "name": name, "uid": target["metadata"]["uid"],
                "resourceVersion": target["metadata"]["resourceVersion"]}}]))
        self.wait_bound(name)
        self.kube("delete", "pvc", temporary, "-n", self.namespace, "--wait=true")

    def populated_import(self, name: str, source: Obj, kind: str) -> None:
        """A DataVolume CDI's import populator finished: its VolumeImportSource named in the claim, the prime
        claim's last words on the claim."""
        dv = self.dv(name, source)
        self.populated_claim(dv, "VolumeImportSource", f"volume-import-source-{dv['metadata']['uid']}", {},
                             prime_annotations={_A + "storage.import.source": kind,
                                                _A + "storage.populator.kind": "VolumeImportSource",
                                                RUNNING_MESSAGE: "Import Complete",
                                                _A + "storage.populator.progress": "100.0%"})
        self.finish(dv, finished(name, "Import Complete"))

    def uploaded(self) -> None:
        dv = self.dv("uploaded", {"upload": {}})
        self.populated_claim(dv, "VolumeUploadSource", f"volume-upload-source-{dv['metadata']['uid']}", {},
                             prime_annotations={_A + "storage.upload.target": "",
                                                _A + "storage.populator.kind": "VolumeUploadSource",
                                                RUNNING_MESSAGE: "Upload Complete"},
                             keep_prime_name=False)  # CDI's upload populator drops it once the upload succeeded
        self.finish(dv, finished("uploaded", "Upload Complete", progress="N/A"))

    def cloned(self, source: str) -> None:
        dv = self.dv("cloned", {"pvc": {"namespace": self.namespace, "name": source}},
                     annotations={_A + "storage.clone.token": CLONE_TOKEN, _A + "cloneType": "csi-clone"})
        name = dv["metadata"]["name"]
        target = self.create(claim_of(dv, self.classes.storage, {}, source_ref(
            "VolumeCloneSource", f"volume-clone-source-{dv['metadata']['uid']}")))
        # the CSI driver cloned the source's volume into a temporary claim; CDI handed its volume over
        temporary = f"tmp-pvc-{dv['metadata']['uid']}"
        self.create(self.prime_manifest(target, temporary, {}))
        volume = self.wait_bound(temporary)["spec"]["volumeName"]
        self.fill(temporary, name)
        self.rebind(temporary, volume, name)
        self.annotate("pvc", name, {_A + "clonePhase": "Succeeded", _A + "cloneType": "csi-clone",
                                    "k8s.io/CloneOf": "true", _A + "storage.populator.progress": "100.0%",
                                    _A + "storage.clone.token": CLONE_TOKEN, RUNNING: "false",
                                    RUNNING_MESSAGE: "Clone Complete", RUNNING_REASON: "Completed"})
        self.finish(dv, finished(name, "Clone Complete"))

    def cloned_legacy(self, source: str) -> None:
        """A host-assisted clone an older CDI finished without populators: its clone-controller's and
        upload-controller's annotations on a claim the copy filled in place (source and target pods gone)."""
        dv = self.dv("cloned-legacy", {"pvc": {"namespace": self.namespace, "name": source}}, populated=False,
                     annotations={_A + "storage.clone.token": CLONE_TOKEN, _A + "cloneType": "copy"})
        uid = dv["metadata"]["uid"]
        self.plain_claim(dv, {"k8s.io/CloneRequest": f"{self.namespace}/{source}", "k8s.io/CloneOf": "true",
                              _A + "storage.sourceClonePodName": f"{uid}-source-pod",
                              _A + "storage.clone.cloneUniqeId": f"{self.namespace}-cloned-legacy-source-pod",
                              _A + "storage.uploadPodName": "cdi-upload-cloned-legacy",
                              _A + "storage.condition.source.running": "false",
                              _A + "storage.condition.source.running.message": "Clone Complete",
                              _A + "storage.condition.source.running.reason": "Completed",
                              **worker_done("Clone Complete")})
        self.finish(dv, finished("cloned-legacy", "Clone Complete"))

    def failed(self) -> None:
        """An import CDI ended for good: the checksum did not match (CDI's fatal error; its pod deleted)."""
        url = "http://images.cdi-takeover.invalid/corrupt.img"
        dv = self.dv("failed", {"http": {"url": url, "checksum": "sha256:" + "0" * 64}}, populated=False)
        message = "Unable to process data: checksum mismatch"
        self.plain_claim(dv, {_A + "storage.import.endpoint": url, _A + "storage.import.source": "http",
                              _A + "storage.import.checksum": "sha256:" + "0" * 64,
                              _A + "storage.import.importPodName": "importer-failed",
                              _A + "storage.pod.schedulable": "true", _A + "storage.import.fatalError": "true",
                              POD_PHASE: "Failed", POD_READY: "false", RUNNING: "false",
                              RUNNING_MESSAGE: message, RUNNING_REASON: "ChecksumError"})
        self.finish(dv, {"phase": "Failed", "progress": "N/A", "restartCount": 0, "claimName": "failed",
                         "conditions": conditions(("True", "PVC failed Bound", "Bound"), ("False", "", ""),
                                                  ("False", message, "ChecksumError"))})

    def wffc(self) -> None:
        """An import on a WaitForFirstConsumer class that no pod consumed yet (HonorWaitForFirstConsumer)."""
        url = "http://images.cdi-takeover.invalid/later.img"
        dv = self.dv("wffc", {"http": {"url": url}}, populated=False, storage_class=self.classes.wffc)
        self.plain_claim(dv, {_A + "storage.import.endpoint": url, _A + "storage.import.source": "http"},
                         fill=False, storage_class=self.classes.wffc)
        self.finish(dv, {"phase": "WaitForFirstConsumer", "progress": "N/A", "restartCount": 0, "claimName": "wffc",
                         "conditions": conditions(("False", "PVC wffc Pending", "Pending"), ("False", "", ""),
                                                  ("False", "", ""))})

    def upload_waiting(self) -> None:
        """An upload DataVolume `UploadReady`: its claim waits for the prime, which CDI's upload server
        serves (here a stand-in with CDI's name, labels and marker annotation, behind CDI's headless Service)."""
        name = self.left.upload_waiting
        dv = self.dv(name, {"upload": {}})
        self.create({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeUploadSource",
                     "metadata": {"name": f"volume-upload-source-{dv['metadata']['uid']}", "namespace": self.namespace,
                                  "ownerReferences": [owner("DataVolume", "cdi.kubevirt.io/v1beta1", dv)]},
                     "spec": {"contentType": "kubevirt"}})
        target = self.create(claim_of(dv, self.classes.storage, {}, source_ref(
            "VolumeUploadSource", f"volume-upload-source-{dv['metadata']['uid']}")))
        prime = f"prime-{target['metadata']['uid']}"
        server = f"cdi-upload-{prime}"
        serving = {POD_PHASE: "Running", POD_READY: "true", POD_RESTARTS: "0", RUNNING: "true", RUNNING_MESSAGE: "",
                   RUNNING_REASON: "Pod is running"}
        created_prime = self.create(self.prime_manifest(target, prime, {
            _A + "storage.upload.target": "", _A + "storage.contentType": "kubevirt",
            _A + "storage.populator.kind": "VolumeUploadSource", _A + "storage.preallocation.requested": "false",
            _A + "storage.uploadPodName": server, **serving}))
        self.wait_bound(prime)
        marker = {CREATED_BY_UPLOAD: "yes"}
        labels = {**APP, "cdi.kubevirt.io": "cdi-upload-server", "service": server,
                  _A + "uploadTarget": created_prime["metadata"]["uid"]}
        owned = [owner("PersistentVolumeClaim", "v1", created_prime)]
        self.create({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": server, "namespace": self.namespace, "annotations": marker,
                                  "labels": {**APP, "cdi.kubevirt.io": "cdi-upload-server"}, "ownerReferences": owned},
                     "spec": {"clusterIP": "None", "selector": {"service": server},
                              "ports": [{"protocol": "TCP", "port": 8443, "targetPort": 8443}]}})
        self.create(self.pod(server, prime, "trap 'exit 0' TERM; sleep 86400 & wait", restart="OnFailure",
                             container="cdi-upload-server",
                             meta={"annotations": marker, "labels": labels, "ownerReferences": owned}))
        wait_for(lambda: (p := self.get("pod", server, self.namespace)) and
                 p.get("status", {}).get("phase") == "Running", 120, 0.2, message=f"stand-in {server} running")
        self.annotate("pvc", name, {PRIME_NAME: prime, **serving})
        self.left.upload_prime, self.left.upload_pod = prime, server
        self.finish(dv, {"phase": "UploadReady", "progress": "N/A", "restartCount": 0, "claimName": name,
                         "conditions": conditions(("False", f"PVC {name} Pending", "Pending"),
                                                  ("False", "", "TransferRunning"),
                                                  ("True", "", "Pod is running"))})

    # -- the DataImportCron -------------------------------------------------------------------------

    def cron(self) -> None:
        """A cron between two runs: two imports kept, the DataSource Ready on the newer, the next run in
        storage.import.nextCronTime (months away)."""
        left = self.left
        cron_labels = {CRON_LABEL: left.cron, **RECOMMENDED}
        imports = []
        for digest, used in zip(DIGESTS, (OLDER_STAMP, STAMP), strict=True):
            name = f"{left.data_source}-{digest[7:19]}"
            dv = self.dv(name, {"registry": {"url": f"docker://registry.cdi-takeover.invalid/golden@{digest}"}},
                         annotations={_A + "storage.bind.immediate.requested": "true", LAST_USE: used},
                         labels=cron_labels)
            prime = {_A + "storage.import.source": "registry", _A + "storage.populator.kind": "VolumeImportSource",
                     RUNNING_MESSAGE: "Import Complete", _A + "storage.populator.progress": "100.0%"}
            self.populated_claim(dv, "VolumeImportSource", f"volume-import-source-{dv['metadata']['uid']}",
                                 {}, prime_annotations=prime)
            self.annotate("pvc", name, {LAST_USE: used})
            self.finish(dv, finished(name, "Import Complete"))
            imports.append(name)
        left.cron_imports = tuple(imports)
        current = imports[-1]
        schedule, left.next_cron_time = cron_schedule()
        self.create({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
                     "metadata": {"name": left.cron, "namespace": self.namespace, "annotations": {
                         NEXT_CRON: left.next_cron_time, LAST_CRON: STAMP, DESIRED_DIGEST: DIGESTS[-1],
                         CRON_CLASS: self.classes.storage}},
                     "spec": {"schedule": schedule, "managedDataSource": left.data_source, "importsToKeep": 2,
                              "garbageCollect": "Outdated", "template": {"spec": {
                                  "source": {"registry": {"url": "docker://registry.cdi-takeover.invalid/golden"}},
                                  "storage": {"storageClassName": self.classes.storage,
                                              "resources": {"requests": {"storage": CLAIM_SIZE}}}}}}})
        self.write_status("dataimportcrons", left.cron, {
            "currentImports": [{"DataVolumeName": current, "Digest": DIGESTS[-1]}],
            "lastImportedPVC": {"namespace": self.namespace, "name": current},
            "lastExecutionTimestamp": STAMP, "lastImportTimestamp": STAMP, "sourceFormat": "pvc",
            "conditions": [
                {"type": "Progressing", "status": "False", "message": "No current import", "reason": "NoImport",
                 "lastTransitionTime": STAMP, "lastHeartbeatTime": STAMP},
                {"type": "UpToDate", "status": "True", "message": "Latest import is up to date", "reason": "UpToDate",
                 "lastTransitionTime": STAMP, "lastHeartbeatTime": STAMP}]}, self.namespace)
        source = {"pvc": {"namespace": self.namespace, "name": current}}
        self.create({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
                     "metadata": {"name": left.data_source, "namespace": self.namespace, "labels": cron_labels},
                     "spec": {"source": source}})
        self.write_status("datasources", left.data_source, {"source": source, "conditions": [
            {"type": "Ready", "status": "True", "message": "DataSource is ready to be consumed", "reason": "Ready",
             "lastTransitionTime": STAMP, "lastHeartbeatTime": STAMP}]}, self.namespace)

    # -- cluster-wide -----------------------------------------------------------------------------------

    def _owned(self) -> Obj:
        """CDI's SetOwnerRuntime: what its controller creates cluster-wide is owned by the CDI resource."""
        return {"ownerReferences": [owner("CDI", "cdi.kubevirt.io/v1beta1", self._cr)]} if self._cr else {}

    def profile(self, storage_class: str, provisioner: str) -> None:
        """An admin's edit of the class's StorageProfile (the one the cron and clones do not use)."""
        spec = {"cloneStrategy": "copy",
                "claimPropertySets": [{"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}]}
        self.left.profile, self.left.profile_spec = storage_class, spec
        body = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "StorageProfile",
                "metadata": {"name": storage_class, "labels": {**APP, **RECOMMENDED},
                             "annotations": {_A + "minimumSupportedPvcSize": "16Mi"}, **self._owned()},
                "spec": spec}
        if self.get("storageprofile", storage_class) is None:
            self.create(body)
        else:
            self.kube("patch", "storageprofile", storage_class, "--type=merge", "-p", json.dumps(body))
        self.write_status("storageprofiles", storage_class, {
            "storageClass": storage_class, "provisioner": provisioner, "cloneStrategy": "copy",
            "claimPropertySets": spec["claimPropertySets"], "dataImportCronSourceFormat": "pvc"})

    def config(self, spec: Obj) -> None:
        """CDIConfig `config` as CDI's config controller keeps it (its spec the CDI resource's `spec.config`)."""
        body = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDIConfig",
                "metadata": {"name": "config", "labels": {**APP, **RECOMMENDED}, **self._owned()}, "spec": spec}
        if self.get("cdiconfig", "config") is None:
            self.create(body)
        else:
            self.kube("patch", "cdiconfig", "config", "--type=merge", "-p", json.dumps({"spec": spec}))
        self.write_status("cdiconfigs", "config", {
            "scratchSpaceStorageClass": self.classes.storage,
            "filesystemOverhead": {"global": spec.get("filesystemOverhead", {}).get("global", "0.06")},
            "defaultPodResourceRequirements": {"limits": {"cpu": "750m", "memory": "600M"},
                                               "requests": {"cpu": "100m", "memory": "60M"}},
            "importProxy": {"HTTPProxy": "", "HTTPSProxy": "", "noProxy": "", "trustedCAProxy": ""},
            "preallocation": False})

    def cdi_resource(self, spec: Obj) -> None:
        """The `CDI` resource as CDI's operator leaves it: Deployed, its versions, its finalizer, the
        config-authority annotation, and `cdi-config` (the ConfigMap naming it the active resource)."""
        cr = self.create({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
                          "metadata": {"name": "cdi", "finalizers": ["operator.cdi.kubevirt.io"],
                                       "annotations": {_A + "configAuthority": ""}},
                          "spec": spec})
        stamp = {"lastTransitionTime": STAMP, "lastHeartbeatTime": STAMP}
        self.write_status("cdis", "cdi", {
            "phase": "Deployed", "operatorVersion": CDI_RELEASE, "targetVersion": CDI_RELEASE,
            "observedVersion": CDI_RELEASE, "conditions": [
                {"type": "Available", "status": "True", "reason": "Completed", "message": "Deployment Completed",
                 **stamp},
                {"type": "Progressing", "status": "False", "reason": "Completed", "message": "", **stamp},
                {"type": "Degraded", "status": "False", "reason": "", "message": "", **stamp}]})
        if self.get("namespace", self.cdi_namespace) is None:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.cdi_namespace}})
        self.create({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "cdi-config", "namespace": self.cdi_namespace,
                                  "labels": {"operator.cdi.kubevirt.io": ""},
                                  "ownerReferences": [owner("CDI", "cdi.kubevirt.io/v1beta1", cr)]}})
        self.left.cdi_spec = spec
        self._cr = cr

    # -- all of it ---------------------------------------------------------------------------------------

    def build(self, *, profile_class: str, profile_provisioner: str, config: Obj,
              cdi_spec: Obj | None = None, namespace_labels: Mapping[str, str] | None = None) -> Left:
        self.create({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": self.namespace, "labels": dict(namespace_labels or {})}})
        wait_for(lambda: self.get("serviceaccount", "default", self.namespace), 60, 0.2,
                 message=f"the default ServiceAccount of {self.namespace}")
        if self.with_cdi_resource:
            self.cdi_resource(cdi_spec or {"config": config})
        self.config(config)
        self.profile(profile_class, profile_provisioner)
        self.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vddk", "namespace": self.namespace},
                     "stringData": {"user": "administrator", "password": "not-a-password"}})
        steps: list[Callable[[], None]] = [self.imported, self.imported_legacy, self.blank, self.vddk, self.uploaded,
                                           lambda: self.cloned("imported"), lambda: self.cloned_legacy("imported"),
                                           self.failed, self.wffc, self.upload_waiting,
                                           self.cron]
        for step in steps:
            step()
        return self.left


def cdi_shipped_crds(ours: list[Obj]) -> list[Obj]:
    """CDI's CRDs as CDI ships them, made from ours: the same schemas, with CDI's status subresources (CDI
    gives one only to DataVolume, StorageProfile and ObjectTransfer) and CDI's versions (the CDI kind also
    `v1alpha1`, served); labelled and annotated as controller-gen leaves them, with no owner of ours."""
    with_status = {"datavolumes", "storageprofiles", "objecttransfers"}
    crds = []
    for crd in ours:
        crd = json.loads(json.dumps(crd))
        if crd["spec"]["group"] != "cdi.kubevirt.io":
            continue
        crd["metadata"] = {"name": crd["metadata"]["name"],
                           "annotations": {"controller-gen.kubebuilder.io/version": "v0.17.2"}}
        for version in crd["spec"]["versions"]:
            if crd["spec"]["names"]["plural"] in with_status:
                version["subresources"] = {"status": {}}
            else:
                version.pop("subresources", None)
        crds.append(crd)
    return crds


def rsa_ca(name: str, namespace: str = "cdi") -> tuple[bytes, bytes]:
    """A signer as CDI's operator makes them (library-go: RSA 2048, CN `<namespace>_<name>@<time>`): PEM
    certificate and key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{namespace}_{name}@1700000000")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=47))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                              serialization.NoEncryption()))
