"""Reaching a Service from inside the API server (webhooks, aggregated APIs): a ready endpoint of it
when there is one (as --enable-aggregator-routing does), else its cluster IP."""

from __future__ import annotations

from cdi.embedded.kubeapi.store import Store


def resolve(store: Store, namespace: str, name: str, port: int = 443) -> tuple[str, int]:
    service = store.get("/services", namespace, name)
    if service is None:
        raise ConnectionError(f'service "{namespace}/{name}" not found')
    spec = service.obj().get("spec") or {}
    service_port = next((p for p in spec.get("ports") or [] if p.get("port") == port), None)
    endpoints = store.get("/endpoints", namespace, name)
    if endpoints is not None:
        for subset in endpoints.obj().get("subsets") or []:
            addresses = subset.get("addresses") or []
            ports = subset.get("ports") or []
            if not addresses or not ports:
                continue
            wanted = service_port.get("name") if service_port else None
            chosen = next((p for p in ports if p.get("name") == wanted), ports[0])
            return str(addresses[0]["ip"]), int(chosen["port"])
    ip = spec.get("clusterIP")
    if not ip or ip == "None":
        raise ConnectionError(f'service "{namespace}/{name}" has no ready endpoints')
    return str(ip), port
