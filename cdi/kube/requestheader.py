"""Who the aggregation layer says is calling: the request-header (front-proxy) authentication every
aggregated API server does, shared by cdi-apiserver (`upload.cdi.kubevirt.io`) and the upload proxy
(`upload.extensions.cdi.dev`, our extension).

An aggregated API server does not see the user's credentials. kube-apiserver (or the embedded one)
authenticates the user, checks RBAC, and forwards the request over TLS with a *front-proxy client
certificate*, naming the user in `X-Remote-User` and the groups in `X-Remote-Group` (extras in
`X-Remote-Extra-<key>`). Those headers are believed only on a connection whose client certificate chains
to the request-header CA and whose common name is in the allowed list. Both come from ConfigMap
`kube-system/extension-apiserver-authentication`, which the API server publishes (keys
`requestheader-client-ca-file`, `requestheader-allowed-names`, `requestheader-username-headers`,
`requestheader-group-headers`, `requestheader-extra-headers-prefix`), as CDI's `auth-config.go` reads it.

`AuthenticationWatch` follows that ConfigMap while a server runs (a list+watch of that one object, as
Kubernetes' own aggregated API servers follow it): a rotated CA reaches its subscribers for the
connections made after it. It is the one reader of the ConfigMap: cdi-apiserver also takes the cluster's
client CA (`client-ca-file`, who may call its webhooks) from what it passes on. Reading it takes the
`extension-apiserver-authentication-reader` Role of kube-system, which cdi-operator binds to the accounts
of both servers."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from cdi.api import groups
from cdi.kube.client import KubeClient
from cdi.kube.errors import ApiError
from cdi.kube.informer import Informer

log = logging.getLogger(__name__)

AUTH_CONFIGMAP = "extension-apiserver-authentication"
AUTH_NAMESPACE = "kube-system"
CLIENT_CA_KEY = "requestheader-client-ca-file"
Subscriber = Callable[[Mapping[str, str]], None]


@dataclass(frozen=True)
class Caller:
    user: str
    groups: tuple[str, ...]
    extra: dict[str, list[str]] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.user} (groups {', '.join(self.groups) or 'none'})"


class Unauthenticated(Exception):
    """The request did not come through a trusted front proxy."""


@dataclass(frozen=True)
class RequestHeaderConfig:
    """How front-proxy requests are recognised (empty CA: nobody is trusted)."""

    client_ca: str = ""
    allowed_names: tuple[str, ...] = ()
    user_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    @classmethod
    def from_configmap(cls, data: Mapping[str, str]) -> RequestHeaderConfig:
        def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
            text = data.get(key)
            if not text:
                return default
            try:
                value = json.loads(text)
            except ValueError:
                return default
            return tuple(str(v) for v in value) if isinstance(value, list) else default

        return cls(client_ca=data.get(CLIENT_CA_KEY, ""),
                   allowed_names=names("requestheader-allowed-names", ()),
                   user_headers=names("requestheader-username-headers", ("X-Remote-User",)),
                   group_headers=names("requestheader-group-headers", ("X-Remote-Group",)),
                   extra_prefixes=names("requestheader-extra-headers-prefix", ("X-Remote-Extra-",)))

    def identity_headers(self) -> tuple[str, ...]:
        """The header names (lower case) and prefixes that carry an identity: never passed on by a server that
        forwards a request, whoever sent them."""
        return tuple(h.lower() for h in (*self.user_headers, *self.group_headers, *self.extra_prefixes))

    def caller(self, common_name: str | None, headers: Iterable[tuple[str, str]]) -> Caller:
        """The user the front proxy names, once the connection's client certificate is known to chain to
        `client_ca` (the TLS layer verified it) and its common name (`None`: no certificate) is allowed."""
        if common_name is None:
            raise Unauthenticated("request is not authenticated: no verified front-proxy client certificate")
        if self.allowed_names and common_name not in self.allowed_names:
            raise Unauthenticated(f"front-proxy certificate CN {common_name!r} is not an allowed requestheader name")
        items = list(headers)
        group_headers = {h.lower() for h in self.group_headers}
        user = next((value for wanted in self.user_headers for name, value in items
                     if name.lower() == wanted.lower() and value), "")
        if not user:
            raise Unauthenticated(f"one of these headers is required: {', '.join(self.user_headers)}")
        member_of = [value for name, value in items if name.lower() in group_headers]
        extra: dict[str, list[str]] = {}
        for prefix in self.extra_prefixes:
            for name, value in items:
                if name.lower().startswith(prefix.lower()):
                    extra.setdefault(unquote(name[len(prefix):].lower()), []).append(value)
        return Caller(user, tuple(member_of), extra)


def common_name(subject: Any) -> str | None:
    """The common name in a peer certificate's subject as `ssl.SSLSocket.getpeercert()` gives it (a tuple of
    RDNs, each a tuple of (name, value) pairs); "" for a certificate without one, None for no subject."""
    if not subject:
        return None
    for rdn in subject:
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


class AuthenticationWatch:
    """ConfigMap `kube-system/extension-apiserver-authentication`, read at start and followed: each change of
    what it holds reaches the subscribers (on the event loop) as its data."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.data: Mapping[str, str] = {}
        self.config = RequestHeaderConfig()  # what `data` says of the front proxy
        self._subscribers: list[Subscriber] = []
        self.informer = Informer(client, groups.CONFIGMAPS, AUTH_NAMESPACE,
                                 field_selector=f"metadata.name={AUTH_CONFIGMAP}")
        self.informer.add_handler(on_add=self._changed, on_update=lambda _old, new: self._changed(new))

    async def start(self) -> None:
        """Read it once (what serves until the watch says otherwise), then follow it; the watch is not waited
        for: where the account may not watch, it keeps trying, as an informer does. Unreadable, it is empty:
        nobody is trusted (no front proxy, no webhook caller where names are required)."""
        try:
            configmap = await self.client.get(groups.CONFIGMAPS, AUTH_CONFIGMAP, AUTH_NAMESPACE)
        except ApiError as exc:
            log.warning("cannot read %s/%s (%s): requests through the aggregation layer will be refused",
                        AUTH_NAMESPACE, AUTH_CONFIGMAP, exc)
        else:
            self._set(configmap.get("data") or {})
        self.informer.start()

    async def stop(self) -> None:
        await self.informer.stop()

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call `subscriber` with the data now and at each change."""
        self._subscribers.append(subscriber)
        subscriber(self.data)

    def _set(self, data: Mapping[str, str]) -> None:
        self.data = dict(data)
        self.config = RequestHeaderConfig.from_configmap(self.data)

    def _changed(self, configmap: dict[str, Any]) -> None:
        data = configmap.get("data") or {}
        if data == self.data:
            return
        self._set(data)
        log.info("%s/%s changed: following its CAs and front-proxy names (%s)", AUTH_NAMESPACE, AUTH_CONFIGMAP,
                 ", ".join(self.config.allowed_names) or "any name")
        for subscriber in self._subscribers:
            try:
                subscriber(self.data)
            except Exception:  # one server that cannot take it keeps what it had; the others still change
                log.exception("following %s/%s failed", AUTH_NAMESPACE, AUTH_CONFIGMAP)
