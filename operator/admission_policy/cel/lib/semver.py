"""Kubernetes' semver library: ``semver('1.2.3')``, ``isSemver``, and comparisons of versions.

Versions are parsed as Kubernetes parses them, with blang/semver v4's ``Parse``, whose error
texts are the CEL error's message (``semver('v1.0')`` fails with "No Major.Minor.Patch elements
found"); ``semver(s, true)`` first normalises ``s`` the way Kubernetes does.

A ``kubernetes.Semver`` value's text is the version without its build metadata: blang/semver
orders versions and tests them for equality without it (``1.0.0+a == 1.0.0+b``), and the
library offers no way to read it back.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Final

from cel_expr_python import cel

from .gostrings import quote  # Go's %q, which blang/semver's errors quote with
from .library import Library, accepts, function, overload
from .types import opaque

SEMVER: Final = opaque("kubernetes.Semver")

_DIGITS: Final = frozenset("0123456789")
_ALPHANUMERIC: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789")
_UINT64_MAX: Final = 2**64 - 1


@dataclasses.dataclass(frozen=True)
class Version:
    """A version as blang/semver holds it, less the build metadata nothing here reads."""
    major: int
    minor: int
    patch: int
    prerelease: tuple[int | str, ...] = ()   # numeric identifiers as ints: they compare as numbers

    def text(self) -> str:
        """blang/semver's ``String()``: the state a ``kubernetes.Semver`` value holds, which ``parse`` reads back."""
        core = f"{self.major}.{self.minor}.{self.patch}"
        return core + ("-" + ".".join(str(part) for part in self.prerelease) if self.prerelease else "")

    def compare(self, other: Version) -> int:
        """-1, 0 or 1, by semver precedence (build metadata plays no part)."""
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if not self.prerelease or not other.prerelease:   # a release follows its pre-releases
            return (not self.prerelease) - (not other.prerelease)
        for a, b in zip(self.prerelease, other.prerelease, strict=False):
            if a != b:
                return -1 if _identifier_key(a) < _identifier_key(b) else 1
        return _sign(len(self.prerelease) - len(other.prerelease))


def _identifier_key(identifier: int | str) -> tuple[int, int, str]:
    """Numeric identifiers come before alphanumeric ones; each kind compares in its own way."""
    return (0, identifier, "") if isinstance(identifier, int) else (1, 0, identifier)


def _sign(number: int) -> int:
    return (number > 0) - (number < 0)


# --- parsing, as blang/semver v4 -----------------------------------------------------------

def _only(text: str, allowed: frozenset[str]) -> bool:
    return all(char in allowed for char in text)


def _has_leading_zero(text: str) -> bool:
    return len(text) > 1 and text[0] == "0"


def _uint64(digits: str) -> int:
    """Go's ``strconv.ParseUint(digits, 10, 64)``, with its error texts."""
    if not digits:
        raise ValueError(f"strconv.ParseUint: parsing {quote(digits)}: invalid syntax")
    # Compared as text first: Python refuses to convert more than 4,300 digits.
    if len(digits.lstrip("0")) > len(str(_UINT64_MAX)) or int(digits) > _UINT64_MAX:
        raise ValueError(f"strconv.ParseUint: parsing {quote(digits)}: value out of range")
    return int(digits)


def _number(text: str, name: str) -> int:
    if not _only(text, _DIGITS):
        raise ValueError(f"Invalid character(s) found in {name.lower()} number {quote(text)}")
    if _has_leading_zero(text):
        raise ValueError(f"{name} number must not contain leading zeroes {quote(text)}")
    return _uint64(text)


def _prerelease_identifier(text: str) -> int | str:
    if not text:
        raise ValueError("Prerelease is empty")
    if _only(text, _DIGITS):
        if _has_leading_zero(text):
            raise ValueError(f"Numeric PreRelease version must not contain leading zeroes {quote(text)}")
        return _uint64(text)
    if _only(text, _ALPHANUMERIC):
        return text
    raise ValueError(f"Invalid character(s) found in prerelease {quote(text)}")


def parse(text: str) -> Version:
    """A strict semantic version (no "v", no leading zeroes, all three numbers), else ValueError
    with blang/semver's message."""
    if not text:
        raise ValueError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise ValueError("No Major.Minor.Patch elements found")
    major, minor = _number(parts[0], "Major"), _number(parts[1], "Minor")
    rest, has_build, build = parts[2].partition("+")
    patch_text, has_prerelease, prerelease = rest.partition("-")
    patch = _number(patch_text, "Patch")
    identifiers = tuple(_prerelease_identifier(part) for part in prerelease.split(".")) if has_prerelease else ()
    for part in build.split(".") if has_build else ():
        if not part:
            raise ValueError("Build meta data is empty")
        if not _only(part, _ALPHANUMERIC):
            raise ValueError(f"Invalid character(s) found in build meta data {quote(part)}")
    return Version(major, minor, patch, identifiers)


def normalize_and_parse(text: str) -> Version:
    """Kubernetes' lenient form: one leading "v" dropped, leading zeroes dropped, a missing minor
    or patch number taken as 0; then parsed strictly (spaces are not trimmed)."""
    parts = text.removeprefix("v").split(".", 2)
    for index, part in enumerate(parts):
        if len(part.encode()) > 1:   # Go counts bytes: "é" is "long" and becomes "0é"
            part = part.lstrip("0")
            parts[index] = part if part and part[0] in _DIGITS else "0" + part
    if len(parts) < 3:
        if any(mark in parts[-1] for mark in "+-"):
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return parse(".".join(parts))


# --- the CEL functions ---------------------------------------------------------------------

def _version(value: Any) -> Version:
    """The version a ``kubernetes.Semver`` value holds (its text is always a valid version)."""
    return parse(SEMVER.state(value))


def _semver(text: str, normalize: bool = False) -> Any:
    version = normalize_and_parse(text) if normalize else parse(text)
    return SEMVER.of(version.text())


def _as_int64(number: int) -> int:
    """Kubernetes returns the uint64 numbers as CEL ints by Go's conversion, which wraps."""
    return number - 2**64 if number >= 2**63 else number


def _compare(a: Any, b: Any) -> int:
    return _version(a).compare(_version(b))


_S, _B, _I, _V = cel.Type.STRING, cel.Type.BOOL, cel.Type.INT, SEMVER.type

LIBRARY: Final = Library("semver", "1.33", functions=(
    function("semver",
             overload("string_to_semver", _V, [_S], _semver),
             overload("string_bool_to_semver", _V, [_S, _B], _semver)),
    function("isSemver",
             overload("is_semver_string", _B, [_S], accepts(_semver)),
             overload("is_semver_string_bool", _B, [_S, _B], accepts(_semver))),
    function("isGreaterThan", overload("semver_is_greater_than", _B, [_V, _V], lambda a, b: _compare(a, b) == 1,
                                       member=True)),
    function("isLessThan", overload("semver_is_less_than", _B, [_V, _V], lambda a, b: _compare(a, b) == -1,
                                    member=True)),
    function("compareTo", overload("semver_compare_to", _I, [_V, _V], _compare, member=True)),
    function("major", overload("semver_major", _I, [_V], lambda v: _as_int64(_version(v).major), member=True)),
    function("minor", overload("semver_minor", _I, [_V], lambda v: _as_int64(_version(v).minor), member=True)),
    function("patch", overload("semver_patch", _I, [_V], lambda v: _as_int64(_version(v).patch), member=True)),
), summary="semantic versions: semver(), isSemver(), major/minor/patch, comparisons")
