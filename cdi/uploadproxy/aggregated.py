"""The upload proxy's second listener: the aggregated API `upload.extensions.cdi.dev/v1beta1` (our
extension, `cdi.api.upload`), which the Kubernetes API server's aggregation layer forwards uploads to,
so that a user with a kubeconfig and the RBAC right uploads without reaching the proxy's own address.

Only the aggregation layer is answered here. The listener asks every client for a certificate issued by
the cluster's request-header CA (ConfigMap `kube-system/extension-apiserver-authentication`, followed as it
changes: `cdi.kube.requestheader`); a certificate of another CA fails the TLS handshake, and a request
without one, or with one whose common name is not in `requestheader-allowed-names`, or without
`X-Remote-User`, is answered 401. The user the API server names is logged with each upload; the API
server has already authorized `create` (or `get`, for `HEAD`) on `uploads/proxy` for them in the
namespace. The public listener (`front.Front`) never reads these headers.

Paths (all others 404):

* `GET /apis`, `/apis/<group>`, `/apis/<group>/<version>`: discovery, as the aggregation layer reads it
  (its availability check and `kubectl api-resources`); only the subresource `uploads/proxy` is listed.
* `<version path>/namespaces/<ns>/uploads/<pvc>/proxy/<upload path>`: routed to the PVC's upload server as an
  upload with a token for that PVC would be (`UploadProxy.plan_for`), then served by the same code as on the
  public listener (`front._Upload`): streamed, the same answers and resume headers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import h11

from cdi.api import upload as names
from cdi.common import pki, sockhttp, threadfront, tlsfront
from cdi.kube.requestheader import Caller, RequestHeaderConfig, Unauthenticated, common_name
from cdi.uploadproxy.front import Answer, Forward, Route, serve_routed

log = logging.getLogger(__name__)

_SERVER = b"cdi-uploadproxy"
_JSON = b"application/json"
# namespace, pvc, upload path, caller, X-CDI-Upload-Target -> where the upload goes (on the proxy's event loop)
PlanFor = Callable[[str, str, str, Caller, "str | None"], Coroutine[Any, Any, Forward | Answer]]


def api_group() -> dict[str, Any]:
    version = {"groupVersion": names.EXTENSION_API_VERSION, "version": names.EXTENSION_VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": names.EXTENSION_GROUP, "versions": [version],
            "preferredVersion": version}


def resource_list() -> dict[str, Any]:
    """Only the subresource: the API server then makes a parent without verbs, so `kubectl get uploads` has
    nothing to list and nothing to confuse (KubeVirt's `subresources.kubevirt.io` is published the same way)."""
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": names.EXTENSION_API_VERSION,
            "resources": [{"name": f"{names.EXTENSION_RESOURCE}/{names.EXTENSION_SUBRESOURCE}", "singularName": "",
                           "namespaced": True, "kind": names.EXTENSION_KIND, "verbs": ["create", "get"]}]}


DISCOVERY = {
    "/apis": lambda: {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]},
    f"/apis/{names.EXTENSION_GROUP}": api_group,
    names.EXTENSION_BASE: resource_list,
}


def status(code: int, reason: str, message: str) -> str:
    """A Kubernetes Status, so that kubectl and client libraries show the message."""
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code})


def write_client_ca(path: Path, pem: str) -> None:
    """The request-header CA bundle where the listener's TLS reads it (replaced in one rename, so a handshake
    never reads half a file). No CA published (a cluster without the aggregation layer configured): a CA of
    nobody's, whose key is thrown away, so that every client certificate fails and the listener still runs."""
    if not pem.strip():
        pem = pki.make_ca("cdi-uploadproxy-no-requestheader-ca").cert_pem.decode()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(pem)
    partial.replace(path)


class AggregatedFront:
    """The aggregation listener (`cdi.common.threadfront`, like the public one)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tls: tlsfront.ServerTLS, plan_for: PlanFor,
                 config: Callable[[], RequestHeaderConfig]) -> None:
        assert tls.client_ca_file is not None, "the aggregation listener verifies the front proxy's certificate"
        self.loop = loop
        self.plan_for = plan_for
        self.config = config
        self._front = threadfront.ThreadFront(tls, self._serve, name="uploadproxy-aggregation", server=_SERVER)

    def start(self, host: str, port: int) -> int:
        return self._front.start(host, port)

    def set_policy(self, policy: pki.TLSPolicy) -> None:
        self._front.set_policy(policy)

    def reload(self) -> None:
        """The serving certificate and the request-header CA read again from their files (a renewal, a
        rotation): for the connections accepted from now on."""
        self._front.reload_certificate()

    async def closed(self) -> None:
        await asyncio.to_thread(self._front.close)

    def _serve(self, sock: threadfront.Conn, conn: h11.Connection, request: h11.Request) -> None:
        items = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw_items()]
        peer = tlsfront.peer_cert(sock)
        try:
            caller = self.config().caller(common_name((peer or {}).get("subject")), items)
        except Unauthenticated as exc:
            log.warning("refused a request on the aggregation listener: %s", exc)
            self._answer(sock, conn, 401, status(401, "Unauthorized", str(exc)), request)
            return
        path = request.target.decode("latin-1").partition("?")[0]
        document = DISCOVERY.get(path.rstrip("/") or path)
        if document is not None and request.method in (b"GET", b"HEAD"):
            self._answer(sock, conn, 200, json.dumps(document()), request)
            return
        parsed = names.parse_extension_path(path)
        if parsed is None:
            self._answer(sock, conn, 404, status(404, "NotFound", "the server could not find the requested resource"),
                         request)
            return
        namespace, pvc, upload_path = parsed
        target = next((v for k, v in items if k.lower() == names.TARGET_HEADER.lower()), None)

        def where() -> Forward | Answer:
            """THE BOUNDARY, as `Front.where`: the plan needs the proxy's Kubernetes client, on its loop."""
            return asyncio.run_coroutine_threadsafe(self.plan_for(namespace, pvc, upload_path, caller, target),
                                                    self.loop).result()

        serve_routed(sock, conn, request, Route(upload_path, where))

    @staticmethod
    def _answer(sock: threadfront.Conn, conn: h11.Connection, code: int, body: str, request: h11.Request) -> None:
        sockhttp.text_answer(sock, conn, code, body, server=_SERVER, head=request.method == b"HEAD",
                             content_type=_JSON)
        if request.method not in (b"GET", b"HEAD"):  # a body may be on its way: let the client read the answer
            with contextlib.suppress(OSError):
                sockhttp.linger(sock)
