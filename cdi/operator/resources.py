"""What CDI's operator installs, as plain manifests: the operator's own install (`cdi manifests`, CDI's
release asset `cdi-operator.yaml`), the example `CDI` resource (`cdi-cr.yaml`), and everything the operator
reconciles a `CDI` resource into (component Deployments, their ServiceAccounts and least-privilege RBAC,
Services, the PodDisruptionBudget, CDI's aggregated ClusterRoles, webhooks and the APIService).

Pure functions of their inputs: the reconciler applies them, `cdi manifests` prints them, tests read them.
Names are CDI's (`cdi-deployment`, `cdi-sa`, `cdi-apiserver`, `cdi-uploadproxy`, `cdi-api`, ...)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cdi import __version__
from cdi.api import annotations as ann
from cdi.api import componentenv, groups, upload
from cdi.api.crds import cdi_crds
from cdi.api.groups import GVR
from cdi.api.upload import PROXY_SERVICE

Obj = dict[str, Any]

DEPLOYMENTS = GVR("apps", "v1", "deployments", "Deployment", True)
ROLES = GVR("rbac.authorization.k8s.io", "v1", "roles", "Role", True)
ROLEBINDINGS = GVR("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True)
CLUSTERROLES = GVR("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False)
CLUSTERROLEBINDINGS = GVR("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False)
PDBS = GVR("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)

MANAGED_BY = {"app.kubernetes.io/managed-by": "cdi-operator", "app.kubernetes.io/component": "storage"}
OPERATOR = "cdi-operator"
CONTROLLER = "cdi-deployment"
CONTROLLER_SA = "cdi-sa"
APISERVER = "cdi-apiserver"
UPLOADPROXY = PROXY_SERVICE
API_SERVICE = "cdi-api"
METRICS_SERVICE = "cdi-prometheus-metrics"
COMPONENTS = ("cdi-operator", "cdi-controller", "cdi-apiserver", "cdi-uploadproxy", "cdi-importer",
              "cdi-uploadserver", "cdi-cloner")
DEFAULT_REGISTRY = "localhost/cdi"
UPLOAD_APISERVICE = f"{groups.UPLOAD_VERSION}.{groups.UPLOAD_GROUP}"
APISERVER_STATE_DIR = "/var/run/cdi-apiserver"
UPLOADPROXY_CERT_DIR = "/var/run/cdi-uploadproxy/certs"
UPLOADPROXY_STATE_DIR = "/var/run/cdi-uploadproxy/state"  # the request-header CA it follows (aggregation)


@dataclass(frozen=True)
class Images:
    """The component images, as CDI's operator gets them (its env vars `CONTROLLER_IMAGE`, ...)."""

    registry: str = DEFAULT_REGISTRY
    tag: str = __version__

    def of(self, component: str) -> str:
        return f"{self.registry}/{component}:{self.tag}"

    def env(self) -> list[Obj]:
        return [{"name": var, "value": self.of(component)} for component, var in componentenv.IMAGES.items()]


def _meta(name: str, namespace: str | None = None, labels: Mapping[str, str] | None = None) -> Obj:
    meta: Obj = {"name": name, "labels": {ann.LABEL_COMPONENT: "", **MANAGED_BY, **(labels or {})}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _rule(api_groups: Iterable[str], resources: Iterable[str], verbs: Iterable[str],
          names: Iterable[str] = ()) -> Obj:
    rule: Obj = {"apiGroups": list(api_groups), "resources": list(resources), "verbs": list(verbs)}
    if names:
        rule["resourceNames"] = list(names)
    return rule


READ = ("get", "list", "watch")
ALL = ("get", "list", "watch", "create", "update", "patch", "delete")

# -- RBAC of each component (CDI's doc/RBAC.md and pkg/operator/resources: only what each one does) -----

CONTROLLER_CLUSTER_RULES = [
    _rule([""], ["persistentvolumeclaims"], ALL),
    _rule([""], ["persistentvolumeclaims/finalizers", "pods/finalizers"], ["update"]),
    _rule([""], ["pods", "services", "secrets"], ("get", "list", "watch", "create", "delete")),
    # the import proxy's CA copied into a claim's namespace (import-proxy-cm-<pvc>), kept up to date and removed
    # when the import ends; CDI leaves that to garbage collection of the pod owning it (get and create only)
    _rule([""], ["configmaps"], ("get", "list", "watch", "create", "update", "delete")),
    _rule([""], ["persistentvolumes", "nodes"], READ),
    # a DataVolume whose claim or worker a quota refused goes on as soon as a quota of its namespace changes
    # (CDI only retries with backoff, and grants no read of quotas)
    _rule([""], ["resourcequotas"], READ),
    _rule([""], ["persistentvolumes"], ("update", "patch")),  # a volume handed over: smart clones, populators
    # list: a populator copies its prime claim's events onto the user's claim (CDI grants get/list/watch too)
    _rule([""], ["events"], ("create", "patch", "update", "get", "list", "watch")),
    _rule(["storage.k8s.io"], ["storageclasses", "csidrivers"], READ),
    _rule([groups.SNAPSHOT_GROUP], ["volumesnapshotclasses", "volumesnapshotcontents"], READ),
    _rule([groups.SNAPSHOT_GROUP], ["volumesnapshots"], ALL),  # DataImportCron snapshot sources
    # a populated claim's dataSourceRef into another namespace needs a grant there (Gateway API)
    _rule([groups.REFERENCEGRANTS.group], [groups.REFERENCEGRANTS.plural], READ),
    _rule([groups.CDI_GROUP], ["*"], ("*",)),
    # a DataImportCron cloning a claim: may its service account clone it? (CDI's authorizeCloneDataVolume)
    _rule(["authorization.k8s.io"], ["subjectaccessreviews"], ["create"]),
]
CONTROLLER_NAMESPACE_RULES = [
    _rule([""], ["secrets", "configmaps"], ALL),
    _rule(["coordination.k8s.io"], ["leases"], ALL),
    # an Ingress or Route in front of the upload proxy gives CDIConfig `status.uploadProxyURL`; the controller
    # caches them in this namespace only, as CDI's (which grants them here, not cluster-wide)
    _rule([groups.INGRESSES.group], [groups.INGRESSES.plural], READ),
    _rule([groups.ROUTES.group], [groups.ROUTES.plural], READ),
]
APISERVER_CLUSTER_RULES = [
    _rule(["authorization.k8s.io"], ["subjectaccessreviews"], ["create"]),
    _rule([""], ["persistentvolumeclaims"], READ),
    # datasources: the DataVolume mutating webhook resolves a sourceRef to the volume a clone token names
    _rule([groups.CDI_GROUP], ["datavolumes", "cdis", "cdiconfigs", "storageprofiles", "dataimportcrons",
                               "datasources"], READ),
    _rule(["storage.k8s.io"], ["storageclasses"], READ),
    # it registers its own webhooks and APIService (and drops the PVC-rendering webhook when it is disabled)
    _rule(["admissionregistration.k8s.io"], ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
          ("get", "list", "watch", "create", "update", "delete")),
    _rule(["apiregistration.k8s.io"], ["apiservices"], ("get", "list", "watch", "create", "update")),
]
APISERVER_NAMESPACE_RULES = [
    _rule([""], ["secrets"], ("get", "create")),
    _rule([""], ["configmaps", "services", "endpoints"], ("get", "list", "watch", "create", "update")),
]
UPLOADPROXY_CLUSTER_RULES = [
    _rule([""], ["persistentvolumeclaims", "services", "endpoints"], READ),
    _rule([groups.CDI_GROUP], ["cdiconfigs"], READ),  # its TLS profile (`cdi.kube.tlswatch`), as CDI's proxy
]
UPLOADPROXY_NAMESPACE_RULES = [
    _rule([""], ["secrets"], ["get"], names=["cdi-uploadserver-client-cert"]),
    _rule([""], ["configmaps"], ("get", "list", "watch", "create", "update")),
]
# the aggregation layer's client CA: what every aggregated API server reads (kube-system Role of that name)
AUTH_READER_ROLE = "extension-apiserver-authentication-reader"


def _admin_rules() -> list[Obj]:
    return [
        _rule([groups.CDI_GROUP], ["datavolumes", "dataimportcrons", "datasources", "volumeimportsources",
                                   "volumeuploadsources", "volumeclonesources"], ["*"]),
        _rule([groups.CDI_GROUP], ["datavolumes/source"], ["create"]),
        _rule([groups.UPLOAD_GROUP], ["uploadtokenrequests"], ["*"]),
        # uploads through the API server (our extension): POST is `create`, the HEAD probe and resume `get`
        _rule([upload.EXTENSION_GROUP], [f"{upload.EXTENSION_RESOURCE}/{upload.EXTENSION_SUBRESOURCE}"],
              ["create", "get"]),
    ]


def _view_rules() -> list[Obj]:
    return [_rule([groups.CDI_GROUP], ["cdiconfigs", "dataimportcrons", "datasources", "datavolumes",
                                       "objecttransfers", "storageprofiles", "volumeimportsources",
                                       "volumeuploadsources", "volumeclonesources"], READ)]


def aggregated_cluster_roles() -> list[Obj]:
    """CDI's ClusterRoles: `cdi.kubevirt.io:admin|edit|view` aggregated into the built-in roles, the
    clone sourcer, and the config reader every authenticated user and service account is bound to."""
    def role(name: str, rules: list[Obj], aggregate: str | None = None) -> Obj:
        labels = {f"rbac.authorization.k8s.io/aggregate-to-{aggregate}": "true"} if aggregate else {}
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": _meta(name, labels=labels), "rules": rules}

    reader = "cdi.kubevirt.io:config-reader"
    return [
        role("cdi.kubevirt.io:admin", _admin_rules(), "admin"),
        role("cdi.kubevirt.io:edit", _admin_rules(), "edit"),
        role("cdi.kubevirt.io:view", _view_rules(), "view"),
        role("cdi.kubevirt.io:clone-sourcer", [_rule([groups.CDI_GROUP], ["datavolumes/source"], ["create"])]),
        role(reader, [_rule([groups.CDI_GROUP], ["cdiconfigs", "storageprofiles"], READ)]),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(reader),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"},
                      {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                       "name": "system:serviceaccounts"}]},
    ]


def _account_rbac(name: str, namespace: str, cluster_rules: list[Obj], namespace_rules: list[Obj],
                  account: str | None = None) -> list[Obj]:
    account = account or name
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    def ref(kind: str) -> Obj:
        return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(account, namespace)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(name),
         "rules": cluster_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(name),
         "roleRef": ref("ClusterRole"), "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, namespace),
         "rules": namespace_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(name, namespace),
         "roleRef": ref("Role"), "subjects": subject},
    ]


# -- pods --------------------------------------------------------------------------------------------

def _restricted_container() -> Obj:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}


def _deployment(name: str, namespace: str, *, label: str, image: str, args: list[str], account: str,
                replicas: int, cr_spec: Mapping[str, Any], port: int, probe_path: str, probe_scheme: str,
                volumes: list[Obj] | None = None, mounts: list[Obj] | None = None,
                annotations: Mapping[str, str] | None = None, env: list[Obj] | None = None,
                extra_ports: list[Obj] | None = None) -> Obj:
    labels = {ann.LABEL_COMPONENT: label, ann.LABEL_OPERATOR_COMPONENT: label}
    container: Obj = {
        "name": label, "image": image, "imagePullPolicy": cr_spec.get("imagePullPolicy") or "IfNotPresent",
        "args": args,
        "env": [{"name": componentenv.POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                *(env or [])],
        "ports": [{"name": "https" if probe_scheme == "HTTPS" else "metrics", "containerPort": port,
                   "protocol": "TCP"}, *(extra_ports or [])],
        "readinessProbe": {"httpGet": {"path": probe_path, "port": port, "scheme": probe_scheme},
                           "periodSeconds": 3, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "10m", "memory": "80Mi"}},
        "securityContext": _restricted_container(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod: Obj = {
        "serviceAccountName": account, "containers": [container],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 107, "runAsGroup": 107, "fsGroup": 107,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if volumes:
        pod["volumes"] = volumes
    infra = cr_spec.get("infra") or {}
    for key in ("nodeSelector", "tolerations", "affinity"):
        if infra.get(key):
            pod[key] = infra[key]
    if cr_spec.get("priorityClass"):
        pod["priorityClassName"] = cr_spec["priorityClass"]
    template_meta: Obj = {"labels": {**labels, **MANAGED_BY}}
    if annotations:
        template_meta["annotations"] = dict(annotations)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, namespace, labels),
            "spec": {"replicas": replicas, "selector": {"matchLabels": {ann.LABEL_COMPONENT: label}},
                     "template": {"metadata": template_meta, "spec": pod}}}


def _service(name: str, namespace: str, selector: str, port: int, target: int, port_name: str = "https") -> Obj:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, namespace),
            "spec": {"selector": {ann.LABEL_COMPONENT: selector}, "type": "ClusterIP",
                     "ports": [{"name": port_name, "port": port, "targetPort": target, "protocol": "TCP"}]}}


def upload_extension_apiservice(namespace: str, proxy_bundle: str) -> Obj:
    """The APIService of our extension `upload.extensions.cdi.dev`: the aggregation layer sends uploads to the
    upload proxy's aggregation port, checking its certificate against the proxy's CA bundle (base64)."""
    return {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": _meta(upload.EXTENSION_APISERVICE),
            "spec": {"group": upload.EXTENSION_GROUP, "version": upload.EXTENSION_VERSION,
                     "groupPriorityMinimum": 1000, "versionPriority": 15, "caBundle": proxy_bundle,
                     "service": {"namespace": namespace, "name": UPLOADPROXY, "port": upload.AGGREGATION_PORT}}}


def webhooks_and_apiservice(namespace: str, ca_bundle: str, proxy_bundle: str = "") -> list[Obj]:
    """The admission webhooks and the upload APIService, addressed at the `cdi-api` Service with the
    apiserver's CA (the apiserver registers the same from that CA when it starts); and the APIService of
    uploads through the API server, addressed at the `cdi-uploadproxy` Service with the proxy's CA."""
    def hook(name: str, path: str, resource: str | list[str], operations: list[str], failure: str = "Fail") -> Obj:
        return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": failure,
                "clientConfig": {"service": {"namespace": namespace, "name": API_SERVICE, "path": path, "port": 443},
                                 "caBundle": ca_bundle},
                "rules": [{"operations": operations, "apiGroups": [groups.CDI_GROUP],
                           "apiVersions": [groups.CDI_VERSION],
                           "resources": [resource] if isinstance(resource, str) else resource, "scope": "*"}]}

    def configuration(name: str, webhook: Obj) -> Obj:
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": _meta(name), "webhooks": [webhook]}

    return [
        configuration("cdi-api-datavolume-validate", hook("datavolume-validate.cdi.kubevirt.io",
                                                          "/datavolume-validate", "datavolumes",
                                                          ["CREATE", "UPDATE"])),
        configuration("cdi-api-dataimportcron-validate", hook("dataimportcron-validate.cdi.kubevirt.io",
                                                              "/dataimportcron-validate", "dataimportcrons",
                                                              ["CREATE", "UPDATE"])),
        configuration("cdi-api-populator-validate", hook("populator-validate.cdi.kubevirt.io", "/populator-validate",
                                                         ["volumeimportsources", "volumeuploadsources"],
                                                         ["CREATE", "UPDATE"])),
        # as CDI's: Ignore, so that a CDI whose apiserver is gone can still be deleted
        configuration("cdi-api-validate", hook("cdi-validate.cdi.kubevirt.io", "/cdi-validate", "cdis",
                                               ["DELETE"], "Ignore")),
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": _meta(UPLOAD_APISERVICE),
         "spec": {"group": groups.UPLOAD_GROUP, "version": groups.UPLOAD_VERSION, "groupPriorityMinimum": 1000,
                  "versionPriority": 15, "caBundle": ca_bundle,
                  "service": {"namespace": namespace, "name": API_SERVICE, "port": 443}}},
        upload_extension_apiservice(namespace, proxy_bundle),
    ]


def components(cr: Mapping[str, Any], namespace: str, images: Images, cert_hashes: Mapping[str, str]) -> list[Obj]:
    """Everything a `CDI` resource stands for in `namespace`, except certificates and webhooks."""
    spec: Mapping[str, Any] = cr.get("spec") or {}
    infra = spec.get("infra") or {}
    objects: list[Obj] = []
    objects += _account_rbac("cdi", namespace, CONTROLLER_CLUSTER_RULES, CONTROLLER_NAMESPACE_RULES, CONTROLLER_SA)
    objects += _account_rbac(APISERVER, namespace, APISERVER_CLUSTER_RULES, APISERVER_NAMESPACE_RULES)
    objects += _account_rbac(UPLOADPROXY, namespace, UPLOADPROXY_CLUSTER_RULES, UPLOADPROXY_NAMESPACE_RULES)
    for account in (APISERVER, UPLOADPROXY):  # both serve the aggregation layer
        objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                        "metadata": _meta(f"{account}-auth-reader", "kube-system"),
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AUTH_READER_ROLE},
                        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]})
    objects += aggregated_cluster_roles()
    objects.append(_deployment(
        CONTROLLER, namespace, label=CONTROLLER, image=images.of("cdi-controller"), account=CONTROLLER_SA,
        replicas=int(infra.get("deploymentReplicas") or 2), cr_spec=spec, port=8080, probe_path="/readyz",
        probe_scheme="HTTP",
        args=["--namespace", namespace, "--metrics-listen", "0.0.0.0:8080", "--no-cdi-status",
              "--importer-image", images.of("cdi-importer"), "--uploadserver-image", images.of("cdi-uploadserver"),
              "--cloner-image", images.of("cdi-cloner"),
              # worker pods pull as the CDI resource says (CDI's controller reads PULL_POLICY)
              "--pull-policy", spec.get("imagePullPolicy") or "IfNotPresent"],
        # the upload signers it issues per-pod certificates from: rotated by the operator, read at start
        annotations={ann.CERTIFICATES_HASH: cert_hashes.get(CONTROLLER, "")}))
    objects.append(_deployment(
        APISERVER, namespace, label=APISERVER, image=images.of("cdi-apiserver"), account=APISERVER,
        replicas=int(infra.get("apiServerReplicas") or 1), cr_spec=spec, port=8443, probe_path="/healthz",
        probe_scheme="HTTPS", args=["--namespace", namespace, "--listen", "0.0.0.0:8443",
                                    "--state-dir", APISERVER_STATE_DIR],
        annotations={ann.CERTIFICATES_HASH: cert_hashes.get(APISERVER, "")},
        # the operator's CA for the apiserver, in the state directory where the apiserver looks for it
        volumes=[{"name": "state", "emptyDir": {}},
                 {"name": "signer", "secret": {"secretName": "cdi-apiserver-signer", "items": [
                     {"key": "tls.crt", "path": "ca.crt"}, {"key": "tls.key", "path": "ca.key"}]}},
                 # its serving certificate, with certConfig's server lifetime
                 {"name": "server-cert", "secret": {"secretName": "cdi-apiserver-server-cert"}}],
        mounts=[{"name": "state", "mountPath": APISERVER_STATE_DIR},
                {"name": "signer", "mountPath": f"{APISERVER_STATE_DIR}/ca.crt", "subPath": "ca.crt"},
                {"name": "signer", "mountPath": f"{APISERVER_STATE_DIR}/ca.key", "subPath": "ca.key"},
                {"name": "server-cert", "mountPath": f"{APISERVER_STATE_DIR}/tls.crt", "subPath": "tls.crt"},
                {"name": "server-cert", "mountPath": f"{APISERVER_STATE_DIR}/tls.key", "subPath": "tls.key"}]))
    objects.append(_deployment(
        UPLOADPROXY, namespace, label=UPLOADPROXY, image=images.of("cdi-uploadproxy"), account=UPLOADPROXY,
        replicas=int(infra.get("uploadProxyReplicas") or 1), cr_spec=spec, port=8443, probe_path="/healthz",
        probe_scheme="HTTPS",
        args=["--namespace", namespace, "--listen", "0.0.0.0:8443", "--tls-cert", f"{UPLOADPROXY_CERT_DIR}/tls.crt",
              "--tls-key", f"{UPLOADPROXY_CERT_DIR}/tls.key",
              "--aggregation-listen", f"0.0.0.0:{upload.AGGREGATION_PORT}", "--state-dir", UPLOADPROXY_STATE_DIR],
        annotations={ann.CERTIFICATES_HASH: cert_hashes.get(UPLOADPROXY, "")},
        volumes=[{"name": "server-cert", "secret": {"secretName": "cdi-uploadproxy-server-cert"}},
                 {"name": "state", "emptyDir": {}}],
        mounts=[{"name": "server-cert", "mountPath": UPLOADPROXY_CERT_DIR, "readOnly": True},
                {"name": "state", "mountPath": UPLOADPROXY_STATE_DIR}],
        extra_ports=[{"name": upload.AGGREGATION_PORT_NAME, "containerPort": upload.AGGREGATION_PORT,
                      "protocol": "TCP"}]))
    objects.append(_service(API_SERVICE, namespace, APISERVER, 443, 8443))
    proxy_service = _service(UPLOADPROXY, namespace, UPLOADPROXY, 443, 8443)
    proxy_service["spec"]["ports"].append({"name": upload.AGGREGATION_PORT_NAME, "port": upload.AGGREGATION_PORT,
                                           "targetPort": upload.AGGREGATION_PORT, "protocol": "TCP"})
    objects.append(proxy_service)
    metrics = _service(METRICS_SERVICE, namespace, CONTROLLER, 8080, 8080, "metrics")
    metrics["metadata"]["labels"][ann.LABEL_PROMETHEUS] = "true"  # what the ServiceMonitor selects
    objects.append(metrics)
    objects.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(CONTROLLER, namespace),
                    "spec": {"minAvailable": 1, "selector": {"matchLabels": {ann.LABEL_COMPONENT: CONTROLLER}}}})
    return objects


# -- the operator's own install (cdi manifests) ------------------------------------------------------------

def _union(*rule_sets: list[Obj]) -> list[Obj]:
    seen: list[Obj] = []
    for rules in rule_sets:
        for rule in rules:
            if rule not in seen:
                seen.append(rule)
    return seen


def operator_cluster_rules() -> list[Obj]:
    """What the operator does itself, plus every permission it grants (RBAC lets nobody grant more than
    it holds; no `escalate` or `bind`)."""
    own = [
        _rule(["rbac.authorization.k8s.io"], ["clusterroles", "clusterrolebindings"], ALL),
        _rule(["admissionregistration.k8s.io"], ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
              ALL),
        _rule(["apiregistration.k8s.io"], ["apiservices"], ALL),
        _rule(["apiextensions.k8s.io"], ["customresourcedefinitions"], READ),
        _rule([""], ["namespaces"], ["get"]),
        _rule([""], ["events"], ("create", "patch", "update")),
    ]
    aggregated = [rule for role in aggregated_cluster_roles() if role["kind"] == "ClusterRole"
                  for rule in role["rules"]]
    return _union(own, CONTROLLER_CLUSTER_RULES, APISERVER_CLUSTER_RULES, UPLOADPROXY_CLUSTER_RULES, aggregated)


def operator_namespace_rules() -> list[Obj]:
    own = [
        _rule([""], ["serviceaccounts", "services", "secrets", "configmaps"], ALL),
        # CDI's PrometheusRule and ServiceMonitor, when the Prometheus operator is installed
        _rule(["monitoring.coreos.com"], ["prometheusrules", "servicemonitors"], ALL),
        _rule([""], ["services", "endpoints", "pods"], READ),  # granted to Prometheus (cdi-monitoring)
        _rule(["apps"], ["deployments"], ALL),
        _rule(["policy"], ["poddisruptionbudgets"], ALL),
        _rule(["rbac.authorization.k8s.io"], ["roles", "rolebindings"], ALL),
        _rule(["coordination.k8s.io"], ["leases"], ALL),
        _rule([""], ["pods"], READ),
    ]
    return _union(own, CONTROLLER_NAMESPACE_RULES, APISERVER_NAMESPACE_RULES, UPLOADPROXY_NAMESPACE_RULES)


def operator_install(namespace: str = groups.CDI_NAMESPACE, images: Images | None = None,
                     pull_policy: str = "IfNotPresent", version: str | None = None) -> list[Obj]:
    """`cdi-operator.yaml`: the namespace, CDI's CRDs, the operator's account, RBAC and Deployment. The operator's
    version (`OPERATOR_VERSION`, what it writes to the `CDI` resource and upgrades by) is the images' tag unless
    `version` says otherwise, as CDI's manifest generator takes `-operator-version` beside `-docker-tag`."""
    images = images or Images()
    objects: list[Obj] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {ann.LABEL_COMPONENT: "", "pod-security.kubernetes.io/enforce": "restricted"}}}]
    objects += [dict(crd) for crd in cdi_crds()]
    objects += _account_rbac(OPERATOR, namespace, operator_cluster_rules(), operator_namespace_rules())
    # to bind the aggregation layer's reader Role for cdi-apiserver, the operator holds what it grants
    objects += [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(OPERATOR, "kube-system"),
         "rules": [_rule(["rbac.authorization.k8s.io"], ["rolebindings"], ALL),
                   _rule([""], ["configmaps"], READ, names=["extension-apiserver-authentication"])]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(OPERATOR, "kube-system"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OPERATOR},
         "subjects": [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": namespace}]},
    ]
    spec: Obj = {"imagePullPolicy": pull_policy}
    deployment = _deployment(OPERATOR, namespace, label=OPERATOR, image=images.of("cdi-operator"), account=OPERATOR,
                             replicas=1, cr_spec=spec, port=8080, probe_path="/readyz", probe_scheme="HTTP",
                             args=["--namespace", namespace, "--listen", "0.0.0.0:8080"],
                             env=[*images.env(),
                                  {"name": componentenv.OPERATOR_VERSION, "value": version or images.tag},
                                  {"name": componentenv.PULL_POLICY, "value": pull_policy}])
    deployment["metadata"]["labels"]["operator.cdi.kubevirt.io"] = ""
    objects.append(deployment)
    return objects


def example_cr() -> Obj:
    """`cdi-cr.yaml`: the `CDI` resource CDI's release ships (its defaults, spelled out)."""
    return {"apiVersion": groups.CDI_API_VERSION, "kind": "CDI", "metadata": {"name": groups.CDI_CR_NAME},
            "spec": {"config": {"featureGates": ["HonorWaitForFirstConsumer"]},
                     "imagePullPolicy": "IfNotPresent",
                     "infra": {"nodeSelector": {"kubernetes.io/os": "linux"},
                               "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]},
                     "workload": {"nodeSelector": {"kubernetes.io/os": "linux"}}}}
