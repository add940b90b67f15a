"""Services on the local node: the endpoints controller (an Endpoints object per Service with a
selector, listing the matching pods' IPs, ready or not) and a small kube-proxy (a TCP listener on
each `clusterIP:port` that forwards every connection to a ready endpoint, round-robin), so that a
client connecting to a Service's cluster IP reaches a pod as on a real cluster."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from cdi.api.groups import ENDPOINTS, PODS, SERVICES
from cdi.embedded.control import Controller, Key, LocalApi
from cdi.embedded.kubeapi.errors import StatusError

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def target_port(port: Obj, pod: Obj) -> int | None:
    """The pod port a service port forwards to (a number, or a named container port)."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for cport in container.get("ports") or []:
            if cport.get("name") == target and cport.get("protocol", "TCP") == port.get("protocol", "TCP"):
                return int(cport["containerPort"])
    return None


def endpoint_subsets(service: Obj, pods: list[Obj]) -> list[Obj]:
    """Subsets of the Endpoints object for `service`, grouping pods that resolve ports alike."""
    spec = service.get("spec") or {}
    ports = spec.get("ports") or []
    publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
    groups: dict[tuple[tuple[str, int, str], ...], Obj] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        status, meta = pod.get("status") or {}, pod["metadata"]
        if not status.get("podIP") or meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded",
                                                                                                 "Failed"):
            continue
        if not selector_matches(spec.get("selector") or {}, meta.get("labels") or {}):
            continue
        resolved = []
        for port in ports:
            number = target_port(port, pod)
            if number is not None:
                resolved.append((port.get("name", ""), number, port.get("protocol", "TCP")))
        key = tuple(resolved)
        subset = groups.setdefault(key, {"addresses": [], "notReadyAddresses": [], "ports": [
            {**({"name": n} if n else {}), "port": p, "protocol": proto} for n, p, proto in resolved]})
        address = {"ip": status["podIP"], "nodeName": (pod.get("spec") or {}).get("nodeName", ""),
                   "targetRef": {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"],
                                 "uid": meta["uid"]}}
        ready = pod_ready(pod) or publish_not_ready
        subset["addresses" if ready else "notReadyAddresses"].append(address)
    out = []
    for subset in groups.values():
        cleaned = {k: v for k, v in subset.items() if v}
        if cleaned.get("addresses") or cleaned.get("notReadyAddresses"):
            out.append(cleaned)
    return out


class EndpointsController(Controller):
    name = "endpoints"

    def __init__(self, api: LocalApi) -> None:
        super().__init__()
        self.api = api

    def sources(self) -> Iterable[tuple[Any, Any]]:
        def service_key(_: str, svc: Obj) -> Iterable[Key]:
            yield svc["metadata"]["namespace"], svc["metadata"]["name"]

        def from_pod(_: str, pod: Obj) -> Iterable[Key]:
            ns = pod["metadata"]["namespace"]
            return [(ns, s["metadata"]["name"]) for s in self.api.list(SERVICES, ns)
                    if (s.get("spec") or {}).get("selector")]

        return [(SERVICES, service_key), (PODS, from_pod)]

    def all_keys(self) -> Iterable[Key]:
        return [(s["metadata"]["namespace"], s["metadata"]["name"]) for s in self.api.list(SERVICES)]

    async def reconcile(self, key: Key) -> None:
        ns, name = key
        service = self.api.get(SERVICES, ns, name)
        current = self.api.get(ENDPOINTS, ns, name)
        if service is None:
            if current is not None and (current["metadata"].get("labels") or {}).get(
                    "endpoints.kubernetes.io/managed-by") == "endpoint-controller":
                await self.api.delete(ENDPOINTS, ns, name)
            return
        selector = (service.get("spec") or {}).get("selector")
        if not selector:
            return  # endpoints of a service without a selector are the user's
        subsets = endpoint_subsets(service, self.api.list(PODS, ns))
        labels = {**(service["metadata"].get("labels") or {}),
                  "endpoints.kubernetes.io/managed-by": "endpoint-controller"}
        if current is None:
            body: Obj = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": name, "namespace": ns,
                                                                          "labels": labels}}
            if subsets:
                body["subsets"] = subsets
            try:
                await self.api.create(ENDPOINTS, ns, body)
            except StatusError as exc:
                if exc.code != 409:
                    raise
                self.enqueue(key)
            return
        if (current.get("subsets") or []) == subsets and (current["metadata"].get("labels") or {}) == labels:
            return
        updated = {**current, "metadata": {**current["metadata"], "labels": labels}}
        if subsets:
            updated["subsets"] = subsets
        else:
            updated.pop("subsets", None)
        await self.api.update(ENDPOINTS, ns, updated)


class ServiceProxy:
    """Listens on every ClusterIP service port and forwards connections to ready endpoints."""

    def __init__(self, api: LocalApi) -> None:
        self.api = api
        self._servers: dict[tuple[str, int], asyncio.Server] = {}
        self._targets: dict[tuple[str, int], tuple[str, str, str]] = {}  # (ip, port) -> (ns, service, port name)
        self._rr = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._dirty = asyncio.Event()

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._watch(), name="proxy-watch"))
        self._tasks.append(asyncio.create_task(self._sync_loop(), name="proxy-sync"))
        self._dirty.set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for server in self._servers.values():
            server.close()
        for conn in list(self._connections):
            conn.cancel()
        for server in self._servers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)
        self._servers.clear()

    async def _watch(self) -> None:
        while True:
            try:
                async for _type, _svc in self.api.events(SERVICES):
                    self._dirty.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("proxy: service watch failed")
                await asyncio.sleep(1.0)

    async def _sync_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), 30.0)
            self._dirty.clear()
            try:
                await self._sync()
            except Exception:
                log.exception("proxy: sync failed")

    async def _sync(self) -> None:
        wanted: dict[tuple[str, int], tuple[str, str, str]] = {}
        for svc in self.api.list(SERVICES):
            spec = svc.get("spec") or {}
            ip = spec.get("clusterIP")
            if not ip or ip == "None":
                continue
            for port in spec.get("ports") or []:
                if port.get("protocol", "TCP") != "TCP":
                    continue
                wanted[(ip, int(port["port"]))] = (svc["metadata"]["namespace"], svc["metadata"]["name"],
                                                   port.get("name", ""))
        for address in list(self._servers):
            if address not in wanted:
                self._servers.pop(address).close()
                self._targets.pop(address, None)
        for address, target in wanted.items():
            self._targets[address] = target
            if address in self._servers:
                continue
            try:
                server = await asyncio.start_server(self._acceptor(address), address[0], address[1],
                                                    reuse_address=True)
            except OSError as exc:
                log.warning("proxy: cannot listen on %s:%s for service %s/%s: %s", address[0], address[1],
                            target[0], target[1], exc)
                continue
            self._servers[address] = server

    def _endpoint(self, address: tuple[str, int]) -> tuple[str, int] | None:
        target = self._targets.get(address)
        if target is None:
            return None
        ns, name, port_name = target
        endpoints = self.api.get(ENDPOINTS, ns, name)
        choices: list[tuple[str, int]] = []
        for subset in (endpoints or {}).get("subsets") or []:
            port = next((p for p in subset.get("ports") or [] if p.get("name", "") == port_name), None)
            if port is None:
                continue
            choices.extend((a["ip"], int(port["port"])) for a in subset.get("addresses") or [])
        if not choices:
            return None
        return choices[next(self._rr) % len(choices)]

    def _acceptor(self, address: tuple[str, int]) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]:
        return lambda reader, writer: self._accept(address, reader, writer)

    def _accept(self, address: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._forward(address, reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _forward(self, address: tuple[str, int], reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        endpoint = self._endpoint(address)
        upstream_writer = None
        try:
            if endpoint is None:
                return  # no ready endpoint: the connection is refused (closed)
            up_reader, upstream_writer = await asyncio.wait_for(asyncio.open_connection(*endpoint), 10.0)
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(up_reader, writer))
        except (OSError, TimeoutError):
            pass
        finally:
            for w in (writer, upstream_writer):
                if w is not None:
                    w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, RuntimeError):
        writer.close()
