"""CDIConfig `status.uploadProxyURL` from what an admin put in front of the upload proxy, as CDI's CDIConfig
controller finds it: the override, else an Ingress, else an OpenShift Route, in CDI's namespace and naming the
proxy's Service; else (under `cdi up`) the proxy it runs. On the fake client, in milliseconds."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api import groups
from cdi.controller.cdiconfig import ConfigReconciler
from cdi.controller.manager import all_reconcilers, served, watch_all
from cdi.controller.metrics import ControllerMetrics
from cdi.controller.runtime import Context, Settings
from cdi.controller.uploadproxyurl import upload_proxy_url, url_from_ingress, url_from_route
from cdi.kube import NotFound, ObjectList
from cdi.operator import resources
from tests.support.fakekube import FakeKube
from tests.unit.controller.test_watches import requeued

Obj = dict[str, Any]
CDI_NS = "cdi"  # the conftest's Settings(namespace=...)
HOST = "upload.example.test"


def path_to(service: str) -> Obj:
    return {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 443}}}}


def ingress(name: str = "upload", *, host: str = HOST, service: str = "cdi-uploadproxy", namespace: str = CDI_NS,
            **spec: Any) -> Obj:
    rules = [{"host": host, "http": {"paths": [path_to(service)]}}] if host or service else []
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"rules": rules, **spec}}


def route(name: str = "upload", *, service: str = "cdi-uploadproxy", admitted: str = "route.example.test") -> Obj:
    status = {"ingress": [{"host": admitted, "routerName": "default"}]} if admitted else {}
    return {"apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": {"name": name, "namespace": CDI_NS},
            "spec": {"host": "", "to": {"kind": "Service", "name": service}}, "status": status}


# -- the host, as CDI reads it ---------------------------------------------------------------------------

def test_an_ingress_names_the_host_of_a_rule_with_a_path_to_the_proxy() -> None:
    assert url_from_ingress(ingress()) == HOST
    assert url_from_ingress(ingress(service="something-else")) == ""
    # TLS or not, the URL is the host: the client adds https://
    assert url_from_ingress(ingress(tls=[{"hosts": [HOST], "secretName": "cert"}])) == HOST
    # a rule without a host matches every host and names none; the next rule's does
    two_rules = ingress()
    two_rules["spec"]["rules"].insert(0, {"http": {"paths": [path_to("cdi-uploadproxy")]}})
    assert url_from_ingress(two_rules) == HOST
    assert url_from_ingress(ingress(host="")) == ""


def test_a_default_backend_decides_alone() -> None:
    to_proxy = {"service": {"name": "cdi-uploadproxy", "port": {"number": 443}}}
    to_other = {"service": {"name": "web", "port": {"number": 80}}}
    assert url_from_ingress(ingress(service="web", defaultBackend=to_proxy)) == HOST  # the first rule's host
    assert url_from_ingress(ingress(defaultBackend=to_other)) == ""  # whatever the rules send to the proxy
    assert url_from_ingress({"spec": {"defaultBackend": to_proxy}}) == ""  # no rule, no host
    # a resource backend is no Service: the rules decide
    assert url_from_ingress(ingress(defaultBackend={"resource": {"kind": "Bucket", "name": "b"}})) == HOST


def test_a_route_names_the_host_it_was_admitted_with() -> None:
    assert url_from_route(route()) == "route.example.test"
    assert url_from_route(route(admitted="")) == ""  # not admitted by a router yet
    assert url_from_route(route(service="web")) == ""


def test_ingresses_come_before_routes_and_each_in_name_order() -> None:
    assert upload_proxy_url([ingress("b", host="b.test"), ingress("a", host="a.test")], [route()]) == "a.test"
    assert upload_proxy_url([ingress(service="web")], [route()]) == "route.example.test"
    assert upload_proxy_url([ingress(service="web")], [route(service="web")]) == ""


# -- the CDIConfig reconciler -----------------------------------------------------------------------------

def url(kube: FakeKube) -> str | None:
    config = kube.object(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
    assert config is not None
    found = config["status"].get("uploadProxyURL")
    return None if found is None else str(found)


async def test_an_ingress_in_front_of_the_proxy_gives_the_url_until_it_goes(kube: FakeKube, ctx: Context) -> None:
    reconciler = ConfigReconciler(ctx)
    await reconciler.reconcile(groups.CDI_CONFIG_NAME)
    assert url(kube) is None  # nothing exposes the proxy: virtctl needs --uploadproxy-url

    await kube.create(groups.INGRESSES, ingress("web", host="www.example.test", service="web"), CDI_NS)
    await kube.create(groups.INGRESSES, ingress("elsewhere", namespace="default"), "default")
    await reconciler.reconcile(groups.CDI_CONFIG_NAME)
    assert url(kube) is None  # another Service's, or not in CDI's namespace

    await kube.create(groups.INGRESSES, ingress(), CDI_NS)
    await reconciler.reconcile(groups.CDI_CONFIG_NAME)
    assert url(kube) == HOST

    await kube.delete(groups.INGRESSES, "upload", CDI_NS)
    await reconciler.reconcile(groups.CDI_CONFIG_NAME)
    assert url(kube) is None


async def test_the_override_wins_over_an_ingress(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.INGRESSES, ingress())
    await kube.create(groups.CDIS, {"metadata": {"name": groups.CDI_CR_NAME}, "spec": {
        "config": {"uploadProxyURLOverride": "https://proxy.example.test:31001"}}})
    await ConfigReconciler(ctx).reconcile(groups.CDI_CONFIG_NAME)
    assert url(kube) == "https://proxy.example.test:31001"


async def test_a_route_counts_when_no_ingress_does(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.ROUTES, route())
    await ConfigReconciler(ctx).reconcile(groups.CDI_CONFIG_NAME)
    assert url(kube) == "route.example.test"
    await kube.create(groups.INGRESSES, ingress(), CDI_NS)
    await ConfigReconciler(ctx).reconcile(groups.CDI_CONFIG_NAME)
    assert url(kube) == HOST


async def test_under_cdi_up_the_proxy_it_runs_is_the_url_when_nothing_fronts_it(kube: FakeKube) -> None:
    ctx = Context(kube, Settings(namespace=CDI_NS, upload_proxy_url="https://127.0.0.1:31001"), ControllerMetrics())
    ctx.informers.update({gvr: kube.informer(gvr) for gvr in (groups.CDICONFIGS, groups.CDIS, groups.STORAGECLASSES,
                                                             groups.INGRESSES, groups.ROUTES)})
    await ConfigReconciler(ctx).reconcile(groups.CDI_CONFIG_NAME)
    assert url(kube) == "https://127.0.0.1:31001"
    kube.add(groups.INGRESSES, ingress())
    await ConfigReconciler(ctx).reconcile(groups.CDI_CONFIG_NAME)
    assert url(kube) == HOST
    await ctx.recorder.close()


# -- what brings the config back, and what the controller may read ----------------------------------------

async def test_ingresses_fronting_the_proxy_bring_back_the_config(kube: FakeKube, ctx: Context) -> None:
    reconcilers = all_reconcilers(ctx)
    watch_all(ctx, reconcilers)
    await kube.create(groups.INGRESSES, ingress("web", service="web"), CDI_NS)
    await kube.create(groups.INGRESSES, ingress("elsewhere", namespace="default"), "default")
    assert await requeued(reconcilers) == {}

    await kube.create(groups.INGRESSES, ingress(), CDI_NS)
    assert await requeued(reconcilers) == {"cdiconfig": {groups.CDI_CONFIG_NAME}}
    # one that stops naming the proxy takes its URL away
    await kube.patch(groups.INGRESSES, "upload", {"spec": {"rules": [
        {"host": HOST, "http": {"paths": [path_to("web")]}}]}}, CDI_NS)
    assert await requeued(reconcilers) == {"cdiconfig": {groups.CDI_CONFIG_NAME}}
    await kube.delete(groups.INGRESSES, "web", CDI_NS)
    assert await requeued(reconcilers) == {}

    await kube.create(groups.ROUTES, route(), CDI_NS)
    assert await requeued(reconcilers) == {"cdiconfig": {groups.CDI_CONFIG_NAME}}


def test_ingresses_and_routes_are_listed_in_cdis_namespace_only_which_its_role_allows() -> None:
    ctx = Context(FakeKube(), Settings(namespace="cdi-here"), ControllerMetrics())
    assert ctx.informer(groups.INGRESSES).namespace == ctx.informer(groups.ROUTES).namespace == "cdi-here"
    assert ctx.informer(groups.PVCS).namespace is None
    installed = resources.components({"spec": {}}, "cdi-here", resources.Images(), {})
    binding = next(o for o in installed if o["kind"] == "RoleBinding"
                   and o["subjects"][0]["name"] == resources.CONTROLLER_SA)
    role = next(o for o in installed if o["kind"] == "Role" and o["metadata"]["name"] == binding["roleRef"]["name"])
    for gvr in (groups.INGRESSES, groups.ROUTES):
        assert {"apiGroups": [gvr.group], "resources": [gvr.plural], "verbs": ["get", "list", "watch"]} \
            in role["rules"]


class WithoutRoutes(FakeKube):
    """A cluster that is not OpenShift: Routes are not served."""

    async def list(self, gvr: Any, namespace: str | None = None, **kw: Any) -> ObjectList:
        if gvr == groups.ROUTES:
            raise NotFound("the server could not find the requested resource")
        return await super().list(gvr, namespace, **kw)


@pytest.mark.parametrize(("client", "watched"), [(FakeKube(), True), (WithoutRoutes(), False)])
async def test_routes_are_watched_only_where_they_are_served(client: FakeKube, watched: bool) -> None:
    ctx = Context(client, Settings(namespace=CDI_NS), ControllerMetrics())
    assert await served(client, ctx.informer(groups.ROUTES)) is watched
    assert await served(client, ctx.informer(groups.INGRESSES))
