"""Observability as CDI's operator installs it when the Prometheus operator is there (its CRDs
`prometheusrules.monitoring.coreos.com` and `servicemonitors.monitoring.coreos.com` exist): the
PrometheusRule `prometheus-cdi-rules` (CDI's recording rules and alerts, each alert with a summary and
its runbook under `runbook_url`), the ServiceMonitor `service-monitor-cdi` that scrapes the
`cdi-prometheus-metrics` Service, and the `cdi-monitoring` Role/RoleBinding that lets Prometheus
(`prometheus-k8s` in `$MONITORING_NAMESPACE`, default `monitoring`) discover the targets.

Metric, rule, alert and label names are CDI's, since dashboards, silences and the runbooks at
kubevirt.io key on them. Pure functions: the reconciler applies them, tests read them."""

from __future__ import annotations

import os
from typing import Any

from cdi.api import annotations as ann
from cdi.api import componentenv
from cdi.api.groups import GVR
from cdi.operator.resources import MANAGED_BY

Obj = dict[str, Any]

MONITORING_GROUP = "monitoring.coreos.com"
PROMETHEUSRULES = GVR(MONITORING_GROUP, "v1", "prometheusrules", "PrometheusRule", True)
SERVICEMONITORS = GVR(MONITORING_GROUP, "v1", "servicemonitors", "ServiceMonitor", True)
CRD_NAMES = (f"{PROMETHEUSRULES.plural}.{MONITORING_GROUP}", f"{SERVICEMONITORS.plural}.{MONITORING_GROUP}")
RULE_NAME = "prometheus-cdi-rules"
MONITOR_NAME = "service-monitor-cdi"
RBAC_NAME = "cdi-monitoring"
DEFAULT_RUNBOOK_TEMPLATE = "https://kubevirt.io/monitoring/runbooks/%s"
RESTART_THRESHOLD = 3  # restarts of one worker pod that CDI calls unusual

# worker pods by name pattern and container (importer-<pvc>, cdi-upload-<pvc>, <uid>-source-pod)
_WORKERS = {"import": ("importer-.*", "importer"), "upload": ("cdi-upload-.*", "cdi-upload-server"),
            "clone": (".*-source-pod", "cdi-clone-source")}


def runbook_template() -> str:
    """`$RUNBOOK_URL_TEMPLATE` (exactly one `%s`, the alert's name), else kubevirt.io's runbooks."""
    template = os.environ.get(componentenv.RUNBOOK_URL_TEMPLATE, DEFAULT_RUNBOOK_TEMPLATE)
    if template.count("%s") != 1:
        raise ValueError(f"{componentenv.RUNBOOK_URL_TEMPLATE} must hold exactly one %s: {template!r}")
    return template


def recording_rules(namespace: str) -> list[Obj]:
    """Each series under CDI's current name and its deprecated one (both still queried)."""
    operator_up = f"sum(up{{namespace='{namespace}', pod=~'cdi-operator-.*'}} or vector(0))"
    rules: list[Obj] = [{"record": "kubevirt_cdi_operator_up", "expr": operator_up},
                        {"record": "cluster:kubevirt_cdi_operator_up:sum", "expr": operator_up}]
    for kind, (pod, container) in _WORKERS.items():
        expr = (f"count(kube_pod_container_status_restarts_total{{pod=~'{pod}', container='{container}'}} "
                f"> {RESTART_THRESHOLD}) or on() vector(0)")
        rules += [{"record": f"kubevirt_cdi_{kind}_pods_high_restart", "expr": expr},
                  {"record": f"cluster:kubevirt_cdi_{kind}_pods_high_restart:count", "expr": expr}]
    return rules


def _alert(name: str, expr: str, wait: str, severity: str, impact: str, summary: str, template: str) -> Obj:
    return {"alert": name, "expr": expr, "for": wait,
            "annotations": {"summary": summary, "runbook_url": template % name},
            "labels": {"severity": severity, "operator_health_impact": impact,
                       "kubernetes_operator_part_of": "kubevirt",
                       "kubernetes_operator_component": "containerized-data-importer"}}


def alerts() -> list[Obj]:
    template = runbook_template()
    profile = "kubevirt_cdi_storageprofile_info"
    return [
        _alert("CDIOperatorDown", "cluster:kubevirt_cdi_operator_up:sum == 0", "10m", "critical", "critical",
               "No cdi-operator pod has been up for 10 minutes", template),
        _alert("CDINotReady", "kubevirt_cdi_cr_ready == 0", "10m", "critical", "critical",
               "The CDI resource has not been ready for 10 minutes: DataVolumes cannot be populated", template),
        _alert("CDIDataVolumeUnusualRestartCount",
               "cluster:kubevirt_cdi_import_pods_high_restart:count > 0 or "
               "cluster:kubevirt_cdi_upload_pods_high_restart:count > 0 or "
               "cluster:kubevirt_cdi_clone_pods_high_restart:count > 0", "5m", "warning", "none",
               f"Importer, upload or clone pods restarted more than {RESTART_THRESHOLD} times: "
               "their DataVolumes are likely failing", template),
        _alert("CDIStorageProfilesIncomplete",
               f'sum by(storageclass,provisioner) (({profile}{{complete="false"}}>0))', "5m", "info", "none",
               "StorageProfile {{ $labels.storageclass }} is incomplete: CDI cannot infer the access and volume "
               "modes of claims for it", template),
        _alert("CDIDataImportCronOutdated",
               'sum by(namespace,cron_name) (kubevirt_cdi_dataimportcron_outdated{pending="false"}) > 0', "15m",
               "warning", "none", "A DataImportCron's golden image is not being refreshed on its schedule",
               template),
        _alert("CDINoDefaultStorageClass",
               f'sum({profile}{{default="true"}} or on() vector(0)) + '
               f'sum({profile}{{virtdefault="true"}} or on() vector(0)) + '
               "(count(kubevirt_cdi_datavolume_pending == 0) or on() vector(0)) == 0", "5m", "warning", "none",
               "A DataVolume waits for a default storage class, and there is neither a default nor a "
               "virtualization default one", template),
        _alert("CDIMultipleDefaultVirtStorageClasses",
               f'sum({profile}{{virtdefault="true"}} or on() vector(0)) > 1', "5m", "warning", "none",
               "Several storage classes are marked the default for virtualization", template),
        _alert("CDIDefaultStorageClassDegraded",
               f'sum({profile}{{default="true",degraded="false"}} or on() vector(0)) + '
               f'sum({profile}{{virtdefault="true",degraded="false"}} or on() vector(0)) + '
               f'on () (0*(sum({profile}{{default="true"}}) or sum({profile}{{virtdefault="true"}}))) == 0',
               "5m", "warning", "none",
               "The default storage class supports neither smart clones nor ReadWriteMany", template),
    ]


def _labels(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {ann.LABEL_COMPONENT: "", **MANAGED_BY, ann.LABEL_PROMETHEUS: "true", **(extra or {})}


def prometheus_rule(namespace: str) -> Obj:
    return {"apiVersion": f"{MONITORING_GROUP}/v1", "kind": "PrometheusRule",
            "metadata": {"name": RULE_NAME, "namespace": namespace, "labels": _labels()},
            "spec": {"groups": [{"name": "recordingRules.rules", "rules": recording_rules(namespace)},
                                {"name": "alerts.rules", "rules": alerts()}]}}


def service_monitor(namespace: str) -> Obj:
    """Scrapes every Service labelled `prometheus.cdi.kubevirt.io=true` in CDI's namespace on its
    `metrics` port (plain HTTP: cdi's metrics endpoints serve no TLS)."""
    return {"apiVersion": f"{MONITORING_GROUP}/v1", "kind": "ServiceMonitor",
            "metadata": {"name": MONITOR_NAME, "namespace": namespace,
                         "labels": _labels({"openshift.io/cluster-monitoring": ""})},
            "spec": {"selector": {"matchLabels": {ann.LABEL_PROMETHEUS: "true"}},
                     "namespaceSelector": {"matchNames": [namespace]},
                     "endpoints": [{"port": "metrics", "scheme": "http"}]}}


def monitoring_rbac(namespace: str) -> list[Obj]:
    """What Prometheus needs in CDI's namespace to find the targets."""
    prometheus_ns = os.environ.get(componentenv.MONITORING_NAMESPACE) or "monitoring"
    meta = {"name": RBAC_NAME, "namespace": namespace, "labels": _labels()}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["services", "endpoints", "pods"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": RBAC_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": prometheus_ns}]},
    ]


def objects(namespace: str) -> list[Obj]:
    return [prometheus_rule(namespace), service_monitor(namespace), *monitoring_rbac(namespace)]
