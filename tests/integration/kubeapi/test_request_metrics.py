"""`apiserver_request_total` on `/metrics`, as kube-apiserver counts: what a benchmark reads before and after
a run to say how many API requests a DataVolume cost."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from cdi.embedded.kubeapi.requestmetrics import RequestLabels, labels_of
from tests.integration.kubeapi.conftest import CM, DV, Api, configmap, datavolume
from tests.support.cluster import async_wait_for


async def request_totals(api: Api) -> dict[tuple[str, str, str, str, str], float]:
    """(verb, resource, subresource, scope, code) -> count."""
    status, text = await api.call("GET", "/metrics")
    assert status == 200, text
    totals: dict[tuple[str, str, str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "apiserver_request":
            for sample in family.samples:
                if sample.name == "apiserver_request_total":
                    labels = sample.labels
                    key = (labels["verb"], labels["resource"], labels["subresource"], labels["scope"], labels["code"])
                    totals[key] = totals.get(key, 0) + sample.value
    return totals


async def test_requests_are_counted_by_verb_resource_scope_and_code(api: Api) -> None:
    before = await request_totals(api)
    await api.ok("POST", CM, configmap("one"))
    await api.ok("GET", f"{CM}/one")
    await api.ok("GET", CM)
    await api.ok("PATCH", f"{CM}/one", {"data": {"k": "v"}}, content_type="application/merge-patch+json")
    status, _ = await api.call("GET", f"{CM}/missing")
    assert status == 404
    await api.ok("POST", DV, datavolume("dv"))
    await api.ok("PATCH", f"{DV}/dv/status", {"status": {"phase": "Pending"}},
                 content_type="application/merge-patch+json")
    await api.ok("DELETE", f"{CM}/one")
    after = await request_totals(api)

    def delta(key: tuple[str, str, str, str, str]) -> float:
        return after.get(key, 0) - before.get(key, 0)

    assert delta(("POST", "configmaps", "", "namespace", "201")) == 1
    assert delta(("GET", "configmaps", "", "resource", "200")) == 1
    assert delta(("LIST", "configmaps", "", "namespace", "200")) == 1
    assert delta(("PATCH", "configmaps", "", "resource", "200")) == 1
    assert delta(("GET", "configmaps", "", "resource", "404")) == 1
    assert delta(("POST", "datavolumes", "", "namespace", "201")) == 1
    assert delta(("PATCH", "datavolumes", "status", "resource", "200")) == 1
    assert delta(("DELETE", "configmaps", "", "resource", "200")) == 1


async def test_a_watch_counts_once_when_it_ends_with_the_code_it_was_answered(api: Api) -> None:
    before = await request_totals(api)
    async with api.session.get(f"{api.url}{CM}?watch=true") as response:
        assert response.status == 200  # answered; the client now goes away mid-stream
    key = ("WATCH", "configmaps", "", "namespace", "200")

    async def counted() -> bool:
        return (await request_totals(api)).get(key, 0) - before.get(key, 0) == 1

    await async_wait_for(counted, 10, message="the ended watch counted")


async def test_metrics_need_a_user(api: Api) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as anonymous, \
            anonymous.get(f"{api.url}/metrics") as response:
        assert response.status == 401


def test_labels_follow_kube_apiservers_request_info() -> None:
    assert labels_of("GET", "/api/v1/namespaces/ns/pods", {"watch": "1"}) == RequestLabels(
        "WATCH", "", "", "v1", "pods", "", "namespace")
    assert labels_of("GET", "/api/v1/watch/pods", {}) == RequestLabels("WATCH", "", "", "v1", "pods", "", "cluster")
    assert labels_of("GET", "/api/v1/namespaces/ns", {}) == RequestLabels(
        "GET", "", "", "v1", "namespaces", "", "resource")
    assert labels_of("PUT", "/api/v1/namespaces/ns/finalize", {}) == RequestLabels(
        "PUT", "", "", "v1", "namespaces", "finalize", "resource")
    assert labels_of("DELETE", "/apis/cdi.kubevirt.io/v1beta1/namespaces/ns/datavolumes", {"dryRun": "All"}) == \
        RequestLabels("DELETECOLLECTION", "All", "cdi.kubevirt.io", "v1beta1", "datavolumes", "", "namespace")
    assert labels_of("PATCH", "/apis/coordination.k8s.io/v1/namespaces/cdi/leases/l", {},
                     "application/apply-patch+yaml").verb == "APPLY"
    assert labels_of("GET", "/apis/cdi.kubevirt.io/v1beta1", {}) == RequestLabels("GET", "", "", "", "", "", "")
    assert labels_of("GET", "/version", {}).resource == ""
