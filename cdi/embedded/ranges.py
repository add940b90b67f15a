"""Address ranges of one `cdi up`: a /24 of the loopback for its pods (in 127.10.0.0/16) and one for its
Services' cluster IPs (in 127.20.0.0/16). Linux routes all of 127.0.0.0/8 to `lo`, so a process can
listen on any of them without network setup; but every `cdi up` on a machine shares that loopback, so
two instances must never hand out the same address, or one's upload proxy talks to the other's
upload server.

A range is chosen once per data directory and kept:

- derived: the /24 a hash of the data directory names, else the next ones in turn;
- checked free: no other live instance claims it (a claim is an abstract Unix socket named after the
  range, bound while the instance runs: atomic, seen by every user of the machine, and gone when the
  process dies, even by `kill -9`), nothing listens on any of its addresses, and, while another
  range is free, no stopped instance whose data directory still exists has it recorded (`ranges/`
  in `$XDG_RUNTIME_DIR/cdi`, else `/tmp/cdi-<uid>`);
- persisted: in a file of the data directory, so a restart takes the same range back and the
  addresses stored in objects (Services' cluster IPs, pods' IPs) stay valid.

Inside its range an instance still skips any address something listens on (`AddressPool`)."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import os
import socket
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

POD_NETWORK = "127.10.0.0/16"
SERVICE_NETWORK = "127.20.0.0/16"
PREFIX = 24

Network = ipaddress.IPv4Network


class AddressRange:
    """A range this instance holds (and the claim on it, released by `close` or when the process ends)."""

    def __init__(self, network: Network, claim: socket.socket | None = None) -> None:
        self.network = network
        self._claim = claim

    def close(self) -> None:
        if self._claim is not None:
            self._claim.close()
            self._claim = None


def claim_range(within: str, record: Path) -> AddressRange:
    """The /24 of `within` recorded in `record` (a file in the data directory), or a free one chosen
    and recorded there now."""
    parent = ipaddress.IPv4Network(within)
    kept = _recorded(record)
    if kept is not None and not (kept.prefixlen == PREFIX and kept.subnet_of(parent)):
        kept = None
    subnets = list(parent.subnets(new_prefix=PREFIX))
    start = int.from_bytes(hashlib.sha256(str(record.resolve()).encode()).digest()[:8], "big") % len(subnets)
    candidates = subnets[start:] + subnets[:start]
    if kept is not None:
        candidates = [kept, *(s for s in candidates if s != kept)]
    busy = listening()
    recorded_elsewhere = []
    for network in candidates:
        claim = _claim(network)
        if claim is None:
            if network == kept:
                log.warning("the address range %s this data directory used is held by another cdi up; "
                            "taking another", network)
            continue
        if network != kept:
            if any(ipaddress.IPv4Address(ip) in network for ip in busy):
                claim.close()
                continue
            if _reserved_elsewhere(network, record):
                claim.close()
                recorded_elsewhere.append(network)
                continue
        return _take(network, claim, record, kept)
    # every other range is held or recorded: a stopped instance's record is a preference, not a lock
    # (data directories nobody will start again must not use the ranges up)
    for network in recorded_elsewhere:
        claim = _claim(network)
        if claim is not None:
            log.warning("taking the address range %s another (stopped) cdi up recorded: none other is free",
                        network)
            return _take(network, claim, record, kept)
    raise RuntimeError(f"no free /{PREFIX} left in {parent} for this cdi up")


def _take(network: Network, claim: socket.socket, record: Path, kept: Network | None) -> AddressRange:
    if network != kept:
        record.write_text(f"{network}\n")
    _register(network, record)
    return AddressRange(network, claim)


class AddressPool:
    """Addresses of a range handed out one by one: never one in use here, never one something on the
    machine listens on (a stray server, a pod that outlived its node)."""

    def __init__(self, network: str | Network) -> None:
        self.network = ipaddress.IPv4Network(network)
        self._used: set[str] = set()
        self._next = 0

    def __contains__(self, ip: str) -> bool:
        try:
            return ipaddress.IPv4Address(ip) in self.network
        except ValueError:
            return False

    def in_use(self, ip: str) -> bool:
        return ip in self._used

    def take(self, ip: str) -> None:
        self._used.add(ip)

    def release(self, ip: str) -> None:
        self._used.discard(ip)

    def allocate(self) -> str:
        """The next free address after the last one handed out (a released address is reused last)."""
        hosts = self.network.num_addresses - 2
        busy = listening()
        for step in range(hosts):
            index = (self._next + step) % hosts + 1
            ip = str(self.network.network_address + index)
            if ip.endswith((".0", ".255")) or ip in self._used or ip in busy:
                continue
            self._next = index
            self._used.add(ip)
            return ip
        raise RuntimeError(f"address range {self.network} exhausted")


def listening() -> set[str]:
    """IPv4 addresses with a TCP listener on this machine (from /proc/net/tcp)."""
    found: set[str] = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":  # LISTEN
            address = int(fields[1].split(":")[0], 16)
            found.add(str(ipaddress.IPv4Address(address.to_bytes(4, "little"))))
    return found


def _recorded(record: Path) -> Network | None:
    try:
        return ipaddress.IPv4Network(record.read_text().strip())
    except (OSError, ValueError):
        return None


def _claim(network: Network) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(f"\0cdi/address-range/{network}")
    except OSError:
        sock.close()
        return None
    return sock


def _registry() -> Path | None:
    """Where this user's instances record their ranges, if it is a directory only this user may change."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) / "cdi" if runtime and Path(runtime).is_dir() else Path(tempfile.gettempdir()) / \
        f"cdi-{os.geteuid()}"
    directory = base / "ranges"
    try:
        for path in (base, directory):
            path.mkdir(mode=0o700, exist_ok=True)
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
                return None
    except OSError:
        return None
    return directory


def _entry(network: Network) -> Path | None:
    registry = _registry()
    return None if registry is None else registry / str(network).replace("/", "_")


def _reserved_elsewhere(network: Network, record: Path) -> bool:
    """Whether a (stopped) instance whose data directory still exists recorded `network`."""
    entry = _entry(network)
    if entry is None:
        return False
    try:
        owner = Path(entry.read_text().strip())
    except OSError:
        return False
    if owner == record.resolve():
        return False
    return _recorded(owner) == network


def _register(network: Network, record: Path) -> None:
    entry = _entry(network)
    if entry is None:
        return
    with contextlib.suppress(OSError):
        temporary = entry.with_name(f".{entry.name}.{os.getpid()}")
        temporary.write_text(f"{record.resolve()}\n")
        os.replace(temporary, entry)
