"""Size arithmetic shared by the controller (PVC requests) and the worker pods (usable space).

The formulas are CDI's (GetRequiredSpace / GetUsableSpace), computed in float64 as CDI computes
them, so that a PVC sized here holds exactly what CDI would put in it: a difference of one MiB turns
into "DataVolume too small" for images CDI accepts."""

import math

ALIGN = 1024 * 1024  # 1 MiB: a multiple of every common sector and cluster size
DEFAULT_FILESYSTEM_OVERHEAD = "0.06"


def round_up(value: int, align: int = ALIGN) -> int:
    return -(-value // align) * align


def round_down(value: int, align: int = ALIGN) -> int:
    return value // align * align


def overhead_fraction(overhead: str | float) -> float:
    value = float(overhead)
    if not 0 <= value < 1:
        raise ValueError(f"filesystem overhead must be in [0, 1), got {overhead}")
    return value


def required_space(overhead: str | float, requested: int) -> int:
    """PVC size that leaves `requested` usable bytes after filesystem overhead."""
    return math.ceil(float(round_up(requested)) * (1 + overhead_fraction(overhead)))


def usable_space(overhead: str | float, available: int) -> int:
    """Bytes an image may use on a volume of `available` bytes."""
    return round_down(math.ceil(float(available) / (1 + overhead_fraction(overhead))))
