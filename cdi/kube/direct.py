"""Reaching the API server without the client, with the client's own connection settings: for a request the
client cannot make, such as streaming gigabytes from a file through the API server (`cdi image-upload`
through the aggregation layer, `cdi.api.upload`).

Everything comes from what `cdi.kube.config` loaded, so it is what `kubectl` and `KubeClient` use: the
server's URL and `tls-server-name`, its CA (or `insecure-skip-tls-verify`), a client certificate and key
(also one an exec plugin gives), and the `Authorization` header: a bearer token, a token file, basic auth or
an exec plugin's token, refreshed by the official client's own hook when it expires."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cdi.kube.config import ClusterConfig, ConfigError


@dataclass
class DirectAccess:
    server: str  # https://HOST[:PORT][/PREFIX]
    context: ssl.SSLContext
    server_hostname: str | None  # the kubeconfig's `tls-server-name`, else the server's host
    configuration: Any  # the official client's Configuration (its auth settings and refresh hook)

    @classmethod
    def of(cls, config: ClusterConfig) -> DirectAccess:
        c = config.configuration
        server = str(c.host or "").rstrip("/")
        parts = urlsplit(server)
        if parts.scheme != "https" or not parts.hostname:
            raise ConfigError(f"the API server {server!r} of {config.source} is not an https:// URL")
        if c.proxy:
            raise ConfigError(f"{config.source} reaches the API server through a proxy ({c.proxy}), which cannot carry "
                              "an upload here")
        context = ssl.create_default_context(cafile=c.ssl_ca_cert, cadata=c.ca_cert_data)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if c.cert_file:
            context.load_cert_chain(c.cert_file, keyfile=c.key_file)
        if not c.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return cls(server, context, c.tls_server_name or parts.hostname, c)

    async def authorization(self) -> str | None:
        """The `Authorization` header's value the client would send now (None: the certificate is the credential)."""
        settings = await self.configuration.auth_settings()
        bearer = settings.get("BearerToken") or {}
        value = bearer.get("value")
        return str(value) if value else None

    def authorization_from(self, loop: asyncio.AbstractEventLoop, timeout: float = 60.0) -> str | None:
        """`authorization`, asked from a thread other than `loop`'s (an exec plugin runs on the loop)."""
        return asyncio.run_coroutine_threadsafe(self.authorization(), loop).result(timeout)
