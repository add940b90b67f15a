"""The cluster the end-to-end scenarios run against: `cdi up` (the default), or any Kubernetes cluster
given by `CDI_E2E_KUBECONFIG` where cdi is installed and its images are loaded (the real-cluster tier
runs the suite so against the realk8s kit, from inside its network namespace).

Scenarios marked `anycluster` run on both, those marked `realcluster` (a controller's pods, a node's processes)
only against a kubeconfig; the others need `cdi up` (its storage classes `local` and
`local-nosnap`, its flags, its node's files) and are skipped against a kubeconfig. What differs between
the two is stated here once, never in a test:

| variable | what | `cdi up` |
|---|---|---|
| `CDI_E2E_KUBECONFIG` | the cluster | (started by the tests) |
| `CDI_E2E_STORAGE_CLASS` | a class with snapshots and CSI clones | `local` |
| `CDI_E2E_SMART_CLONE` | the `cloneType` the planner picks on that class (default `snapshot`) | `csi-clone` |
| `CDI_E2E_COPY_CLASS` | a class without snapshots (host-assisted clones) | `local-nosnap` |
| `CDI_E2E_WFFC_CLASS` | a CSI class binding `WaitForFirstConsumer` | `local-wffc` |
| `CDI_E2E_SERVE_HOST` | where the file servers listen, which pods reach (`tests/support/servers.py`) | `127.0.0.1` |
| `CDI_E2E_IMAGE` | the image of the tests' own pods (python3, sh, coreutils) | `debian` (the node runs it locally) |
| `CDI_E2E_BLOCK` | `0`: the cluster's runtime gives non-root pods no block devices; Block cases skip | `1` |
| `CDI_E2E_CDI_NAMESPACE` | where cdi's components run (the upload proxy's Service) | `cdi` |
| `CDI_E2E_SNAPSHOT_CLASS` | a VolumeSnapshotClass of `CDI_E2E_STORAGE_CLASS`'s driver | `local` |
| `CDI_E2E_WEBHOOK_CLIENT_AUTH` | `1`: webhooks get the API server's client certificate and require it | `1` |
| `CDI_E2E_CROSS_NAMESPACE_GATE` | `1`: the API server has `CrossNamespaceVolumeDataSource` | per module |
| `CDI_E2E_PROVISIONER_CROSS_NAMESPACE` | `1`: its CSI provisioner honours that gate (claims, snapshots) | `1` |
| `CDI_E2E_UNLISTED_PROVISIONER` | a provisioner CDI does not know (default `hostpath.csi.k8s.io`) | `unlisted...` |
| `CDI_E2E_NODE_LOCAL` | `1`: the cluster's node is this machine (its pods' processes are in this `/proc`) | (none) |
| `CDI_E2E_NODE_RESTART` | a command that restarts the node's kubelet and container runtime | (none) |
| `CDI_E2E_NODES` | how many nodes the cluster has (`multinode` scenarios need 2) | `1` |
| `CDI_E2E_NODE_DOWN` | a command that cuts the power of the second node | (none) |
| `CDI_E2E_NODE_UP` | a command that brings the second node back | (none) |

`unlisted...` is `unlisted.local.storage.cdi.kubevirt.io`; a class of the unlisted provisioner gets a
StorageProfile without `claimPropertySets`, as CDI gives one to a driver it does not know.

Against a real cluster the tests' pods run as CDI's workers do (uid 107, the `restricted` Pod Security
profile), and the namespaces they create enforce that profile."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cdi.api.groups import CDI_NAMESPACE
from cdi.operator.resources import Images
from cdi.uploadproxy.serving import CA_CONFIGMAP, CA_KEY
from tests.support.cluster import CdiUp

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
LABEL = {"cdi-e2e": "true"}  # on the namespaces the suite creates on a real cluster, for whoever cleans it up


@dataclass(frozen=True)
class Target:
    kubeconfig: Path | None  # None: `cdi up`, started by the tests
    storage_class: str
    smart_clone: str  # what the planner picks on `storage_class`: stated, not read from what the code computed
    copy_class: str
    wffc_class: str
    image: str
    block: bool
    cdi_namespace: str
    snapshot_class: str = "local"
    webhook_client_auth: bool = True
    cross_namespace_gate: bool | None = None  # None: `cdi up`, where each module chooses
    provisioner_cross_namespace: bool = True
    unlisted_provisioner: str = "unlisted.local.storage.cdi.kubevirt.io"
    node_local: bool = False
    node_restart: tuple[str, ...] = ()
    nodes: int = 1
    node_down: tuple[str, ...] = ()
    node_up: tuple[str, ...] = ()

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> Target:
        kubeconfig = env.get("CDI_E2E_KUBECONFIG")
        if not kubeconfig:
            return cls(None, "local", "csi-clone", "local-nosnap", "local-wffc", "debian", True, CDI_NAMESPACE)
        return cls(Path(kubeconfig), env.get("CDI_E2E_STORAGE_CLASS", "csi-hostpath-sc"),
                   env.get("CDI_E2E_SMART_CLONE", "snapshot"),
                   env.get("CDI_E2E_COPY_CLASS", "csi-hostpath-nosnap"), env.get("CDI_E2E_WFFC_CLASS", "cdi-e2e-wffc"),
                   env.get("CDI_E2E_IMAGE", Images().of("cdi-importer")), env.get("CDI_E2E_BLOCK", "1") != "0",
                   env.get("CDI_E2E_CDI_NAMESPACE", "cdi"),
                   env.get("CDI_E2E_SNAPSHOT_CLASS", "csi-hostpath-snapclass"),
                   env.get("CDI_E2E_WEBHOOK_CLIENT_AUTH", "0") == "1",
                   env.get("CDI_E2E_CROSS_NAMESPACE_GATE", "0") == "1",
                   env.get("CDI_E2E_PROVISIONER_CROSS_NAMESPACE", "0") == "1",
                   env.get("CDI_E2E_UNLISTED_PROVISIONER", "hostpath.csi.k8s.io"),
                   env.get("CDI_E2E_NODE_LOCAL", "0") == "1", tuple(shlex.split(env.get("CDI_E2E_NODE_RESTART", ""))),
                   int(env.get("CDI_E2E_NODES", "1")), tuple(shlex.split(env.get("CDI_E2E_NODE_DOWN", ""))),
                   tuple(shlex.split(env.get("CDI_E2E_NODE_UP", ""))))

    @property
    def embedded(self) -> bool:
        return self.kubeconfig is None

    def pod_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A test pod's spec made to run on the target: on a real cluster with an image that is there and
        as the `restricted` profile wants it (CDI's uid, its group owning the volume)."""
        for container in spec["containers"]:
            if not self.embedded:
                container["image"] = self.image
                container["imagePullPolicy"] = "IfNotPresent"
                container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                "runAsNonRoot": True, "runAsUser": 107}
        if not self.embedded:
            spec["securityContext"] = {"runAsNonRoot": True, "fsGroup": 107,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
        return spec

    def namespace(self, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if not self.embedded:
            meta["labels"] = {**RESTRICTED, **LABEL}
        return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}

    def describe(self) -> str:
        return "cdi up" if self.embedded else json.dumps({"kubeconfig": str(self.kubeconfig),
                                                          "storage": self.storage_class, "image": self.image})


TARGET = Target.from_environ(os.environ)


class External:
    """A cluster the tests did not start, in the place of a `CdiUp`: its kubeconfig, where its upload proxy
    is (its Service's cluster IP: the tests run where that is reachable) and the CA `cdi image-upload`
    trusts, and no node logs to show when a test fails (its pods' logs are the cluster's)."""

    found_clean = False  # checked once per run: the modules of one run share the cluster, as they are meant to

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        if not External.found_clean:
            self.refuse_leftovers()
            External.found_clean = True

    def refuse_leftovers(self) -> None:
        """On `cdi up` every module starts from an empty cluster; here the scenarios name their objects in
        `default` and in namespaces of fixed names, so what an earlier run left would be found again
        ("unchanged") and its bytes read back as this run's. The suite deletes nothing it did not create:
        it stops and says what to clear."""
        kinds = "datavolumes,dataimportcrons,datasources,persistentvolumeclaims,pods"
        try:
            left = self._kubectl("get", kinds, "-n", "default", "-o", "name").split()
        except subprocess.CalledProcessError as exc:
            pytest.fail(f"{self.kubeconfig}: is cdi installed there? {exc.stderr.strip()}", pytrace=False)
        namespaces = json.loads(self._kubectl("get", "namespaces", "-l", ",".join(LABEL), "-o", "json"))["items"]
        left += [f"namespace/{n['metadata']['name']}" for n in namespaces
                 if (n.get("status") or {}).get("phase") != "Terminating"]  # a terminating one cannot be reused
        if left:
            pytest.fail(f"{self.kubeconfig}: an earlier run's objects are still there ({', '.join(left[:8])}"
                        f"{', ...' if len(left) > 8 else ''}); clear them first: kubectl delete namespace -l "
                        f"{','.join(LABEL)}; kubectl delete -n default {kinds} --all", pytrace=False)

    def _kubectl(self, *args: str) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        return subprocess.run(["kubectl", *args], capture_output=True, text=True, check=True, env=env).stdout

    def proxy_url(self) -> str:
        ip = self._kubectl("get", "service", "cdi-uploadproxy", "-n", TARGET.cdi_namespace,
                           "-o", "jsonpath={.spec.clusterIP}")
        return f"https://{ip}:443"

    def proxy_ca(self) -> Path:
        path = self.workdir / "uploadproxy-ca.crt"
        path.write_text(self._kubectl("get", "configmap", CA_CONFIGMAP, "-n", TARGET.cdi_namespace,
                                      "-o", "go-template={{index .data \"" + CA_KEY + "\"}}"))
        return path

    def recent_logs(self) -> str:
        return ""


def own_cluster(tmp_path_factory: pytest.TempPathFactory, name: str, *flags: str) -> Iterator[CdiUp | External]:
    """A module's own `cdi up` with its flags; against a kubeconfig, that cluster (as it is configured)."""
    if TARGET.kubeconfig is not None:
        yield External(TARGET.kubeconfig, tmp_path_factory.mktemp(name))
        return
    up = CdiUp(tmp_path_factory.mktemp(name) / "cdi", *flags)
    up.start()
    yield up
    up.stop()
