"""The key upload tokens are signed with, kept where CDI keeps it, and its public half published.

* Secret `cdi-api-signing-key` in CDI's namespace, keys `id_rsa` (PKCS#1 PEM) and `id_rsa.pub`, as
  CDI's `keys.GetOrCreatePrivateKey` stores it: a cluster moved from CDI keeps its key.
* ConfigMap `cdi-api-public-key` (key `id_rsa.pub`): what the upload proxy reads to verify tokens. CDI
  hands the public key to its proxy through an environment variable filled by the operator; a
  ConfigMap lets a proxy pick up a rotated key without a restart and without read access to the
  Secret (which holds the private key).

Both are created idempotently: the first cdi-apiserver to start creates them, every later one (or a
restart) reads them back; a lost race reads the winner's key."""

from __future__ import annotations

import base64
import logging
from typing import Any

from cdi.api import groups
from cdi.common import uploadtoken
from cdi.kube import AlreadyExists, KubeClient, NotFound

log = logging.getLogger(__name__)

SECRET_NAME = "cdi-api-signing-key"
PUBLIC_KEY_CONFIGMAP = "cdi-api-public-key"
PRIVATE_KEY_FILE = "id_rsa"
PUBLIC_KEY_FILE = "id_rsa.pub"
LABELS = {"cdi.kubevirt.io": ""}


async def ensure_signing_key(client: KubeClient, namespace: str) -> bytes:
    """The private key (PEM), created with its Secret and public ConfigMap when missing."""
    private = await _ensure_secret(client, namespace)
    public = uploadtoken.public_key_pem(private)
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": PUBLIC_KEY_CONFIGMAP, "namespace": namespace, "labels": LABELS},
            "data": {PUBLIC_KEY_FILE: public.decode()}}
    try:
        current = await client.get(groups.CONFIGMAPS, PUBLIC_KEY_CONFIGMAP, namespace)
    except NotFound:
        try:
            await client.create(groups.CONFIGMAPS, body, namespace)
        except AlreadyExists:
            pass
        return private
    if (current.get("data") or {}).get(PUBLIC_KEY_FILE) != public.decode():
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await client.replace(groups.CONFIGMAPS, body, namespace)
    return private


async def _ensure_secret(client: KubeClient, namespace: str) -> bytes:
    try:
        return _private_key(await client.get(groups.SECRETS, SECRET_NAME, namespace))
    except NotFound:
        pass
    private = uploadtoken.generate_private_key()
    public = uploadtoken.public_key_pem(private)
    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET_NAME, "namespace": namespace, "labels": LABELS},
            "data": {PRIVATE_KEY_FILE: base64.b64encode(private).decode(),
                     PUBLIC_KEY_FILE: base64.b64encode(public).decode()}}
    try:
        await client.create(groups.SECRETS, body, namespace)
        log.info("created the upload-token signing key %s/%s", namespace, SECRET_NAME)
        return private
    except AlreadyExists:
        return _private_key(await client.get(groups.SECRETS, SECRET_NAME, namespace))


def _private_key(secret: dict[str, object]) -> bytes:
    data = secret.get("data") or {}
    assert isinstance(data, dict)
    return base64.b64decode(data[PRIVATE_KEY_FILE])
