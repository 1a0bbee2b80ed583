"""Kubernetes' semver library: ``semver()``, ``isSemver()``, the version numbers and comparisons.

Cases come from Kubernetes' library tests (``semver_test.go``), from blang/semver v4's parser
(whose error texts Kubernetes returns) and from semver.org's precedence rules.
"""
from __future__ import annotations

import itertools

import pytest
from celcases import compile_error, evaluate, evaluation_error

VALUES = [
    # semver(): the value reads back as the version, without build metadata
    ('semver("1.2.3")', "1.2.3"),
    ('semver("0.1.0-alpha.1")', "0.1.0-alpha.1"),
    ('semver("1.2.3-beta.1+build.1")', "1.2.3-beta.1"),
    ('semver("v1.0.0", true)', "1.0.0"),
    ('semver("1.0", true)', "1.0.0"),
    ('semver("1", true)', "1.0.0"),
    ('semver("01.01.01", true)', "1.1.1"),
    ('semver("v01.01", true)', "1.1.0"),
    ('semver("1.2.03-rc.1+b", true)', "1.2.3-rc.1"),
    ('semver("1.2.3", false)', "1.2.3"),
    # the numbers
    ('semver("1.2.3").major()', 1),
    ('semver("1.2.3").minor()', 2),
    ('semver("1.2.3").patch()', 3),
    ('semver("9223372036854775807.0.0").major()', 9223372036854775807),
    ('semver("0.18446744073709551615.0").minor()', -1),    # Go's int64(uint64) wraps
    # equality: build metadata plays no part
    ('semver("1.2.3") == semver("1.2.3")', True),
    ('semver("1.2.3") == semver("1.0.0")', False),
    ('semver("v01.01", true) == semver("1.1.0")', True),
    ('semver("1.0.0+a") == semver("1.0.0+b")', True),
    ('semver("1.0.0-rc.1") == semver("1.0.0")', False),
    ('semver("1.0.0") in [semver("0.9.0"), semver("1.0.0+x")]', True),
    # comparisons
    ('semver("1.0.0").isLessThan(semver("1.2.3"))', True),
    ('semver("1.0.0").isLessThan(semver("1.0.0"))', False),
    ('semver("1.2.3").isGreaterThan(semver("1.0.0"))', True),
    ('semver("1.0.0").isGreaterThan(semver("1.0.0"))', False),
    ('semver("1.2.3").compareTo(semver("1.2.3"))', 0),
    ('semver("1.0.0").compareTo(semver("1.2.3"))', -1),
    ('semver("1.2.3").compareTo(semver("1.0.0"))', 1),
    ('semver("1.10.0").compareTo(semver("1.9.0"))', 1),           # numbers, not text
    ('semver("1.0.0+b").compareTo(semver("1.0.0+a"))', 0),
    ('semver("18446744073709551615.0.0").isGreaterThan(semver("9223372036854775808.0.0"))', True),
]


@pytest.mark.parametrize(("source", "expected"), VALUES)
def test_values(source: str, expected: object) -> None:
    assert evaluate(source) == expected


# semver.org's example of precedence, lowest first.
PRECEDENCE = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11",
              "1.0.0-rc.1", "1.0.0", "2.0.0", "2.1.0", "2.1.1"]


@pytest.mark.parametrize(("lower", "higher"), list(itertools.pairwise(PRECEDENCE)))
def test_precedence(lower: str, higher: str) -> None:
    assert evaluate(f'semver("{lower}").compareTo(semver("{higher}"))') == -1
    assert evaluate(f'semver("{higher}").compareTo(semver("{lower}"))') == 1
    assert evaluate(f'semver("{lower}").isLessThan(semver("{higher}"))') is True
    assert evaluate(f'semver("{higher}").isGreaterThan(semver("{lower}"))') is True


IS_SEMVER = [
    ("1.2.3-beta.1+build.1", False, True),
    ("1.0.0-0.3.7", False, True),
    ("1.0.0-x-y-z.--", False, True),
    ("", False, False),
    ("v1.0.0", False, False),
    (" 1.0.0", False, False),
    ("1. 0.0", False, False),
    ("1.0.0 ", False, False),
    ("01.01.01", False, False),
    ("1", False, False),
    ("1.1", False, False),
    ("1.0.0-01", False, False),
    ("1.0.0+", False, False),
    ("1.0.0-é", False, False),
    ("", True, False),
    (" 1.0.0", True, False),
    ("1. 0.0", True, False),
    ("1.0.0 ", True, False),
    ("v1.0.0", True, True),
    ("01.01.01", True, True),
    ("1", True, True),
    ("1.1", True, True),
    ("vv1.0.0", True, False),
    ("1-rc.1", True, False),
    ("1.0-rc.1", True, False),
]


@pytest.mark.parametrize(("text", "normalize", "expected"), IS_SEMVER)
def test_is_semver(text: str, normalize: bool, expected: bool) -> None:
    assert evaluate("isSemver(object, params)", object=text, params=normalize) is expected
    if not normalize:
        assert evaluate("isSemver(object)", object=text) is expected


ERRORS = [
    ("v1.0", False, "No Major.Minor.Patch elements found"),
    ("", False, "Version string empty"),
    ("a.0.0", False, 'Invalid character(s) found in major number "a"'),
    ("1.b.0", False, 'Invalid character(s) found in minor number "b"'),
    ("1.0.c", False, 'Invalid character(s) found in patch number "c"'),
    ("01.0.0", False, 'Major number must not contain leading zeroes "01"'),
    ("1.00.0", False, 'Minor number must not contain leading zeroes "00"'),
    ("1.0.01-rc", False, 'Patch number must not contain leading zeroes "01"'),
    ("1..0", False, 'strconv.ParseUint: parsing "": invalid syntax'),
    ("18446744073709551616.0.0", False,
     'strconv.ParseUint: parsing "18446744073709551616": value out of range'),
    ("1." + "9" * 5000 + ".0", False,
     'strconv.ParseUint: parsing "' + "9" * 5000 + '": value out of range'),
    ("1.0.0-", False, "Prerelease is empty"),
    ("1.0.0-a..b", False, "Prerelease is empty"),
    ("1.0.0-01", False, 'Numeric PreRelease version must not contain leading zeroes "01"'),
    ("1.0.0-a_b", False, 'Invalid character(s) found in prerelease "a_b"'),
    ("1.0.0+a..b", False, "Build meta data is empty"),
    ("1.0.0+a b", False, 'Invalid character(s) found in build meta data "a b"'),
    ("1.0.0-\u00e9\t", False, 'Invalid character(s) found in prerelease "\u00e9\\t"'),   # quoted as Go's %q
    ("1.0-rc", True, "short version cannot contain PreRelease/Build meta data"),
    ("1-rc.1", True, 'Invalid character(s) found in major number "1-rc"'),   # split at dots first
    ("1.0+b", True, "short version cannot contain PreRelease/Build meta data"),
    (" 1.0.0", True, 'Invalid character(s) found in major number "0 1"'),   # leading zeroes: " 1" is "long"
    ("", True, 'strconv.ParseUint: parsing "": invalid syntax'),
]


@pytest.mark.parametrize(("text", "normalize", "message"), ERRORS)
def test_errors_are_blang_semver_s(text: str, normalize: bool, message: str) -> None:
    assert evaluation_error("semver(object, params)", object=text, params=normalize) == message


def test_an_invalid_version_in_a_comparison_is_an_error() -> None:
    assert evaluation_error('semver("1.0.0").isLessThan(semver("2.0"))') == "No Major.Minor.Patch elements found"


def test_a_version_built_by_hand_is_parsed_too() -> None:
    assert evaluation_error('kubernetes.Semver{state: "1.0"}.major()') == "No Major.Minor.Patch elements found"


@pytest.mark.parametrize(("source", "message"), [
    ("isSemver([1, 2, 3])", "found no matching overload for 'isSemver'"),
    ('semver("1.0.0", "yes")', "found no matching overload for 'semver'"),
    ('semver("1.0.0").isLessThan("2.0.0")', "found no matching overload for 'isLessThan'"),
    ('semver("1.0.0").major() + "x"', "found no matching overload for '_+_'"),
])
def test_misuse_does_not_compile(source: str, message: str) -> None:
    assert message in compile_error(source)
