"""CDIConfig `spec.tlsSecurityProfile`: the TLS versions and cipher suites of CDI's servers.

The profiles are OpenShift's (CDI's API copies them; HyperConverged sets CDIConfig's from the cluster's
APIServer profile): Old, Intermediate (the default, also when the field is absent) and Modern, or Custom
with its own `ciphers` and `minTLSVersion`. Cipher names are as OpenShift writes them: OpenSSL's names for
TLS 1.2 and older, the IANA names for TLS 1.3 (`cdi.common.pki.TLSPolicy` turns a spec into what OpenSSL
is told). As in CDI, cdi-apiserver and the upload proxy follow the CDIConfig as it changes, and each
upload-server pod gets the spec in its environment (`TLS_CIPHERS`, comma-separated, and
`TLS_MIN_VERSION`, CDI's names) when it is created."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from cdi.api import env

OLD: Final = "Old"
INTERMEDIATE: Final = "Intermediate"
MODERN: Final = "Modern"
CUSTOM: Final = "Custom"

_TLS13: Final = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
_INTERMEDIATE_TLS12: Final = ("ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
                        "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
                        "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
                        "DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384")


@dataclass(frozen=True)
class TLSProfileSpec:
    """A profile's cipher names (in its order of preference) and minimum version (`VersionTLS12`)."""

    ciphers: tuple[str, ...]
    min_tls_version: str

    def to_env(self) -> list[dict[str, str]]:
        """The upload-server pod's environment entries, as CDI's controller writes them."""
        return [{"name": env.TLS_CIPHERS, "value": ",".join(self.ciphers)},
                {"name": env.TLS_MIN_VERSION, "value": self.min_tls_version}]

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TLSProfileSpec:
        """What the upload server serves with: its environment's, or Intermediate's where it has none (a pod
        made by an older controller)."""
        ciphers = tuple(name for name in environ.get(env.TLS_CIPHERS, "").split(",") if name.strip())
        if not ciphers:
            return PROFILES[INTERMEDIATE]
        return cls(ciphers, environ.get(env.TLS_MIN_VERSION, "").strip() or PROFILES[INTERMEDIATE].min_tls_version)


PROFILES: Final[Mapping[str, TLSProfileSpec]] = {
    OLD: TLSProfileSpec(_TLS13 + _INTERMEDIATE_TLS12 + (
        "DHE-RSA-CHACHA20-POLY1305", "ECDHE-ECDSA-AES128-SHA256", "ECDHE-RSA-AES128-SHA256",
        "ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384", "ECDHE-RSA-AES256-SHA384",
        "ECDHE-ECDSA-AES256-SHA", "ECDHE-RSA-AES256-SHA", "DHE-RSA-AES128-SHA256", "DHE-RSA-AES256-SHA256",
        "AES128-GCM-SHA256", "AES256-GCM-SHA384", "AES128-SHA256", "AES256-SHA256", "AES128-SHA", "AES256-SHA",
        "DES-CBC3-SHA"), "VersionTLS10"),
    INTERMEDIATE: TLSProfileSpec(_TLS13 + _INTERMEDIATE_TLS12, "VersionTLS12"),
    MODERN: TLSProfileSpec(_TLS13, "VersionTLS13"),
}
DEFAULT: Final = PROFILES[INTERMEDIATE]


def select(profile: Mapping[str, Any] | None) -> TLSProfileSpec:
    """The spec a `tlsSecurityProfile` stands for: its `custom` spec when it has one (whatever `type`
    says, as CDI), else the named profile's; absent or of an unknown type: Intermediate."""
    if not profile:
        return DEFAULT
    custom = profile.get("custom")
    if isinstance(custom, Mapping):
        ciphers = custom.get("ciphers") or []
        return TLSProfileSpec(tuple(str(name) for name in ciphers if isinstance(name, str)),
                              str(custom.get("minTLSVersion") or ""))
    return PROFILES.get(str(profile.get("type") or ""), DEFAULT)


def of_config(config: Mapping[str, Any] | None) -> TLSProfileSpec:
    """The spec of a CDIConfig object (None: no CDIConfig yet, Intermediate)."""
    spec = (config or {}).get("spec") or {}
    profile = spec.get("tlsSecurityProfile") if isinstance(spec, Mapping) else None
    return select(profile if isinstance(profile, Mapping) else None)
