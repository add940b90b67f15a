"""The certificates CDI's operator keeps, created and rotated from the `CDI` resource's `certConfig`
(`ca`, `server` and `client`: `duration`, `renewBefore`, Go duration strings; CDI's defaults 48h/24h for
CAs and 24h/12h for leaves), with no manual step:

* `cdi-apiserver-signer` (Secret, the apiserver's CA, mounted where cdi-apiserver issues its own
  serving leaf from it) and its bundle ConfigMap `cdi-apiserver-signer-bundle` (the webhooks' and the
  APIService's `caBundle`);
* the apiserver's serving leaf `cdi-apiserver-server-cert` (the `cdi-api` Service's names), mounted
  where cdi-apiserver takes it instead of issuing its own;
* `cdi-uploadproxy-signer`, the proxy's serving leaf `cdi-uploadproxy-server-cert` (for the Service's
  names and cluster IP), and `cdi-uploadproxy-signer-bundle` / `cdi-uploadproxy-ca` (where
  `cdi image-upload` looks for the CA);
* between the proxy and upload servers: `cdi-uploadserver-signer` (+ `-bundle`, what the proxy trusts;
  the controller issues each upload server's leaf from it), `cdi-uploadserver-client-signer` and the
  proxy's client certificate `cdi-uploadserver-client-cert` (the `client` lifetime).

A renewed CA is published in the bundle next to the old one until the old one expires, so clients
that hold the bundle keep trusting the serving certificates issued before the renewal. Components
read certificates when they start; the Deployments carry a hash of theirs, so a rotation rolls them.
`cdi up` keeps the same certificates with the same code (`issue`), and hands renewals to its in-process
servers instead (`cdi.cli.stackcerts`)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.common import certconfig, pki
from cdi.kube import AlreadyExists, KubeClient, NotFound
from cdi.operator.resources import MANAGED_BY

Obj = dict[str, Any]
APISERVER_SIGNER = "cdi-apiserver-signer"
UPLOADPROXY_SIGNER = "cdi-uploadproxy-signer"
UPLOADPROXY_SERVER = "cdi-uploadproxy-server-cert"
UPLOADPROXY_CA_CONFIGMAP = "cdi-uploadproxy-ca"  # what `cdi image-upload` reads (cdi/uploadproxy/serving.py)
APISERVER_SERVER = "cdi-apiserver-server-cert"
UPLOADSERVER_SIGNER = "cdi-uploadserver-signer"
UPLOADSERVER_CLIENT_SIGNER = "cdi-uploadserver-client-signer"
UPLOADSERVER_CLIENT = "cdi-uploadserver-client-cert"
UPLOADSERVER_CLIENT_NAME = "client.upload-server.cdi.kubevirt.io"
@dataclass(frozen=True)
class Lifetime:
    duration: datetime.timedelta
    renew_before: datetime.timedelta

    @classmethod
    def of(cls, cert_config: Mapping[str, Any], which: str) -> Lifetime:
        return cls(*certconfig.lifetime(cert_config, which))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _days(delta: datetime.timedelta) -> float:
    return delta.total_seconds() / 86400


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _pair(secret: Mapping[str, Any] | None) -> pki.KeyPair | None:
    data = (secret or {}).get("data") or {}
    if "tls.crt" not in data or "tls.key" not in data:
        return None
    return pki.KeyPair(base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"]))


def due(pair: pki.KeyPair | None, lifetime: Lifetime, issuer: pki.KeyPair | None = None) -> bool:
    """Does this certificate need (re)issuing: missing, within `renewBefore` of its end, longer-lived
    than `duration` allows (the config was shortened), or not signed by the current CA."""
    if pair is None:
        return True
    cert = pair.certificate()
    now = _now()
    end = cert.not_valid_after_utc
    if end - now <= lifetime.renew_before or end - cert.not_valid_before_utc > lifetime.duration + datetime.timedelta(
            minutes=10):
        return True
    return issuer is not None and cert.issuer != issuer.certificate().subject


def _bundle(current: pki.KeyPair, previous: str) -> str:
    """The current CA plus every still-valid CA of the previous bundle (rotation without a trust gap)."""
    keep = [current.cert_pem.decode()]
    now = _now()
    for block in re.findall(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n?", previous or "", re.S):
        cert = x509.load_pem_x509_certificate(block.encode())
        if cert.not_valid_after_utc > now and block.strip() not in (k.strip() for k in keep):
            keep.append(block if block.endswith("\n") else block + "\n")
    return "".join(keep)


class Certificates:
    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    async def _secret(self, name: str) -> Obj | None:
        try:
            return await self.client.get(groups.SECRETS, name, self.namespace)
        except NotFound:
            return None

    async def _write_secret(self, name: str, pair: pki.KeyPair, current: Obj | None) -> None:
        body: Obj = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                     "metadata": {"name": name, "namespace": self.namespace,
                                  "labels": {ann.LABEL_COMPONENT: "", **MANAGED_BY}},
                     "data": {"tls.crt": _b64(pair.cert_pem), "tls.key": _b64(pair.key_pem)}}
        if current is None:
            await self.client.create(groups.SECRETS, body, self.namespace)
        else:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await self.client.replace(groups.SECRETS, body, self.namespace)

    async def _write_configmap(self, name: str, key: str, make: Any) -> str:
        try:
            current: Obj | None = await self.client.get(groups.CONFIGMAPS, name, self.namespace)
        except NotFound:
            current = None
        value = str(make(((current or {}).get("data") or {}).get(key, "")))
        body: Obj = {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": name, "namespace": self.namespace,
                                  "labels": {ann.LABEL_COMPONENT: "", **MANAGED_BY}},
                     "data": {key: value}}
        if current is None:
            try:
                await self.client.create(groups.CONFIGMAPS, body, self.namespace)
            except AlreadyExists:
                pass
        elif (current.get("data") or {}).get(key) != value:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await self.client.replace(groups.CONFIGMAPS, body, self.namespace)
        return value

    async def ca(self, name: str, lifetime: Lifetime) -> tuple[pki.KeyPair, bool]:
        current = await self._secret(name)
        pair = _pair(current)
        # a CA cdi cannot sign with (CDI's RSA signers, on a cluster cdi took over) is replaced like one due:
        # the bundle keeps it beside the new one until it expires, so what trusted it goes on trusting
        if pair is not None and not due(pair, lifetime) and pki.can_sign(pair):
            return pair, False
        # CDI's `namespace_name@unixtime`, made unique: a CA renewed within the second of its predecessor
        # (a certConfig change right after a start) shares the bundle with it, and OpenSSL picks an issuer
        # by name before it checks the signature, so two CAs of one name would fail one of their leaves
        # (a common name holds 64 characters at most)
        suffix = f"@{int(_now().timestamp())}-{secrets.token_hex(4)}"
        pair = pki.make_ca(f"{self.namespace}_{name}"[:64 - len(suffix)] + suffix, days=_days(lifetime.duration))
        await self._write_secret(name, pair, current)
        return pair, True

    async def leaf(self, name: str, ca: pki.KeyPair, lifetime: Lifetime, common_name: str,
                   hosts: list[str] | None, *, client: bool = False) -> pki.KeyPair:
        current = await self._secret(name)
        pair = _pair(current)
        if pair is not None and not due(pair, lifetime, ca) and _hosts(pair) >= set(hosts or ()) and \
                _common_name(pair) == common_name:
            return pair
        pair = pki.issue(ca, common_name, hosts, days=_days(lifetime.duration),
                         server=not client, client=client)
        await self._write_secret(name, pair, current)
        return pair

    async def issue(self, cert_config: Mapping[str, Any], uploadproxy_hosts: Sequence[str] = (),
                    apiserver_hosts: Sequence[str] = ()) -> Issued:
        """Create or rotate every certificate, the leaves for their Services' names and these extra ones
        (the proxy's Service IP here; `cdi up`, whose servers are reached on loopback, adds its own)."""
        ca_life, server_life = Lifetime.of(cert_config, "ca"), Lifetime.of(cert_config, "server")
        client_life = Lifetime.of(cert_config, "client")
        api_ca, _ = await self.ca(APISERVER_SIGNER, ca_life)
        api_bundle = await self._write_configmap(f"{APISERVER_SIGNER}-bundle", "ca-bundle.crt",
                                                 lambda old: _bundle(api_ca, old))
        api = f"cdi-api.{self.namespace}.svc"
        api_leaf = await self.leaf(APISERVER_SERVER, api_ca, server_life, api,
                                   ["cdi-api", f"cdi-api.{self.namespace}", api, f"{api}.cluster.local",
                                    *apiserver_hosts])
        proxy_ca, _ = await self.ca(UPLOADPROXY_SIGNER, ca_life)
        proxy_bundle = await self._write_configmap(f"{UPLOADPROXY_SIGNER}-bundle", "ca-bundle.crt",
                                                   lambda old: _bundle(proxy_ca, old))
        await self._write_configmap(UPLOADPROXY_CA_CONFIGMAP, "ca.crt", lambda _old: proxy_bundle)
        service = f"cdi-uploadproxy.{self.namespace}.svc"
        hosts = ["cdi-uploadproxy", f"cdi-uploadproxy.{self.namespace}", service, f"{service}.cluster.local",
                 *uploadproxy_hosts]
        proxy_leaf = await self.leaf(UPLOADPROXY_SERVER, proxy_ca, server_life, service, hosts)
        upload_ca, _ = await self.ca(UPLOADSERVER_SIGNER, ca_life)
        upload_bundle = await self._write_configmap(f"{UPLOADSERVER_SIGNER}-bundle", "ca-bundle.crt",
                                                    lambda old: _bundle(upload_ca, old))
        client_ca, _ = await self.ca(UPLOADSERVER_CLIENT_SIGNER, ca_life)
        client = await self.leaf(UPLOADSERVER_CLIENT, client_ca, client_life, UPLOADSERVER_CLIENT_NAME, None,
                                 client=True)
        renewals = [(pair, life) for life, pairs in ((ca_life, (api_ca, proxy_ca, upload_ca, client_ca)),
                                                     (server_life, (api_leaf, proxy_leaf)), (client_life, (client,)))
                    for pair in pairs]
        next_renewal = min(pair.certificate().not_valid_after_utc - life.renew_before for pair, life in renewals)
        return Issued(api_ca, api_leaf, api_bundle, proxy_ca, proxy_leaf, proxy_bundle, upload_ca, upload_bundle,
                      client_ca, client, next_renewal)

    async def reconcile(self, cert_config: Mapping[str, Any], uploadproxy_ip: str | None) -> dict[str, str]:
        """Create or rotate every certificate; returns the apiserver's and the proxy's CA bundles (`bundle`,
        `proxy_bundle`, base64, for the webhooks and APIServices) and, per
        component, a hash of what it mounts (`cdi-apiserver`, `cdi-uploadproxy`)."""
        issued = await self.issue(cert_config, [uploadproxy_ip] if uploadproxy_ip else [])
        upload = _hash(issued.upload_ca.cert_pem + issued.client_ca.cert_pem + issued.client.cert_pem
                       + issued.upload_bundle.encode())
        return {"bundle": _b64(issued.api_bundle.encode()), "proxy_bundle": _b64(issued.proxy_bundle.encode()),
                "cdi-apiserver": _hash(issued.api_ca.cert_pem + issued.api_leaf.cert_pem),
                "cdi-uploadproxy": _hash(issued.proxy_leaf.cert_pem) + upload,
                "cdi-deployment": upload}


@dataclass(frozen=True)
class Issued:
    """What one pass holds: each CA and leaf, the bundles clients trust (current CA plus the previous ones
    still valid), and when the first of them is due for renewal (its end less its `renewBefore`)."""

    api_ca: pki.KeyPair
    api_leaf: pki.KeyPair
    api_bundle: str
    proxy_ca: pki.KeyPair
    proxy_leaf: pki.KeyPair
    proxy_bundle: str
    upload_ca: pki.KeyPair
    upload_bundle: str
    client_ca: pki.KeyPair
    client: pki.KeyPair
    next_renewal: datetime.datetime


def _hosts(pair: pki.KeyPair) -> set[str]:
    try:
        sans = pair.certificate().extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(v) for v in sans.get_values_for_type(x509.DNSName)} | {
        str(v) for v in sans.get_values_for_type(x509.IPAddress)}


def _common_name(pair: pki.KeyPair) -> str:
    names = pair.certificate().subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]
