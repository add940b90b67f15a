"""The local node as one object: its Node object (named after the host, Ready, with a Lease as
heartbeat), the scheduler, the kubelet, the endpoints controller and the service proxy, and the
log source the API server serves `kubectl logs` from."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from cdi.api.groups import LEASES, NODES
from cdi.embedded.control import LocalApi
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.node.kubelet import HOST_IP, Kubelet, KubeletConfig
from cdi.embedded.node.logs import NodeLogs
from cdi.embedded.node.podips import PodIPs
from cdi.embedded.node.scheduler import Scheduler
from cdi.embedded.node.services import EndpointsController, ServiceProxy
from cdi.embedded.ranges import POD_NETWORK, claim_range

log = logging.getLogger(__name__)

Obj = dict[str, Any]
KUBELET_VERSION = "v1.32.0"
LEASE_PERIOD = 10.0
POD_RANGE_FILE = "pod-cidr"  # the node's /24 of 127.10.0.0/16, kept across restarts (cdi.embedded.ranges)


def node_name() -> str:
    """The host name as a valid Node name (lower case DNS subdomain)."""
    name = re.sub(r"[^a-z0-9.-]", "-", socket.gethostname().lower()).strip("-.") or "localhost"
    return name[:253]


def _stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _bwrap_version(bwrap: str) -> str:
    try:
        result = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=5, check=False)
        out = result.stdout.split()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out[-1] if out else "unknown"


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1])}Ki"
    except (OSError, ValueError):
        pass
    return "8Gi"


def _os_image() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()


class LocalNode:
    def __init__(self, api: LocalApi, root: Path, publish: Any, name: str | None = None,
                 hide: list[Path] | None = None, restart_backoff: float = 10.0, shutdown_grace: float = 5.0) -> None:
        self.api = api
        self.name = name or node_name()
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise RuntimeError("the local node needs bubblewrap: apt-get install bubblewrap")
        self.bwrap = bwrap
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise RuntimeError("the local node needs setpriv: apt-get install util-linux")
        self.logs = NodeLogs()
        root.mkdir(parents=True, exist_ok=True)
        self.pod_range = claim_range(POD_NETWORK, root / POD_RANGE_FILE)
        self.ips = PodIPs(self.pod_range.network)
        self.config = KubeletConfig(node_name=self.name, root=root, hide=list(hide or []),
                                    restart_backoff=restart_backoff, shutdown_grace=shutdown_grace, bwrap=bwrap,
                                    setpriv=setpriv)
        self.kubelet = Kubelet(api, self.config, self.ips, self.logs, publish)
        self.scheduler = Scheduler(api, self.name)
        self.endpoints = EndpointsController(api)
        self.proxy = ServiceProxy(api)
        self._heartbeat: asyncio.Task[None] | None = None

    def node_object(self) -> Obj:
        cpus = str(os.cpu_count() or 1)
        memory = _memory()
        disk = shutil.disk_usage(self.config.root if self.config.root.exists() else "/").total
        resources = {"cpu": cpus, "memory": memory, "pods": "110", "ephemeral-storage": f"{disk // 1024}Ki"}
        stamp = _stamp()
        conditions = [
            {"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": stamp,
             "lastTransitionTime": stamp}
            for t, r, m in (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                            ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                            ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))
        ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady",
              "message": "kubelet is posting ready status", "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "labels": {
                "kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": _arch(),
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": _arch(),
                "node-role.kubernetes.io/control-plane": "", "node.kubernetes.io/exclude-from-external-load-"
                                                             "balancers": ""},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": {"podCIDR": str(self.ips.network), "podCIDRs": [str(self.ips.network)]},
            "status": {
                "capacity": resources, "allocatable": resources, "conditions": conditions,
                "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": self.name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                "nodeInfo": {"architecture": _arch(), "operatingSystem": "linux", "osImage": _os_image(),
                             "kernelVersion": platform.release(), "kubeletVersion": KUBELET_VERSION,
                             "kubeProxyVersion": KUBELET_VERSION,
                             "containerRuntimeVersion": f"bwrap://{_bwrap_version(self.bwrap)}",
                             "machineID": "", "systemUUID": "", "bootID": ""},
            },
        }

    async def _register(self) -> None:
        body = self.node_object()
        current = self.api.get(NODES, None, self.name)
        if current is None:
            created = await self.api.create(NODES, None, {k: v for k, v in body.items() if k != "status"})
            del created
        else:
            labels = {**(current["metadata"].get("labels") or {}), **body["metadata"]["labels"]}
            # the pod range of a data directory from before ranges were per instance (127.10.0.0/16) changes
            await self.api.patch(NODES, None, self.name, {"metadata": {"labels": labels}, "spec": body["spec"]})
        await self.api.patch(NODES, None, self.name, {"status": body["status"]}, status=True)

    async def _beat(self) -> None:
        """Renew the node's Lease, and the Ready condition's heartbeat now and then, as kubelets do."""
        beats = 0
        while True:
            try:
                await self._renew_lease()
                if beats % 6 == 0:
                    node = self.api.get(NODES, None, self.name)
                    if node is not None:
                        stamp = _stamp()
                        conditions = [{**c, "lastHeartbeatTime": stamp}
                                      for c in (node.get("status") or {}).get("conditions") or []]
                        await self.api.patch(NODES, None, self.name, {"status": {"conditions": conditions}},
                                             status=True)
            except StatusError as exc:
                log.warning("node heartbeat: %s", exc)
            beats += 1
            await asyncio.sleep(LEASE_PERIOD)

    async def _renew_lease(self) -> None:
        stamp = _micro_stamp()
        lease = self.api.get(LEASES, "kube-node-lease", self.name)
        if lease is None:
            await self.api.create(LEASES, "kube-node-lease", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": stamp}})
        else:
            await self.api.patch(LEASES, "kube-node-lease", self.name, {"spec": {"renewTime": stamp}})

    async def start(self) -> None:
        await self._register()
        self.scheduler.start(self.api)
        await self.kubelet.start()
        self.endpoints.start(self.api)
        await self.proxy.start()
        self._heartbeat = asyncio.create_task(self._beat(), name="node-heartbeat")
        log.info("node %s ready (pods run in bubblewrap, pod IPs from %s)", self.name, self.ips.network)

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._heartbeat
        await self.scheduler.stop()
        await self.kubelet.stop()
        await self.endpoints.stop()
        await self.proxy.stop()
        self.pod_range.close()
