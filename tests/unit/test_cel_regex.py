"""Kubernetes' regex CEL library: ``find`` and ``findAll`` with Go's ``regexp`` (RE2) syntax.

Cases come from the library's documentation (``pkg/cel/library/regex.go``) and from Go's
``regexp`` rules where Python's ``re`` would answer otherwise: what parses, Go's error texts,
``$`` and ``\\s``, Unicode classes, and how ``FindAllString`` steps past empty matches.
"""
from __future__ import annotations

from typing import Any

import pytest
from celcases import evaluate, evaluation_error

from admission_policy import cel
from admission_policy.api import Expression
from admission_policy.cel import CelCompileError
from admission_policy.cel.lib import regex


def _illegal(code: str, expr: str) -> str:
    return f"Illegal regex: error parsing regexp: {code}: `{expr}`"


VALUES = [
    # find: the leftmost-first match, '' for none
    ("'abc 123'.find('[0-9]+')", "123"),
    ("'abc 123'.find('[0-9]*')", ""),      # the empty match at 0 comes first
    ("'abc 123'.find('xyz')", ""),
    ("''.find('a*')", ""),
    ("'abab'.find('a|ab')", "a"),          # leftmost-first, not longest
    ("'aaa'.find('a+?')", "a"),
    ("'aaa'.find('(?U)a+')", "a"),
    # findAll: an empty match right after a match is skipped, others are kept
    ("'123 abc 456'.findAll('[0-9]*')", ["123", "", "", "", "", "456"]),
    ("'123 abc 456'.findAll('[0-9]+')", ["123", "456"]),
    ("'123 abc 456'.findAll('[0-9]+', 1)", ["123"]),
    ("'123 abc 456'.findAll('[0-9]+', 0)", []),
    ("'123 abc 456'.findAll('[0-9]+', -1)", ["123", "456"]),
    ("'123 abc 456'.findAll('xyz')", []),
    ("'héllo'.findAll('')", ["", "", "", "", "", ""]),   # one per character boundary
    ("'aaa'.findAll('a*?')", ["", "", "", ""]),
    ("'a1b22'.findAll('[0-9]+', 5)", ["1", "22"]),
    # Go's syntax, where Python's re differs
    ("'a\\nb'.find('a$')", ""),            # $ is the end of the text only
    ("'a\\nb'.find('(?m)a$')", "a"),
    ("'x\\u000by'.find('\\\\s')", ""),     # \s has no \v
    ("'x y'.find('\\\\s')", " "),
    ("'١٢'.find('\\\\d')", ""),            # \d is ASCII
    ("'ab'.find('\\\\w+')", "ab"),
    ("'a{,3}'.find('a{,3}')", "a{,3}"),    # not a repetition: literal
    ("'a*'.find('a\\\\Q*\\\\E')", "a*"),
    ("'abc'.find('(?P<first>a)(?<second>b)')", "ab"),
    ("'abc'.find('\\\\x{62}\\\\x63')", "bc"),
    ("'a\\nb'.find('a.b')", ""),
    ("'a\\nb'.find('(?s)a.b')", "a\nb"),
    ("'a\\nb'.find('a[^x]b')", "a\nb"),    # a negated class takes newlines
    ("'ABC'.find('(?i)b')", "B"),
    ("'ABC'.find('(?i:b)C')", "BC"),
    ("'\\u212a'.find('(?i)k')", "\u212a"),  # Kelvin sign folds to k
    ("'\\u212a'.find('(?i)[^k]')", ""),
    ("'\\u017f'.find('(?i)\\\\w')", "\u017f"),
    ("'abc'.find('[[:alpha:]]+')", "abc"),
    ("'a-b'.find('[^[:alpha:]]')", "-"),
    # Unicode classes, with Go's names
    ("'héllo wörld'.findAll('\\\\pL+')", ["héllo", "wörld"]),
    ("'x αβγ'.find('\\\\p{Greek}+')", "αβγ"),
    ("'x αβγ'.find('\\\\p{greek}+')", "αβγ"),
    ("'x αβγ'.find('\\\\p{Letter}+')", "x"),
    ("'Ab1'.find('\\\\p{LC}+')", "Ab"),
    ("'Ab1'.find('[\\\\P{LC}]')", "1"),
    ("'a\\u0378'.find('\\\\p{C}')", "\u0378"),   # Go's C includes unassigned code points
    ("'a\\u0378'.find('\\\\p{Cn}')", "\u0378"),
    ("'\\u0378a'.find('\\\\p{Assigned}')", "a"),
    ("'é'.find('\\\\p{ASCII}')", ""),
    ("'xy'.findAll('\\\\b')", ["", ""]),
]


@pytest.mark.parametrize(("source", "expected"), VALUES)
def test_values(source: str, expected: Any) -> None:
    assert evaluate(source) == expected


ERRORS = [
    ("'abc'.find('[')", _illegal("missing closing ]", "[")),
    ("'abc'.find('[a')", _illegal("missing closing ]", "[a")),
    ("'abc'.find('(a')", _illegal("missing closing )", "(a")),
    ("'abc'.find('a)')", _illegal("unexpected )", "a)")),
    ("'abc'.find('a**')", _illegal("invalid nested repetition operator", "**")),
    ("'abc'.find('a{2}{3}')", _illegal("invalid nested repetition operator", "{2}{3}")),
    ("'abc'.find('*a')", _illegal("missing argument to repetition operator", "*")),
    ("'abc'.find('(|*)')", _illegal("missing argument to repetition operator", "*")),
    ("'abc'.find('a{1001}')", _illegal("invalid repeat count", "{1001}")),
    ("'abc'.find('a{3,2}')", _illegal("invalid repeat count", "{3,2}")),
    ("'abc'.find('(a{500}){3}')", _illegal("invalid repeat count", "{3}")),
    ("'abc'.find('(?=a)')", _illegal("invalid or unsupported Perl syntax", "(?=")),     # look-ahead
    ("'abc'.find('(?<=a)b')", _illegal("invalid named capture", "(?<=a)b")),           # look-behind
    ("'abc'.find('a++')", _illegal("invalid nested repetition operator", "++")),        # possessive
    ("'abc'.find('(?>a)')", _illegal("invalid or unsupported Perl syntax", "(?>")),     # atomic group
    ("'abc'.find('(?P<n-1>a)')", _illegal("invalid named capture", "(?P<n-1>")),
    ("'abc'.find('(?i')", _illegal("invalid or unsupported Perl syntax", "(?i")),
    ("'abc'.find('(?i-)')", _illegal("invalid or unsupported Perl syntax", "(?i-)")),
    ("'abc'.find('(a)\\\\1')", _illegal("invalid escape sequence", "\\1")),             # back-reference
    ("'abc'.find('\\\\Z')", _illegal("invalid escape sequence", "\\Z")),
    ("'abc'.find('\\\\C')", _illegal("invalid escape sequence", "\\C")),
    ("'abc'.find('\\\\x{110000}')", _illegal("invalid escape sequence", "\\x{110000")),
    ("'abc'.find('\\\\xg1')", _illegal("invalid escape sequence", "\\xg1")),
    ("'abc'.find('[\\\\b]')", _illegal("invalid escape sequence", "\\b")),
    ("'abc'.find('a\\\\')", _illegal("trailing backslash at end of expression", "")),
    ("'abc'.find('[z-a]')", _illegal("invalid character class range", "z-a")),
    ("'abc'.find('[[:foo:]]')", _illegal("invalid character class range", "[:foo:]")),
    ("'abc'.find('\\\\p{Klingon}')", _illegal("invalid character class range", "\\p{Klingon}")),
    ("'abc'.find('\\\\pX')", _illegal("invalid character class range", "\\pX")),
    ("'abc'.find('" + "(" * 1001 + ")" * 1001 + "')", _illegal("expression nests too deeply", "(" * 1001 + ")" * 1001)),
    ("'abc'.find('" + "(" * 999 + ")" * 999 + "')", None),   # within the limit: compiles
    ("'abc'.findAll('[')", _illegal("missing closing ]", "[")),
    ("'abc'.findAll('[', 2)", _illegal("missing closing ]", "[")),
]


@pytest.mark.parametrize(("source", "message"), ERRORS)
def test_errors(source: str, message: str | None) -> None:
    if message is None:
        assert evaluate(source) == ""
        return
    try:
        assert evaluation_error(source) == message
    except CelCompileError as error:   # a literal pattern: refused when the program is built
        assert error.message in message


@pytest.mark.parametrize(("source", "errors"), [
    ("'abc'.find('[')", ["error parsing regexp: missing closing ]: `[`"]),
    ("'abc'.findAll('a**', 2)", ["error parsing regexp: invalid nested repetition operator: `**`"]),
    ("'abc'.find('[a]')", []),
    ("'abc'.find(object.pattern)", []),   # known only when it runs
])
def test_constant_patterns_fail_when_the_program_is_built(source: str, errors: list[str]) -> None:
    if errors:   # the policy is refused at kubectl apply, as Kubernetes refuses it
        with pytest.raises(CelCompileError) as caught:
            cel.compile_expression(Expression(source, "spec.validations[0].expression"))
        assert caught.value.message == errors[0]
        return
    compiled = cel.compile_expression(Expression(source, "spec.validations[0].expression"))
    assert regex.constant_pattern_errors(compiled.tree()) == errors
