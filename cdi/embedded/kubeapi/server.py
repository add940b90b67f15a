"""Starting and stopping the API server: data directory, CA and serving certificate, bearer token,
kubeconfig, SQLite store, built-in objects, background controllers, and the HTTPS listener."""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from cdi.api import referencegrant, tlsprofile
from cdi.api.crds import all_crds
from cdi.api.referencegrant import crd as reference_grant_crd
from cdi.common import pki
from cdi.embedded import datadir
from cdi.embedded.kubeapi import bodies
from cdi.embedded.kubeapi.aggregator import Aggregator
from cdi.embedded.kubeapi.authz import RbacAuthorizer, RoleAggregation, bootstrap_policy, reconcile_bootstrap
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.kubeapi.garbage import GarbageCollector
from cdi.embedded.kubeapi.handlers import ApiHandlers, Authenticator
from cdi.embedded.kubeapi.objects import Objects, RequestContext, UserInfo
from cdi.embedded.kubeapi.quota import QuotaAdmission, QuotaController
from cdi.embedded.kubeapi.resources import Registry
from cdi.embedded.kubeapi.store import ADDED, Store
from cdi.embedded.kubeapi.strategies import ServiceIPs, Strategies
from cdi.embedded.kubeapi.webhooks import WebhookAdmission
from cdi.embedded.ranges import SERVICE_NETWORK, claim_range

log = logging.getLogger(__name__)

ADMIN = UserInfo("admin", ("system:masters", "system:authenticated"))
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
SERVICE_RANGE_FILE = "service-cidr"  # this instance's /24 of 127.20.0.0/16, kept across restarts


@dataclass
class ServerConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    watch_history: int = 20_000
    bookmark_interval: float = 10.0
    token_auth_file: Path | None = None
    feature_gates: frozenset[str] = frozenset()


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class ApiServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.dir = config.data_dir
        datadir.prepare(self.dir)  # 0700 before anything is written in it
        self.store = Store(self.dir / "state.db", config.watch_history)
        self.registry = Registry()
        self.service_range = claim_range(SERVICE_NETWORK, self.dir / SERVICE_RANGE_FILE)
        self.strategies = Strategies(ServiceIPs(self.service_range.network),
                                     cross_namespace_data_sources=referencegrant.FEATURE_GATE in config.feature_gates)
        self.objects = Objects(self.registry, self.store, self.strategies)
        self.webhooks = WebhookAdmission(self.store)
        self.objects.admission.append(self.webhooks)
        self.objects.admission_last.append(QuotaAdmission(self.store))
        self.auth = Authenticator()
        self.authz = RbacAuthorizer(self.store)
        self.aggregator = Aggregator(self.store, self.dir)
        self.handlers = ApiHandlers(self.objects, self.auth, self.authz, self.aggregator,
                                    lambda: f"{self.config.host}:{self.port}")
        self.handlers.bookmark_interval = config.bookmark_interval
        self.gc = GarbageCollector(self.objects)
        self.role_aggregation = RoleAggregation(self.objects)
        self.quotas = QuotaController(self.objects)
        self.port = 0
        self.token = ""
        self.ca: pki.KeyPair | None = None
        self._runner: web.AppRunner | None = None
        self._context: ssl.SSLContext | None = None
        # Intermediate until `cdi up` has read CDIConfig (`set_tls_policy`), as CDI's servers begin
        self.tls_policy = pki.TLSPolicy.of(tlsprofile.DEFAULT.ciphers, tlsprofile.DEFAULT.min_tls_version)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"https://{host}:{self.port}"

    @property
    def kubeconfig_path(self) -> Path:
        return self.dir / "kubeconfig"

    # -- identity ----------------------------------------------------------------------------------

    def _pki(self) -> pki.KeyPair:
        ca_crt, ca_key = self.dir / "ca.crt", self.dir / "ca.key"
        if ca_crt.exists() and ca_key.exists():
            self.ca = pki.KeyPair.read(ca_crt, ca_key)
        else:
            self.ca = pki.make_ca("cdi-embedded-ca")
            self.ca.write(ca_crt, ca_key)
        hosts = sorted({self.config.host, "127.0.0.1", "localhost", "::1", socket.gethostname()})
        return pki.issue(self.ca, "cdi-apiserver", hosts)

    def _token(self) -> str:
        path = self.dir / "token"
        if path.exists():
            return path.read_text().strip()
        token = secrets.token_hex(32)
        pki.write_private(path, f"{token}\n".encode())
        return token

    def kubeconfig(self) -> dict[str, Any]:
        assert self.ca is not None
        return {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "cdi", "cluster": {
                "server": self.url, "certificate-authority-data": base64.b64encode(self.ca.cert_pem).decode()}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "cdi", "context": {"cluster": "cdi", "user": "admin", "namespace": "default"}}],
            "current-context": "cdi",
        }

    # -- bootstrap ---------------------------------------------------------------------------------

    def _load_crds(self) -> None:
        for _, _, entry in self.store.items("apiextensions.k8s.io/customresourcedefinitions"):
            self.registry.register_crd(entry.obj())

    def _reserve_service_ips(self) -> None:
        for _, _, entry in self.store.items("/services"):
            ip = (entry.obj().get("spec") or {}).get("clusterIP")
            if ip and ip != "None":
                self.strategies.service_ips.reserve(ip)

    async def _ensure(self, plural: str, body: dict[str, Any], group: str = "", version: str = "v1",
                      namespace: str | None = None) -> None:
        rtype = self.registry.lookup(group, version, plural)
        assert rtype is not None, plural
        name = body["metadata"]["name"]
        current = self.objects.find(rtype, namespace, name)
        ctx = RequestContext()
        if current is None:
            await self.objects.create(rtype, namespace, body, ctx)
        elif plural == "customresourcedefinitions" and current.get("spec") != body.get("spec"):
            body = {**body, "metadata": {**body["metadata"],
                                         "resourceVersion": current["metadata"]["resourceVersion"]}}
            await self.objects.update(rtype, namespace, name, body, ctx)
        elif group == "rbac.authorization.k8s.io" and (updated := reconcile_bootstrap(current, body)) is not None:
            await self.objects.update(rtype, namespace, name, updated, ctx)

    async def _bootstrap(self) -> None:
        for ns in SYSTEM_NAMESPACES:
            await self._ensure("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for crd in all_crds():
            await self._ensure("customresourcedefinitions", crd, "apiextensions.k8s.io")
        if self.strategies.cross_namespace_data_sources:  # what the gate is for needs Gateway API's grants
            await self._ensure("customresourcedefinitions", reference_grant_crd(), "apiextensions.k8s.io")
        for policy in bootstrap_policy():
            plural = "clusterroles" if policy["kind"] == "ClusterRole" else "clusterrolebindings"
            await self._ensure(plural, policy, "rbac.authorization.k8s.io")
        assert self.ca is not None
        configmap = self.aggregator.authentication_configmap(self.ca.cert_pem)
        rtype = self.registry.lookup("", "v1", "configmaps")
        assert rtype is not None
        current = self.objects.find(rtype, "kube-system", configmap["metadata"]["name"])
        if current is None:
            await self.objects.create(rtype, "kube-system", configmap)
        elif current.get("data") != configmap["data"]:
            await self.objects.update(rtype, "kube-system", configmap["metadata"]["name"],
                                      {**configmap, "metadata": current["metadata"]})

    async def _default_service_accounts(self) -> None:
        """Every namespace gets a `default` ServiceAccount, as the token controller does."""
        sa = self.registry.lookup("", "v1", "serviceaccounts")
        assert sa is not None
        with self.store.subscribe("/namespaces") as sub:
            for _, name, _ in self.store.items("/namespaces"):
                await self._ensure_sa(name)
            while True:
                change = await sub.queue.get()
                if change is None:
                    return
                if change.type == ADDED:
                    await self._ensure_sa(change.name)

    async def _ensure_sa(self, namespace: str) -> None:
        try:
            await self._ensure("serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                                   "metadata": {"name": "default"}}, namespace=namespace)
        except StatusError as exc:
            if exc.code not in (403, 404, 409):
                raise

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        serving = self._pki()
        self.token = self._token()
        self.auth.add(self.token, ADMIN)
        if self.config.token_auth_file is not None:
            self.auth.load_token_file(self.config.token_auth_file)
        self.aggregator.setup_identity()
        assert self.ca is not None
        self.webhooks.setup_identity(self.ca, self.dir)
        self._load_crds()
        self._reserve_service_ips()
        await self._bootstrap()
        await self.role_aggregation.settle()
        self.quotas.sync_all()  # quotas changed while the server was down are right before it answers
        self.gc.start()
        self.role_aggregation.start()
        self.quotas.start()
        self._tasks.append(asyncio.create_task(self._default_service_accounts(), name="serviceaccounts"))
        app = web.Application(middlewares=[self.handlers.middleware], client_max_size=bodies.MAX_BYTES)
        app.on_response_prepare.append(self.handlers.on_response_prepare)
        app.add_routes(self.handlers.routes())
        # handler_cancellation: a watch whose client disconnected ends at once instead of holding its
        # subscription until the next event for it (and an upload proxied to an aggregated server is cut there
        # too, which is what lets it resume). read_bufsize: a body the aggregation layer streams on is read up to
        # a MiB at a time (aiohttp's 64 KiB halved an upload through `upload.extensions.cdi.dev`, bench/RESULTS.md).
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0, handle_signals=False,
                                     handler_cancellation=True, read_bufsize=1 << 20)
        await self._runner.setup()
        port = self.config.port
        port_file = self.dir / "port"
        if port == 0 and port_file.exists():
            previous = int(port_file.read_text().strip() or 0)
            if previous and _port_free(self.config.host, previous):
                port = previous
        context = self._context = pki.server_context(serving, self.dir / "serving", policy=self.tls_policy)
        site = web.TCPSite(self._runner, self.config.host, port, ssl_context=context, reuse_address=True)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]
        port_file.write_text(f"{self.port}\n")
        pki.write_private(self.kubeconfig_path, yaml.safe_dump(self.kubeconfig(), sort_keys=False).encode())

    def set_tls_policy(self, policy: pki.TLSPolicy) -> None:
        """Serve the connections made from now on with these versions and suites (`cdi up` follows CDIConfig's
        TLS profile, the cluster's in CDI's world). Changed in place on the event loop, where aiohttp makes
        every connection from the context."""
        self.tls_policy = policy
        if self._context is not None:
            policy.apply(self._context)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        await self.gc.stop()
        await self.role_aggregation.stop()
        await self.quotas.stop()
        self.store.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.webhooks.close()
        await self.aggregator.close()
        self.store.close()
        self.service_range.close()
