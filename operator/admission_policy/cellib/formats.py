"""Kubernetes' format library: ``format.dns1123Label().validate(name)`` and the other named formats.

``<format>.validate(s)`` is ``optional.none()`` when ``s`` is valid, else the list of what is
wrong with it, in the words of the Kubernetes validation it names (``k8s.io/apimachinery``'s
``IsDNS1123Label`` …, kube-openapi's formats, Go's ``url.ParseRequestURI``), so that a
``messageExpression`` can show them: ``format.dns1123Label().validate(x).value().join(", ")``.

cel-expr-python can neither return an optional from Python nor declare an optional result, so
``format.named`` and ``validate`` are declared as returning dyn, and each call of them runs as
``optional.ofNonZeroValue`` of a helper that returns the value itself, or its zero value for
none (``rewrite``). Go measures lengths in bytes and slices bytes; so does this module where
the difference shows.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, NoReturn

from cel_expr_python import cel

from .library import Library, function, overload
from .net import NetipError, parse_addr
from .types import opaque

NAMED_FORMAT: Final = opaque("kubernetes.NamedFormat")


# --- Go's text conventions ------------------------------------------------------------------

_GO_ESCAPES: Final = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v",
                      "\\": r"\\", '"': r"\""}


def go_quote(text: str) -> str:
    """``text`` as Go's ``strconv.Quote`` (``%q``) writes it; a byte that is not UTF-8, which
    ``surrogateescape`` decoding keeps as a lone surrogate, is written ``\\xNN`` as Go does."""
    out = []
    for char in text:
        code = ord(char)
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():
            out.append(char)
        else:
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _byte_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


# --- k8s.io/apimachinery's validation --------------------------------------------------------

_DNS1123_LABEL: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN: Final = _DNS1123_LABEL + r"(\." + _DNS1123_LABEL + ")*"
_DNS1035_LABEL: Final = "[a-z]([-a-z0-9]*[a-z0-9])?"
_LABEL_KEY: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE: Final = "(" + _LABEL_KEY + ")?"

_LABEL_KEY_MESSAGE: Final = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                             "with an alphanumeric character")
_SUBDOMAIN_MESSAGE: Final = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                             "'-' or '.', and must start and end with an alphanumeric character")


def _matches(pattern: str, value: str) -> bool:
    """Go's ``regexp.MatchString("^" + pattern + "$", value)``: ``$`` is the end of the text."""
    return re.fullmatch(pattern, value) is not None


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    """apimachinery's ``RegexError`` (whose examples read "'a',  or 'b', ", two spaces and all)."""
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{pattern}')"


def _too_long(limit: int, unit: str) -> str:
    """``MaxLenError``: "characters" in util/validation, "bytes" in api/validate/content."""
    return f"must be no more than {limit} {unit}"


def _subdomain(value: str, unit: str) -> list[str]:
    errors = [_too_long(253, unit)] if _byte_length(value) > 253 else []
    if not _matches(_DNS1123_SUBDOMAIN, value):
        errors.append(_regex_error(_SUBDOMAIN_MESSAGE, _DNS1123_SUBDOMAIN, "example.com"))
    return errors


def is_dns1123_subdomain(value: str) -> list[str]:
    return _subdomain(value, "characters")


def is_dns1123_label(value: str) -> list[str]:
    errors = [_too_long(63, "characters")] if _byte_length(value) > 63 else []
    if not _matches(_DNS1123_LABEL, value):
        if _matches(_DNS1123_SUBDOMAIN, value):   # a valid subdomain, and the length was checked: dots
            errors.append("must not contain dots")
        else:
            errors.append(_regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                "start and end with an alphanumeric character", _DNS1123_LABEL, "my-name", "123-abc"))
    return errors


def is_dns1035_label(value: str) -> list[str]:
    errors = [_too_long(63, "characters")] if _byte_length(value) > 63 else []
    if not _matches(_DNS1035_LABEL, value):
        errors.append(_regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
            "character, and end with an alphanumeric character", _DNS1035_LABEL, "my-name", "abc-123"))
    return errors


def is_qualified_name(value: str) -> list[str]:
    """A label key: an optional DNS subdomain and '/', then a name (``content.IsLabelKey``)."""
    parts = value.split("/")
    if len(parts) > 2:
        return ["a valid label key " + _regex_error(_LABEL_KEY_MESSAGE, _LABEL_KEY, "MyName", "my.name", "123-abc")
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    errors = []
    name = parts[-1]
    if len(parts) == 2 and not parts[0]:
        errors.append("prefix part must be non-empty")
    elif len(parts) == 2:
        errors += ["prefix part " + error for error in _subdomain(parts[0], "bytes")]
    if not name:
        errors.append("name part must be non-empty")
    elif _byte_length(name) > 63:
        errors.append("name part " + _too_long(63, "bytes"))
    if not _matches(_LABEL_KEY, name):
        errors.append("name part " + _regex_error(_LABEL_KEY_MESSAGE, _LABEL_KEY, "MyName", "my.name", "123-abc"))
    return errors


def is_label_value(value: str) -> list[str]:
    errors = [_too_long(63, "bytes")] if _byte_length(value) > 63 else []
    if not _matches(_LABEL_VALUE, value):
        errors.append(_regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
            "must start and end with an alphanumeric character", _LABEL_VALUE, "MyValue", "my_value", "12345"))
    return errors


def _prefix(validate: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """A name that something will be appended to (``generateName``) may end with '-'.

    As Kubernetes' ``maskTrailingDash`` does, the last *two* bytes are replaced by one "a"."""
    def masked(value: str) -> list[str]:
        raw = value.encode("utf-8", "surrogateescape")
        return validate(_text(raw[:-2] + b"a") if len(raw) > 1 and raw.endswith(b"-") else value)
    return masked


# --- kube-openapi's string formats -------------------------------------------------------------

_UUID: Final = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}")
_BASE64: Final = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})")
_DATE: Final = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIME: Final = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")
_DAYS: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_date(value: str) -> bool:
    """Go's ``time.Parse("2006-01-02", value)`` succeeds (years 0000-9999, leap days checked)."""
    found = _DATE.fullmatch(value)
    if found is None:
        return False
    year, month, day = (int(part) for part in found.groups())
    if not 1 <= month <= 12:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return 1 <= day <= _DAYS[month - 1] + (month == 2 and leap)


def is_datetime(value: str) -> bool:
    """kube-openapi's ``IsDateTime``: a date, a "t" or "T", a time with a zone; text after a
    second "t" is ignored, as there."""
    if _byte_length(value) < 4:
        return False
    # Go lowercases rune by rune (simple case mapping): the length never changes.
    parts = "".join(char.lower() if len(char.lower()) == 1 else char for char in value).split("t")
    if len(parts) < 2 or not is_date(parts[0]):
        return False
    found = _TIME.fullmatch(parts[1])
    return found is not None and found[1] <= "23" and found[2] <= "59" and found[3] <= "59"


# --- Go's url.ParseRequestURI ----------------------------------------------------------------

_LETTERS: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_HOST_BYTES: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                               b"-_.~!$&'()*+,;=:[]<>\"")
_USERINFO_BYTES: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                   b"-._:~!$&'()*+,;=%@")
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")


class _UrlError(Exception):
    """Why Go's parser stops (the text after ``parse "<url>": ``)."""


def _unescape(data: bytes, mode: str = "") -> bytes:
    """Go's ``unescape``: percent escapes must be whole; a host ("host", "zone") also refuses
    ASCII that would need escaping, and escapes of ASCII but for "%25"."""
    if not mode and b"%" not in data:   # a path without escapes (long ones are common)
        return data
    out, index = bytearray(), 0
    while index < len(data):
        byte = data[index]
        if byte == ord("%"):
            escape = data[index:index + 3]
            if len(escape) < 3 or not set(escape[1:]) <= _HEX:
                raise _UrlError(f"invalid URL escape {go_quote(_text(escape))}")
            value = int(escape[1:], 16)
            if mode == "host" and value < 0x80 and escape != b"%25":
                raise _UrlError(f"invalid URL escape {go_quote(_text(escape))}")
            if mode == "zone" and escape != b"%25" and value != 0x20 and value not in _HOST_BYTES:
                raise _UrlError(f"invalid URL escape {go_quote(_text(escape))}")
            out.append(value)
            index += 3
            continue
        if mode and byte < 0x80 and byte not in _HOST_BYTES:
            raise _UrlError(f"invalid character {go_quote(chr(byte))} in host name")
        out.append(byte)
        index += 1
    return bytes(out)


def _valid_port(colon_port: bytes) -> bool:
    """Empty, or ":" and digits (maybe none)."""
    return not colon_port or (colon_port[:1] == b":" and all(0x30 <= byte <= 0x39 for byte in colon_port[1:]))


def _parse_host(scheme: bytes, host: bytes) -> None:
    opening = host.rfind(b"[")
    if opening > 0:
        raise _UrlError("invalid IP-literal")
    if opening == 0:   # [IPv6]:port, with an optional zone: [fe80::1%25en0]
        closing = host.rfind(b"]")
        if closing < 0:
            raise _UrlError("missing ']' in host")
        if not _valid_port(host[closing + 1:]):
            raise _UrlError(f"invalid port {go_quote(_text(host[closing + 1:]))} after host")
        name = host[1:closing]
        zone = name.find(b"%25")
        address = (_unescape(name[:zone], "host") + _unescape(name[zone:], "zone") if zone >= 0
                   else _unescape(name, "host"))
        try:
            is_ipv4 = parse_addr(_text(address)).is4
        except NetipError as error:
            raise _UrlError(f"invalid host: {error}") from None
        if is_ipv4:   # brackets hold IPv6 addresses only
            raise _UrlError("invalid IP-literal")
        return
    colon = host.find(b":")
    if colon >= 0:
        # More than one colon: http(s) hosts are strict (the first starts the port), others
        # are lists of hosts (the last starts the port).
        if scheme not in (b"http", b"https"):
            colon = host.rfind(b":")
        if not _valid_port(host[colon:]):
            raise _UrlError(f"invalid port {go_quote(_text(host[colon:]))} after host")
    _unescape(host, "host")


def _parse_authority(scheme: bytes, authority: bytes) -> None:
    at = authority.rfind(b"@")
    _parse_host(scheme, authority[at + 1:])
    if at < 0:
        return
    userinfo = authority[:at]
    if not set(userinfo) <= _USERINFO_BYTES:
        raise _UrlError("net/url: invalid userinfo")
    for part in userinfo.split(b":", 1):
        _unescape(part)


def _scheme(raw: bytes) -> tuple[bytes, bytes]:
    """(scheme, rest): a scheme is a letter, then letters, digits, "+", "-" or "."; then ":"."""
    for index, byte in enumerate(raw):
        if byte in _LETTERS or (index > 0 and byte in b"0123456789+-."):
            continue
        if byte == ord(":"):
            if index == 0:
                raise _UrlError("missing protocol scheme")
            return raw[:index].lower(), raw[index + 1:]
        break
    return b"", raw


def request_uri_error(text: str) -> str | None:
    """The error of Go's ``url.ParseRequestURI(text)`` (an absolute URI, or an absolute path),
    or None. Go 1.26's rules: strict colons in http(s) hosts, IPv6 only in brackets."""
    raw = text.encode()
    try:
        if any(byte < 0x20 or byte == 0x7F for byte in raw):
            raise _UrlError("net/url: invalid control character in URL")
        if not raw:
            raise _UrlError("empty url")
        if raw == b"*":
            return None
        scheme, rest = _scheme(raw)
        rest = rest[:-1] if rest.endswith(b"?") and rest.count(b"?") == 1 else rest.partition(b"?")[0]
        if not rest.startswith(b"/"):
            if scheme:   # scheme:opaque (mailto:someone), which Go does not look into
                return None
            raise _UrlError("invalid URI for request")
        if scheme and rest.startswith(b"//"):
            authority, slash, path = rest[2:].partition(b"/")
            _parse_authority(scheme, authority)
            rest = slash + path
        _unescape(rest)
    except _UrlError as error:
        return f"parse {go_quote(text)}: {error}"
    return None


# --- the CEL functions ---------------------------------------------------------------------

def _one(message: str, test: Callable[[str], bool]) -> Callable[[str], list[str]]:
    return lambda value: [] if test(value) else [message]


def _uri(value: str) -> list[str]:
    error = request_uri_error(value)
    return [] if error is None else [error]


# Each name of ``format.named``, and ``format.<name>()``, with its validation.
FORMATS: Final[Mapping[str, Callable[[str], list[str]]]] = {
    "dns1123Label": is_dns1123_label,
    "dns1123Subdomain": is_dns1123_subdomain,
    "dns1035Label": is_dns1035_label,
    "qualifiedName": is_qualified_name,
    "dns1123LabelPrefix": _prefix(is_dns1123_label),
    "dns1123SubdomainPrefix": _prefix(is_dns1123_subdomain),
    "dns1035LabelPrefix": _prefix(is_dns1035_label),
    "labelValue": is_label_value,
    "uri": _uri,
    "uuid": _one("does not match the UUID format", lambda value: _UUID.fullmatch(value) is not None),
    "byte": _one("invalid base64", lambda value: _BASE64.fullmatch(value) is not None),
    "date": _one("invalid date", is_date),
    "datetime": _one("invalid datetime", is_datetime),
}

# Helpers the calls of ``format.named`` and ``validate`` run as (see ``rewrite``): "@" keeps
# them out of reach of expressions, which cannot spell it.
NAMED_HELPER: Final = "@format.named"
VALIDATE_HELPER: Final = "@format.validate"
# Overload id of a function declared with an optional result → the helper that computes it.
OPTIONAL_RESULTS: Final[Mapping[str, str]] = {"format-named": NAMED_HELPER, "format-validate": VALIDATE_HELPER}


def _named_or_zero(name: str) -> Any:
    """The format of that name, or a format with no name (the zero value: none)."""
    return NAMED_FORMAT.of(name if name in FORMATS else "")


def _errors(named_format: Any, value: str) -> list[str]:
    """What is wrong with ``value``: the empty list (the zero value: none) when nothing is."""
    name = NAMED_FORMAT.state(named_format)
    if name not in FORMATS:   # a message built by hand: kubernetes.NamedFormat{state: "…"}
        raise ValueError(f"unknown format {go_quote(name)}")
    return FORMATS[name](value)


def _not_rewritten(*_: Any) -> NoReturn:
    raise ValueError("internal error: a call returning an optional ran without being rewritten")


_S, _F = cel.Type.STRING, NAMED_FORMAT.type
_STRINGS = cel.Type.List(_S)
# Kubernetes declares optional<NamedFormat> and optional<list<string>>; cel-expr-python cannot
# declare an optional result (the type it builds is not the optional type ``hasValue()`` takes),
# so they are checked as dyn, which ``hasValue()``, ``value()`` and ``orValue()`` accept.
_OPTIONAL = cel.Type.DYN

LIBRARY: Final = Library("formats", "1.31", functions=(
    *(function(f"format.{name}", overload(f"format.{name}", _F, [], functools.partial(NAMED_FORMAT.of, name)))
      for name in FORMATS),
    function("format.named", overload("format-named", _OPTIONAL, [_S], _not_rewritten)),
    function("validate", overload("format-validate", _OPTIONAL, [_F, _S], _not_rewritten, member=True)),
    function(NAMED_HELPER, overload("format-named-or-zero", _F, [_S], _named_or_zero)),
    function(VALIDATE_HELPER, overload("format-validate-errors", _STRINGS, [_F, _S], _errors)),
), summary="named string formats (DNS names, label keys and values, URI, UUID, base64, dates): "
           "format.<name>().validate(s), format.named(name)")
