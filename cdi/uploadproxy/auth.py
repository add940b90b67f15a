"""Who may upload where: the bearer token of an upload request, checked against the key that signed it.

Status codes follow CDI's proxy where it has one and the issue where CDI is silent:

* no `Authorization` header, or not `Bearer <token>`: 400 (CDI);
* a token that is not validly signed by cdi-apiserver, expired, or not yet valid: 401 (CDI);
* a valid token that is not an Upload token for a PVC: 400 (CDI);
* a valid token for another PVC than the one the client names in `X-CDI-Upload-Target`: 401 (ours:
  a client that says where it means to upload is never sent somewhere else).

The public key is read from ConfigMap `cdi-api-public-key` (published by cdi-apiserver) unless given
(`APISERVER_PUBLIC_KEY`, as CDI's proxy takes it). It is re-read when a signature does not verify
(at most every few seconds), so a rotated key is picked up without a restart."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from cdi.api import groups
from cdi.api import upload as names
from cdi.common import uploadtoken
from cdi.kube import ApiError, KubeClient

log = logging.getLogger(__name__)

PUBLIC_KEY_CONFIGMAP = "cdi-api-public-key"
PUBLIC_KEY_FILE = "id_rsa.pub"
_BEARER = re.compile(r"^Bearer\s+([A-Za-z0-9\-._~+/]+=*)$", re.IGNORECASE)
_REFRESH_SECONDS = 5.0


@dataclass
class Denied(Exception):
    status: int
    message: str

    def __str__(self) -> str:
        return self.message


class PublicKey:
    """The key tokens are verified with: fixed, or read from the cluster and refreshed on demand."""

    def __init__(self, client: KubeClient | None, namespace: str, fixed: bytes | None = None) -> None:
        self.client = client
        self.namespace = namespace
        self._key = fixed
        self._fixed = fixed is not None
        self._loaded_at = 0.0

    async def get(self, *, refresh: bool = False) -> bytes | None:
        stale = refresh and time.monotonic() - self._loaded_at > _REFRESH_SECONDS
        if self._fixed or (self._key is not None and not stale):
            return self._key
        if self.client is None:
            return self._key
        try:
            configmap = await self.client.get(groups.CONFIGMAPS, PUBLIC_KEY_CONFIGMAP, self.namespace)
        except ApiError as exc:
            log.warning("cannot read the token public key %s/%s: %s", self.namespace, PUBLIC_KEY_CONFIGMAP, exc)
            return self._key
        text = (configmap.get("data") or {}).get(PUBLIC_KEY_FILE)
        if text:
            self._key = text.encode()
            self._loaded_at = time.monotonic()
        return self._key


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise Denied(400, "an upload needs an 'Authorization: Bearer <token>' header; get a token by creating an "
                          "UploadTokenRequest (upload.cdi.kubevirt.io/v1beta1)")
    match = _BEARER.match(authorization.strip())
    if match is None:
        raise Denied(400, "the Authorization header must be 'Bearer <token>'")
    return match.group(1)


async def authorize(authorization: str | None, target: str | None, key: PublicKey) -> uploadtoken.TokenPayload:
    """The PVC an upload request may go to, or Denied."""
    token = bearer_token(authorization)
    public = await key.get()
    if public is None:
        raise Denied(503, "the upload proxy has no key to verify tokens with yet (cdi-apiserver publishes it)")
    try:
        payload = uploadtoken.verify(token, public)
    except uploadtoken.TokenError as first:
        fresh = await key.get(refresh=True)
        if fresh is None or fresh == public:
            raise Denied(401, str(first)) from None
        try:
            payload = uploadtoken.verify(token, fresh)
        except uploadtoken.TokenError as exc:
            raise Denied(401, str(exc)) from None
    if not payload.is_pvc_upload:
        raise Denied(400, f"the token is not an upload token for a PVC (operation {payload.operation!r})")
    if target:
        wanted = target.strip()
        if "/" not in wanted:
            raise Denied(400, f"{names.TARGET_HEADER} must be <namespace>/<pvc>, not {wanted!r}")
        if wanted != f"{payload.namespace}/{payload.name}":
            raise Denied(401, f"the upload token is for PVC {payload.namespace}/{payload.name}, not {wanted}")
    return payload
