"""Kubernetes' quantity library: ``quantity('1.5Gi')``, ``isQuantity``, and exact arithmetic.

A ``kubernetes.Quantity`` holds the exact value of Go's ``resource.Quantity``: parsed by its
rules, refused with its messages, finer than a nano-unit rounded away from zero ("0.9n" is 1n),
binary-suffixed values capped at 2^63-1; then added, subtracted and compared exactly, however
large ("9999999999999999999999999999999999999" plus 1 loses nothing).

The value's text is Kubernetes' canonical form of the value in decimal SI ("1.5" reads "1500m",
"1Gi" reads "1073741824"): ``==`` compares the texts, and they must be equal exactly when
Kubernetes' ``Equal`` says so (``quantity('1Ki') == quantity('1024')``). So a value cannot also
remember how it was written, which Kubernetes' does, and two things follow by the value alone:

- ``isInteger``/``asInteger`` accept any integer within int64, as Kubernetes documents them.
  Its implementation also refuses some of those by how they were written ("1000m", "1.0",
  "1.5Gi", 19 digits or more); its own tests mark those answers as ones to fix.
- ``asApproximateFloat`` is the nearest double; Kubernetes' may differ in the last binary digit.

Besides Kubernetes' functions, this project adds ``<``, ``<=``, ``>``, ``>=`` between quantities
and ``formatQuantity`` (the canonical text).
"""
from __future__ import annotations

import dataclasses
import decimal
import functools
import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

from cel_expr_python import cel

from ...errors import AdmissionPolicyError
from .library import Function, Library, accepts, function, overload
from .types import opaque

QUANTITY: Final = opaque("kubernetes.Quantity")

# resource.ParseQuantity's errors, word for word.
FORMAT_WRONG: Final = ("quantities must match the regular expression "
                       "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
NUMERIC: Final = "unable to parse numeric part of quantity"
SUFFIX: Final = "unable to parse quantity's suffix"
NOT_AN_INTEGER: Final = "cannot convert value to integer"   # asInteger's

_DIGITS: Final = frozenset("0123456789")
_SUFFIX_LETTERS: Final = frozenset("eEinumkKMGTP")
_DECIMAL_SI: Final = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SI_OF_EXPONENT: Final = {exponent: suffix for suffix, exponent in _DECIMAL_SI.items()}
_EXPONENT: Final = re.compile(r"[+-]?[0-9]+")
_STATE: Final = re.compile(r"-?[1-9][0-9]*(?:[numkMGTPE]|e-?[0-9]+)?")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NANO: Final = Decimal("1e-9")
# Go keeps a quantity of up to 18 digits (a binary one: 15, less about 0.3 per power of two) in
# its int64 form, exactly; more, or finer than a nano-unit, take its arbitrary-precision path,
# which is where the rounding, the binary cap and the error for a number without digits are.
_INT64_DIGITS: Final = 18
_BINARY_INT64_DIGITS: Final = 15
# A sum whose exact digits would pass this (1e100000 + 1) is refused: Kubernetes would build it.
MAX_DIGITS: Final = 100_000

# Every operation is exact (a value needing more digits than MAX_DIGITS is refused before).
_EXACT: Final = decimal.Context(prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN,
                                traps=[decimal.InvalidOperation, decimal.Overflow, decimal.Inexact])
_ROUNDING: Final = decimal.Context(prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN,
                                   rounding=decimal.ROUND_UP, traps=[decimal.InvalidOperation])


class QuantityError(AdmissionPolicyError, ValueError):
    """Not a quantity; the message is Kubernetes' own."""


# --- parsing, as resource.ParseQuantity --------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Parts:
    negative: bool
    number: str     # sign, digits and point as written: what Go's slow path reads
    whole: str      # integer digits without leading zeros, "0" for none
    fraction: str   # the digits after the point
    suffix: str


def _digits_end(text: str, start: int) -> int:
    end = start
    while end < len(text) and text[end] in _DIGITS:
        end += 1
    return end


def _scan(text: str) -> _Parts:
    """Split a quantity into number and suffix the way Kubernetes' scanner does; "." and "+"
    are numbers (zero) to it, and a suffix is letters, then an optional sign and digits."""
    negative = text.startswith("-")
    position = 1 if text[:1] in ("+", "-") else 0
    while position < len(text) and text[position] == "0":
        position += 1
    if position == len(text):
        return _Parts(negative, "0", "0", "", "")
    end = _digits_end(text, position)
    whole, fraction = text[position:end] or "0", ""
    if end < len(text) and text[end] == ".":
        fraction_end = _digits_end(text, end + 1)
        fraction, end = text[end + 1:fraction_end], fraction_end
    number, suffix_start = text[:end], end
    while end < len(text) and text[end] in _SUFFIX_LETTERS:
        end += 1
    if end < len(text) and text[end] in "+-":
        end += 1
    if _digits_end(text, end) != len(text):
        raise QuantityError(FORMAT_WRONG)
    return _Parts(negative, number, whole, fraction, text[suffix_start:])


def _int32(number: int) -> int:
    """Go's int32 arithmetic: Kubernetes keeps exponents in int32, so they wrap ("1e4294967296" is 1)."""
    return (number + 2**31) % 2**32 - 2**31


def _interpret(suffix: str) -> tuple[int, int]:
    """(base, exponent) of a suffix: decimal SI, binary SI, or an exponent as "e3" / "E-3"."""
    if suffix in _DECIMAL_SI:
        return 10, _DECIMAL_SI[suffix]
    if suffix in _BINARY_SI:
        return 2, _BINARY_SI[suffix]
    if len(suffix) > 1 and suffix[0] in "eE" and _EXPONENT.fullmatch(suffix[1:]):
        sign, digits = ("-" if suffix[1] == "-" else ""), suffix[1:].lstrip("+-").lstrip("0") or "0"
        # Go's ParseInt(…, 64) on the digits without their leading zeros ("1e0…01" is 1e1).
        if len(digits) <= 19 and _INT64_MIN <= int(sign + digits) <= _INT64_MAX:
            return 10, _int32(int(sign + digits))
    raise QuantityError(SUFFIX)


def parse_quantity(text: str) -> Decimal:
    """The value Kubernetes parses ``text`` as, or QuantityError with its message."""
    if not text:
        raise QuantityError(FORMAT_WRONG)
    parts = _scan(text)
    base, exponent = _interpret(parts.suffix)
    digits = parts.whole + parts.fraction
    if base == 10:
        scale = _int32(exponent - len(parts.fraction))
        if len(digits) <= _INT64_DIGITS and scale >= -9:   # Go's int64 path: exact, nothing to round
            return _signed(parts.negative, Decimal(digits).scaleb(scale, _EXACT))
    elif not parts.fraction and len(parts.whole) + exponent * 3 // 10 + 1 <= _BINARY_INT64_DIGITS:
        return _signed(parts.negative, Decimal(int(digits) << exponent))
    if not _DIGITS.intersection(parts.number):
        raise QuantityError(NUMERIC)   # "." alone is zero above, but not to the decimal parser
    if base == 10:
        value = Decimal(digits).scaleb(-_int32(len(parts.fraction) + _int32(-exponent)), _EXACT)
    else:
        value = _EXACT.multiply(Decimal(digits), 1 << exponent).scaleb(-len(parts.fraction), _EXACT)
    if value and _exponent(value) < -9:
        value = value.quantize(_NANO, context=_ROUNDING)   # away from zero: a request gets something
    if base == 2 and value > _INT64_MAX:
        value = Decimal(_INT64_MAX)
    return _signed(parts.negative, value)


def _signed(negative: bool, magnitude: Decimal) -> Decimal:
    # copy_negate, not "-": Python's operators round to the thread's context (28 digits).
    if not magnitude:
        return Decimal(0)   # never a negative zero
    return magnitude.copy_negate() if negative else magnitude


def _exponent(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)   # quantities are finite
    return exponent


# --- the canonical text -----------------------------------------------------------------------

def canonical(value: Decimal) -> str:
    """Kubernetes' String() of the value as a decimal-SI quantity: an integer mantissa, the
    exponent a multiple of 3 and as large as can be, SI suffixes up to E, "e21" beyond."""
    if not value:
        return "0"
    normal = _EXACT.normalize(value)
    sign, digits, exponent = normal.is_signed(), normal.as_tuple().digits, _exponent(normal)
    padding = exponent % 3
    suffix = _SI_OF_EXPONENT.get(exponent - padding, f"e{exponent - padding}")
    return ("-" if sign else "") + "".join(map(str, digits)) + "0" * padding + suffix


@functools.lru_cache(maxsize=4096)
def _decode(state: str) -> Decimal:
    """The value a canonical text stands for (refusing any other text: a hand-built message)."""
    if _STATE.fullmatch(state):
        mantissa, _, exponent = state.partition("e")
        if not exponent and mantissa[-1] in _DECIMAL_SI:
            mantissa, exponent = mantissa[:-1], str(_DECIMAL_SI[mantissa[-1]])
        value = Decimal(f"{mantissa}E{exponent or 0}")
        if canonical(value) == state:
            return value
    elif state == "0":
        return Decimal(0)
    raise ValueError(f"{state!r} is not the text of a kubernetes.Quantity")


def value_of(quantity: Any) -> Decimal:
    """The exact value a CEL ``kubernetes.Quantity`` holds (its state is its canonical text)."""
    return _decode(QUANTITY.state(quantity))


def of(value: Decimal) -> Any:
    """A CEL ``kubernetes.Quantity`` of ``value``, in canonical form, so equal values are equal states."""
    return QUANTITY.of(canonical(value))


# --- arithmetic ------------------------------------------------------------------------------

def add(a: Decimal, b: Decimal) -> Decimal:
    """The exact sum; refused only when it would need more than MAX_DIGITS digits."""
    if a and b and max(a.adjusted(), b.adjusted()) - min(_exponent(a), _exponent(b)) >= MAX_DIGITS:
        raise ValueError(f"the quantities' exact sum would have more than {MAX_DIGITS:,} digits")
    return _EXACT.add(a, b)


def compare(a: Decimal, b: Decimal) -> int:
    """-1, 0 or 1, as Kubernetes' Quantity.Cmp."""
    return (a > b) - (a < b)


def as_integer(value: Decimal) -> int:
    """The value as an int64, or Kubernetes' error when it is not an integer in range."""
    if not _INT64_MIN <= value <= _INT64_MAX or value != value.to_integral_value():
        raise ValueError(NOT_AN_INTEGER)
    return int(value)


def _format_double(number: float) -> str:
    """formatQuantity of a double, as before quantities were their own type: whole numbers as
    digits, else millis when exact, else nanos (kept so that such policies read the same)."""
    if not math.isfinite(number):
        raise ValueError(f"formatQuantity: {number} is not a quantity")
    exact = Decimal(repr(number))
    if exact == exact.to_integral_value():
        return str(int(exact))
    milli = exact * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return f"{int((exact * 10**9).to_integral_value())}n"


def _quantity(text: str) -> Any:
    return of(parse_quantity(text))


def _unary(compute: Callable[[Decimal], Any]) -> Callable[[Any], Any]:
    """An impl of one quantity argument, given the function of its value."""
    return lambda quantity: compute(value_of(quantity))


def _binary(compute: Callable[[Decimal, Decimal], Any]) -> Callable[[Any, Any], Any]:
    """An impl of a quantity and a quantity or an int, given the function of their values."""
    def impl(quantity: Any, other: Any) -> Any:
        return compute(value_of(quantity), Decimal(other) if isinstance(other, int) else value_of(other))
    return impl


def _functions() -> tuple[Function, ...]:
    q, string, boolean, integer, double = QUANTITY.type, cel.Type.STRING, cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE
    plus = _binary(lambda a, b: of(add(a, b)))
    minus = _binary(lambda a, b: of(add(a, b.copy_negate())))
    return (
        function("quantity", overload("string_to_quantity", q, [string], _quantity)),
        function("isQuantity", overload("is_quantity_string", boolean, [string],
                                        accepts(parse_quantity, QuantityError))),
        # Kubernetes declares sign() as a global function, not a method: sign(q), not q.sign().
        function("sign", overload("quantity_sign", integer, [q], _unary(lambda value: compare(value, Decimal(0))))),
        function("isInteger", overload("quantity_is_integer", boolean, [q], _unary(accepts(as_integer)),
                                       member=True)),
        function("asInteger", overload("quantity_get_int", integer, [q], _unary(as_integer), member=True)),
        function("asApproximateFloat", overload("quantity_get_float", double, [q], _unary(float), member=True)),
        function("isGreaterThan", overload("quantity_is_greater_than", boolean, [q, q],
                                           _binary(lambda a, b: a > b), member=True)),
        function("isLessThan", overload("quantity_is_less_than", boolean, [q, q],
                                        _binary(lambda a, b: a < b), member=True)),
        function("compareTo", overload("quantity_compare_to", integer, [q, q], _binary(compare), member=True)),
        function("add", overload("quantity_add", q, [q, q], plus, member=True),
                 overload("quantity_add_int", q, [q, integer], plus, member=True)),
        function("sub", overload("quantity_sub", q, [q, q], minus, member=True),
                 overload("quantity_sub_int", q, [q, integer], minus, member=True)),
    )


def _ours() -> tuple[Function, ...]:
    """This project's additions: operators and a text, which Kubernetes' library lacks."""
    q, string, boolean, double = QUANTITY.type, cel.Type.STRING, cel.Type.BOOL, cel.Type.DOUBLE
    return (
        *(function(operator, overload(f"{name}_quantity", boolean, [q, q], _binary(test)))
          for operator, name, test in (
              ("_<_", "less", lambda a, b: a < b), ("_<=_", "less_equals", lambda a, b: a <= b),
              ("_>_", "greater", lambda a, b: a > b), ("_>=_", "greater_equals", lambda a, b: a >= b))),
        function("formatQuantity", overload("format_quantity", string, [q], _unary(canonical)),
                 overload("format_quantity_double", string, [double], _format_double)),
    )


LIBRARY: Final = Library(
    "quantity", "1.28", _functions(),
    "quantity(), isQuantity(), sign, isInteger/asInteger, asApproximateFloat, add/sub, comparisons, exact")
# Not portable to ValidatingAdmissionPolicy: ``admission-policy lint`` says so of a policy using them.
OURS: Final = Library("quantity-extensions", "ours", _ours(),
                      "<, <=, >, >= between quantities and formatQuantity() (the canonical text)")
