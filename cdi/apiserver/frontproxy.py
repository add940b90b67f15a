"""Who is calling: the identity the aggregation layer vouches for, and the API server itself calling
an admission webhook.

An aggregated API server does not see the user's credentials. kube-apiserver (or the embedded one)
authenticates the user, checks RBAC, and forwards the request over TLS with a *front-proxy client
certificate*, naming the user in `X-Remote-User` and the groups in `X-Remote-Group`. Those headers
are trusted only on a connection whose client certificate chains to the request-header CA and whose
common name is in the allowed list. Both come from ConfigMap
`kube-system/extension-apiserver-authentication`, which the API server publishes (keys
`requestheader-client-ca-file`, `requestheader-allowed-names`, `requestheader-username-headers`,
`requestheader-group-headers`, `requestheader-extra-headers-prefix`), as CDI's `auth-config.go` reads
it.

An admission webhook answers only the API server: a forged AdmissionReview names whatever user it likes
in `userInfo`, and the DataVolume webhook signs clone tokens for that user. kube-apiserver presents a
client certificate to webhooks when its admission configuration says so (`WebhookAdmissionConfiguration`
`kubeConfigFile`, a user named after the webhook Service); the certificate must be issued by the
cluster's client CA (the same ConfigMap's `client-ca-file`) and carry one of the common names cdi-apiserver
is told to expect (`--webhook-client-names`; `cdi up` presents and expects its own).

cdi-apiserver reads the ConfigMap at start and then watches it (`cdi.kube.requestheader.AuthenticationWatch`,
as the upload proxy does), as Kubernetes' own aggregated API servers do: a CA the API server publishes later
(a rotation) is trusted for the connections made after it, and one it no longer publishes vouches for no
webhook caller any more."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from cdi.kube.requestheader import (
    AUTH_CONFIGMAP,
    AUTH_NAMESPACE,
    Caller,
    RequestHeaderConfig,
    Unauthenticated,
    common_name,
)

# the request-header authentication itself is `cdi.kube.requestheader`'s (the upload proxy does it too)
__all__ = ["AUTH_CONFIGMAP", "AUTH_NAMESPACE", "Caller", "RequestHeaderConfig", "Unauthenticated", "WebhookCallers",
           "caller_of"]


def caller_of(request: web.Request, config: RequestHeaderConfig) -> Caller:
    """The user the front proxy names, once its client certificate is verified and its CN allowed.

    The TLS layer has already verified the chain against the request-header CA (the server's SSL
    context trusts only that CA for client certificates), so a peer certificate here is a valid one."""
    peer: Any = request.transport.get_extra_info("peercert") if request.transport else None
    return config.caller(common_name((peer or {}).get("subject")), request.headers.items())


@dataclass(frozen=True)
class WebhookCallers:
    """Who may call the admission webhooks: certificates of `client_ca` with a common name in `names`.
    No names: anyone who reaches the Service (CDI's behaviour; the README says what that leaves open)."""

    client_ca: str = ""
    names: tuple[str, ...] = ()

    @property
    def required(self) -> bool:
        return bool(self.names)

    @classmethod
    def from_configmap(cls, data: Mapping[str, str], names: tuple[str, ...]) -> WebhookCallers:
        return cls(str(data.get("client-ca-file") or ""), names)

    def authorities(self) -> list[x509.Certificate]:
        return x509.load_pem_x509_certificates(self.client_ca.encode()) if self.client_ca else []

    def check(self, request: web.Request) -> None:
        """Raises Unauthenticated unless the connection's client certificate, which TLS has verified
        against one of the server's trusted CAs, was issued by the client CA to an expected name."""
        if not self.required:
            return
        ssl_object: Any = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            raise Unauthenticated("admission webhooks answer only the API server: no client certificate")
        cert = x509.load_der_x509_certificate(der)
        names = [a.value for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
        if not any(name in self.names for name in names):
            raise Unauthenticated(f"admission webhooks answer only the API server: certificate CN "
                                  f"{', '.join(map(str, names)) or '(none)'} is not one of {', '.join(self.names)}")
        for authority in self.authorities():
            try:
                cert.verify_directly_issued_by(authority)
                return
            except (ValueError, TypeError, InvalidSignature):
                continue
        raise Unauthenticated("admission webhooks answer only the API server: the client certificate was not "
                              "issued by the cluster's client CA")
