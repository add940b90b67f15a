"""The importer pod for a PVC, built from the PVC's import annotations and CDI's configuration,
following the worker-pod contract (DESIGN §3.1): configuration by CDI's env var names, the target at
/data or /dev/cdi-block-volume, scratch at /scratch, CA bundles and header secrets as mounted files,
progress on :8443/metrics, the result in the termination message.

Unlike CDI, the pod is `restartPolicy: Never`: retries are the controller's decision, made from
the importer's reason code, so a permanent failure ends instead of crash-looping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from cdi.api import annotations as ann
from cdi.api import env, naming
from cdi.api.views import dig
from cdi.controller.claims import owner_reference
from cdi.controller.datavolume.importproxy import proxy_ca_configmap_name, trusted_ca_proxy
from cdi.controller.workerpod import PodSettings, worker_pod

Body = Mapping[str, Any]
Obj = dict[str, Any]

IMPORTER_CONTAINER = "importer"
DATA_VOLUME = "cdi-data-vol"
SCRATCH_VOLUME = "cdi-scratch-vol"
CERT_VOLUME = "cdi-cert-vol"
PROXY_CERT_VOLUME = "cdi-proxy-cert-vol"
SECRET_VOLUME = "cdi-secret-vol"  # gcs: the credentials secret, mounted as a file (CDI's name)
# registry pullMethod node (CDI's makeNodeImporterPodSpec names): the init container copies the server
# from the importer image into the shared emptyDir; the user's image runs it as the `server` container
NODE_PULL_INIT_CONTAINER = "init"
NODE_PULL_SERVER_CONTAINER = "server"
NODE_PULL_SHARED_VOLUME = "shared-volume"
NODE_PULL_SHARED_DIR = "/shared"
NODE_PULL_PORT = 8100
NODE_PULL_IMAGE_DIR = "/disk"


@dataclass(frozen=True)
class ImportSource:
    """An import as the PVC's annotations describe it (CDI's legacy PVC API, also what DataVolumes write)."""

    source: str
    endpoint: str = ""
    content_type: str = "kubevirt"
    secret: str = ""
    cert_configmap: str = ""
    extra_headers: tuple[str, ...] = ()
    secret_extra_headers: tuple[str, ...] = ()
    checksum: str = ""
    insecure_skip_verify: bool = False
    registry_arch: str = ""
    pull_method: str = "pod"

    @property
    def node_pull(self) -> bool:
        """A registry import whose image the node pulls and runs (CDI's isRegistryNodeImport)."""
        return self.source == env.SOURCE_REGISTRY and self.pull_method == env.PULL_METHOD_NODE

    def node_image(self) -> str:
        """The image the node pulls: the endpoint without `docker://` (CDI's getRegistryImportImage)."""
        parsed = urlparse(self.endpoint)
        return parsed.netloc + parsed.path if parsed.scheme else self.endpoint

    @classmethod
    def from_pvc(cls, pvc: Body) -> ImportSource:
        annotations: Mapping[str, str] = dig(pvc, "metadata", "annotations") or {}
        return cls(
            source=annotations.get(ann.IMPORT_SOURCE, env.SOURCE_HTTP),
            endpoint=annotations.get(ann.IMPORT_ENDPOINT, ""),
            content_type=annotations.get(ann.CONTENT_TYPE, "") or "kubevirt",
            secret=annotations.get(ann.IMPORT_SECRET, ""),
            cert_configmap=annotations.get(ann.IMPORT_CERT_CONFIGMAP, ""),
            extra_headers=tuple(_lines(annotations.get(ann.IMPORT_EXTRA_HEADERS, ""))),
            secret_extra_headers=tuple(_lines(annotations.get(ann.IMPORT_SECRET_EXTRA_HEADERS, ""))),
            checksum=annotations.get(ann.IMPORT_CHECKSUM, ""),
            insecure_skip_verify=annotations.get(ann.IMPORT_INSECURE_SKIP_VERIFY, "") == "true",
            registry_arch=annotations.get(ann.IMPORT_REGISTRY_ARCHITECTURE, ""),
            pull_method=annotations.get(ann.IMPORT_REGISTRY_IMPORT_METHOD, "") or "pod",
        )


def _lines(text: str) -> list[str]:
    """Header lists are stored one per line (CDI stores them JSON-encoded; both are accepted)."""
    text = text.strip()
    if text.startswith("["):
        import json
        return [str(v) for v in json.loads(text)]
    return [line for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class WorkerSettings:
    """CDIConfig status and controller flags that shape importer pods: what every worker pod gets
    (`pod`, applied by `workerpod.worker_pod`) and the importer's own."""

    importer_image: str = "cdi-importer"
    import_proxy: Body | None = None
    insecure_registries: tuple[str, ...] = ()
    pod: PodSettings = field(default_factory=PodSettings)
    retry_budget: float | None = None  # IMPORTER_RETRY_BUDGET: seconds of failing before the import gives up


def pod_name(pvc_name: str, attempt: int) -> str:
    """`importer-<pvc>` (`-retry-N` for a later attempt), shortened as CDI does for long claim names."""
    return naming.resource_name("importer", pvc_name if attempt == 0 else f"{pvc_name}-retry-{attempt}")


def _insecure_registry(endpoint: str, registries: Sequence[str]) -> bool:
    host = urlparse(endpoint.replace("docker://", "https://", 1)).netloc
    return host in registries


def _owner_uid(pvc: Body) -> str:
    owners = dig(pvc, "metadata", "ownerReferences") or []
    return str(owners[0]["uid"]) if len(owners) == 1 else str(dig(pvc, "metadata", "uid"))


def _node_pull(importer: Obj, volumes: list[Obj], source: ImportSource, settings: WorkerSettings) -> tuple[Obj, Obj]:
    """CDI's pod shape for registry pullMethod node: the importer reads the disk over HTTP from the
    user's image, which runs the server an init container copied into the shared emptyDir (see
    `cdi.importer.containerimage`); (server container, init container). The server binds the pod IP
    (on the embedded node pods share the host's network, so `localhost:8100` would be shared too),
    hence the endpoint. The user's image is pulled with the controller's pull policy, as in CDI."""
    shared = {"name": NODE_PULL_SHARED_VOLUME, "mountPath": NODE_PULL_SHARED_DIR}
    variables = {env.SOURCE: env.SOURCE_HTTP,
                 env.ENDPOINT: f"http://$({env.POD_IP}):{NODE_PULL_PORT}/{env.DISK_IMAGE_NAME}"}
    pod_ip = next(e for e in importer["env"] if e["name"] == env.POD_IP)
    rest = [dict(e, value=variables[e["name"]]) if e["name"] in variables else e
            for e in importer["env"] if e["name"] != env.POD_IP]
    importer["env"] = [pod_ip, *rest,  # POD_IP first: the endpoint refers to it
                       {"name": env.PULL_METHOD, "value": env.PULL_METHOD_NODE},
                       {"name": env.READY_FILE, "value": f"{NODE_PULL_SHARED_DIR}/ready"},
                       {"name": env.DONE_FILE, "value": f"{NODE_PULL_SHARED_DIR}/done"}]
    importer.setdefault("volumeMounts", []).append(dict(shared))
    volumes.append({"name": NODE_PULL_SHARED_VOLUME, "emptyDir": {}})
    server: Obj = {
        "name": NODE_PULL_SERVER_CONTAINER, "image": source.node_image(),
        "command": [f"{NODE_PULL_SHARED_DIR}/server", "-p", str(NODE_PULL_PORT), "-image-dir", NODE_PULL_IMAGE_DIR,
                    "-ready-file", f"{NODE_PULL_SHARED_DIR}/ready", "-done-file", f"{NODE_PULL_SHARED_DIR}/done"],
        "env": [dict(pod_ip)], "volumeMounts": [dict(shared)],
    }
    init: Obj = {
        "name": NODE_PULL_INIT_CONTAINER, "image": settings.importer_image,
        "args": ["--install-containerimage-server", f"{NODE_PULL_SHARED_DIR}/server"],
        "volumeMounts": [dict(shared)],
    }
    return server, init


def importer_pod(pvc: Body, source: ImportSource, settings: WorkerSettings, *, attempt: int = 0,
                 scratch_claim: str | None = None, filesystem_overhead: str = "0", preallocation: bool = False) -> Obj:
    """The importer's container and volumes; placement, resources, security context, priority class,
    service account and pass-through annotations are every worker pod's (`workerpod.worker_pod`)."""
    name = str(dig(pvc, "metadata", "name"))
    namespace = str(dig(pvc, "metadata", "namespace"))
    block = dig(pvc, "spec", "volumeMode") == "Block"
    environment: list[Obj] = [
        {"name": env.SOURCE, "value": source.source},
        {"name": env.ENDPOINT, "value": source.endpoint},
        {"name": env.CONTENT_TYPE, "value": source.content_type},
        {"name": env.IMAGE_SIZE, "value": str(dig(pvc, "spec", "resources", "requests", "storage") or "")},
        {"name": env.OWNER_UID, "value": _owner_uid(pvc)},
        {"name": env.FILESYSTEM_OVERHEAD, "value": "0" if block else filesystem_overhead},
        {"name": env.PREALLOCATION, "value": "true" if preallocation else "false"},
        {"name": env.POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    insecure = source.insecure_skip_verify or (
        source.source == env.SOURCE_REGISTRY and _insecure_registry(source.endpoint, settings.insecure_registries))
    environment.append({"name": env.INSECURE_TLS, "value": "true" if insecure else "false"})
    if source.checksum:
        environment.append({"name": env.CHECKSUM, "value": source.checksum})
    if settings.retry_budget is not None:
        environment.append({"name": env.RETRY_BUDGET, "value": f"{settings.retry_budget:g}"})
    if source.registry_arch:
        environment.append({"name": env.REGISTRY_ARCHITECTURE, "value": source.registry_arch})
    if source.secret and source.source == env.SOURCE_GCS:
        environment.append({"name": env.GOOGLE_CREDENTIALS,
                            "value": f"{env.GOOGLE_CREDENTIALS_DIR}/{env.GOOGLE_CREDENTIALS_KEY}"})
    elif source.secret:
        for var, key in ((env.ACCESS_KEY_ID, "accessKeyId"), (env.SECRET_KEY, "secretKey")):
            environment.append({"name": var, "valueFrom": {"secretKeyRef": {
                "name": source.secret, "key": key, "optional": True}}})
    for index, header in enumerate(source.extra_headers):
        environment.append({"name": f"{env.EXTRA_HEADER_PREFIX}{index}", "value": header})
    proxy = settings.import_proxy or {}
    for var, key in ((env.HTTP_PROXY, "HTTPProxy"), (env.HTTPS_PROXY, "HTTPSProxy"), (env.NO_PROXY, "noProxy")):
        if proxy.get(key):
            environment.append({"name": var, "value": str(proxy[key])})

    mounts: list[Obj] = []
    devices: list[Obj] = []
    volumes: list[Obj] = [{"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": name, "readOnly": False}}]
    if block:
        devices.append({"name": DATA_VOLUME, "devicePath": env.BLOCK_PATH_DEFAULT})
    else:
        mounts.append({"name": DATA_VOLUME, "mountPath": env.DATA_DIR_DEFAULT})
    if scratch_claim:
        volumes.append({"name": SCRATCH_VOLUME, "persistentVolumeClaim": {"claimName": scratch_claim}})
        mounts.append({"name": SCRATCH_VOLUME, "mountPath": env.SCRATCH_DIR_DEFAULT})
    if source.secret and source.source == env.SOURCE_GCS:
        volumes.append({"name": SECRET_VOLUME, "secret": {"secretName": source.secret}})
        mounts.append({"name": SECRET_VOLUME, "mountPath": env.GOOGLE_CREDENTIALS_DIR, "readOnly": True})
    if source.cert_configmap:
        volumes.append({"name": CERT_VOLUME, "configMap": {"name": source.cert_configmap}})
        mounts.append({"name": CERT_VOLUME, "mountPath": env.CERT_DIR_DEFAULT})
        environment.append({"name": env.CERT_DIR, "value": env.CERT_DIR_DEFAULT})
    if trusted_ca_proxy(proxy):  # the copy in the claim's namespace (importproxy.ensure_proxy_ca)
        volumes.append({"name": PROXY_CERT_VOLUME, "configMap": {"name": proxy_ca_configmap_name(name)}})
        mounts.append({"name": PROXY_CERT_VOLUME, "mountPath": env.PROXY_CERT_DIR_DEFAULT})
        environment.append({"name": env.PROXY_CERT_DIR, "value": env.PROXY_CERT_DIR_DEFAULT})
    for index, secret in enumerate(source.secret_extra_headers):
        volume = f"cdi-extra-headers-{index}"
        volumes.append({"name": volume, "secret": {"secretName": secret}})
        mounts.append({"name": volume, "mountPath": f"/extraheaders/secret_{index}", "readOnly": True})

    container: Obj = {
        "name": IMPORTER_CONTAINER, "image": settings.importer_image, "env": environment,
        "ports": [{"name": "metrics", "containerPort": env.METRICS_PORT, "protocol": "TCP"}],
        "terminationMessagePath": env.TERMINATION_LOG_DEFAULT, "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if mounts:
        container["volumeMounts"] = mounts
    if devices:
        container["volumeDevices"] = devices
    containers, init_containers = [container], []
    if source.node_pull:
        server, init = _node_pull(container, volumes, source, settings)
        containers.append(server)
        init_containers.append(init)
    pod = worker_pod(
        name=pod_name(name, attempt), namespace=namespace, component="importer", annotated=pvc,
        owner=owner_reference(pvc), containers=containers, volumes=volumes, restart_policy="Never",
        settings=settings.pod, init_containers=init_containers, labels={ann.LABEL_PROMETHEUS: "true"})
    if source.node_pull and source.registry_arch:  # CDI's setRegistryNodeImportNodeSelector
        pod["spec"].setdefault("nodeSelector", {})["kubernetes.io/arch"] = source.registry_arch
    return pod


def mounts_scratch(pod: Body) -> bool:
    """Whether an importer pod had a scratch claim (a pod without one may ask for it)."""
    return any(v.get("name") == SCRATCH_VOLUME for v in dig(pod, "spec", "volumes") or [])
