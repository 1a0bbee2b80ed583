"""cel-go's text of values, and its string functions, where cel-cpp's differ (Kubernetes runs cel-go).

cel-cpp writes ``string(1.0/0.0)`` as ``inf`` (Go: ``+Inf``), ``string(duration('1.5s'))`` as
``1.500s`` (Go: ``1.5s``), a timestamp's fraction with trailing zeros (Go drops them); its
``charAt``/``substring`` errors read differently, its ``indexOf`` and ``lastIndexOf`` refuse an
offset past the end (cel-go 0.26, Kubernetes 1.34's, answers -1), and ``''.split('')`` is
``['']`` (Go: ``[]``). ``compat`` routes those calls here. Errors are ``ValueError`` with
cel-go's message. ``quote`` (Go's ``%q``) also serves the libraries whose error texts quote
their input as Go does.
"""
from __future__ import annotations

import datetime
import decimal
import math
from typing import Any, Final

_ESCAPES: Final = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
                   "\\": "\\\\", '"': '\\"'}
_TYPE_NAMES: Final = {"INT": "int", "UINT": "uint", "DOUBLE": "double", "BOOL": "bool", "STRING": "string",
                      "BYTES": "bytes", "NULL": "null_type", "TYPE": "type", "DYN": "dyn",
                      "TIMESTAMP": "google.protobuf.Timestamp", "DURATION": "google.protobuf.Duration"}


# --- numbers, durations and timestamps as Go writes them ------------------------------------

def _shortest(value: float) -> tuple[str, int]:
    """The shortest digits that read back as ``abs(value)``, and the decimal exponent of the first
    (``1234.5`` → ``("12345", 3)``), as Go's strconv finds them (Python's repr is the same)."""
    _, digits, exponent = decimal.Decimal(repr(abs(value))).normalize().as_tuple()
    text = "".join(map(str, digits))
    assert isinstance(exponent, int)
    return text, len(text) + exponent - 1


def _fixed(digits: str, point: int) -> str:
    """``digits`` (the first one at decimal exponent ``point``) without an exponent."""
    if point < 0:
        return "0." + "0" * (-point - 1) + digits
    whole, fraction = digits[:point + 1].ljust(point + 1, "0"), digits[point + 1:]
    return whole + ("." + fraction if fraction else "")


def double_text(value: float) -> str:
    """Go's ``%g``: cel-go's ``string(double)``, and ``%s`` of a double in ``format``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    digits, exponent = _shortest(value)
    if exponent < -4 or exponent >= 6:   # Go's rule for the shortest form
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    return sign + _fixed(digits, exponent)


def _seconds_text(nanoseconds: int) -> str:
    """Go's ``FormatFloat(d.Seconds(), 'f', -1, 64) + "s"``, through the same float."""
    whole, part = divmod(abs(nanoseconds), 10**9)
    sign = -1 if nanoseconds < 0 else 1
    seconds = float(sign * whole) + float(sign * part) / 1e9
    if seconds == 0:
        return "0s"
    digits, exponent = _shortest(seconds)
    return ("-" if seconds < 0 else "") + _fixed(digits, exponent) + "s"


def duration_text(value: str | datetime.timedelta) -> str:
    """cel-go's text of a duration, from cel-cpp's (``1.500s``, exact) or a Python one (to the µs)."""
    if isinstance(value, datetime.timedelta):
        nanoseconds = ((value.days * 86_400 + value.seconds) * 10**6 + value.microseconds) * 1000
    else:
        nanoseconds = int(decimal.Decimal(value.removesuffix("s")) * 10**9)
    return _seconds_text(nanoseconds)


def timestamp_text(value: str | datetime.datetime) -> str:
    """Go's RFC 3339 with nanoseconds: no trailing zeros in the fraction, no fraction if zero."""
    if isinstance(value, datetime.datetime):
        value = value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    stamp, _, rest = value.partition(".")
    if not rest:
        return value
    fraction = rest.removesuffix("Z").rstrip("0")
    return f"{stamp}.{fraction}Z" if fraction else f"{stamp}Z"


def quote(text: str | bytes) -> str:
    """Go's ``%q`` (strconv.Quote): printable characters as they are, the rest escaped.

    Go's strings are bytes, and its errors quote whatever they were given: a byte that is not
    UTF-8 is written ``\\xNN``. Such bytes reach here as ``bytes``, or as text decoded with
    ``surrogateescape`` (which keeps each as a lone surrogate U+DC80-U+DCFF); both read the same.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable():   # Go's unicode.IsPrint: letters, marks, numbers, punctuation, symbols, ' '
            out.append(char)
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out) + '"'


def type_name(value: Any) -> str:
    """cel-go's name for the type of a value as cel-expr-python gives it to Python (a uint comes
    as an int: its name here is int's)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    names = {float: "double", str: "string", bytes: "bytes", bytearray: "bytes", type(None): "null_type",
             list: "list", dict: "map", datetime.datetime: "google.protobuf.Timestamp",
             datetime.timedelta: "google.protobuf.Duration"}
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    if hasattr(value, "DESCRIPTOR"):
        return str(value.DESCRIPTOR.full_name)
    return "type" if hasattr(value, "is_assignable_from") else type(value).__name__


def cel_type_name(value: Any) -> str:
    """cel-go's name of a type value (``type(1)`` is ``int``, ``type([])`` is ``list``), from
    cel-expr-python's (``INT``, ``LIST<DYN>``)."""
    name = str(value.name())
    base = name.partition("<")[0]
    if base in ("LIST", "MAP"):
        return base.lower()
    return _TYPE_NAMES.get(name, name)


# --- the strings extension, version 2 as cel-go 0.26 has it ------------------------------------

def _out_of_range(index: int) -> ValueError:
    return ValueError(f"index out of range: {index}")


def char_at(text: str, index: int) -> str:
    """``charAt``: the index may be the length (giving ""), as in cel-go; past it is an error."""
    if index < 0 or index > len(text):
        raise _out_of_range(index)
    return text[index:index + 1]


def index_of(text: str, sub: str, offset: int) -> int:
    """``indexOf``: an empty ``sub`` is found at ``offset`` (unchecked), as in cel-go."""
    if not sub:
        return offset
    if offset < 0:
        raise _out_of_range(offset)
    return -1 if offset >= len(text) else text.find(sub, offset)


def last_index_of(text: str, sub: str, offset: int) -> int:
    """``lastIndexOf``: the last ``sub`` starting at or before ``offset``; empty: ``offset``."""
    if not sub:
        return offset
    if offset < 0:
        raise _out_of_range(offset)
    if offset >= len(text):
        return -1
    return text.rfind(sub, 0, min(offset, len(text) - len(sub)) + len(sub))


def substring(text: str, start: int, end: int | None = None) -> str:
    """``substring``: an error, with cel-go's message, for a range Python would quietly clip."""
    if end is not None and start > end:
        raise ValueError(f"invalid substring range. start: {start}, end: {end}")
    for index in (start, end):
        if index is not None and not 0 <= index <= len(text):
            raise _out_of_range(index)
    return text[start:end]


def split(text: str, separator: str, limit: int = -1) -> list[str]:
    """Go's ``strings.SplitN`` (``Split`` for a negative limit)."""
    if limit == 0:
        return []
    if separator:
        return text.split(separator, limit - 1 if limit > 0 else -1)
    count = len(text) if limit < 0 else min(limit, len(text))   # an empty separator splits characters
    return [*text[:count - 1], text[count - 1:]] if count else []
