"""Kubernetes resource quantities ("10Gi", "1.5G", "500M", "100m", "1e3"): exact integers of bytes for
sizes, and `Quantity` for what the API server keeps and prints (quota usage, canonical forms).

Sizes decide whether an image fits, so they are parsed with Decimal and rounded up, never through
floats."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
    "m": Decimal(1) / 1000, "u": Decimal(1) / 10**6, "n": Decimal(1) / 10**9,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|u|n)?$")
_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E", -3: "m", -6: "u", -9: "n"}
_NANO = Decimal(1) / 10**9

# how a quantity is written back (Kubernetes' resource.Format), from the suffix it was given with
DECIMAL_SI = "DecimalSI"
BINARY_SI = "BinarySI"
DECIMAL_EXPONENT = "DecimalExponent"


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def _parse(value: str | int | float) -> tuple[Decimal, str]:
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a number or string, not {value!r}")
    if isinstance(value, int):
        return Decimal(value), DECIMAL_SI
    if isinstance(value, float):
        return Decimal(str(value)), DECIMAL_SI
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"quantities must match the regular expression "
                            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number) * _SUFFIXES[suffix]
    except InvalidOperation as exc:
        raise QuantityError(f"invalid quantity {value!r}") from exc
    if suffix.endswith("i"):
        return amount, BINARY_SI
    return amount, DECIMAL_EXPONENT if "e" in number.lower() else DECIMAL_SI


def parse_decimal(value: str | int | float) -> Decimal:
    return _parse(value)[0]


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


@dataclass(frozen=True)
class Quantity:
    """A quantity as the API server holds it (resource.Quantity): its value, at most nano-precise
    (rounded up, as Kubernetes rounds), and the format it is written back in. `str()` is the canonical
    form the API server answers with ("1024Mi" is "1Gi", "1000m" is "1", "1500000" is "1500k"); a sum
    keeps the format of its first non-zero term, as `Quantity.Add`."""

    value: Decimal = Decimal(0)
    format: str = DECIMAL_SI

    @classmethod
    def parse(cls, value: str | int | float) -> Quantity:
        amount, fmt = _parse(value)
        return cls(amount, fmt)

    def __post_init__(self) -> None:
        exponent = self.value.as_tuple().exponent
        if isinstance(exponent, int) and exponent < -9:
            object.__setattr__(self, "value", self.value.quantize(_NANO, rounding=ROUND_CEILING))

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.value + other.value, other.format if self.value == 0 else self.format)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value, other.format if self.value == 0 else self.format)

    def rounded_up(self) -> Quantity:
        """Whole units (a claim's storage request counts as whole bytes)."""
        return Quantity(self.value.to_integral_value(rounding=ROUND_CEILING), self.format)

    def __str__(self) -> str:
        value, fmt = self.value, self.format
        if value == 0:
            return "0"
        if fmt == BINARY_SI and (abs(value) < 1024 or value != value.to_integral_value()):
            fmt = DECIMAL_SI  # as Kubernetes: small or fractional binary quantities print in decimal
        if fmt == BINARY_SI:
            amount, power = int(value), 0
            while power < len(_BINARY) - 1 and amount % 1024 == 0:
                amount, power = amount // 1024, power + 1
            return f"{amount}{_BINARY[power]}"
        sign, digits, exponent = value.normalize().as_tuple()
        assert isinstance(exponent, int)
        mantissa = int("".join(map(str, digits)))
        shift = exponent % 3  # the exponent down to a multiple of 3, the mantissa up to match
        mantissa, exponent = mantissa * 10**shift, exponent - shift
        number = f"{'-' if sign else ''}{mantissa}"
        if fmt == DECIMAL_SI and exponent in _DECIMAL:
            return number + _DECIMAL[exponent]
        return number + (f"e{exponent}" if exponent else "")
