"""Where users reach the upload proxy from outside the cluster, as CDI's CDIConfig controller finds it: an
Ingress, else an OpenShift Route, in CDI's namespace whose backend is the proxy's Service. Its host becomes
CDIConfig `status.uploadProxyURL` (unless `spec.uploadProxyURLOverride` says otherwise), which virtctl and
`cdi image-upload` read when no `--uploadproxy-url` is given, so an admin who exposes the proxy once spares
every user the flag.

Only the objects' specs (and a Route's admitted host) are read: an Ingress nobody serves still names a host,
and TLS or not, the URL is that host alone (the client adds `https://`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdi.api.upload import PROXY_SERVICE
from cdi.api.views import ObjectView

Body = Mapping[str, Any]


def url_from_ingress(ingress: Body, service: str = PROXY_SERVICE) -> str:
    """The host of an Ingress that sends to `service`, or "" (CDI's getURLFromIngress). A default backend
    decides alone: to `service`, the first rule's host; to another Service, none, whatever the rules say.
    Without one, the host of the first rule with a path to `service` (a rule without a host matches every
    host, so names none)."""
    spec = ObjectView(ingress).spec
    default = (spec.get("defaultBackend") or {}).get("service")
    rules = spec.get("rules") or []
    if default:
        if default.get("name") != service:
            return ""
        return str(rules[0].get("host") or "") if rules else ""
    for rule in rules:
        paths = (rule.get("http") or {}).get("paths") or []
        if rule.get("host") and any(((path.get("backend") or {}).get("service") or {}).get("name") == service
                                    for path in paths):
            return str(rule["host"])
    return ""


def url_from_route(route: Body, service: str = PROXY_SERVICE) -> str:
    """The host a Route to `service` was admitted with (its first `status.ingress`), or "" (CDI's
    getURLFromRoute): a Route's `spec.host` may be empty, the router fills in the one it serves."""
    view = ObjectView(route)
    if (view.spec.get("to") or {}).get("name") != service:
        return ""
    admitted = view.status.get("ingress") or []
    return str(admitted[0].get("host") or "") if admitted else ""


def upload_proxy_url(ingresses: Iterable[Body], routes: Iterable[Body], service: str = PROXY_SERVICE) -> str:
    """The first Ingress's host, else the first Route's, in name order (as the API server lists them), or ""."""
    found = [url_from_ingress(i, service) for i in _by_name(ingresses)]
    found += [url_from_route(r, service) for r in _by_name(routes)]
    return next((url for url in found if url), "")


def _by_name(objects: Iterable[Body]) -> list[Body]:
    return sorted(objects, key=lambda obj: ObjectView(obj).name)
