"""Pod IP addresses from a loopback range: Linux routes all of 127.0.0.0/8 to `lo`, so a process
can bind 127.10.x.y without any network setup, and every pod gets an address of its own as on a
real cluster. The range is disjoint from the API server's Service range (127.20.0.0/16) and from
127.0.0.1. An address stays with its pod until the pod is deleted, then becomes free again."""

from __future__ import annotations

import ipaddress

POD_NETWORK = "127.10.0.0/16"


class PodIPs:
    def __init__(self, network: str = POD_NETWORK) -> None:
        self._network = ipaddress.ip_network(network)
        self._by_pod: dict[str, str] = {}
        self._used: set[str] = set()
        self._next = 0

    def reserve(self, pod_uid: str, ip: str) -> bool:
        """Keep an address a pod already had (after a restart); False if it is not ours to give."""
        try:
            if ipaddress.ip_address(ip) not in self._network:
                return False
        except ValueError:
            return False
        owner = next((uid for uid, used in self._by_pod.items() if used == ip), None)
        if owner not in (None, pod_uid):
            return False
        self._by_pod[pod_uid] = ip
        self._used.add(ip)
        return True

    def get(self, pod_uid: str) -> str | None:
        return self._by_pod.get(pod_uid)

    def allocate(self, pod_uid: str) -> str:
        if pod_uid in self._by_pod:
            return self._by_pod[pod_uid]
        hosts = self._network.num_addresses - 2
        for step in range(hosts):
            index = (self._next + step) % hosts + 1
            ip = str(self._network.network_address + index)
            if ip.endswith(".0") or ip.endswith(".255") or ip in self._used:
                continue
            self._next = index
            self._by_pod[pod_uid] = ip
            self._used.add(ip)
            return ip
        raise RuntimeError("pod IP range exhausted")

    def release(self, pod_uid: str) -> None:
        ip = self._by_pod.pop(pod_uid, None)
        if ip is not None:
            self._used.discard(ip)
