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

from .gostrings import quote
from .library import Library, function, overload
from .types import opaque
from .urls import UrlError, parse_request_uri

NAMED_FORMAT: Final = opaque("kubernetes.NamedFormat")


# --- Go's strings are bytes ------------------------------------------------------------------

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
    """apimachinery's ``IsDNS1123Subdomain``: its messages, word for word (empty: valid)."""
    return _subdomain(value, "characters")


def is_dns1123_label(value: str) -> list[str]:
    """apimachinery's ``IsDNS1123Label``, with its special message for a subdomain's dots."""
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
    """apimachinery's ``IsDNS1035Label``: a label that starts with a letter (Service names)."""
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
    """apimachinery's ``IsValidLabelValue``: at most 63 bytes, and empty is valid."""
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
        if len(raw) > 1 and raw.endswith(b"-"):
            return validate((raw[:-2] + b"a").decode("utf-8", "surrogateescape"))
        return validate(value)
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


# --- the CEL functions ---------------------------------------------------------------------

def _one(message: str, test: Callable[[str], bool]) -> Callable[[str], list[str]]:
    return lambda value: [] if test(value) else [message]


def _uri(value: str) -> list[str]:
    """Go's ``url.ParseRequestURI`` accepts it (an absolute URI, or an absolute path)."""
    try:
        parse_request_uri(value.encode())
    except UrlError as error:
        return [str(error)]
    return []


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
        raise ValueError(f"unknown format {quote(name)}")
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
