"""Pod IP addresses from a loopback range: Linux routes all of 127.0.0.0/8 to `lo`, so a process
can bind 127.10.x.y without any network setup, and every pod gets an address of its own as on a
real cluster. The range is disjoint from the API server's Service range (127.20.0.0/16) and from
127.0.0.1. An address stays with its pod until the pod is deleted, then becomes free again.

Several `cdi up`s may run on one machine (tests do): each node starts in a random /24 of the range
and skips addresses something already listens on, so their pods do not collide."""

from __future__ import annotations

import ipaddress
import random

POD_NETWORK = "127.10.0.0/16"


class PodIPs:
    def __init__(self, network: str = POD_NETWORK) -> None:
        self._network = ipaddress.ip_network(network)
        self._by_pod: dict[str, str] = {}
        self._used: set[str] = set()
        self._next = random.randrange(0, self._network.num_addresses, 256)

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
        busy = _listening()
        for step in range(hosts):
            index = (self._next + step) % hosts + 1
            ip = str(self._network.network_address + index)
            if ip.endswith(".0") or ip.endswith(".255") or ip in self._used or ip in busy:
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


def _listening() -> set[str]:
    """IPv4 addresses with a TCP listener on this machine (from /proc/net/tcp)."""
    found: set[str] = set()
    try:
        lines = open("/proc/net/tcp").read().splitlines()[1:]  # noqa: SIM115 - a small procfs read
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":  # LISTEN
            address = int(fields[1].split(":")[0], 16)
            found.add(str(ipaddress.IPv4Address(address.to_bytes(4, "little"))))
    return found
