"""Helpers for end-to-end upload tests: `cdi image-upload` as a user runs it, upload tokens through
kubectl, and curl against the upload proxy (as a browser or virtctl would talk to it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.target import External
from tests.support.cluster import ROOT, CdiUp, Kubectl, wait_for


def image_upload(cluster: CdiUp | External, *args: str, timeout: float = 180.0,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`cdi image-upload ARGS --kubeconfig ...` in a subprocess (its output not a terminal); on a cluster that
    publishes no upload proxy URL, with its Service's, as a user of CDI gives it to virtctl."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    env.pop("KUBECONFIG", None)
    if isinstance(cluster, External) and "--uploadproxy-url" not in args:
        args = (*args, "--uploadproxy-url", cluster.proxy_url())
    return subprocess.run([sys.executable, "-m", "cdi.cli.main", "image-upload", *args, "--kubeconfig",
                           str(cluster.kubeconfig)], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)


def upload_dv(name: str, size: str = "64Mi", *, volume_mode: str | None = None, content_type: str | None = None,
              storage_class: str | None = None) -> dict[str, Any]:
    storage: dict[str, Any] = {"resources": {"requests": {"storage": size}}}
    if volume_mode:
        storage["volumeMode"] = volume_mode
    if storage_class:
        storage["storageClassName"] = storage_class
    spec: dict[str, Any] = {"source": {"upload": {}}, "storage": storage}
    if content_type:
        spec["contentType"] = content_type
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name}, "spec": spec}


def token(kubectl: Kubectl, pvc: str, namespace: str = "default") -> str:
    request = {"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
               "metadata": {"name": f"token-{pvc}", "namespace": namespace}, "spec": {"pvcName": pvc}}
    result = kubectl("create", "-f", "-", "-o", "jsonpath={.status.token}", input=json.dumps(request))
    assert result.stdout.count(".") == 2, result.stdout
    return result.stdout


def proxy_url(kubectl: Kubectl, cluster: CdiUp | External | None = None) -> str:
    if isinstance(cluster, External):
        return cluster.proxy_url()
    return str(wait_for(lambda: kubectl("get", "cdiconfig", "config", "-o", "jsonpath={.status.uploadProxyURL}",
                                        check=False).stdout, 30, message="CDIConfig status.uploadProxyURL"))


def proxy_ca(cluster: CdiUp | External) -> Path:
    if isinstance(cluster, External):
        return cluster.proxy_ca()
    return cluster.kubeconfig.parent / "uploadproxy-ca.crt"


def curl(cluster: CdiUp | External, kubectl: Kubectl, path: str, *args: str, bearer: str | None = None,
         timeout: float = 120.0) -> tuple[int, str, dict[str, str]]:
    """curl to the upload proxy; (status, body, headers in lower case)."""
    cmd = ["curl", "-sS", "--cacert", str(proxy_ca(cluster)), "-D", "-", "-o", "-"]
    if bearer is not None:
        cmd += ["-H", f"Authorization: Bearer {bearer}"]
    result = subprocess.run([*cmd, *args, proxy_url(kubectl, cluster) + path], capture_output=True, timeout=timeout,
                            check=False)
    assert result.returncode == 0, result.stderr.decode()
    return parse_response(result.stdout)


def parse_response(raw: bytes) -> tuple[int, str, dict[str, str]]:
    text = raw.decode(errors="replace")
    while text.startswith("HTTP/1.1 100"):
        text = text.split("\r\n\r\n", 1)[1]
    head, _, body = text.partition("\r\n\r\n")
    lines = head.split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), body, headers


def wait_ready(kubectl: Kubectl, name: str, namespace: str = "default") -> None:
    wait_for(lambda: kubectl("get", "dv", name, "-n", namespace, "-o", "jsonpath={.status.phase}",
                             check=False).stdout == "UploadReady", 60, interval=0.2, message=f"{name} UploadReady")
