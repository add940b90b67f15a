"""An in-process embedded API server and a plain HTTPS client for it, for semantics tests that need
to look at status codes and bodies exactly."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cdi.embedded.kubeapi.server import ApiServer, ServerConfig


@dataclass
class Api:
    server: ApiServer
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.server.url

    async def call(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                   headers: dict[str, str] | None = None, raw: bytes | None = None) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"headers": {"Content-Type": content_type, **(headers or {})}}
        if raw is not None:
            kwargs["data"] = raw
        elif body is not None:
            kwargs["json"] = body
        async with self.session.request(method, self.url + path, **kwargs) as resp:
            text = await resp.text()
            try:
                import json
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, data = await self.call(method, path, body, **kw)
        assert 200 <= status < 300, (status, data)
        return data


async def make_api(data_dir: Path, **config: Any) -> Api:
    server = ApiServer(ServerConfig(data_dir=data_dir, **config))
    await server.start()
    assert server.ca is not None
    context = ssl.create_default_context(cadata=server.ca.cert_pem.decode())
    session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {server.token}"},
                                    connector=aiohttp.TCPConnector(ssl=context))
    return Api(server, session)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    instance = await make_api(tmp_path / "srv", watch_history=50, bookmark_interval=0.2)
    yield instance
    await instance.session.close()
    await instance.server.stop()


DV = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes"
CM = "/api/v1/namespaces/default/configmaps"
PODS = "/api/v1/namespaces/default/pods"


def datavolume(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name},
        "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}},
    }
    body["spec"].update(spec)
    return body


def configmap(name: str, labels: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None,
              **meta: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, **meta}
    if labels:
        metadata["labels"] = labels
    if owners:
        metadata["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": name}}


def owner_ref(obj: dict[str, Any], block: bool = False) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "blockOwnerDeletion": block}
