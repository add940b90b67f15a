"""CDI's own components on top of a cluster, in one process: what `cdi up` and `cdi demo` run on
the embedded control plane (on a real cluster each is a Deployment of its own). They reach the API
server only through its kubeconfig, as they would anywhere.

The upload proxy listens on 127.0.0.1 (the port of the previous run when it is free, else any); its
URL becomes CDIConfig `status.uploadProxyURL`. CDI's certificates (cdi-apiserver's, the proxy's, the
upload-server signers) are cdi-operator's, kept per the `CDI` resource's `certConfig` by `stackcerts`
while this runs: the proxy's CA bundle is written next to the kubeconfig (`uploadproxy-ca.crt`) and
published in ConfigMap `cdi/cdi-uploadproxy-ca`, which is how `cdi image-upload` trusts it without
flags.

The proxy also serves the embedded API server's aggregation layer on a second loopback port, as on a
cluster: the `cdi-uploadproxy` Service (its Endpoints that port) and the APIService
`v1beta1.upload.extensions.cdi.dev` with the proxy's CA bundle, so that `cdi image-upload` uploads through
the API server with nothing but the kubeconfig (and a user's RBAC)."""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from cdi.api import featuregates, groups
from cdi.api import upload as names
from cdi.apiserver.server import CdiApiServer
from cdi.cli.stackcerts import StackCertificates
from cdi.common import pki
from cdi.controller.manager import Manager
from cdi.controller.runtime import Settings
from cdi.embedded.kubeapi.webhooks import WEBHOOK_CLIENT
from cdi.kube import AlreadyExists, KubeClient, NotFound
from cdi.operator import resources
from cdi.operator.certs import Issued
from cdi.uploadproxy import serving
from cdi.uploadproxy.server import UploadProxy

log = logging.getLogger(__name__)


class CdiStack:
    def __init__(self, kubeconfig: Path, state_dir: Path, settings: Settings | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.state_dir = state_dir
        self.settings = settings or Settings()
        self.client: KubeClient | None = None
        self.manager: Manager | None = None
        self.apiserver: CdiApiServer | None = None
        self._metrics: web.AppRunner | None = None
        self.metrics_url = ""
        self.uploadproxy: UploadProxy | None = None
        self.uploadproxy_url = ""
        self.uploadproxy_ca = kubeconfig.parent / serving.CA_FILE_NEXT_TO_KUBECONFIG
        self.certificates: StackCertificates | None = None

    async def _bootstrap(self, client: KubeClient) -> None:
        """What installing CDI creates: its namespace, the CDI resource (with the feature gates of CDI's
        released `cdi-cr.yaml`), and the aggregated ClusterRoles the operator gives every cluster (without
        them a user bound to `edit` could not create a DataVolume). Those are the operator's to own: a
        newer version's replace an older data directory's."""
        for role in resources.aggregated_cluster_roles():
            gvr = resources.CLUSTERROLES if role["kind"] == "ClusterRole" else resources.CLUSTERROLEBINDINGS
            try:
                await client.create(gvr, role)
            except AlreadyExists:
                current = await client.get(gvr, role["metadata"]["name"])
                metadata = {**role["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
                await client.replace(gvr, {**role, "metadata": metadata})
        for gvr, body in (
            (groups.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                 "metadata": {"name": self.settings.namespace}}),
            (groups.CDIS, {"apiVersion": groups.CDI_API_VERSION, "kind": "CDI",
                           "metadata": {"name": groups.CDI_CR_NAME},
                           "spec": {"imagePullPolicy": "IfNotPresent",
                                    "config": {"featureGates": list(featuregates.RELEASED_GATES)}}}),
        ):
            try:
                await client.create(gvr, body)
            except AlreadyExists:
                pass

    async def start(self) -> None:
        self.client = await KubeClient.connect(self.kubeconfig)
        await self._bootstrap(self.client)
        self.certificates = StackCertificates(self.client, self.settings.namespace, self.state_dir / "cdi-apiserver",
                                              self.state_dir / "uploadproxy", self.uploadproxy_ca)
        await self.certificates.renew()
        assert self.certificates.issued is not None
        self.apiserver = CdiApiServer(self.client, self.settings.namespace, self.state_dir / "cdi-apiserver",
                                      webhook_client_names=(WEBHOOK_CLIENT,))
        await self.apiserver.start()
        await self.apiserver.register(ca_bundle=self.certificates.issued.api_bundle.encode())
        await self._start_uploadproxy(self.client, self.certificates)
        self.certificates.start(self._renewed)
        self.settings.upload_proxy_url = self.uploadproxy_url
        self.manager = Manager(self.client, self.settings)
        self._metrics = web.AppRunner(self.manager.metrics_app(), access_log=None)
        await self._metrics.setup()
        site = web.TCPSite(self._metrics, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        await self.manager.start()

    def follow_tls_profile(self, subscriber: Callable[[pki.TLSPolicy], None]) -> None:
        """Call `subscriber` with CDIConfig's TLS policy now and at each change (what cdi-apiserver follows)."""
        assert self.apiserver is not None
        self.apiserver.tls_profile.subscribe(subscriber)

    async def _renewed(self, issued: Issued) -> None:
        """Renewed certificates reach the servers running here (on a cluster, the operator rolls them)."""
        if self.apiserver is not None:
            await self.apiserver.certificates_renewed(issued.api_bundle.encode())
        if self.uploadproxy is not None:
            await self.register_upload_extension(issued.proxy_bundle)  # the bundle first: it trusts old and new
            await self.uploadproxy.certificates_renewed()

    async def _start_uploadproxy(self, client: KubeClient, certificates: StackCertificates) -> None:
        directory = self.state_dir / "uploadproxy"
        namespace = self.settings.namespace
        for stale in ("ca.crt", "ca.key"):  # the CA of its own an older version kept: the operator's now
            (directory / stale).unlink(missing_ok=True)
        context = serving.brought(*certificates.uploadproxy_cert)
        self.uploadproxy = UploadProxy(client, namespace)
        port_file = directory / "port"
        previous = int(port_file.read_text()) if port_file.exists() and port_file.read_text().isdigit() else 0
        await self.uploadproxy.start("127.0.0.1", previous if previous and _free(previous) else 0, context)
        port_file.write_text(str(self.uploadproxy.port))
        self.uploadproxy_url = f"https://127.0.0.1:{self.uploadproxy.port}"
        await self.uploadproxy.start_aggregation("127.0.0.1", 0, context, directory / "aggregation")
        assert certificates.issued is not None
        await self.register_upload_extension(certificates.issued.proxy_bundle)

    async def register_upload_extension(self, proxy_bundle: str) -> None:
        """The `cdi-uploadproxy` Service, its Endpoints (the aggregation listener on loopback) and the APIService
        of uploads through the API server, as cdi-operator installs them on a cluster."""
        assert self.client is not None and self.uploadproxy is not None
        namespace = self.settings.namespace
        port = {"name": names.AGGREGATION_PORT_NAME, "port": names.AGGREGATION_PORT,
                "targetPort": self.uploadproxy.aggregation_port, "protocol": "TCP"}
        await _apply(self.client, groups.SERVICES, {"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": names.PROXY_SERVICE, "namespace": namespace}, "spec": {"ports": [port]}}, namespace)
        await _apply(self.client, groups.ENDPOINTS, {
            "apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": names.PROXY_SERVICE, "namespace": namespace},
            "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [
                {"name": names.AGGREGATION_PORT_NAME, "port": self.uploadproxy.aggregation_port}]}]}, namespace)
        await _apply(self.client, groups.APISERVICES, resources.upload_extension_apiservice(
            namespace, base64.b64encode(proxy_bundle.encode()).decode()))

    async def stop(self) -> None:
        if self.certificates is not None:
            await self.certificates.stop()
        if self.uploadproxy is not None:
            await self.uploadproxy.stop()
        if self.manager is not None:
            await self.manager.stop()
        if self._metrics is not None:
            await self._metrics.cleanup()
        if self.apiserver is not None:
            await self.apiserver.stop()
        if self.client is not None:
            await self.client.close()


async def _apply(client: KubeClient, gvr: groups.GVR, body: dict[str, Any], namespace: str | None = None) -> None:
    """Create, or replace what is there (keeping a Service's cluster IP, which cannot change)."""
    try:
        current = await client.get(gvr, body["metadata"]["name"], namespace)
    except NotFound:
        with contextlib.suppress(AlreadyExists):
            await client.create(gvr, body, namespace)
        return
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    if gvr == groups.SERVICES:
        for key in ("clusterIP", "clusterIPs"):
            if key in (current.get("spec") or {}):
                body["spec"][key] = current["spec"][key]
    await client.replace(gvr, body, namespace)


def _free(port: int) -> bool:
    with socket.socket() as sock, contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        return True
    return False
