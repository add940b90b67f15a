"""The importer pod for a PVC, built from the PVC's import annotations and CDI's configuration,
following the worker-pod contract (DESIGN §3.1): configuration by CDI's env var names, the target at
/data or /dev/cdi-block-volume, scratch at /scratch, CA bundles and header secrets as mounted files,
progress on :8443/metrics, the result in the termination message.

Unlike CDI, the pod is `restartPolicy: Never`: retries are the controller's decision, made from
the importer's reason code, so a permanent failure ends instead of crash-looping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlparse

from cdi.api import annotations as ann
from cdi.api import env, groups, naming
from cdi.api.envvalues import pod_ip_from_status
from cdi.api.importrequest import ImporterOptions, ImportRequest
from cdi.api.owners import owner_reference
from cdi.api.targetvolume import TargetVolume, default_path
from cdi.api.views import ClaimView, PodView
from cdi.controller.claims import progress_owner_uid
from cdi.controller.datavolume.importproxy import proxy_ca_configmap_name
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


def node_image(request: ImportRequest) -> str:
    """The image the node pulls: the endpoint without `docker://` (CDI's getRegistryImportImage)."""
    parsed = urlparse(request.endpoint)
    return parsed.netloc + parsed.path if parsed.scheme else request.endpoint


def import_request_of(pod: Body) -> ImportRequest:
    """The import an importer pod was made for: its importer's environment, with the names only its
    volumes hold (cert ConfigMap, GCS secret, secret extra headers) and, for a node pull, the
    registry image its server container runs."""
    view = PodView(pod)
    containers = view.containers
    importer = next(c for c in containers if c.get("name") == IMPORTER_CONTAINER)
    request = ImportRequest.from_env(importer.get("env") or [])
    volumes = {str(v.get("name")) for v in view.volumes}
    cert = view.configmap_of(CERT_VOLUME)
    secret = view.secret_of(SECRET_VOLUME) or request.secret
    headers = tuple(view.secret_of(f"cdi-extra-headers-{i}")
                    for i in range(len(volumes)) if f"cdi-extra-headers-{i}" in volumes)
    request = replace(request, cert_configmap=cert, secret=secret, secret_extra_headers=headers)
    server = next((c for c in containers if c.get("name") == NODE_PULL_SERVER_CONTAINER), None)
    if request.pull_method == env.PULL_METHOD_NODE and server is not None:
        request = replace(request, source=env.SOURCE_REGISTRY, endpoint=f"docker://{server.get('image')}")
    return request


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


def _node_pull(importer: Obj, volumes: list[Obj], source: ImportRequest, settings: WorkerSettings) -> tuple[Obj, Obj]:
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
                       {"name": env.READY_FILE, "value": f"{NODE_PULL_SHARED_DIR}/ready"},
                       {"name": env.DONE_FILE, "value": f"{NODE_PULL_SHARED_DIR}/done"}]
    importer.setdefault("volumeMounts", []).append(dict(shared))
    volumes.append({"name": NODE_PULL_SHARED_VOLUME, "emptyDir": {}})
    server: Obj = {
        "name": NODE_PULL_SERVER_CONTAINER, "image": node_image(source),
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


def importer_pod(pvc: Body, source: ImportRequest, settings: WorkerSettings, *, attempt: int = 0,
                 scratch_claim: str | None = None, filesystem_overhead: str = "0", preallocation: bool = False,
                 poll: bool = False) -> Obj:
    """The importer's container and volumes; placement, resources, security context, priority class,
    service account and pass-through annotations are every worker pod's (`workerpod.worker_pod`). `poll`:
    the importer only reports the source's current version (a DataImportCron's poller)."""
    claim = ClaimView(pvc)
    name, namespace, block = claim.name, claim.namespace, claim.block
    insecure = source.insecure_skip_verify or (
        source.source == env.SOURCE_REGISTRY and _insecure_registry(source.endpoint, settings.insecure_registries))
    target = TargetVolume(path=default_path(block), size=claim.requested_storage,
                          filesystem_overhead="0" if block else filesystem_overhead, preallocation=preallocation,
                          owner_uid=progress_owner_uid(pvc))
    options = ImporterOptions.from_import_proxy(settings.import_proxy, retry_budget=settings.retry_budget, poll=poll)
    environment: list[Obj] = [*source.to_env(insecure_tls=insecure), *target.to_env(size_var=env.IMAGE_SIZE),
                              pod_ip_from_status(), *options.to_env()]

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
    if options.proxy_cert_dir:  # the copy in the claim's namespace (importproxy.ensure_proxy_ca)
        volumes.append({"name": PROXY_CERT_VOLUME, "configMap": {"name": proxy_ca_configmap_name(name)}})
        mounts.append({"name": PROXY_CERT_VOLUME, "mountPath": options.proxy_cert_dir})
    for index, secret in enumerate(source.secret_extra_headers):
        volume = f"cdi-extra-headers-{index}"
        volumes.append({"name": volume, "secret": {"secretName": secret}})
        mounts.append({"name": volume, "mountPath": f"{env.SECRET_EXTRA_HEADERS_DIR_DEFAULT}/secret_{index}",
                       "readOnly": True})

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
        owner=owner_reference(groups.PVCS, pvc), containers=containers, volumes=volumes, restart_policy="Never",
        settings=settings.pod, init_containers=init_containers, labels={ann.LABEL_PROMETHEUS: "true"})
    if source.node_pull and source.registry_arch:  # CDI's setRegistryNodeImportNodeSelector
        pod["spec"].setdefault("nodeSelector", {})["kubernetes.io/arch"] = source.registry_arch
    return pod


NODE_POLLER_CONTAINER = "image-container"  # CDI's name for the image a node-pull cron's poller runs


def node_pull_poller(annotated: Body, source: ImportRequest, settings: WorkerSettings, owner: Body) -> Obj:
    """The poller of a DataImportCron with registry `pullMethod: node`, as CDI builds it: the node pulls
    the user's image (pull policy Always, so a tag that moved is resolved again) and runs the server an
    init container copied in with `-h`, which exits at once; the version is the digest the node reports in
    the container's `imageID`. The image is reached with the node's credentials, mirrors and trust, as
    its import will be: no pod asks the registry anything, which is the point of pulling by the node."""
    shared = {"name": NODE_PULL_SHARED_VOLUME, "mountPath": NODE_PULL_SHARED_DIR}
    container: Obj = {"name": NODE_POLLER_CONTAINER, "image": node_image(source), "imagePullPolicy": "Always",
                      "command": [f"{NODE_PULL_SHARED_DIR}/server", "-h"], "volumeMounts": [dict(shared)]}
    init: Obj = {"name": NODE_PULL_INIT_CONTAINER, "image": settings.importer_image,
                 "args": ["--install-containerimage-server", f"{NODE_PULL_SHARED_DIR}/server"],
                 "volumeMounts": [dict(shared)]}
    meta = annotated.get("metadata") or {}
    pod = worker_pod(name=naming.resource_name("poller", str(meta.get("name", ""))),
                     namespace=str(meta.get("namespace", "")), component="importer", annotated=annotated, owner=owner,
                     containers=[container], volumes=[{"name": NODE_PULL_SHARED_VOLUME, "emptyDir": {}}],
                     restart_policy="Never", settings=settings.pod, init_containers=[init])
    if source.registry_arch:  # CDI's poller too runs on a node of the image's architecture
        pod["spec"].setdefault("nodeSelector", {})["kubernetes.io/arch"] = source.registry_arch
    return pod


def mounts_scratch(pod: Body) -> bool:
    """Whether an importer pod had a scratch claim (a pod without one may ask for it)."""
    return PodView(pod).volume(SCRATCH_VOLUME) is not None
