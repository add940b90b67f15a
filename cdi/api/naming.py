"""Names of the objects CDI makes for a claim (`importer-<pvc>`, `cdi-upload-<pvc>`, `<pvc>-scratch`), shortened
as CDI shortens them (OpenShift's `naming.GetName`, which CDI's `naming` package wraps), so that a claim with
a long name still gets its worker pod and Service, and two long names never share them.

Cutting a name at the limit instead made two claims whose names share their first 52 characters share one
upload Service: the upload proxy would have sent one claim's upload to the other's volume. The hash is
of the whole name, so names that differ only beyond the cut get different objects."""

from __future__ import annotations

DNS1123_SUBDOMAIN_MAX = 253  # pods, secrets, claims
DNS1035_LABEL_MAX = 63  # services


def _fnv32a(text: str) -> str:
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{value:08x}"


def shortened(base: str, suffix: str, max_length: int) -> str:
    """`<base>-<suffix>`, or when longer than `max_length`, `<base cut>-<hash of base>-<suffix>` (or, for a
    suffix too long to keep, `<base cut>-<hash of the whole>`), exactly as CDI names them."""
    name = f"{base}-{suffix}"
    if len(name) <= max_length:
        return name
    base_length = max_length - 10 - len(suffix)  # room for "-<8 hex>-"
    if base_length <= 0:
        return f"{base[:max(0, max_length - 9)]}-{_fnv32a(name)}"[:max_length]
    return f"{base[:base_length]}-{_fnv32a(base)}-{suffix}"


def resource_name(base: str, suffix: str) -> str:
    """A pod, Secret or claim name (CDI's `naming.GetResourceName`)."""
    return shortened(base, suffix, DNS1123_SUBDOMAIN_MAX)


def service_name(resource: str) -> str:
    """The Service for a resource name: a DNS label (CDI's `naming.GetServiceNameFromResourceName`)."""
    base = resource.replace(".", "-")
    if len(base) <= DNS1035_LABEL_MAX:
        return base
    return shortened(base, "cdi", DNS1035_LABEL_MAX)


