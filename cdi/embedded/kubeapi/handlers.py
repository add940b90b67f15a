"""The REST API over aiohttp: paths as Kubernetes lays them out, JSON and Table responses,
watch streams, `Status` errors, bearer-token authentication."""

from __future__ import annotations

import asyncio
import csv
import logging
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiohttp import web

from cdi.embedded.kubeapi import bodies, discovery, errors, fieldlabels, requestmetrics
from cdi.embedded.kubeapi.aggregator import Aggregator
from cdi.embedded.kubeapi.authz import Attributes, RbacAuthorizer
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.kubeapi.objects import DeleteOptions, Objects, RequestContext, UserInfo, WatchEvent
from cdi.embedded.kubeapi.requestmetrics import RequestMetrics, labels_of
from cdi.embedded.kubeapi.resources import ResourceType
from cdi.embedded.kubeapi.selectors import FieldSelector, parse_field_selector, parse_label_selector
from cdi.embedded.kubeapi.tables import table

log = logging.getLogger(__name__)

JSON = "application/json"
_PUBLIC = {"/healthz", "/livez", "/readyz", "/version"}
USER = web.RequestKey("user", UserInfo)
# the status of a response whose headers went out (a watch or a log stream answers before it ends)
PREPARED_STATUS = web.RequestKey("prepared_status", int)
IMPERSONATE_EXTRA = "impersonate-extra-"


class LogSource(Protocol):
    """Serves `pods/log` (the local node registers one)."""

    def stream(self, namespace: str, pod: str, container: str | None, *, follow: bool, previous: bool,
               tail_lines: int | None, timestamps: bool, limit_bytes: int | None) -> AsyncIterator[bytes]: ...


class Authenticator:
    """Static bearer tokens, as kube-apiserver's --token-auth-file (CSV: token,user,uid,"group1,group2")."""

    def __init__(self) -> None:
        self._tokens: dict[str, UserInfo] = {}

    def add(self, token: str, user: UserInfo) -> None:
        groups = user.groups if "system:authenticated" in user.groups else (*user.groups, "system:authenticated")
        self._tokens[token] = UserInfo(user.name, groups, user.uid)

    def load_token_file(self, path: Path) -> None:
        for row in csv.reader(path.read_text().splitlines()):
            if len(row) >= 2 and not row[0].startswith("#"):
                groups = tuple(g for g in (row[3].split(",") if len(row) > 3 else []) if g)
                self.add(row[0].strip(), UserInfo(row[1].strip(), groups, row[2].strip() if len(row) > 2 else ""))

    def authenticate(self, request: web.Request) -> UserInfo | None:
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return self._tokens.get(header[7:].strip())
        return None


@dataclass
class Target:
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str
    watch: bool


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON, headers=headers)


def _warning_header(text: str) -> str:
    """One `Warning` header value as kube-apiserver writes it (RFC 7234: code 299, no agent, the text a
    quoted-string with `"` and `\\` escaped). kubectl drops a value it cannot parse, so an unescaped quote
    in the text (`unknown field "spec.x"`) would hide the warning from the user."""
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{quoted}"'


def _raw(body: bytes, status: int = 200, warnings: list[str] | None = None) -> web.Response:
    """A JSON body; each distinct warning in a `Warning` header of its own, as kube-apiserver adds them."""
    response = web.Response(body=body, status=status, content_type=JSON)
    for text in dict.fromkeys(warnings or ()):
        response.headers.add("Warning", _warning_header(text))
    return response


def _wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def _bool(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1", "")


_JSON_TYPES: dict[type, str] = {str: "string", float: "number", bool: "bool", list: "array", dict: "object"}
_INT = re.compile(r"[+-]?[0-9]+")
_UINT = re.compile(r"[0-9]+")


def _int(query: Mapping[str, str], name: str) -> int | None:
    """An integer query parameter; 400 in the words of kube-apiserver's parameter codec when it is not one."""
    text = query.get(name)
    if not text:
        return None
    if not _INT.fullmatch(text):
        raise errors.bad_request(f'strconv.ParseInt: parsing "{text}": invalid syntax')
    return int(text)


def _resource_version(query: Mapping[str, str]) -> int | None:
    """The `resourceVersion` parameter: None when absent, 0 for "0" (any), else the version it names
    (an unsigned integer, or 400 as kube-apiserver's versioner refuses it)."""
    text = query.get("resourceVersion", "")
    if not text:
        return None
    if not _UINT.fullmatch(text) or int(text) >= 1 << 64:
        raise errors.invalid_resource_version(text)
    return int(text)


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def _selected_name(request: web.Request, verb: str) -> str:
    """The name a list, watch or deletecollection asks for with a `metadata.name=` term of its field selector,
    which kube-apiserver authorizes as a request for that name (a Role's `resourceNames` then lets one watch
    one object, as aggregated API servers watch `extension-apiserver-authentication`)."""
    if verb not in ("list", "watch", "deletecollection"):
        return ""
    try:
        selector = parse_field_selector(request.query.get("fieldSelector"))
    except StatusError:
        return ""  # refused in the selector's own words where it is used
    names = [r.value for r in selector.requirements if r.path == ("metadata", "name") and not r.negate]
    return names[0] if names and names[0] not in ("", ".", "..") and "/" not in names[0] else ""


class ApiHandlers:
    def __init__(self, objects: Objects, auth: Authenticator, authz: RbacAuthorizer, aggregator: Aggregator,
                 server_address: Callable[[], str]) -> None:
        self.objects = objects
        self.registry = objects.registry
        self.auth = auth
        self.authz = authz
        self.aggregator = aggregator
        self.server_address = server_address
        self.log_source: LogSource | None = None
        # reviews are answered, never stored
        self._reviews: dict[str, Callable[[web.Request, Target], Awaitable[web.Response]]] = {
            "authorization.k8s.io/subjectaccessreviews": self._access_review,
            "authorization.k8s.io/selfsubjectaccessreviews": self._access_review,
            "authorization.k8s.io/selfsubjectrulesreviews": self._rules_review,
            "authentication.k8s.io/selfsubjectreviews": self._self_review,
        }
        self.bookmark_interval = 10.0
        self.request_metrics = RequestMetrics()

    def _authorize(self, request: web.Request, attrs: Attributes) -> None:
        user = request.get(USER)
        if user is None:
            return  # public endpoint
        if not self.authz.allowed(user, attrs):
            raise StatusError(403, attrs.describe(user), "Forbidden",
                              details={"group": attrs.group, "kind": attrs.resource, "name": attrs.name}
                              if attrs.is_resource else {})

    def _impersonated(self, request: web.Request, user: UserInfo) -> UserInfo:
        """`Impersonate-User`/`-Group`/`-Uid`/`-Extra-<key>` (`kubectl --as`, `--as-group`, `--as-uid`, a
        kubeconfig's `as-user-extra`): the request runs as that user if the caller may `impersonate` each
        of them, as kube-apiserver's impersonation filter decides: users, groups and service accounts in
        the core group, `uids` and `userextras/<key>` (the value as the name) in authentication.k8s.io."""
        name = request.headers.get("Impersonate-User")
        groups = tuple(request.headers.getall("Impersonate-Group", ()))
        uid = request.headers.get("Impersonate-Uid", "")
        extra: dict[str, tuple[str, ...]] = {}
        for header, value in request.headers.items():
            if header.lower().startswith(IMPERSONATE_EXTRA):
                key = urllib.parse.unquote(header[len(IMPERSONATE_EXTRA):].lower())
                extra[key] = (*extra.get(key, ()), value)
        if name is None:
            if groups or uid or extra:
                raise StatusError(500, "Internal error occurred: requested impersonation of groups, extras or "
                                       "uid without a user", "InternalError")
            return user
        checks = []
        if name.startswith("system:serviceaccount:") and name.count(":") == 3:
            _, _, namespace, account = name.split(":")
            checks.append(Attributes("impersonate", "", "serviceaccounts", "", namespace, account))
        else:
            checks.append(Attributes("impersonate", "", "users", "", "", name))
        checks += [Attributes("impersonate", "", "groups", "", "", group) for group in groups]
        checks += [Attributes("impersonate", "authentication.k8s.io", "userextras", key, "", value)
                   for key, values in extra.items() for value in values]
        if uid:
            checks.append(Attributes("impersonate", "authentication.k8s.io", "uids", "", "", uid))
        for attrs in checks:
            if not self.authz.allowed(user, attrs):
                raise StatusError(403, attrs.describe(user), "Forbidden",
                                  details={"group": attrs.group, "kind": attrs.resource, "name": attrs.name})
        if name != "system:anonymous" and "system:authenticated" not in groups:
            groups = (*groups, "system:authenticated")
        return UserInfo(name, groups, uid, extra)

    def _authorize_path(self, request: web.Request) -> None:
        self._authorize(request, Attributes(verb=request.method.lower() if request.method != "GET" else "get",
                                            path=request.path))

    async def _maybe_aggregated(self, request: web.Request, group: str, version: str) -> web.StreamResponse | None:
        apiservice = self.aggregator.claimed(group, version) if group else None
        if apiservice is None:
            return None
        parts = [p for p in request.match_info.get("rest", "").split("/") if p]
        namespace = ""
        if len(parts) >= 3 and parts[0] == "namespaces":
            namespace, parts = parts[1], parts[2:]
        if parts:
            name = parts[1] if len(parts) > 1 else ""
            verb = _VERBS.get(request.method) or (
                "delete" if request.method == "DELETE" and name else
                "deletecollection" if request.method == "DELETE" else
                "get" if name else "watch" if _bool(request.query.get("watch")) else "list")
            self._authorize(request, Attributes(verb, group, parts[0], parts[2] if len(parts) > 2 else "",
                                                namespace, name))
        else:
            self._authorize_path(request)
        return await self.aggregator.proxy(request, apiservice, request[USER])

    # -- plumbing ----------------------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Answers every request (errors as `Status` bodies) and counts it in `apiserver_request_total` when it
        ends, with the code the client got: a stream's once its headers went out even if the client then
        went away, 0 for a request that ended before any answer (as kube-apiserver's counter says)."""
        code = 0
        try:
            response = await self._answer(request, handler)
            code = response.status
            return response
        except web.HTTPException as exc:
            code = exc.status
            raise
        finally:
            self.request_metrics.count(
                labels_of(request.method, request.path, request.query, request.headers.get("Content-Type", "")),
                code or request.get(PREPARED_STATUS, 0))

    @staticmethod
    async def on_response_prepare(request: web.Request, response: web.StreamResponse) -> None:
        request[PREPARED_STATUS] = response.status

    async def _answer(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            if request.path not in _PUBLIC:
                user = self.auth.authenticate(request)
                if user is None:
                    raise StatusError(401, "Unauthorized", "Unauthorized")
                request[USER] = self._impersonated(request, user)
            return await handler(request)
        except StatusError as exc:
            return _json(exc.body(), exc.code, exc.headers)
        except web.HTTPRequestEntityTooLarge:
            too_large = errors.entity_too_large(bodies.MAX_BYTES)
            return _json(too_large.body(), too_large.code)
        except web.HTTPNotFound:
            # no route: kube-apiserver's mux answers as Go's http.NotFound does, in plain text
            return web.Response(status=404, text="404 page not found\n",
                                headers={"X-Content-Type-Options": "nosniff"})
        except web.HTTPException:
            raise
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.path_qs)
            return _json(StatusError(500, f"Internal error occurred: {exc}", "InternalError").body(), 500)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/version", self.version), web.get("/healthz", self.healthz), web.get("/livez", self.healthz),
            web.get("/readyz", self.healthz), web.get("/api", self.api), web.get("/apis", self.apis),
            web.get("/openapi/v2", self.openapi_v2), web.get("/openapi/v3", self.openapi_index),
            web.get("/openapi/v3/{path:.*}", self.openapi_gv), web.get("/metrics", self.metrics),
            web.route("*", "/api/{version}", self.api_version_or_resource),
            web.route("*", "/api/{version}/{rest:.*}", self.resource),
            web.get("/apis/{group}", self.group), web.route("*", "/apis/{group}/{version}", self.group_version),
            web.route("*", "/apis/{group}/{version}/{rest:.*}", self.resource),
        ]

    async def version(self, request: web.Request) -> web.Response:
        return _json(discovery.KUBERNETES_VERSION)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        """`apiserver_request_total` and the process's series, to whoever may `get` the non-resource URL
        `/metrics` (kube-apiserver's `system:monitoring`; the admin)."""
        self._authorize_path(request)
        return web.Response(body=self.request_metrics.exposition(),
                            headers={"Content-Type": requestmetrics.CONTENT_TYPE})

    async def api(self, request: web.Request) -> web.Response:
        self._authorize_path(request)
        return _json(discovery.api_versions(self.server_address()))

    async def apis(self, request: web.Request) -> web.Response:
        self._authorize_path(request)
        return _json(discovery.group_list(self.registry, self.aggregator.groups()))

    async def group(self, request: web.Request) -> web.Response:
        self._authorize_path(request)
        body = discovery.group(self.registry, request.match_info["group"], self.aggregator.groups())
        if body is None:
            raise StatusError(404, "the server could not find the requested resource", "NotFound")
        return _json(body)

    async def group_version(self, request: web.Request) -> web.StreamResponse:
        return await self._discover(request, request.match_info["group"], request.match_info["version"])

    async def api_version_or_resource(self, request: web.Request) -> web.StreamResponse:
        return await self._discover(request, "", request.match_info["version"])

    async def _discover(self, request: web.Request, group: str, version: str) -> web.StreamResponse:
        aggregated = await self._maybe_aggregated(request, group, version)
        if aggregated is not None:
            return aggregated
        self._authorize_path(request)
        if request.method != "GET":
            raise StatusError(405, "the server does not allow this method on the requested resource",
                              "MethodNotAllowed")
        body = discovery.resource_list(self.registry, group, version)
        if body is None:
            raise StatusError(404, "the server could not find the requested resource", "NotFound")
        return _json(body)

    async def openapi_v2(self, request: web.Request) -> web.Response:
        self._authorize_path(request)
        if "protobuf" in request.headers.get("Accept", ""):
            body = discovery.openapi_v2(protobuf=True)
            assert isinstance(body, bytes)
            return web.Response(body=body,
                                content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        return _json(discovery.openapi_v2(protobuf=False))

    async def openapi_index(self, request: web.Request) -> web.Response:
        self._authorize_path(request)
        return _json(discovery.openapi_index(self.registry))

    async def openapi_gv(self, request: web.Request) -> web.Response:
        self._authorize_path(request)
        path = request.match_info["path"].strip("/").split("/")
        body = None
        if len(path) == 2 and path[0] == "api":
            body = discovery.openapi_group_version(self.registry, "", path[1])
        elif len(path) == 3 and path[0] == "apis":
            body = discovery.openapi_group_version(self.registry, path[1], path[2])
        if body is None:
            raise StatusError(404, "the server could not find the requested resource", "NotFound")
        return _json(body)

    def _target(self, request: web.Request) -> Target:
        group = request.match_info.get("group", "")
        version = request.match_info["version"]
        parts = [p for p in request.match_info["rest"].split("/") if p]
        watch = _bool(request.query.get("watch")) if "watch" in request.query else False
        if parts and parts[0] == "watch":
            watch, parts = True, parts[1:]
        namespace = None
        if len(parts) >= 3 and parts[0] == "namespaces":
            candidate = self.registry.lookup(group, version, parts[2])
            if candidate is not None and candidate.namespaced:
                namespace, parts = parts[1], parts[2:]
        if not parts or len(parts) > 3:
            raise StatusError(404, "the server could not find the requested resource", "NotFound")
        rtype = self.registry.lookup(group, version, parts[0])
        if rtype is None:
            raise StatusError(404, "the server could not find the requested resource", "NotFound",
                              details={"group": group, "kind": parts[0]})
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else ""
        if sub and sub not in rtype.subresources:
            raise StatusError(404, "the server could not find the requested resource", "NotFound")
        if rtype.namespaced and namespace is None and (name is not None or request.method in ("POST",)):
            raise StatusError(404, "the server could not find the requested resource", "NotFound")
        return Target(rtype, namespace, name, sub, watch)

    def _context(self, request: web.Request) -> RequestContext:
        validation = request.query.get("fieldValidation", "")
        return RequestContext(
            user=request.get(USER) or UserInfo("anonymous"),
            dry_run=request.query.get("dryRun") == "All",
            field_validation=validation if validation in ("Strict", "Warn", "Ignore") else "Warn",
        )

    async def _body(self, request: web.Request) -> Any:
        return bodies.decode(await request.read(), request.headers.get("Content-Type", JSON))

    # -- resources ---------------------------------------------------------------------------------

    async def resource(self, request: web.Request) -> web.StreamResponse:
        aggregated = await self._maybe_aggregated(request, request.match_info.get("group", ""),
                                                  request.match_info["version"])
        if aggregated is not None:
            return aggregated
        target = self._target(request)
        method = request.method
        self._authorize(request, self._attributes(request, target))
        review = self._reviews.get(target.rtype.key)
        if review is not None and method == "POST" and target.name is None:
            return await review(request, target)
        if target.subresource == "log" and method == "GET":
            return await self._log(request, target)
        if target.name is None:
            if method == "GET":
                if target.watch:
                    return await self._watch(request, target)
                return self._list(request, target)
            if method == "POST":
                return await self._create(request, target)
            if method == "DELETE":
                return await self._delete_collection(request, target)
        else:
            if method == "GET":
                return self._get(request, target)
            if method == "PUT":
                return await self._update(request, target)
            if method == "PATCH":
                return await self._patch(request, target)
            if method == "DELETE":
                return await self._delete(request, target)
            if method == "POST" and target.subresource == "binding":
                return await self._bind(request, target)
        raise StatusError(405, "the server does not allow this method on the requested resource", "MethodNotAllowed")

    @staticmethod
    def _attributes(request: web.Request, target: Target) -> Attributes:
        method = request.method
        if method == "GET":
            verb = "get" if target.name else "watch" if target.watch else "list"
        elif method == "DELETE":
            verb = "delete" if target.name else "deletecollection"
        else:
            verb = _VERBS.get(method, method.lower())
        return Attributes(verb, target.rtype.group, target.rtype.plural, target.subresource,
                          target.namespace or "", target.name or _selected_name(request, verb))

    async def _access_review(self, request: web.Request, target: Target) -> web.Response:
        """SubjectAccessReview (for a named user) and SelfSubjectAccessReview (for the caller): evaluated,
        never stored."""
        review = await self._body(request) or {}
        spec = review.get("spec") or {}
        if target.rtype.plural == "selfsubjectaccessreviews":
            user: UserInfo = request[USER]
        else:
            user = UserInfo(spec.get("user", ""), tuple(spec.get("groups") or ()), spec.get("uid", ""),
                            {str(key): tuple(values) for key, values in (spec.get("extra") or {}).items()})
        resource = spec.get("resourceAttributes")
        if resource:
            attrs = Attributes(resource.get("verb", ""), resource.get("group", ""), resource.get("resource", ""),
                               resource.get("subresource", ""), resource.get("namespace", ""),
                               resource.get("name", ""))
        else:
            other = spec.get("nonResourceAttributes") or {}
            attrs = Attributes(other.get("verb", ""), path=other.get("path", ""))
        allowed = self.authz.allowed(user, attrs)
        status: dict[str, Any] = {"allowed": allowed}
        if allowed:  # kube-apiserver's RBAC authorizer gives no reason when nothing allows (kubectl prints "no")
            status["reason"] = "allowed by RBAC"
        return _json({**review, "apiVersion": target.rtype.api_version, "kind": target.rtype.kind,
                      "status": status}, 201)

    async def _rules_review(self, request: web.Request, target: Target) -> web.Response:
        """SelfSubjectRulesReview (`kubectl auth can-i --list`): the caller's rules in the namespace asked,
        as kube-apiserver's RBAC rule resolver lists them; complete, RBAC being the only authorizer here."""
        review = await self._body(request) or {}
        namespace = str((review.get("spec") or {}).get("namespace") or "")
        if not namespace:
            raise errors.bad_request("no namespace on request")
        resource_rules, non_resource_rules = [], []
        for rule in self.authz.rules_for(request[USER], namespace):
            verbs = list(rule.get("verbs") or [])
            if rule.get("resources"):
                resource_rules.append({"verbs": verbs, **{field: list(rule[field]) for field in
                                                          ("apiGroups", "resources", "resourceNames")
                                                          if rule.get(field)}})
            if rule.get("nonResourceURLs"):
                non_resource_rules.append({"verbs": verbs, "nonResourceURLs": list(rule["nonResourceURLs"])})
        return _json({"apiVersion": target.rtype.api_version, "kind": target.rtype.kind,
                      "metadata": {"creationTimestamp": None}, "spec": {},
                      "status": {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
                                 "incomplete": False}}, 201)

    async def _self_review(self, request: web.Request, target: Target) -> web.Response:
        """SelfSubjectReview (`kubectl auth whoami`): who the server takes the caller for, impersonation
        applied."""
        await self._body(request)
        return _json({"apiVersion": target.rtype.api_version, "kind": target.rtype.kind,
                      "metadata": {"creationTimestamp": None}, "status": {"userInfo": request[USER].as_dict()}}, 201)

    def _respond(self, request: web.Request, target: Target, obj: dict[str, Any], status: int = 200,
                 ctx: RequestContext | None = None) -> web.Response:
        if _wants_table(request):
            return _json(table(target.rtype, [obj], request.query.get("includeObject", "Metadata")), status)
        return _raw(orjson.dumps(obj), status, ctx.warnings if ctx else None)

    def _not_newer_than_store(self, request: web.Request) -> None:
        """A read at a resourceVersion the store has not reached: kube-apiserver waits briefly for its
        cache to catch up with etcd, then answers 504. This store is never behind, so it answers at once."""
        rv = _resource_version(request.query)
        current = self.objects.store.rv
        if rv is not None and rv > current:
            raise errors.too_large_resource_version(rv, current)

    def _fields(self, request: web.Request, target: Target) -> FieldSelector:
        return fieldlabels.convert(target.rtype, parse_field_selector(request.query.get("fieldSelector")))

    def _get(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        self._not_newer_than_store(request)
        entry = self.objects.get_entry(target.rtype, target.namespace, target.name)
        if _wants_table(request):
            return self._respond(request, target, self.objects.view(target.rtype, entry))
        return _raw(self.objects.raw(target.rtype, entry))

    def _list(self, request: web.Request, target: Target) -> web.Response:
        query = request.query
        labels, fields = parse_label_selector(query.get("labelSelector")), self._fields(request, target)
        limit = max(0, _int(query, "limit") or 0)  # as kube-apiserver: zero or less is no limit
        self._not_newer_than_store(request)
        page = self.objects.list(target.rtype, target.namespace, labels, fields, limit, query.get("continue", ""))
        meta: dict[str, Any] = {"resourceVersion": str(page.rv)}
        if page.continue_token:
            meta["continue"] = page.continue_token
            meta["remainingItemCount"] = page.remaining
        if _wants_table(request):
            objs = [self.objects.view(target.rtype, e) for e in page.entries]
            return _json(table(target.rtype, objs, query.get("includeObject", "Metadata"), meta))
        head = orjson.dumps({"kind": target.rtype.kind + "List", "apiVersion": target.rtype.api_version,
                             "metadata": meta})[:-1]
        items = b",".join(self.objects.raw(target.rtype, e) for e in page.entries)
        return _raw(head + b',"items":[' + items + b"]}")

    async def _create(self, request: web.Request, target: Target) -> web.Response:
        ctx = self._context(request)
        obj = await self.objects.create(target.rtype, target.namespace, await self._body(request), ctx)
        return self._respond(request, target, obj, 201, ctx)

    async def _update(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        ctx = self._context(request)
        obj = await self.objects.update(target.rtype, target.namespace, target.name, await self._body(request), ctx,
                                        target.subresource)
        return self._respond(request, target, obj, 200, ctx)

    async def _patch(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        ctx = self._context(request)
        content_type = request.headers.get("Content-Type", "")
        obj = await self.objects.patch(target.rtype, target.namespace, target.name, content_type,
                                       await self._body(request), ctx, target.subresource)
        return self._respond(request, target, obj, 200, ctx)

    def _delete_options(self, request: web.Request, body: Any) -> DeleteOptions:
        body = body if isinstance(body, dict) else {}
        query = request.query
        grace = body.get("gracePeriodSeconds", _int(query, "gracePeriodSeconds"))
        if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
            raise errors.bad_request(f"json: cannot unmarshal {_JSON_TYPES.get(type(grace), 'value')} into Go "
                                     "struct field DeleteOptions.gracePeriodSeconds of type int64")
        pre = body.get("preconditions") or {}
        if not isinstance(pre, dict):
            raise errors.bad_request(f"json: cannot unmarshal {_JSON_TYPES.get(type(pre), 'value')} into Go struct "
                                     "field DeleteOptions.preconditions of type v1.Preconditions")
        policy = body.get("propagationPolicy") or query.get("propagationPolicy")
        if body.get("orphanDependents") is True or query.get("orphanDependents") == "true":
            policy = "Orphan"
        if policy not in (None, "Background", "Foreground", "Orphan"):
            raise errors.bad_request(f"propagationPolicy: Unsupported value: \"{policy}\"")
        return DeleteOptions(policy, grace, pre.get("uid"), pre.get("resourceVersion"))

    async def _delete(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        ctx = self._context(request)
        options = self._delete_options(request, await self._body(request))
        obj = await self.objects.delete(target.rtype, target.namespace, target.name, options, ctx)
        return _raw(orjson.dumps(obj), 200)

    async def _delete_collection(self, request: web.Request, target: Target) -> web.Response:
        ctx = self._context(request)
        options = self._delete_options(request, await self._body(request))
        deleted = await self.objects.delete_collection(
            target.rtype, target.namespace, parse_label_selector(request.query.get("labelSelector")),
            self._fields(request, target), options, ctx)
        return _json({"kind": target.rtype.kind + "List", "apiVersion": target.rtype.api_version,
                      "metadata": {"resourceVersion": str(self.objects.store.rv)}, "items": deleted})

    async def _bind(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        body = await self._body(request) or {}
        node = (body.get("target") or {}).get("name")
        if not node:
            raise errors.bad_request("binding target name is required")
        await self.objects.patch(target.rtype, target.namespace, target.name, "application/merge-patch+json",
                                 {"spec": {"nodeName": node}}, self._context(request))
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)

    # -- watch -------------------------------------------------------------------------------------

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        query = request.query
        labels = parse_label_selector(query.get("labelSelector"))
        fields = self._fields(request, target)
        timeout = _int(query, "timeoutSeconds") or None
        # Checked before the stream starts, so a bad version is a 400 and not a 200 that ends at once. A
        # version the store has not reached yet is waited for, as kube-apiserver's watch cache does.
        rv = _resource_version(query)
        as_table = _wants_table(request)
        include = query.get("includeObject", "Metadata")
        events = self.objects.watch(target.rtype, target.namespace, "" if rv is None else str(rv), labels, fields,
                                    bookmarks=_bool(query.get("allowWatchBookmarks")),
                                    bookmark_interval=self.bookmark_interval, timeout=timeout)
        response = web.StreamResponse(headers={"Content-Type": JSON, "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            async for event in events:
                await response.write(self._encode_event(target, event, as_table, include))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            await events.aclose()
        try:
            await response.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        return response

    def _encode_event(self, target: Target, event: WatchEvent, as_table: bool, include: str) -> bytes:
        rtype = target.rtype
        if event.type == "BOOKMARK":
            obj: Any = {"kind": rtype.kind, "apiVersion": rtype.api_version,
                        "metadata": {"resourceVersion": str(event.rv)}}
            return orjson.dumps({"type": "BOOKMARK", "object": obj}) + b"\n"
        if event.type == "ERROR":
            return orjson.dumps({"type": "ERROR", "object": event.obj}) + b"\n"
        assert event.entry is not None
        if as_table:
            body = table(rtype, [self.objects.view(rtype, event.entry)], include)
            return orjson.dumps({"type": event.type, "object": body}) + b"\n"
        return b'{"type":"' + event.type.encode() + b'","object":' + self.objects.raw(rtype, event.entry) + b"}\n"

    # -- logs --------------------------------------------------------------------------------------

    async def _log(self, request: web.Request, target: Target) -> web.StreamResponse:
        assert target.name is not None and target.namespace is not None
        self.objects.get(target.rtype, target.namespace, target.name)
        if self.log_source is None:
            raise errors.bad_request(f'pod "{target.name}" is not running on any node: no logs available')
        query = request.query
        stream = self.log_source.stream(
            target.namespace, target.name, query.get("container"), follow=_bool(query.get("follow")),
            previous=_bool(query.get("previous")),
            tail_lines=_int(query, "tailLines"), timestamps=_bool(query.get("timestamps")),
            limit_bytes=_int(query, "limitBytes"))
        iterator = stream.__aiter__()
        try:
            first = await iterator.__anext__()
        except StopAsyncIteration:
            first = b""
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            if first:
                await response.write(first)
            async for chunk in iterator:
                await response.write(chunk)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        try:
            await response.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        return response
