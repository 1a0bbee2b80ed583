"""``'…'.format([…])`` as cel-go's strings extension version 2 does it (Kubernetes' VAP environment).

cel-cpp's format differs in many places: ``'%d'.format([1.0])`` prints ``1.000000`` (cel-go: an
error), ``%e`` prints ``3.140000e+00`` (cel-go, through golang.org/x/text's en-US printer:
``3.140000\u202f\u00d7\u202f10⁰⁰``), ``%f`` has no thousands separators, ``%s`` of a list or map writes CEL
literals differently. So ``compat`` sends every call here. ``check`` is cel-go's compile-time
validator: a literal format string with a literal list is checked clause by clause against the
arguments' types.

Values arrive converted to Python: a uint is an int (printed the same by every clause), and
timestamps and durations keep microseconds (cel-go would print nanoseconds).
"""
from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Sequence
from typing import Any, Final

from ...errors import AdmissionPolicyError
from . import gostrings

_SCIENTIFIC_TIMES: Final = "\u202f\u00d7\u202f10"   # x/text's en-US: narrow spaces around a times sign
_SUPERSCRIPTS: Final = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
_SPECIAL_DOUBLES: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_STRING_TYPES: Final = "strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps"


class FormatError(AdmissionPolicyError, ValueError):
    """A format that cannot be applied; ``argument``: the index of the argument at fault, if one is."""

    def __init__(self, message: str, argument: int | None = None) -> None:
        super().__init__(message)
        self.argument = argument


# --- the clauses at run time -----------------------------------------------------------------

def _string(value: Any) -> str:
    """``%s``: cel-go's FormatString."""
    if isinstance(value, list):
        return "[" + ", ".join(_literal(item) for item in value) + "]"
    if isinstance(value, dict):
        return _map(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, float):
        return gostrings.double_text(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            raise ValueError('could not convert argument "invalid UTF-8 in bytes, cannot convert to string" '
                             "to string") from None
    if isinstance(value, datetime.datetime):
        return gostrings.timestamp_text(value)
    if isinstance(value, datetime.timedelta):
        return gostrings.duration_text(value)
    if gostrings.type_name(value) == "type":
        return gostrings.cel_type_name(value)
    raise ValueError(f"string clause can only be used on {_STRING_TYPES}, was given {gostrings.type_name(value)}")


def _literal(value: Any) -> str:
    """An item of a list, or a map's value, written as the CEL literal cel-go writes."""
    if isinstance(value, float):
        text = _go_fixed(value)
        return gostrings.quote(text) if math.isnan(value) or math.isinf(value) else text
    if isinstance(value, datetime.datetime):
        return f"timestamp({gostrings.quote(gostrings.timestamp_text(value))})"
    if isinstance(value, datetime.timedelta):
        return f"duration({gostrings.quote(gostrings.duration_text(value))})"
    name = gostrings.type_name(value)
    if name not in ("bool", "int", "string", "bytes", "null_type", "list", "map", "type"):
        raise ValueError(f"no formatting function for {name}")
    text = _string(value)
    if isinstance(value, str):
        return gostrings.quote(text)
    return "b" + gostrings.quote(text) if isinstance(value, (bytes, bytearray)) else text


def _map(value: dict[Any, Any]) -> str:
    entries = []
    for key, item in value.items():
        if isinstance(key, (bool, str)):
            key_text = gostrings.quote(key) if isinstance(key, str) else _string(key)
        elif isinstance(key, int):
            key_text = str(key)
        else:
            raise ValueError(f"no formatting function for map key of type {gostrings.type_name(key)}")
        entries.append((key_text, _literal(item)))
    entries.sort(key=lambda entry: entry[0].encode())
    return "{" + ", ".join(f"{key}:{item}" for key, item in entries) + "}"


def _go_fixed(value: float) -> str:
    """Go's plain ``%.6f`` (cel-go writes doubles in lists and maps with it)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.6f}"


def _as_double(value: Any, clause: str) -> float:
    """The argument of ``%f``/``%e``: a double, or one of the strings naming NaN and infinities."""
    if isinstance(value, float):
        return value
    if isinstance(value, str) and value in _SPECIAL_DOUBLES:
        return _SPECIAL_DOUBLES[value]
    raise ValueError(f"{clause} clause can only be used on doubles, was given {gostrings.type_name(value)}")


def _special(value: float) -> str | None:
    """x/text's NaN and infinities."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return None


def _fixed(precision: int | None) -> Callable[[Any], str]:
    """``%f``: x/text's en-US decimal, with thousands separators (and no sign for -0)."""
    def clause(value: Any) -> str:
        number = _as_double(value, "fixed-point")
        special = _special(number)
        if special is not None:
            return special
        return ("-" if number < 0 else "") + f"{abs(number):,.{6 if precision is None else precision}f}"
    return clause


def _scientific(precision: int | None) -> Callable[[Any], str]:
    """``%e``: x/text's en-US scientific notation, ``1.052033\u202f\u00d7\u202f10⁰³``."""
    def clause(value: Any) -> str:
        number = _as_double(value, "scientific")
        special = _special(number)
        if special is not None:
            return special
        mantissa, _, exponent = f"{abs(number):.{6 if precision is None else precision}e}".partition("e")
        power = int(exponent)
        digits = f"{'-' if power < 0 else ''}{abs(power):02d}".translate(_SUPERSCRIPTS)
        return ("-" if number < 0 else "") + mantissa + _SCIENTIFIC_TIMES + digits
    return clause


def _integer(clause: str, base: str) -> Callable[[Any], str]:
    """``%d``, ``%o``: ints and uints only."""
    def format_integer(value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            return format(value, base)
        raise ValueError(f"{clause} clause can only be used on integers, was given {gostrings.type_name(value)}")
    return format_integer


def _binary(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return format(value, "b")
    raise ValueError(f"only integers and bools can be formatted as binary, was given {gostrings.type_name(value)}")


def _hex(upper: bool) -> Callable[[Any], str]:
    def clause(value: Any) -> str:
        if isinstance(value, str):
            value = value.encode()
        if isinstance(value, (bytes, bytearray)):
            text = bytes(value).hex()
        elif isinstance(value, int) and not isinstance(value, bool):
            text = format(value, "x")
        else:
            raise ValueError("only integers, byte buffers, and strings can be formatted as hex, was given "
                             f"{gostrings.type_name(value)}")
        return text.upper() if upper else text
    return clause


def _clause(verb: str, precision: int | None) -> Callable[[Any], str]:
    clauses: dict[str, Callable[[Any], str]] = {
        "s": _string, "d": _integer("decimal", "d"), "f": _fixed(precision), "e": _scientific(precision),
        "b": _binary, "x": _hex(upper=False), "X": _hex(upper=True), "o": _integer("octal", "o")}
    if verb not in clauses:
        raise ValueError(f'unrecognized formatting clause "{verb}"')
    return clauses[verb]


# --- the format string ------------------------------------------------------------------------

def _parse_clause(template: str, start: int) -> tuple[int, str, int | None]:
    """At ``start`` (after a ``%``): (the index after the clause, its verb, its precision)."""
    index, precision = start, None
    if template[index] == ".":
        index += 1
        begin = index
        while index < len(template) and template[index].isascii() and template[index].isdigit():
            index += 1
        if index >= len(template):
            raise ValueError("error while parsing precision: could not find end of precision specifier")
        if index == begin:
            raise ValueError('error while parsing precision: error while converting precision to integer: '
                             'strconv.Atoi: parsing "": invalid syntax')
        precision = int(template[begin:index])
    return index + 1, template[index], precision


def _walk(template: str, count: int, substitute: Callable[[int, str, int | None], str]) -> str:
    """cel-go's parseFormatString: ``substitute(argument index, verb, precision)`` for each clause."""
    out: list[str] = []
    index = argument = 0
    while index < len(template):
        if template[index] != "%":
            out.append(template[index])
            index += 1
            continue
        if template[index + 1:index + 2] == "%":
            out.append("%")
            index += 2
            continue
        if argument >= count:
            raise FormatError(f"index {argument} out of range")
        if index + 1 >= len(template):
            raise FormatError("unexpected end of string")
        try:
            index, verb, precision = _parse_clause(template, index + 1)
            _clause(verb, precision)
        except ValueError as error:
            raise FormatError(f"could not parse formatting clause: {error}") from None
        out.append(substitute(argument, verb, precision))
        argument += 1
    return "".join(out)


def format_string(template: str, arguments: Sequence[Any]) -> str:
    """The formatted string, or ValueError with cel-go's message."""
    def substitute(argument: int, verb: str, precision: int | None) -> str:
        try:
            return _clause(verb, precision)(arguments[argument])
        except ValueError as error:
            raise FormatError(f"error during formatting: {error}") from None
    return _walk(template, len(arguments), substitute)


# --- the compile-time check -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Argument:
    """What the checker knows of a literal list's item: its type's name (cel-go's: ``int``,
    ``list``, ``google.protobuf.Duration``, ``dyn`` …) and, for a list or map literal, its items."""
    type: str
    items: tuple[Argument, ...] = ()


_ALLOWED: Final[dict[str, tuple[str, ...]]] = {
    "s": ("list", "map", "int", "uint", "double", "bool", "string", "google.protobuf.Timestamp", "bytes",
          "google.protobuf.Duration", "type", "null_type"),
    "d": ("int", "uint"), "f": ("double", "string"), "e": ("double", "string"), "b": ("int", "uint", "bool"),
    "x": ("int", "uint", "string", "bytes"), "X": ("int", "uint", "string", "bytes"), "o": ("int", "uint"),
}
_CHECK_MESSAGES: Final = {
    "s": f"string clause can only be used on {_STRING_TYPES}", "d": "decimal clause can only be used on integers",
    "f": "fixed-point clause can only be used on doubles", "e": "scientific clause can only be used on doubles",
    "b": "only integers and bools can be formatted as binary",
    "x": "only integers, byte buffers, and strings can be formatted as hex",
    "X": "only integers, byte buffers, and strings can be formatted as hex",
    "o": "octal clause can only be used on integers",
}


def _unfit(argument: Argument, verb: str) -> Argument | None:
    """None if the clause may format the argument, else the (innermost) item it cannot."""
    if argument.type == "dyn":
        return None
    if argument.type not in _ALLOWED[verb]:
        return argument
    if verb == "s":
        for item in argument.items:
            if (bad := _unfit(item, "s")) is not None:
                return bad
    return None


def check(template: str, arguments: Sequence[Argument]) -> tuple[str, int | None] | None:
    """cel-go's validation of ``'<template>'.format([<arguments>])``: None when it passes, else
    (its message, the index of the argument at fault or None for the call)."""
    used: list[int] = []

    def substitute(argument: int, verb: str, precision: int | None) -> str:
        bad = _unfit(arguments[argument], verb)
        if bad is not None:
            raise FormatError(f"error during formatting: {_CHECK_MESSAGES[verb]}, was given {bad.type}", argument)
        used.append(argument)
        return ""
    try:
        _walk(template, len(arguments), substitute)
    except FormatError as error:
        return str(error), error.argument
    if len(arguments) > len(used):
        return f"too many arguments supplied to string.format (expected {len(used)}, got {len(arguments)})", None
    return None
