"""Kubernetes' IP and CIDR CEL libraries: results and error texts as Kubernetes gives them.

Cases come from Kubernetes' library tests and documentation, and from the rules of Go's
``net/netip`` parser that Kubernetes relies on (where Python's ``ipaddress`` would differ).
"""
from __future__ import annotations

from typing import Any

import pytest
from celcases import compile_error, evaluate, evaluation_error

_HUGE = "9" * 5000   # more digits than Python's int() takes from a string


def _parse_error(text: str, reason: str) -> str:
    return f'IP Address "{text}" parse error during conversion from string: ParseAddr("{text}"): {reason}'


def _prefix_error(text: str, reason: str) -> str:
    context = "network address parse error during conversion from string"
    return f'{context}: {context}: netip.ParsePrefix("{text}"): {reason}'


VALUES = [
    # ip(): the value reads back as Go writes the address (lower case, longest run of zeros as ::)
    ('ip("192.168.0.1")', "192.168.0.1"),
    ('ip("2001:db8::68")', "2001:db8::68"),
    ('string(ip("192.168.0.1"))', "192.168.0.1"),
    ('string(ip("2001:DB8:0:0:0:0:0:68"))', "2001:db8::68"),
    ('string(ip("0:0:0:0:0:0:0:0"))', "::"),
    ('string(ip("::1"))', "::1"),
    ('string(ip("1::"))', "1::"),
    ('string(ip("1:0:0:1:0:0:0:1"))', "1:0:0:1::1"),
    ('string(ip("1:0:0:1:0:0:1:1"))', "1::1:0:0:1:1"),
    ('string(ip("1:0:1:1:1:1:1:1"))', "1:0:1:1:1:1:1:1"),
    ('string(ip("::1:2:3:4:5:6:7"))', "0:1:2:3:4:5:6:7"),
    ('string(ip("0001:00a0::"))', "1:a0::"),
    ('string(ip("::1.2.3.4"))', "::102:304"),
    ('string(ip("64:ff9b::192.0.2.33"))', "64:ff9b::c000:221"),
    # isIP
    ('isIP("127.0.0.1")', True),
    ('isIP("::1")', True),
    ('isIP("127.0.0.256")', False),
    ('isIP(":::1")', False),
    ('isIP("")', False),
    ('isIP("01.2.3.4")', False),
    ('isIP("1.2.3.4 ")', False),
    ('isIP("fe80::1%eth0")', False),
    ('isIP("::ffff:1.2.3.4")', False),
    ('isIP("00001::")', False),
    ('isIP("10.0.0.0/8")', False),
    # ip.isCanonical
    ('ip.isCanonical("127.0.0.1")', True),
    ('ip.isCanonical("2001:db8::abcd")', True),
    ('ip.isCanonical("2001:DB8::ABCD")', False),
    ('ip.isCanonical("2001:db8::0:0:0:abcd")', False),
    ('ip.isCanonical("::1.2.3.4")', False),
    ('ip.isCanonical("0:0::1")', False),
    # family and the classifications
    ('ip("127.0.0.1").family()', 4),
    ('ip("::1").family()', 6),
    ('ip("::102:304").family()', 6),
    ('ip("0.0.0.0").isUnspecified()', True),
    ('ip("::").isUnspecified()', True),
    ('ip("127.0.0.1").isUnspecified()', False),
    ('ip("::1").isUnspecified()', False),
    ('ip("127.0.0.1").isLoopback()', True),
    ('ip("127.255.255.254").isLoopback()', True),
    ('ip("192.168.0.1").isLoopback()', False),
    ('ip("::1").isLoopback()', True),
    ('ip("::2").isLoopback()', False),
    ('ip("224.0.0.1").isLinkLocalMulticast()', True),
    ('ip("224.0.1.1").isLinkLocalMulticast()', False),
    ('ip("ff02::1").isLinkLocalMulticast()', True),
    ('ip("ff12::1").isLinkLocalMulticast()', True),
    ('ip("ff05::1").isLinkLocalMulticast()', False),
    ('ip("fd00::1").isLinkLocalMulticast()', False),
    ('ip("169.254.169.254").isLinkLocalUnicast()', True),
    ('ip("192.168.0.1").isLinkLocalUnicast()', False),
    ('ip("fe80::1").isLinkLocalUnicast()', True),
    ('ip("febf::1").isLinkLocalUnicast()', True),
    ('ip("fec0::1").isLinkLocalUnicast()', False),
    ('ip("fd80::1").isLinkLocalUnicast()', False),
    ('ip("192.168.0.1").isGlobalUnicast()', True),
    ('ip("10.0.0.1").isGlobalUnicast()', True),
    ('ip("255.255.255.255").isGlobalUnicast()', False),
    ('ip("0.0.0.0").isGlobalUnicast()', False),
    ('ip("127.0.0.1").isGlobalUnicast()', False),
    ('ip("224.0.0.1").isGlobalUnicast()', False),
    ('ip("169.254.0.1").isGlobalUnicast()', False),
    ('ip("2001:db8::abcd").isGlobalUnicast()', True),
    ('ip("fc00::1").isGlobalUnicast()', True),
    ('ip("ff00::1").isGlobalUnicast()', False),
    ('ip("fe80::1").isGlobalUnicast()', False),
    ('ip("::").isGlobalUnicast()', False),
    # equality is Go's: same family and same address
    ('ip("::1") == ip("0:0:0:0:0:0:0:1")', True),
    ('ip("1.2.3.4") == ip("::102:304")', False),
    ('ip("2001:db8::1") in [ip("2001:DB8::1")]', True),
    ('type(ip("192.168.0.1")) == net.IP', True),
    # cidr(): the address is kept as written (host bits too) until masked()
    ('cidr("192.168.0.0/24")', "192.168.0.0/24"),
    ('cidr("192.168.0.1/24")', "192.168.0.1/24"),
    ('cidr("2001:DB8::/32")', "2001:db8::/32"),
    ('cidr("0.0.0.0/0")', "0.0.0.0/0"),
    ('isCIDR("192.168.0.0/16")', True),
    ('isCIDR("::1/128")', True),
    ('isCIDR("192.168.0.1/16")', True),
    ('isCIDR("192.168.0.0/33")', False),
    ('isCIDR("::1/129")', False),
    ('isCIDR("192.168.0.0")', False),
    ('isCIDR("192.168.0.0/08")', False),
    ('isCIDR("::ffff:1.2.3.4/120")', False),
    ('isCIDR("fe80::%eth0/64")', False),
    ('cidr("192.168.0.0/24").containsIP(ip("192.168.0.1"))', True),
    ('cidr("192.168.0.0/24").containsIP(ip("192.168.1.1"))', False),
    ('cidr("192.168.0.0/24").containsIP("192.168.0.1")', True),
    ('cidr("192.168.0.0/24").containsIP("192.168.1.1")', False),
    ('cidr("192.168.0.7/24").containsIP("192.168.0.200")', True),
    ('cidr("1.2.3.4/32").containsIP("1.2.3.4")', True),
    ('cidr("2001:db8::/32").containsIP(ip("2001:db8::1"))', True),
    ('cidr("2001:db8::/32").containsIP("2001:dc8::1")', False),
    ('cidr("0.0.0.0/0").containsIP("::1")', False),
    ('cidr("::/0").containsIP("1.2.3.4")', False),
    ('cidr("::/0").containsIP("::102:304")', True),
    ('cidr("192.168.0.0/16").containsCIDR(cidr("192.168.10.0/24"))', True),
    ('cidr("192.168.1.0/24").containsCIDR(cidr("192.168.2.0/24"))', False),
    ('cidr("192.168.0.0/24").containsCIDR("192.168.0.1/32")', True),
    ('cidr("192.168.0.0/24").containsCIDR("192.168.0.0/23")', False),
    ('cidr("192.168.0.0/24").containsCIDR("192.169.0.1/32")', False),
    ('cidr("192.168.0.0/24").containsCIDR("192.168.0.0/24")', True),
    ('cidr("0.0.0.0/0").containsCIDR("10.0.0.0/8")', True),
    ('cidr("0.0.0.0/0").containsCIDR("::/0")', False),
    ('cidr("2001:db8::/32").containsCIDR(cidr("2001:db8::/33"))', True),
    ('cidr("2001:db8::/32").containsCIDR("2001:db8::/31")', False),
    ('cidr("192.168.0.1/24").ip()', "192.168.0.1"),
    ('cidr("192.168.0.1/24").ip().family()', 4),
    ('cidr("::1/128").ip()', "::1"),
    ('cidr("::1/128").ip().family()', 6),
    ('cidr("192.168.0.0/24").masked()', "192.168.0.0/24"),
    ('cidr("192.168.0.1/24").masked()', "192.168.0.0/24"),
    ('cidr("10.1.2.3/0").masked()', "0.0.0.0/0"),
    ('cidr("2001:db8:1::/32").masked()', "2001:db8::/32"),
    ('cidr("2001:db8::1/128").masked()', "2001:db8::1/128"),
    ('cidr("192.168.0.0/16").prefixLength()', 16),
    ('cidr("::1/128").prefixLength()', 128),
    ('cidr("192.168.0.0/24") == cidr("192.168.0.0/24").masked()', True),
    ('cidr("192.168.0.1/24") == cidr("192.168.0.1/24").masked()', False),
    ('cidr("10.0.0.0/8") == cidr("10.0.0.0/16")', False),
    ('type(cidr("192.168.0.0/24")) == net.CIDR', True),
    # string() of a CIDR: only through dyn (see the library's note on string())
    ('string(dyn(cidr("2001:DB8::/32")))', "2001:db8::/32"),
    ('string(cidr("10.0.0.0/8").ip()) + "/" + string(cidr("10.0.0.0/8").prefixLength())', "10.0.0.0/8"),
]


@pytest.mark.parametrize(("source", "expected"), VALUES)
def test_value(source: str, expected: Any) -> None:
    assert evaluate(source) == expected


EVALUATION_ERRORS = [
    # Kubernetes' own test cases
    ('ip("192.168.0.1.0")', _parse_error("192.168.0.1.0", "IPv4 address too long")),
    ('ip("2001:db8:::68")', _parse_error("2001:db8:::68",
                                         'each colon-separated field must have at least one digit (at ":68")')),
    ('ip.isCanonical("127.0.0.1.0")', _parse_error("127.0.0.1.0", "IPv4 address too long")),
    ('cidr("192.168.0.0/")', _prefix_error("192.168.0.0/", 'bad bits after slash: ""')),
    ('cidr("2001:db8::/")', _prefix_error("2001:db8::/", 'bad bits after slash: ""')),
    # what Kubernetes refuses beyond netip
    ('ip("fe80::1%eth0")', 'IP address "fe80::1%eth0" with zone value is not allowed'),
    ('ip("::ffff:1.2.3.4")', 'IPv4-mapped IPv6 address "::ffff:1.2.3.4" is not allowed'),
    ('ip("::FFFF:102:304")', 'IPv4-mapped IPv6 address "::FFFF:102:304" is not allowed'),
    ('ip.isCanonical("::ffff:1.2.3.4")', 'IPv4-mapped IPv6 address "::ffff:1.2.3.4" is not allowed'),
    ('cidr("::ffff:1.2.3.0/120")', "network address parse error during conversion from string: "
                                   'IPv4-mapped IPv6 address "::ffff:1.2.3.0/120" is not allowed'),
    # netip's IPv4 rules
    ('ip("")', _parse_error("", "unable to parse IP")),
    ('ip("localhost")', _parse_error("localhost", "unable to parse IP")),
    ('ip("1.2.3")', _parse_error("1.2.3", "IPv4 address too short")),
    ('ip("01.2.3.4")', _parse_error("01.2.3.4", "IPv4 field has octet with leading zero")),
    ('ip("1.2.3.00")', _parse_error("1.2.3.00", "IPv4 field has octet with leading zero")),
    ('ip("127.0.0.256")', _parse_error("127.0.0.256", "IPv4 field has value >255")),
    ('ip("1..2.3")', _parse_error("1..2.3", 'IPv4 field must have at least one digit (at ".2.3")')),
    ('ip(".1.2.3")', _parse_error(".1.2.3", 'IPv4 field must have at least one digit (at ".1.2.3")')),
    ('ip("1.2.3.")', _parse_error("1.2.3.", 'IPv4 field must have at least one digit (at ".")')),
    ('ip("1.2.3.4 ")', _parse_error("1.2.3.4 ", 'unexpected character (at " ")')),
    ('ip("1.2.3.4::")', _parse_error("1.2.3.4::", 'unexpected character (at "::")')),
    ('ip("1.2.3.4/32")', _parse_error("1.2.3.4/32", 'unexpected character (at "/32")')),
    # netip's IPv6 rules
    ('ip("%eth0")', _parse_error("%eth0", "missing IPv6 address")),
    ('ip("fe80::1%")', _parse_error("fe80::1%", "zone must be a non-empty string")),
    ('ip("12345::")', _parse_error("12345::", 'each group must have 4 or less digits (at "12345::")')),
    ('ip("00001::")', _parse_error("00001::", 'each group must have 4 or less digits (at "00001::")')),
    ('ip(":1")', _parse_error(":1", 'each colon-separated field must have at least one digit (at ":1")')),
    ('ip("1:g::")', _parse_error("1:g::", 'each colon-separated field must have at least one digit (at "g::")')),
    ('ip("1x:2")', _parse_error("1x:2", 'unexpected character, want colon (at "x:2")')),
    ('ip("1:")', _parse_error("1:", 'colon must be followed by more characters (at ":")')),
    ('ip("1::2::3")', _parse_error("1::2::3", 'multiple :: in address (at ":3")')),
    ('ip("1:2:3:4:5:6:7")', _parse_error("1:2:3:4:5:6:7", "address string too short")),
    ('ip("1:2:3:4:5:6:7:8:9")', _parse_error("1:2:3:4:5:6:7:8:9", 'trailing garbage after address (at "9")')),
    ('ip("1:2:3:4:5:6:7:8::")', _parse_error("1:2:3:4:5:6:7:8::",
                                             "the :: must expand to at least one field of zeros")),
    ('ip("1:2:3:4:5:6:7:1.2.3.4")', _parse_error(
        "1:2:3:4:5:6:7:1.2.3.4",
        'embedded IPv4 address must replace the final 2 fields of the address (at "1.2.3.4")')),
    ('ip("::1:2:3:4:5:6:7:1.2.3.4")', _parse_error(
        "::1:2:3:4:5:6:7:1.2.3.4",
        'too many hex fields to fit an embedded IPv4 at the end of the address (at "1.2.3.4")')),
    ('ip("::1.2.3")', _parse_error("::1.2.3", "IPv4 address too short")),
    ('ip("::1.2.3.04")', _parse_error("::1.2.3.04", "IPv4 field has octet with leading zero")),
    # texts quote the input as Go's %q does
    (r'ip("a\tb")', _parse_error(r"a\tb", "unable to parse IP")),
    (r'ip("1.2.3.\u00e9")', _parse_error("1.2.3.é", 'unexpected character (at "é")')),
    (r'ip("\x7f")', _parse_error(r"\x7f", "unable to parse IP")),
    (r'ip("\u2028")', _parse_error(r"\u2028", "unable to parse IP")),
    # netip's prefix rules
    ('cidr("192.168.0.0")', _prefix_error("192.168.0.0", "no '/'")),
    ('cidr("192.168.0.0/33")', _prefix_error("192.168.0.0/33", "prefix length out of range")),
    ('cidr("::1/129")', _prefix_error("::1/129", "prefix length out of range")),
    ('cidr("10.0.0.0/08")', _prefix_error("10.0.0.0/08", 'bad bits after slash: "08"')),
    ('cidr("10.0.0.0/+8")', _prefix_error("10.0.0.0/+8", 'bad bits after slash: "+8"')),
    ('cidr("10.0.0.0/-1")', _prefix_error("10.0.0.0/-1", 'bad bits after slash: "-1"')),
    ('cidr("10.0.0.0/ 8")', _prefix_error("10.0.0.0/ 8", 'bad bits after slash: " 8"')),
    ('cidr("10.0.0.0/255.0.0.0")', _prefix_error("10.0.0.0/255.0.0.0", 'bad bits after slash: "255.0.0.0"')),
    ('cidr("10.0.0.0/99999999999999999999")', _prefix_error("10.0.0.0/99999999999999999999",
                                                            'bad bits after slash: "99999999999999999999"')),
    (f'cidr("10.0.0.0/{_HUGE}")', _prefix_error(f"10.0.0.0/{_HUGE}", f'bad bits after slash: "{_HUGE}"')),
    ('cidr("10.0.0.0/8/8")', _prefix_error("10.0.0.0/8/8",
                                           'ParseAddr("10.0.0.0/8"): unexpected character (at "/8")')),
    ('cidr("1.2.3/8")', _prefix_error("1.2.3/8", 'ParseAddr("1.2.3"): IPv4 address too short')),
    ('cidr("fe80::%eth0/64")', _prefix_error("fe80::%eth0/64", "IPv6 zones cannot be present in a prefix")),
    # a string argument that does not parse: Kubernetes reports containsIP's as a type mismatch
    ('cidr("10.0.0.0/8").containsIP("10.0.0.256")', "no such overload"),
    ('cidr("10.0.0.0/8").containsCIDR("10.0.0.0/33")', _prefix_error("10.0.0.0/33", "prefix length out of range")),
    # a value of the other type, reaching a function through dyn
    ('dyn(cidr("10.0.0.0/8")).family()', "no such overload"),
    ('dyn(ip("10.0.0.1")).prefixLength()', "no such overload"),
    ('cidr("10.0.0.0/8").containsCIDR(dyn(ip("10.0.0.1")))', "no such overload"),
]


@pytest.mark.parametrize(("source", "message"), EVALUATION_ERRORS)
def test_evaluation_error(source: str, message: str) -> None:
    assert evaluation_error(source) == message


COMPILE_ERRORS = [
    ('isIP(cidr("192.168.0.0/24"))', "found no matching overload for 'isIP' applied to '(net.CIDR)'"),
    ("ip(1)", "found no matching overload for 'ip' applied to '(int)'"),
    ('cidr("10.0.0.0/8").containsIP(1)', "found no matching overload for 'containsIP' applied to '(net.CIDR, int)'"),
    ('ip("1.2.3.4").prefixLength()', "found no matching overload for 'prefixLength' applied to '(net.IP)'"),
    ('ip("1.2.3.4") == "1.2.3.4"', "found no matching overload for '_==_' applied to '(net.IP, string)'"),
    ('ip("1.2.3.4") < ip("1.2.3.5")', "found no matching overload for '_<_' applied to '(net.IP, net.IP)'"),
]


@pytest.mark.parametrize(("source", "message"), COMPILE_ERRORS)
def test_compile_error(source: str, message: str) -> None:
    assert message in compile_error(source)
