"""Deciding, before the importer pod exists, whether it will need scratch space: a small ranged
read of the source tells its compression, its format and whether the server serves ranges, and
`cdi.common.imageprobe.needs_scratch` (the importer's own rule) decides. CDI instead starts a pod,
lets it fail with "scratch space required", and starts a second one."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

import aiohttp

from cdi.api import groups
from cdi.common.imageprobe import ACCESS_NBD, ACCESS_STREAM, HEAD_BYTES, head_needs_scratch
from cdi.controller.importpod import ImportSource
from cdi.kube import ApiError, KubeClient

log = logging.getLogger(__name__)


async def _secret(client: KubeClient, namespace: str, name: str) -> dict[str, str]:
    if not name:
        return {}
    try:
        secret = await client.get(groups.SECRETS, name, namespace)
    except ApiError:
        return {}
    return {k: base64.b64decode(v).decode(errors="replace").strip() for k, v in (secret.get("data") or {}).items()}


async def _ssl_context(client: KubeClient, namespace: str, source: ImportSource) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if source.cert_configmap:
        try:
            configmap = await client.get(groups.CONFIGMAPS, source.cert_configmap, namespace)
            for pem in (configmap.get("data") or {}).values():
                if "BEGIN CERTIFICATE" in pem:
                    context.load_verify_locations(cadata=pem)
        except (ApiError, ssl.SSLError):
            pass
    if source.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def _http_head(client: KubeClient, namespace: str, source: ImportSource) -> tuple[bytes, bool] | None:
    creds = await _secret(client, namespace, source.secret)
    headers = {"Range": f"bytes=0-{HEAD_BYTES - 1}"}
    for line in source.extra_headers:
        key, _, value = line.partition(":")
        headers[key.strip()] = value.strip()
    auth = aiohttp.BasicAuth(creds["accessKeyId"], creds.get("secretKey", "")) if creds.get("accessKeyId") else None
    context = await _ssl_context(client, namespace, source)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session, \
            session.get(source.endpoint, headers=headers, auth=auth, ssl=context) as resp:
        if resp.status not in (200, 206):
            return None
        head = bytearray()  # read(n) returns what has arrived, maybe less than n
        while len(head) < HEAD_BYTES and (data := await resp.content.read(HEAD_BYTES - len(head))):
            head += data
        return bytes(head), resp.status == 206


def _s3_head(endpoint: str, creds: Mapping[str, str]) -> bytes:
    import boto3
    parsed = urlparse(endpoint)
    if parsed.scheme == "s3":
        bucket, key, endpoint_url = parsed.netloc, parsed.path.lstrip("/"), None
    else:
        bucket, _, key = parsed.path.lstrip("/").partition("/")
        endpoint_url = f"{parsed.scheme}://{parsed.netloc}"
    s3: Any = boto3.client("s3", endpoint_url=endpoint_url, aws_access_key_id=creds.get("accessKeyId") or None,
                           aws_secret_access_key=creds.get("secretKey") or None,
                           region_name="us-east-1")
    body = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{HEAD_BYTES - 1}")["Body"]
    data: bytes = body.read()
    return data


async def scratch_required(client: KubeClient, pvc: Mapping[str, Any], source: ImportSource) -> bool:
    """True when the importer will need scratch; an unreadable source gets none (the importer then
    fails with the real reason, or asks for scratch, which the controller still honours)."""
    namespace = str((pvc.get("metadata") or {}).get("namespace", ""))
    if source.content_type == "archive" or source.source in ("blank", "none", "gcs"):
        return False
    if source.source == "registry":
        # a layer is a stream and the disk in it is nearly always qcow2, which streams without scratch;
        # for the rare vmdk the importer asks for scratch and the controller gives it on the next pod
        return False
    try:
        if source.source == "http":
            found = await _http_head(client, namespace, source)
            if found is None:
                return False
            head, ranges = found
            access = ACCESS_NBD if ranges else ACCESS_STREAM
        elif source.source == "s3":
            creds = await _secret(client, namespace, source.secret)
            head, access = await asyncio.to_thread(_s3_head, source.endpoint, creds), ACCESS_NBD  # presigned
        else:
            return False
    except Exception as exc:  # any failure to probe is the importer's to report, with its reason
        log.info("could not probe %s: %s", source.endpoint, exc)
        return False
    return head_needs_scratch(head, access)
