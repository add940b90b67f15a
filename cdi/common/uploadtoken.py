"""Upload tokens: the signed, short-lived permission to upload into one PVC.

cdi-apiserver issues them (UploadTokenRequest) and the upload proxy checks them, so the format lives
here, in one place both can import. It is CDI's, byte for byte where it matters (`pkg/token`):

* a JWT signed **PS256** with the apiserver's RSA key, issuer `cdi-apiserver`;
* registered claims `iat`, `nbf` and `exp` (`iat` + 5 minutes);
* a private payload `{operation: "Upload", name: <pvc>, namespace: <ns>,
  resource: {group: "", version: "v1", resource: "persistentvolumeclaims"}}`;
* verified with 10 seconds of leeway on the time claims.

Keys are PEM: the private key as PKCS#1 (`id_rsa` in Secret `cdi-api-signing-key`, as CDI keeps it),
the public key as SubjectPublicKeyInfo (`id_rsa.pub`), so a token from either implementation verifies
with the other's key.

A token is checked once, when an upload request starts: expiry cuts off nobody's slow upload
(CDI#925), it only bounds how long a leaked token can start one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER = "cdi-apiserver"
LIFETIME_SECONDS = 5 * 60
LEEWAY_SECONDS = 10
ALGORITHM = "PS256"
OPERATION_UPLOAD = "Upload"
OPERATION_CLONE = "Clone"
PVC_RESOURCE = {"group": "", "version": "v1", "resource": "persistentvolumeclaims"}
SNAPSHOT_RESOURCE = {"group": "snapshot.storage.k8s.io", "version": "v1", "resource": "volumesnapshots"}
# clone tokens: cdi-apiserver's DataVolume mutating webhook issues short ones (ISSUER, 5 minutes), which
# the controller trades for a long one of its own issuer, bound to the DataVolume's uid (CDI's pkg/token)
EXTENDED_ISSUER = "cdi-deployment"
EXTENDED_LIFETIME_SECONDS = 10 * 365 * 24 * 3600


class TokenError(Exception):
    """The token is not acceptable; the message says why, for the person holding it."""


@dataclass(frozen=True)
class TokenPayload:
    operation: str
    name: str
    namespace: str
    resource: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    expires: float = 0.0

    @property
    def is_pvc_upload(self) -> bool:
        """What the upload proxy accepts: an Upload token naming a PVC."""
        return (self.operation == OPERATION_UPLOAD and bool(self.name) and bool(self.namespace)
                and self.resource.get("resource") == PVC_RESOURCE["resource"])


def generate_private_key(bits: int = 2048) -> bytes:
    """A new RSA key as PKCS#1 PEM ("RSA PRIVATE KEY"), the form CDI stores in `id_rsa`."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def public_key_pem(private_pem: bytes) -> bytes:
    key = serialization.load_pem_private_key(private_pem, password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise TokenError("the signing key is not an RSA key")
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def issue(private_pem: bytes, namespace: str, name: str, *, operation: str = OPERATION_UPLOAD,
          now: float | None = None, lifetime: float = LIFETIME_SECONDS,
          params: dict[str, str] | None = None, resource: dict[str, str] | None = None,
          issuer: str = ISSUER) -> str:
    """A signed token allowing `operation` on PVC (or `resource`) namespace/name for `lifetime` seconds
    from `now`."""
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        "operation": operation, "name": name, "namespace": namespace, "resource": dict(resource or PVC_RESOURCE),
        "iss": issuer, "iat": issued, "nbf": issued, "exp": issued + int(lifetime),
    }
    if params:
        claims["params"] = dict(params)
    return jwt.encode(claims, private_pem, algorithm=ALGORITHM)


def verify(token: str, public_pem: bytes, *, leeway: float = LEEWAY_SECONDS, issuer: str = ISSUER,
           what: str = "upload token") -> TokenPayload:
    """The token's payload if it is signed by the key, from `issuer` and valid now (with leeway)."""
    try:
        claims = jwt.decode(token, public_pem, algorithms=[ALGORITHM], issuer=issuer, leeway=leeway,
                            options={"require": ["exp", "iss"]})
    except jwt.ExpiredSignatureError:
        expired = _unverified(token).get("exp")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expired)) if isinstance(expired, int) else "?"
        raise TokenError(f"the {what} expired at {when}; request a new one "
                         "(tokens are valid for 5 minutes, checked when an upload starts)") from None
    except jwt.ImmatureSignatureError:
        raise TokenError(f"the {what} is not valid yet (check the clocks)") from None
    except jwt.InvalidSignatureError:
        raise TokenError(f"the {what}'s signature is invalid: it was not issued by this cluster's "
                         "cdi-apiserver") from None
    except jwt.InvalidIssuerError:
        raise TokenError(f"the {what} was not issued by {issuer}") from None
    except jwt.MissingRequiredClaimError as exc:
        raise TokenError(f"the {what} lacks the {exc.claim!r} claim") from None
    except jwt.InvalidTokenError as exc:
        raise TokenError(f"the {what} is malformed: {exc}") from None
    resource = claims.get("resource") or {}
    params = claims.get("params") or {}
    return TokenPayload(
        operation=str(claims.get("operation") or ""), name=str(claims.get("name") or ""),
        namespace=str(claims.get("namespace") or ""),
        resource={str(k): str(v) for k, v in resource.items()} if isinstance(resource, dict) else {},
        params={str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {},
        expires=float(claims.get("exp") or 0),
    )


def _unverified(token: str) -> dict[str, Any]:
    try:
        claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
        return claims
    except jwt.InvalidTokenError:
        return {}
