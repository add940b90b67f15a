"""Where an upload goes: the PVC's readiness, the upload server's path, address and TLS identity.

* Readiness (CDI's `uploadReady`): the PVC must exist and carry `cdi.kubevirt.io/storage.upload.target`;
  a PVC whose upload already finished (`storage.pod.phase: Succeeded`) or failed for good is
  refused; otherwise the proxy waits up to 10 seconds for `storage.pod.ready: "true"`. Every refusal
  is a 503 whose body says why, as CDI's (a finished upload too: "rejecting Upload Request for PVC X
  that already finished uploading", plus our `Upload-State: done`, since the answer to a `HEAD` has no
  body to tell a resuming client that its upload got through).
* Path: as requested, except that an `archive` PVC gets `/v1beta1/upload-archive` (CDI's rewrite).
* Address: the `cdi-upload-<pvc>` Service read from the API, never a DNS name, so the proxy works
  where cluster DNS does not reach (outside the cluster, or `cdi up`): the Service's ready endpoint
  (its Endpoints object, as the aggregation layer and ingress controllers route), else its cluster
  IP. Going to the endpoint skips a kube-proxy hop; on the embedded node, whose kube-proxy copies
  every byte in user space, that hop alone costs about a third of the upload throughput.
  The server certificate is checked against the upload-server signer bundle for the name
  `cdi-upload-<pvc>.<namespace>.svc`, which is what the controller put in it.
* Client identity: the proxy's client certificate (Secret `cdi-uploadserver-client-cert`) and the
  server CA (ConfigMap `cdi-uploadserver-signer-bundle`), both in CDI's namespace, re-read when they
  change."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api import upload as names
from cdi.common import pki
from cdi.kube import ApiError, KubeClient, NotFound

log = logging.getLogger(__name__)

READY_WAIT_SECONDS = 10.0
READY_POLL_SECONDS = 0.25
CLIENT_CERT_SECRET = "cdi-uploadserver-client-cert"
SERVER_CA_CONFIGMAP = "cdi-uploadserver-signer-bundle"
_TLS_RECHECK_SECONDS = 30.0


class NotReady(Exception):
    """The upload cannot be forwarded now (answered 503 with this message)."""

    status = 503
    headers: tuple[tuple[str, str], ...] = ()


class AlreadyDone(NotReady):
    """The PVC's upload finished: 503 with CDI's message, as CDI's proxy answers (clients written for CDI
    look for it there). `Upload-State: done` (our resume extension) says it where a `HEAD` has no body:
    a client asking where to resume after a break learns that its upload got through."""

    headers = ((names.STATE_HEADER, "done"),)


@dataclass(frozen=True)
class Upstream:
    url: str  # https://<cluster IP>:<port><path>
    server_hostname: str  # the name in the upload server's certificate


def _annotations(pvc: Mapping[str, Any]) -> Mapping[str, str]:
    return (pvc.get("metadata") or {}).get("annotations") or {}


def _names_upload_source(pvc: Mapping[str, Any]) -> bool:
    ref = (pvc.get("spec") or {}).get("dataSourceRef") or {}
    return bool(ref.get("apiGroup") == groups.CDI_GROUP and ref.get("kind") == "VolumeUploadSource")


async def _prime_of(client: KubeClient, namespace: str, pvc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The prime claim the populator named on the claim (`storage.populator.pvcPrime`), once there."""
    prime_name = _annotations(pvc).get(ann.PVC_PRIME_NAME)
    if not prime_name:
        return None
    try:
        prime: dict[str, Any] = await client.get(groups.PVCS, prime_name, namespace)
    except NotFound:
        return None
    return prime


async def wait_until_ready(client: KubeClient, namespace: str, name: str, *,
                           timeout: float = READY_WAIT_SECONDS) -> dict[str, Any]:
    """The PVC whose upload server takes the upload (for a claim naming a VolumeUploadSource, its prime
    claim, as CDI's proxy), once that server is ready; NotReady with CDI's messages otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pvc = await client.get(groups.PVCS, name, namespace)
        except NotFound:
            raise NotReady(f"rejecting Upload Request for PVC {name} that doesn't exist") from None
        except ApiError as exc:
            raise NotReady(f"cannot read PVC {namespace}/{name}: {exc}") from None
        if _names_upload_source(pvc):  # the upload populator: the upload goes to its prime claim
            if _annotations(pvc).get(ann.POD_PHASE) == "Succeeded":  # mirrored from the prime, now gone
                raise AlreadyDone(f"rejecting Upload Request for PVC {name} that already finished uploading")
            prime = await _prime_of(client, namespace, pvc)
            if prime is None:
                if time.monotonic() >= deadline:
                    raise NotReady(f"the upload server for PVC {namespace}/{name} is not ready after "
                                   f"{timeout:.0f}s (no prime claim yet); try again shortly")
                await asyncio.sleep(READY_POLL_SECONDS)
                continue
            pvc = prime
        annotations = _annotations(pvc)
        if ann.UPLOAD_TARGET not in annotations:
            raise NotReady(f"PVC {name} is not an upload target")
        if annotations.get(ann.POD_PHASE) == "Succeeded":
            raise AlreadyDone(f"rejecting Upload Request for PVC {name} that already finished uploading")
        if annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
            reason = annotations.get(ann.CONDITION_RUNNING_REASON, "")
            message = annotations.get(ann.CONDITION_RUNNING_MESSAGE, "")
            raise NotReady(f"rejecting Upload Request for PVC {name}: its upload failed ({reason}: {message}); "
                           "delete and recreate it to upload again")
        if annotations.get(ann.POD_READY) == "true":
            return pvc
        if time.monotonic() >= deadline:
            phase = annotations.get(ann.POD_PHASE) or "not created yet"
            raise NotReady(f"the upload server for PVC {namespace}/{name} is not ready after {timeout:.0f}s "
                           f"(pod phase: {phase}); try again shortly")
        await asyncio.sleep(READY_POLL_SECONDS)


def upload_path(pvc: Mapping[str, Any], requested: str) -> str:
    content_type = _annotations(pvc).get(ann.CONTENT_TYPE, "")
    if content_type in ("", "kubevirt"):
        return requested
    if content_type == "archive":
        return names.ARCHIVE_ALPHA_PATH if "alpha" in requested else names.ARCHIVE_PATH
    name = (pvc.get("metadata") or {}).get("name", "")
    raise NotReady(f"rejecting upload request for PVC {name} - upload content-type {content_type} is invalid")


async def upstream_for(client: KubeClient, namespace: str, pvc: str, path: str, *,
                       prefer_endpoints: bool = True) -> Upstream:
    service_name = names.upload_service_name(pvc)
    try:
        service = await client.get(groups.SERVICES, service_name, namespace)
    except ApiError as exc:
        raise NotReady(f"cannot find the upload server of PVC {namespace}/{pvc}: service {service_name}: {exc}") \
            from None
    hostname = f"{service_name}.{namespace}.svc"
    spec = service.get("spec") or {}
    ports = spec.get("ports") or [{}]
    if prefer_endpoints:
        endpoint = await _ready_endpoint(client, namespace, service_name, ports[0].get("name", ""))
        if endpoint is not None:
            return Upstream(f"https://{_host(endpoint[0])}:{endpoint[1]}{path}", hostname)
    ip = spec.get("clusterIP")
    if not ip or ip == "None":
        raise NotReady(f"service {namespace}/{service_name} has no cluster IP and no ready endpoint")
    port = int(ports[0].get("port") or names.UPLOAD_PORT)
    return Upstream(f"https://{_host(ip)}:{port}{path}", hostname)


async def _ready_endpoint(client: KubeClient, namespace: str, name: str, port_name: str) -> tuple[str, int] | None:
    try:
        endpoints = await client.get(groups.ENDPOINTS, name, namespace)
    except ApiError:
        return None
    for subset in endpoints.get("subsets") or []:
        port = next((p for p in subset.get("ports") or [] if p.get("name", "") == port_name), None)
        for address in subset.get("addresses") or []:
            if port is not None and address.get("ip"):
                return str(address["ip"]), int(port["port"])
    return None


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


class UpstreamTls:
    """The SSL context for talking to upload servers: mTLS with the proxy's client certificate."""

    def __init__(self, client: KubeClient | None, namespace: str, *, cert: bytes | None = None,
                 key: bytes | None = None, ca_bundle: bytes | None = None) -> None:
        self.client = client
        self.namespace = namespace
        self._fixed = (cert, key, ca_bundle) if cert and key and ca_bundle else None
        self._context: ssl.SSLContext | None = None
        self._material: tuple[bytes, bytes, bytes] | None = None
        self._checked = 0.0
        self._lock = asyncio.Lock()

    async def context(self, *, refresh: bool = False) -> ssl.SSLContext:
        async with self._lock:
            due = time.monotonic() - self._checked > _TLS_RECHECK_SECONDS
            if self._context is not None and not refresh and not due:
                return self._context
            material = self._fixed or await self._read()
            if material != self._material or self._context is None:
                self._context = self._build(*material)
                self._material = material
            self._checked = time.monotonic()
            return self._context

    async def _read(self) -> tuple[bytes, bytes, bytes]:
        assert self.client is not None
        try:
            secret = await self.client.get(groups.SECRETS, CLIENT_CERT_SECRET, self.namespace)
            bundle = await self.client.get(groups.CONFIGMAPS, SERVER_CA_CONFIGMAP, self.namespace)
        except ApiError as exc:
            raise NotReady(f"the upload proxy has no client certificate for upload servers yet ({exc})") from None
        data = secret.get("data") or {}
        ca = (bundle.get("data") or {}).get("ca-bundle.crt", "")
        if not data.get("tls.crt") or not data.get("tls.key") or not ca:
            raise NotReady("the upload proxy's client certificate or the upload-server CA bundle is empty")
        return base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"]), ca.encode()

    def _build(self, cert: bytes, key: bytes, ca_bundle: bytes) -> ssl.SSLContext:
        return pki.client_context(ca_bundle.decode(), identity=pki.KeyPair(cert, key))
