"""A small dict-in, dict-out client for any resource, on top of `kubernetes.aio`'s transport.

Why not the generated `CoreV1Api`/`CustomObjectsApi`: their pydantic models would leak into every
caller (and v36/v37 of the official client changed those models under everyone's feet), they cover
custom resources only through a separate untyped API, and their watch helper gives up after one 410.
What we do take from the official client is everything about *reaching* the server: kubeconfig and
in-cluster loading, exec plugins, bearer tokens with refresh, client certificates, CA bundles, proxies
and the aiohttp session (`ApiClient.param_serialize` adds the auth headers, `rest_client.request`
sends). On top of that this module knows Kubernetes' REST layout for a `GVR`, maps error answers to
`cdi.kube.errors`, and streams watches line by line with an inactivity timer."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlencode

import aiohttp
import orjson
from kubernetes.aio.client import ApiClient

from cdi.api.groups import GVR
from cdi.kube.config import ClusterConfig, load_config
from cdi.kube.errors import ApiError, TransportError, WatchInactive, error_from_response, error_from_status
from cdi.kube.paths import resource_path

log = logging.getLogger(__name__)

Obj = dict[str, Any]
PatchType = Literal["merge", "json", "strategic", "apply"]
QueryValue = str | int | float | bool | None

PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}
JSON = "application/json"
USER_AGENT = "cdi/0.1 (kubernetes.aio)"


@dataclass
class Response:
    """A raw answer from `KubeClient.request` (only 2xx ones: errors raise)."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass
class ObjectList:
    """One page (or all pages) of a list: the items and the resourceVersion to watch from."""

    items: list[Obj]
    resource_version: str
    continue_token: str = ""
    remaining_item_count: int | None = None


@dataclass(frozen=True)
class WatchEvent:
    """ADDED, MODIFIED, DELETED or BOOKMARK; ERROR events are raised as typed errors instead."""

    type: str
    object: Obj = field(repr=False)

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion") or "")


def _query(params: Mapping[str, QueryValue]) -> str:
    pairs: list[tuple[str, str]] = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            pairs.append((key, "true" if value else "false"))
        else:
            pairs.append((key, str(value)))
    return urlencode(pairs)


def _with_type(obj: Obj, gvr: GVR) -> Obj:
    """List and watch items may lack kind/apiVersion (they are implied by the list); fill them in so
    every object our code sees can be referenced (owner references, events) without knowing its GVR."""
    obj.setdefault("apiVersion", gvr.api_version)
    obj.setdefault("kind", gvr.kind)
    return obj


class KubeClient:
    """Async client for one API server. Use as `async with await KubeClient.connect(...) as client`."""

    def __init__(self, config: ClusterConfig, *, request_timeout: float = 60.0,
                 connect_timeout: float = 10.0) -> None:
        self.config = config
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self._api = ApiClient(config.configuration)
        self._api.user_agent = USER_AGENT

    @classmethod
    async def connect(cls, kubeconfig: str | os.PathLike[str] | None = None, *, context: str | None = None,
                      request_timeout: float = 60.0, connect_timeout: float = 10.0) -> KubeClient:
        """From `kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`, else the pod's service account."""
        return cls(await load_config(kubeconfig, context), request_timeout=request_timeout,
                   connect_timeout=connect_timeout)

    @property
    def namespace(self) -> str:
        """The default namespace: the kubeconfig context's, or the pod's own."""
        return self.config.namespace

    @property
    def host(self) -> str:
        return str(self.config.configuration.host)

    async def close(self) -> None:
        await self._api.close()  # type: ignore[no-untyped-call]

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- transport ---------------------------------------------------------------------------------

    def _timeout(self, total: float | None) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=total, connect=self.connect_timeout, sock_connect=self.connect_timeout)

    async def _open(self, method: str, path: str, query: Mapping[str, QueryValue] | None, body: Any,
                    content_type: str, accept: str, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """Send a request, returning the open response; non-2xx answers are read and raised as typed errors."""
        try:
            _, url, headers, _, _ = await self._api.param_serialize(
                method, path, header_params={"Accept": accept, "Content-Type": content_type},
                auth_settings=["BearerToken"])
            qs = _query(query or {})
            if qs:
                url += ("&" if "?" in url else "?") + qs
            wrapped = await self._api.rest_client.request(  # type: ignore[no-untyped-call]
                method, url, headers=headers, body=body, _request_timeout=timeout)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransportError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        response: aiohttp.ClientResponse = wrapped.response
        if response.status >= 300:
            try:
                data = await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError):
                data = b""
            finally:
                response.release()
            raise error_from_response(response.status, data, response.headers.get("Retry-After"))
        return response

    async def request(self, method: str, path: str, *, query: Mapping[str, QueryValue] | None = None,
                      body: Any = None, content_type: str = JSON, accept: str = JSON,
                      timeout: float | None = None) -> Response:
        """Any endpoint, for what the typed verbs don't cover (pod logs, discovery, aggregated APIs).

        `body` is JSON-encoded when `content_type` names JSON (or is apply-patch YAML), and must be
        str or bytes, sent as is, for any other content type. Error answers raise typed errors."""
        response = await self._open(method, path, query, body, content_type, accept,
                                    self._timeout(timeout or self.request_timeout))
        try:
            data = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransportError(f"{method} {path}: reading the answer: {exc}") from exc
        finally:
            response.release()
        return Response(response.status, dict(response.headers), data)

    async def _call(self, method: str, path: str, *, query: Mapping[str, QueryValue] | None = None,
                    body: Any = None, content_type: str = JSON) -> Obj:
        answer = (await self.request(method, path, query=query, body=body, content_type=content_type)).json()
        if not isinstance(answer, dict):
            raise ApiError(f"{method} {path}: expected a JSON object, got {type(answer).__name__}")
        return answer

    @staticmethod
    def _namespace(gvr: GVR, namespace: str | None, body: Mapping[str, Any] | None = None) -> str | None:
        if not gvr.namespaced:
            return None
        ns = namespace or ((body or {}).get("metadata") or {}).get("namespace")
        if not ns:
            raise ValueError(f"{gvr.kind} is namespaced: pass a namespace")
        return str(ns)

    # -- verbs -------------------------------------------------------------------------------------

    async def get(self, gvr: GVR, name: str, namespace: str | None = None, *,
                  subresource: str | None = None) -> Obj:
        path = resource_path(gvr, self._namespace(gvr, namespace), name, subresource)
        obj = await self._call("GET", path)
        return obj if subresource else _with_type(obj, gvr)

    async def list(self, gvr: GVR, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None, limit: int | None = None, continue_token: str | None = None,
                   resource_version: str | None = None) -> ObjectList:
        """One page; `namespace=None` lists across all namespaces. Follow `continue_token` for the next."""
        path = resource_path(gvr, namespace if gvr.namespaced else None)
        answer = await self._call("GET", path, query={
            "labelSelector": label_selector or None, "fieldSelector": field_selector or None,
            "limit": limit or None, "continue": continue_token or None, "resourceVersion": resource_version})
        meta = answer.get("metadata") or {}
        items = [_with_type(item, gvr) for item in answer.get("items") or []]
        remaining = meta.get("remainingItemCount")
        return ObjectList(items, str(meta.get("resourceVersion") or ""), str(meta.get("continue") or ""),
                          int(remaining) if remaining is not None else None)

    async def list_all(self, gvr: GVR, namespace: str | None = None, *, label_selector: str | None = None,
                       field_selector: str | None = None, page_size: int = 500) -> ObjectList:
        """Every page, joined; the resourceVersion is the first page's (the snapshot the pages belong to)."""
        first = await self.list(gvr, namespace, label_selector=label_selector, field_selector=field_selector,
                                limit=page_size)
        items, token = list(first.items), first.continue_token
        while token:
            page = await self.list(gvr, namespace, label_selector=label_selector, field_selector=field_selector,
                                   limit=page_size, continue_token=token)
            items.extend(page.items)
            token = page.continue_token
        return ObjectList(items, first.resource_version)

    async def create(self, gvr: GVR, body: Mapping[str, Any], namespace: str | None = None, *,
                     dry_run: bool = False, field_manager: str | None = None) -> Obj:
        path = resource_path(gvr, self._namespace(gvr, namespace, body))
        return await self._call("POST", path, body=_with_type(dict(body), gvr),
                                query={"dryRun": "All" if dry_run else None, "fieldManager": field_manager})

    async def replace(self, gvr: GVR, body: Mapping[str, Any], namespace: str | None = None, *,
                      subresource: str | None = None, dry_run: bool = False,
                      field_manager: str | None = None) -> Obj:
        """PUT the whole object (metadata.resourceVersion makes it conditional: 409 Conflict if stale)."""
        name = str((body.get("metadata") or {}).get("name") or "")
        path = resource_path(gvr, self._namespace(gvr, namespace, body), name, subresource)
        return await self._call("PUT", path, body=_with_type(dict(body), gvr),
                                query={"dryRun": "All" if dry_run else None, "fieldManager": field_manager})

    async def patch(self, gvr: GVR, name: str, patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                    namespace: str | None = None, *, patch_type: PatchType = "merge",
                    subresource: str | None = None, dry_run: bool = False, field_manager: str | None = None,
                    force: bool | None = None) -> Obj:
        """Merge (default), JSON (a list of operations), strategic (core kinds) or apply patch."""
        if (patch_type == "json") != isinstance(patch, Sequence):
            raise ValueError("a JSON patch is a list of operations, and only a JSON patch is")
        path = resource_path(gvr, self._namespace(gvr, namespace), name, subresource)
        # JSON is YAML, so an apply patch is sent JSON-encoded like the others
        body: Any = [dict(op) for op in patch] if isinstance(patch, Sequence) else dict(patch)
        return await self._call("PATCH", path, body=body, content_type=PATCH_CONTENT_TYPES[patch_type],
                                query={"dryRun": "All" if dry_run else None, "fieldManager": field_manager,
                                       "force": force})

    async def delete(self, gvr: GVR, name: str, namespace: str | None = None, *,
                     propagation_policy: Literal["Background", "Foreground", "Orphan"] | None = None,
                     grace_period_seconds: int | None = None, uid: str | None = None,
                     resource_version: str | None = None, dry_run: bool = False) -> Obj:
        """Delete one object; `uid`/`resource_version` are preconditions (409 Conflict if they don't hold).

        Returns what the server returns: the object (possibly still present with a deletionTimestamp
        while finalizers run) or a `Status`."""
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        if dry_run:
            options["dryRun"] = ["All"]
        path = resource_path(gvr, self._namespace(gvr, namespace), name)
        return await self._call("DELETE", path, body=options)

    def watch(self, gvr: GVR, namespace: str | None = None, *, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_seconds: int | None = None, allow_bookmarks: bool = True,
              inactivity_timeout: float | None = None) -> WatchStream:
        """A watch stream; use `async with client.watch(...) as events: async for event in events`.

        The server closes the stream after `timeout_seconds`; the stream raises `WatchInactive` when no
        bytes arrive for `inactivity_timeout` seconds, and the typed error of an in-stream ERROR event
        (`Gone` for a resourceVersion that is too old)."""
        path = resource_path(gvr, namespace if gvr.namespaced else None)
        query: dict[str, QueryValue] = {
            "watch": True, "resourceVersion": resource_version or None,
            "allowWatchBookmarks": allow_bookmarks or None, "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector or None, "fieldSelector": field_selector or None,
        }
        return WatchStream(self, gvr, path, query, inactivity_timeout)


class WatchStream:
    """One watch request: opened on `__aenter__` (or the first iteration), closed on exit or end."""

    def __init__(self, client: KubeClient, gvr: GVR, path: str, query: Mapping[str, QueryValue],
                 inactivity_timeout: float | None) -> None:
        self._client = client
        self._gvr = gvr
        self._path = path
        self._query = query
        self._inactivity = inactivity_timeout
        self._response: aiohttp.ClientResponse | None = None
        self._buffer = bytearray()
        self._closed = False
        self.resource_version: str = str(query.get("resourceVersion") or "")

    async def open(self) -> None:
        if self._response is not None or self._closed:
            return
        timeout = self._client._timeout(None)
        header_deadline = self._inactivity or self._client.request_timeout
        try:
            async with asyncio.timeout(header_deadline):
                self._response = await self._client._open("GET", self._path, self._query, None, JSON, JSON, timeout)
        except TimeoutError as exc:
            self._closed = True
            raise WatchInactive(f"watch {self._path}: no answer within {header_deadline}s") from exc

    async def close(self) -> None:
        self._closed = True
        if self._response is not None:
            self._response.close()
            self._response = None

    async def __aenter__(self) -> WatchStream:
        await self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        await self.open()
        while True:
            line = await self._line()
            if line is None:
                await self.close()
                raise StopAsyncIteration
            if not line.strip():
                continue
            try:
                raw = orjson.loads(line)
                kind, obj = raw["type"], raw["object"]
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                await self.close()
                raise TransportError(f"watch {self._path}: undecodable event: {line[:200]!r}") from exc
            if kind == "ERROR":
                await self.close()
                raise error_from_status(obj if isinstance(obj, dict) else {})
            event = WatchEvent(kind, _with_type(obj, self._gvr))
            if event.resource_version:
                self.resource_version = event.resource_version
            return event

    async def _line(self) -> bytes | None:
        """The next newline-terminated line, or None at the end of the stream."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 1]
                return line
            if self._response is None:
                return None
            try:
                async with asyncio.timeout(self._inactivity):
                    chunk = await self._response.content.readany()
            except TimeoutError as exc:
                await self.close()
                raise WatchInactive(f"watch {self._path}: nothing received for {self._inactivity}s") from exc
            except (aiohttp.ClientError, OSError) as exc:
                await self.close()
                raise TransportError(f"watch {self._path}: {type(exc).__name__}: {exc}") from exc
            if not chunk:
                rest = bytes(self._buffer)
                self._buffer.clear()
                self._response.release()
                self._response = None
                return rest if rest.strip() else None
            self._buffer.extend(chunk)
