"""Kubernetes resource quantities ("10Gi", "1.5G", "500M", "1e3") as exact integers of bytes.

Sizes decide whether an image fits, so they are parsed with Decimal and rounded up, never through
floats."""

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
    "m": Decimal(1) / 1000,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_decimal(value: str | int | float) -> Decimal:
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a number or string, not {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"quantities must match the regular expression "
                            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        return Decimal(number) * _SUFFIXES[suffix]
    except InvalidOperation as exc:
        raise QuantityError(f"invalid quantity {value!r}") from exc


def parse_bytes(value: str | int | float) -> int:
    """Bytes in a quantity, rounded up as Kubernetes does for storage."""
    return math.ceil(parse_decimal(value))


def format_bytes(value: int) -> str:
    """The shortest exact binary-suffixed quantity for a byte count ("10Gi", "1536Mi", "1000")."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = int(_SUFFIXES[suffix])
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
