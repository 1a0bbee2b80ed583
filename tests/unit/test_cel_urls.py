"""Kubernetes' URL CEL library: results and error texts as Kubernetes gives them.

Cases come from the library's documentation (``pkg/cel/library/urls.go``) and from the rules of
Go's ``net/url`` that it relies on (``ParseRequestURI``, then ``Parse``), where Python's
``urllib`` would answer otherwise.
"""
from __future__ import annotations

from typing import Any

import pytest
from celcases import evaluate, evaluation_error


def _error(text: str, reason: str) -> str:
    return f"URL parse error during conversion from string: parse {text}: {reason}"


VALUES = [
    # url() keeps the URL as Go writes it back (URL.String())
    ("url('https://user:pass@example.com:80/path?query=val#fragment')",
     "https://user:pass@example.com:80/path?query=val#fragment"),
    ("url('/absolute-path')", "/absolute-path"),
    ("url('HTTP://Example.com/a b')", "http://Example.com/a%20b"),   # scheme lowered, path escaped
    ("url('http://é.com/')", "http://%C3%A9.com/"),
    ("url('mailto:someone@example.com')", "mailto:someone@example.com"),
    ("url('*')", "*"),
    ("type(url('/a')) == kubernetes.URL", True),
    # equal when Go writes them alike
    ("url('HTTP://x/a b') == url('http://x/a%20b')", True),
    ("url('http://x/a') == url('http://x/b')", False),
    ("url('http://x/#a#b') == url('http://x/#a%23b')", True),
    # isURL: an absolute URI or an absolute path
    ("isURL('https://user:pass@example.com:80/path?query=val#fragment')", True),
    ("isURL('/absolute-path')", True),
    ("isURL('https://a:b:c/')", False),
    ("isURL('../relative-path')", False),
    ("isURL('')", False),
    ("isURL('http://[::1]:8080/')", True),
    ("isURL('http://[127.0.0.1]/')", False),       # brackets are for IPv6
    ("isURL('http://x/%zz')", False),
    ("isURL('http://x/a#b')", True),
    ("isURL('http://x#b')", False),                # ParseRequestURI reads # as part of the host
    ("isURL('postgres://h1:5432,h2:5433/db')", True),   # colons: strict for http(s) only
    ("isURL('http://h1:5432,h2:5433/db')", False),
    ("isURL('http://::1/')", False),
    # getScheme
    ("url('/path').getScheme()", ""),
    ("url('https://example.com/').getScheme()", "https"),
    ("url('HTTPS://example.com/').getScheme()", "https"),
    # getHost / getHostname / getPort
    ("url('https://example.com:80/').getHost()", "example.com:80"),
    ("url('https://example.com/').getHost()", "example.com"),
    ("url('https://[::1]:80/').getHost()", "[::1]:80"),
    ("url('https://[::1]/').getHost()", "[::1]"),
    ("url('/path').getHost()", ""),
    ("url('//example.com/path').getHost()", "example.com"),   # Parse, after ParseRequestURI took it as a path
    ("url('https://example.com:80/').getHostname()", "example.com"),
    ("url('https://127.0.0.1:80/').getHostname()", "127.0.0.1"),
    ("url('https://[::1]:80/').getHostname()", "::1"),
    ("url('http://[fe80::1%25en0]:8080/').getHostname()", "fe80::1%en0"),
    ("url('/path').getHostname()", ""),
    ("url('https://example.com:80/').getPort()", "80"),
    ("url('https://example.com:/').getPort()", ""),
    ("url('https://example.com/').getPort()", ""),
    ("url('/path').getPort()", ""),
    ("url('http://%C3%A9.com/').getHost()", "é.com"),
    # getEscapedPath: as written when that is a valid spelling, else Go's escaping
    ("url('https://example.com/path').getEscapedPath()", "/path"),
    ("url('https://example.com/path with spaces/').getEscapedPath()", "/path%20with%20spaces/"),
    ("url('https://example.com').getEscapedPath()", ""),
    ("url('https://example.com/a%2Fb%41').getEscapedPath()", "/a%2Fb%41"),
    ("url('https://example.com/%e2%82%ac').getEscapedPath()", "/%e2%82%ac"),
    ("url('https://example.com/€').getEscapedPath()", "/%E2%82%AC"),
    ("url('*').getEscapedPath()", "*"),
    # getQuery: values unescaped, repeated keys collected, malformed settings left out
    ("url('https://example.com/path?k1=a&k2=b&k2=c').getQuery()", {"k1": ["a"], "k2": ["b", "c"]}),
    ("url('https://example.com/path?key with spaces=value with spaces').getQuery()",
     {"key with spaces": ["value with spaces"]}),
    ("url('https://example.com/path?').getQuery()", {}),
    ("url('https://example.com/path').getQuery()", {}),
    ("url('http://x/?a=1+2&b=%41&c&=d').getQuery()", {"a": ["1 2"], "b": ["A"], "c": [""], "": ["d"]}),
    ("url('http://x/?a=1;b=2&c=3&d=%zz&&e=5').getQuery()", {"c": ["3"], "e": ["5"]}),
    ("url('http://x/?a=1#b=2').getQuery()", {"a": ["1"]}),
]


@pytest.mark.parametrize(("source", "expected"), VALUES)
def test_values(source: str, expected: Any) -> None:
    assert evaluate(source) == expected


@pytest.mark.parametrize(("parameters", "expected"), [(9_999, 1), (10_000, 1), (10_001, 0)])
def test_a_query_of_too_many_parameters_reads_as_none(parameters: int, expected: int) -> None:
    """Go's Query() gives up past 10,000 '&'-separated parameters (its urlmaxqueryparams)."""
    query = "&" * (parameters - 1) + "a=1"
    assert evaluate("size(url(object.url).getQuery())", object={"url": f"http://x/?{query}"}) == expected


ERRORS = [
    ("url('https://a:b:c/')", _error('"https://a:b:c/"', 'invalid port ":b:c" after host')),
    ("url('../relative-path')", _error('"../relative-path"', "invalid URI for request")),
    ("url('')", _error('""', "empty url")),
    ("url(':x')", _error('":x"', "missing protocol scheme")),
    ("url('http://x/%zz')", _error('"http://x/%zz"', 'invalid URL escape "%zz"')),
    ("url('http://x/%4')", _error('"http://x/%4"', 'invalid URL escape "%4"')),
    ("url('http://x/%zé')", _error('"http://x/%zé"', 'invalid URL escape "%z\\xc3"')),
    ("url('http://h|st/')", _error('"http://h|st/"', 'invalid character "|" in host name')),
    ("url('http://x#frag')", _error('"http://x#frag"', 'invalid character "#" in host name')),
    ("url('http://%41/')", _error('"http://%41/"', 'invalid URL escape "%41"')),
    ("url('http://a\\nb/')", _error('"http://a\\nb/"', "net/url: invalid control character in URL")),
    ("url('http://us er@x/')", _error('"http://us er@x/"', "net/url: invalid userinfo")),
    ("url('http://[::1/')", _error('"http://[::1/"', "missing ']' in host")),
    ("url('http://x[::1]/')", _error('"http://x[::1]/"', "invalid IP-literal")),
    ("url('http://[127.0.0.1]/')", _error('"http://[127.0.0.1]/"', "invalid IP-literal")),
    ("url('http://[::1]x/')", _error('"http://[::1]x/"', 'invalid port "x" after host')),
    ("url('http://[12345::]/')",
     _error('"http://[12345::]/"', 'invalid host: ParseAddr("12345::"): each group must have 4 or less digits '
                                   '(at "12345::")')),
    ("url('http://[1:2]/')", _error('"http://[1:2]/"', 'invalid host: ParseAddr("1:2"): address string too short')),
    ("url('http://[zz]/')", _error('"http://[zz]/"', 'invalid host: ParseAddr("zz"): unable to parse IP')),
    ("url('http://[::1%25]/')",
     _error('"http://[::1%25]/"', 'invalid host: ParseAddr("::1%"): zone must be a non-empty string')),
    ("url('http://localhost:80:80/')", _error('"http://localhost:80:80/"', 'invalid port ":80:80" after host')),
    ("url('http://x:port/')", _error('"http://x:port/"', 'invalid port ":port" after host')),
    # Parse, after ParseRequestURI: a fragment it kept in the path is checked as a fragment
    ("url('/a?b#%zz')", _error('"/a?b#%zz"', 'invalid URL escape "%zz"')),
    ("url('//a b/x')", _error('"//a b/x"', 'invalid character " " in host name')),
]


@pytest.mark.parametrize(("source", "message"), ERRORS)
def test_errors(source: str, message: str) -> None:
    assert evaluation_error(source) == message
