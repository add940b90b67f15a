"""kube-apiserver's `apiserver_request_total` on `/metrics`: every request counted once when it ends, by
verb, group, version, resource, subresource, scope, component and code, with kube-apiserver's label values,
so that what measures API traffic on a real cluster (a scale benchmark's before/after delta, a dashboard)
reads the embedded API server unchanged. The process's own `process_*` series come with it, as with every
Go component's metrics.

Cheap by design: one split of the path and one counter increment per request; nothing is parsed twice
and nothing is rendered until `/metrics` is read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, ProcessCollector, generate_latest

# kube-apiserver's RequestInfoFactory treats these after `namespaces/<name>` as the namespace's own
# subresources, not as a resource inside it
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_VERBS = {"POST": "POST", "PUT": "PUT", "PATCH": "PATCH", "DELETE": "DELETE"}
APPLY_PATCH = "application/apply-patch+yaml"
CONTENT_TYPE = CONTENT_TYPE_LATEST


class RequestLabels(NamedTuple):
    verb: str
    dry_run: str
    group: str
    version: str
    resource: str
    subresource: str
    scope: str


def labels_of(method: str, path: str, query: Mapping[str, str], content_type: str = "") -> RequestLabels:
    """The labels kube-apiserver gives a request: verb LIST/WATCH/GET for reads (by whether a name is given
    and `watch` is asked), APPLY for server-side apply, DELETECOLLECTION for a delete without a name; scope
    `resource` (a named object), `namespace` or `cluster`. A request outside `/api` and `/apis/<group>`
    (discovery, `/version`, `/openapi`, `/metrics`) is a non-resource request: its method only."""
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return RequestLabels(method, "", "", "", "", "", "")
    watch = query.get("watch", "") in ("true", "1")
    if rest[0] == "watch":
        watch, rest = True, rest[1:]
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces":
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
        else:
            namespace = ""  # the namespace object itself (or its status/finalize)
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if method == "GET":
        verb = "GET" if name else "WATCH" if watch else "LIST"
    elif method == "DELETE" and not name:
        verb = "DELETECOLLECTION"
    elif method == "PATCH" and content_type.startswith(APPLY_PATCH):
        verb = "APPLY"
    else:
        verb = _VERBS.get(method, method)
    scope = "resource" if name else "namespace" if namespace else "cluster"
    dry_run = "All" if query.get("dryRun") == "All" else ""
    return RequestLabels(verb, dry_run, group, version, resource, subresource, scope)


class RequestMetrics:
    """The API server's own registry (several servers may share a process in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "apiserver_request_total", "Counter of apiserver requests broken out for each verb, dry run value, "
            "group, version, resource, scope, component, and HTTP response code.",
            ["verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component", "code"],
            registry=self.registry)
        ProcessCollector(registry=self.registry)

    def count(self, labels: RequestLabels, code: int) -> None:
        self.requests.labels(*labels, "apiserver", str(code)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
