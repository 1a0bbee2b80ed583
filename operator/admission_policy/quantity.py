"""Kubernetes resource quantities ("500m", "1Gi", "2e3") as plain numbers for CEL.

cel-expr-python cannot back an opaque CEL type with a Python value, so a quantity is its value
in base units as a double: comparisons and arithmetic are ordinary CEL operators, and
``format_quantity`` turns a result back into a canonical quantity string.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

_SUFFIXES: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
    "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
_PATTERN: Final = re.compile(
    r"^(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<exponent>[eE][+-]?\d+)|(?P<suffix>[numkMGTPE]i?))?$"
)


class QuantityError(ValueError):
    pass


def parse_quantity(text: str) -> Decimal:
    """The exact value of a quantity string, or QuantityError saying why it is not one."""
    match = _PATTERN.match(text.strip()) if isinstance(text, str) else None
    if match is None or (match["suffix"] or "") not in _SUFFIXES:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity")
    try:
        number = Decimal(match["number"] + (match["exponent"] or ""))
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only valid numbers
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from exc
    return number * _SUFFIXES[match["suffix"] or ""]


def is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def format_quantity(value: float | Decimal) -> str:
    """A canonical quantity string: whole numbers plain, fractions in milli (or nano) units."""
    exact = Decimal(repr(value)) if isinstance(value, float) else value
    if exact == exact.to_integral_value():
        return str(int(exact))
    milli = exact * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return f"{int((exact * 10**9).to_integral_value())}n"
