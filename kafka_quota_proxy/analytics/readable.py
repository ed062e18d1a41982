"""Readable quota values: rounding a recommendation up to a number a person would write, and
printing rates in the units an operator reads (KiB/s, MiB/s).

Byte rates are Kafka LONG keys, so they round up to whole bytes on a binary ladder (1.25 MiB,
40 KiB, 900 KiB); the DOUBLE keys round up to two significant digits (0.035, 160).
"""

from __future__ import annotations

import bisect
import math
from decimal import ROUND_CEILING, Decimal

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _byte_ladder() -> list[int]:
    # Below 10 of a unit, quarters (whole bytes from KiB up); then whole units; then tens.
    ladder: set[int] = set()
    for power, _ in enumerate(_UNITS):
        unit = 1024 ** power
        steps = [m / 4 for m in range(4, 40)] if power else list(range(1, 10))
        steps += list(range(10, 100)) + list(range(100, 1030, 10))
        ladder.update(int(s * unit) for s in steps)
    return sorted(ladder)


_LADDER = _byte_ladder()


def _settled(value: float) -> float:
    # A product like 0.05 * 1.5 is 0.07500000000000001 in binary: rounding up must not see that.
    return float(f"{value:.12g}")


def round_up_bytes(value: float) -> int:
    """The smallest readable whole number of bytes >= value (at least 1)."""
    value = _settled(value)
    if value <= 1:
        return 1
    i = bisect.bisect_left(_LADDER, value)
    return _LADDER[i] if i < len(_LADDER) else math.ceil(value)


def round_up_2sig(value: float) -> float:
    """`value` rounded up to two significant digits, exactly (0.0347 -> 0.035, 157 -> 160)."""
    if value <= 0:
        raise ValueError(f"expected a positive value, got {value!r}")
    d = Decimal(repr(_settled(value)))
    quantum = Decimal(1).scaleb(d.adjusted() - 1)
    return float((d / quantum).to_integral_value(ROUND_CEILING) * quantum)


def format_bytes(value: float) -> str:
    """1572864 -> '1.5 MiB'; three significant digits at most."""
    if value != value:
        return ""
    power = 0
    while abs(value) >= 1024 and power < len(_UNITS) - 1:
        value /= 1024
        power += 1
    if power == 0:
        return f"{value:.0f} B"
    # 1000 to 1023 of a unit: whole, not 1.01e+03.
    return f"{value:.0f} {_UNITS[power]}" if value >= 1000 else f"{value:.3g} {_UNITS[power]}"


def format_number(value: float) -> str:
    """A quota value as kafka-configs and YAML take it: whole numbers without a decimal point,
    others in their shortest exact form."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def format_value(value: float, unit: str) -> str:
    """A measured value in its unit, for tables and plots: bytes/s in binary units."""
    if value != value:
        return ""
    if unit == "B/s":
        return format_bytes(value) + "/s"
    if unit == "B":
        return format_bytes(value)
    return f"{value:.3g} {unit}"
