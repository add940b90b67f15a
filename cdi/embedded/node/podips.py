"""Pod IP addresses from the loopback: Linux routes all of 127.0.0.0/8 to `lo`, so a process can bind
127.10.x.y without any network setup, and every pod gets an address of its own as on a real cluster.
The node hands them out from its instance's /24 of 127.10.0.0/16 (`cdi.embedded.ranges`: derived from
the data directory, checked free, kept across restarts), disjoint from the Services' range and from
127.0.0.1, so pods of two `cdi up`s on one machine never share an address. An address stays with its
pod until the pod is deleted, then becomes free again."""

from __future__ import annotations

from cdi.embedded.ranges import POD_NETWORK, AddressPool, Network


class PodIPs:
    def __init__(self, network: str | Network = POD_NETWORK) -> None:
        self._pool = AddressPool(network)
        self._by_pod: dict[str, str] = {}

    @property
    def network(self) -> Network:
        return self._pool.network

    def reserve(self, pod_uid: str, ip: str) -> bool:
        """Keep an address a pod already had (after a restart); False if it is not ours to give."""
        if ip not in self._pool:
            return False
        owner = next((uid for uid, used in self._by_pod.items() if used == ip), None)
        if owner not in (None, pod_uid):
            return False
        self._by_pod[pod_uid] = ip
        self._pool.take(ip)
        return True

    def get(self, pod_uid: str) -> str | None:
        return self._by_pod.get(pod_uid)

    def allocate(self, pod_uid: str) -> str:
        if pod_uid not in self._by_pod:
            self._by_pod[pod_uid] = self._pool.allocate()
        return self._by_pod[pod_uid]

    def release(self, pod_uid: str) -> None:
        ip = self._by_pod.pop(pod_uid, None)
        if ip is not None:
            self._pool.release(ip)
