"""What a TLS server really offers, asked with the real `openssl s_client`, the way an administrator
checks a cluster's TLS profile: which protocol versions it accepts, and which cipher suites in each.

Suites of TLS 1.2 and older are found by elimination: the client offers every suite OpenSSL knows for the
server's key type, the server picks one (its preference), the client offers the rest again, until the
handshake fails; so `accepted` is exactly the set the server would ever pick. TLS 1.3's five suites are
tried one by one."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

VERSIONS = {"TLSv1": "-tls1", "TLSv1.1": "-tls1_1", "TLSv1.2": "-tls1_2", "TLSv1.3": "-tls1_3"}
TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
                "TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256")
# the expected suites of the profiles below are for servers with an ECDSA key, as all of cdi's certificates


def openssl() -> str:
    found = shutil.which("openssl")
    assert found, "the openssl command is missing (Debian's openssl package)"
    return found


def all_suites(authentication: str = "ECDSA") -> list[str]:
    """Every suite of TLS 1.2 and older OpenSSL knows (at security level 0) for a key of this type."""
    out = subprocess.run([openssl(), "ciphers", "-v", "ALL:@SECLEVEL=0"], capture_output=True, text=True,
                         check=True).stdout
    suites = []
    for line in out.splitlines():
        fields = line.split()
        if fields and f"Au={authentication}" in fields and fields[1] != "TLSv1.3":
            suites.append(fields[0])
    return suites


def handshake(host: str, port: int, version: str, *, ciphers: str | None = None,
              suites: str | None = None, server_name: str = "localhost") -> str | None:
    """The suite a handshake with only `version` ends in, or None when the server refuses it."""
    command = [openssl(), "s_client", "-connect", f"{host}:{port}", "-servername", server_name, "-brief",
               VERSIONS[version]]
    if ciphers is not None:
        command += ["-cipher", f"{ciphers}:@SECLEVEL=0"]
    elif version != "TLSv1.3":
        command += ["-cipher", "ALL:@SECLEVEL=0"]
    if suites is not None:
        command += ["-ciphersuites", suites]
    done = subprocess.run(command, check=False, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=20)
    if done.returncode != 0:
        return None
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("Ciphersuite:"):
            return line.split(":", 1)[1].strip()
    return None


@dataclass
class Offer:
    """Per protocol version the server accepts, the suites it accepts in it."""

    suites: dict[str, set[str]] = field(default_factory=dict)

    @property
    def versions(self) -> set[str]:
        return set(self.suites)


def offer(host: str, port: int, server_name: str = "localhost") -> Offer:
    result = Offer()
    candidates = all_suites()
    for version in VERSIONS:
        accepted: set[str] = set()
        if version == "TLSv1.3":
            for suite in TLS13_SUITES:
                if handshake(host, port, version, suites=suite, server_name=server_name) == suite:
                    accepted.add(suite)
        else:
            remaining = list(candidates)
            while remaining:
                picked = handshake(host, port, version, ciphers=":".join(remaining), server_name=server_name)
                if picked is None:
                    break
                assert picked in remaining, f"{picked} was not offered"
                accepted.add(picked)
                remaining.remove(picked)
        if accepted:
            result.suites[version] = accepted
    return result


def accepts(host: str, port: int, version: str, server_name: str = "localhost") -> bool:
    """Whether the server completes a handshake in `version` (with any suite)."""
    return handshake(host, port, version, server_name=server_name) is not None


# What each profile must offer on a server with an ECDSA key (cdi's): CDI's suites (`cdi.api.tlsprofile`)
# that such a key can serve, TLS 1.3's three whatever the profile (as CDI's servers).
TLS13 = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
ECDSA_AEAD = {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305"}
ECDSA_SHA1 = {"ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA"}
EXPECTED = {
    "Old": {"TLSv1": ECDSA_SHA1, "TLSv1.1": ECDSA_SHA1,
            "TLSv1.2": ECDSA_AEAD | ECDSA_SHA1 | {"ECDHE-ECDSA-AES128-SHA256"}, "TLSv1.3": TLS13},
    "Intermediate": {"TLSv1.2": ECDSA_AEAD, "TLSv1.3": TLS13},
    "Modern": {"TLSv1.3": TLS13},
    # CUSTOM below: an OpenSSL name, an IANA name, a TLS 1.3 name, a DHE suite (no server of CDI's has one)
    "Custom": {"TLSv1.2": {"ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-SHA"}, "TLSv1.3": TLS13},
}
CUSTOM = {"type": "Custom", "custom": {"minTLSVersion": "VersionTLS12", "ciphers": [
    "ECDHE-ECDSA-AES256-GCM-SHA384", "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", "TLS_AES_128_GCM_SHA256",
    "DHE-RSA-AES128-GCM-SHA256"]}}


def profile(name: str) -> dict[str, object]:
    """The `tlsSecurityProfile` of a profile named as in EXPECTED."""
    if name == "Custom":
        return CUSTOM
    return {"type": name, name.lower(): {}}
