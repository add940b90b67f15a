"""CDI's PrometheusRule and ServiceMonitor as the operator renders them (the real-cluster tier has the
apiserver accept them)."""

from __future__ import annotations

import pytest

from cdi.operator import monitoring, resources
from cdi.operator.resources import Images


def test_the_rule_holds_cdis_recording_rules_and_alerts_with_runbooks() -> None:
    rule = monitoring.prometheus_rule("cdi")
    assert (rule["kind"], rule["metadata"]["name"]) == ("PrometheusRule", "prometheus-cdi-rules")
    assert rule["metadata"]["labels"]["prometheus.cdi.kubevirt.io"] == "true"
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    records = {r["record"]: r["expr"] for r in rules if "record" in r}
    assert "namespace='cdi'" in records["cluster:kubevirt_cdi_operator_up:sum"]
    for kind in ("import", "upload", "clone"):
        assert f"cluster:kubevirt_cdi_{kind}_pods_high_restart:count" in records
        assert f"kubevirt_cdi_{kind}_pods_high_restart" in records
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert set(alerts) == {"CDIOperatorDown", "CDINotReady", "CDIDataVolumeUnusualRestartCount",
                           "CDIStorageProfilesIncomplete", "CDIDataImportCronOutdated", "CDINoDefaultStorageClass",
                           "CDIMultipleDefaultVirtStorageClasses", "CDIDefaultStorageClassDegraded"}
    for name, alert in alerts.items():
        assert alert["annotations"]["runbook_url"] == f"https://kubevirt.io/monitoring/runbooks/{name}"
        assert alert["annotations"]["summary"]
        assert alert["labels"]["severity"] in ("critical", "warning", "info")
        assert alert["labels"]["kubernetes_operator_part_of"] == "kubevirt"
    # every series an alert reads is recorded here or exported by cdi's controller
    assert "cluster:kubevirt_cdi_operator_up:sum" in alerts["CDIOperatorDown"]["expr"]


def test_runbook_urls_follow_the_template_and_a_bad_template_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNBOOK_URL_TEMPLATE", "https://runbooks.example/%s.md")
    alerts = monitoring.alerts()
    assert alerts[0]["annotations"]["runbook_url"] == f"https://runbooks.example/{alerts[0]['alert']}.md"
    monkeypatch.setenv("RUNBOOK_URL_TEMPLATE", "https://runbooks.example/")
    with pytest.raises(ValueError, match="exactly one"):
        monitoring.alerts()


def test_the_service_monitor_selects_the_metrics_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monitor = monitoring.service_monitor("cdi")
    assert monitor["metadata"]["name"] == "service-monitor-cdi"
    selector = monitor["spec"]["selector"]["matchLabels"]
    cr = {"metadata": {"name": "cdi"}, "spec": {}}
    service = next(o for o in resources.components(cr, "cdi", Images(), {})
                   if o["kind"] == "Service" and o["metadata"]["name"] == "cdi-prometheus-metrics")
    assert selector.items() <= service["metadata"]["labels"].items()
    port = monitor["spec"]["endpoints"][0]["port"]
    assert port in [p["name"] for p in service["spec"]["ports"]]
    monkeypatch.setenv("MONITORING_NAMESPACE", "openshift-monitoring")
    binding = next(o for o in monitoring.monitoring_rbac("cdi") if o["kind"] == "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus-k8s",
                                    "namespace": "openshift-monitoring"}]
