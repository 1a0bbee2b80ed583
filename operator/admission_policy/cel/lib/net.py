"""Kubernetes' IP and CIDR libraries: ``ip('10.0.0.1')``, ``cidr('10.0.0.0/8')`` and their methods.

Kubernetes parses with Go's ``net/netip`` and then refuses zones (``fe80::1%eth0``) and
IPv4-mapped IPv6 addresses (``::ffff:1.2.3.4``). Python's ``ipaddress`` draws other lines (it
takes ``1.2.3.4/255.0.0.0``, writes ``::ffff:102:304``, and words its errors its own way), and
the error texts are part of what a policy's author sees. So this module follows netip's grammar
(as Go 1.26 has it: the Go of the Kubernetes sources this follows) and its error texts.

A ``net.IP`` value's text is ``netip.Addr.String()``, a ``net.CIDR`` value's is
``netip.Prefix.String()`` (the address as written, not masked): equal texts exactly when
Kubernetes' ``==`` says equal, so ``==`` and ``in`` need nothing more.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Final

from cel_expr_python import cel

from ...errors import AdmissionPolicyError
from .gostrings import quote
from .library import Function, Library, accepts, function, overload
from .types import opaque

IP: Final = opaque("net.IP")
CIDR: Final = opaque("net.CIDR")

_HEX: Final = "0123456789abcdefABCDEF"
_INT64_MAX: Final = 2**63 - 1
# Kubernetes' wording when a function meets a value of another type (a ``dyn`` at run time).
_NO_SUCH_OVERLOAD: Final = "no such overload"


@dataclasses.dataclass(frozen=True)
class Address:
    """An IPv4 (``bits`` 32) or IPv6 (``bits`` 128) address, as ``netip.Addr``."""
    value: int
    bits: int
    zone: str = ""

    @property
    def is4(self) -> bool:
        return self.bits == 32

    @property
    def is4in6(self) -> bool:
        return not self.is4 and self.value >> 32 == 0xFFFF

    def top(self, length: int) -> int:
        """The address with all but its first ``length`` bits cleared."""
        host_bits = self.bits - length
        return self.value >> host_bits << host_bits

    def text(self) -> str:
        """Go's ``Addr.String()``: dotted quad, or RFC 5952 (the first longest run of zeros as ``::``)."""
        if self.is4:
            return ".".join(str((self.value >> shift) & 0xFF) for shift in (24, 16, 8, 0))
        zone = f"%{self.zone}" if self.zone else ""
        if self.is4in6:
            return "::ffff:" + Address(self.value & 0xFFFFFFFF, 32).text() + zone
        groups = [(self.value >> (112 - 16 * index)) & 0xFFFF for index in range(8)]
        start, end = _longest_zero_run(groups)
        if end - start < 2:
            return ":".join(f"{group:x}" for group in groups) + zone
        return (":".join(f"{group:x}" for group in groups[:start]) + "::"
                + ":".join(f"{group:x}" for group in groups[end:]) + zone)

    # The classifications of netip.Addr (never given an IPv4-mapped address: Kubernetes refuses them).
    def is_unspecified(self) -> bool:
        return self.value == 0

    def is_loopback(self) -> bool:
        return self.value >> 24 == 127 if self.is4 else self.value == 1

    def is_multicast(self) -> bool:
        return self.value >> 28 == 0xE if self.is4 else self.value >> 120 == 0xFF

    def is_link_local_multicast(self) -> bool:
        return self.value >> 8 == 0xE00000 if self.is4 else (self.value >> 112) & 0xFF0F == 0xFF02

    def is_link_local_unicast(self) -> bool:
        return self.value >> 16 == 0xA9FE if self.is4 else (self.value >> 112) & 0xFFC0 == 0xFE80

    def is_global_unicast(self) -> bool:
        if self.is4 and self.value == 0xFFFFFFFF:   # the limited broadcast address
            return False
        return not (self.is_unspecified() or self.is_loopback() or self.is_multicast()
                    or self.is_link_local_unicast())


@dataclasses.dataclass(frozen=True)
class Prefix:
    """An address and a prefix length, as ``netip.Prefix`` (host bits are kept until ``masked``)."""
    address: Address
    length: int

    def text(self) -> str:
        """Go's ``Prefix.String()``: the host bits as given (``10.0.0.1/8`` stays so)."""
        return f"{self.address.text()}/{self.length}"

    def masked(self) -> Prefix:
        """Go's ``Prefix.Masked()``: the host bits cleared (``10.0.0.0/8``)."""
        return Prefix(dataclasses.replace(self.address, value=self.address.top(self.length)), self.length)

    def contains(self, address: Address) -> bool:
        """Go's ``Prefix.Contains``: never across families (an IPv4 address is in no IPv6 prefix)."""
        return address.bits == self.address.bits and address.top(self.length) == self.address.top(self.length)

    def contains_prefix(self, other: Prefix) -> bool:
        """Kubernetes' test: the two overlap and ``other`` is no wider (so lies inside)."""
        return self.length <= other.length and self.contains(other.address)


def _longest_zero_run(groups: list[int]) -> tuple[int, int]:
    """[start, end) of the first longest run of zero groups (empty when there is none)."""
    best = (0, 0)
    start = None
    for index, group in enumerate([*groups, 1]):   # the sentinel closes a run at the end
        if group == 0 and start is None:
            start = index
        elif group != 0 and start is not None:
            if index - start > best[1] - best[0]:
                best = (start, index)
            start = None
    return best


# --- netip's parsing, with its error texts --------------------------------------------------

class NetipError(AdmissionPolicyError, ValueError):
    """A string netip refuses; the message is Go's error text."""


def _addr_error(text: str, message: str, at: str = "") -> NetipError:
    where = f" (at {quote(at)})" if at else ""
    return NetipError(f"ParseAddr({quote(text)}): {message}{where}")


def parse_addr(text: str) -> Address:
    """``netip.ParseAddr``: the first '.', ':' or '%' decides what the string is meant to be."""
    for char in text:
        if char == ".":
            return Address(_ipv4_value(text, text), 32)
        if char == ":":
            return _parse_ipv6(text)
        if char == "%":
            raise _addr_error(text, "missing IPv6 address")
    raise _addr_error(text, "unable to parse IP")


def _ipv4_value(text: str, part: str) -> int:
    """The dotted quad ``part`` of ``text`` (all of it, or an IPv6 address's last 32 bits)."""
    octets: list[int] = []
    value, digits = 0, 0
    for index, char in enumerate(part):
        if "0" <= char <= "9":
            if digits == 1 and value == 0:   # "01" could be read as octal elsewhere: refused
                raise _addr_error(text, "IPv4 field has octet with leading zero")
            value, digits = value * 10 + ord(char) - ord("0"), digits + 1
            if value > 255:
                raise _addr_error(text, "IPv4 field has value >255")
        elif char == ".":
            if index == 0 or index == len(part) - 1 or part[index - 1] == ".":
                raise _addr_error(text, "IPv4 field must have at least one digit", part[index:])
            if len(octets) == 3:
                raise _addr_error(text, "IPv4 address too long")
            octets.append(value)
            value, digits = 0, 0
        else:
            raise _addr_error(text, "unexpected character", part[index:])
    if len(octets) < 3:
        raise _addr_error(text, "IPv4 address too short")
    return int.from_bytes(bytes([*octets, value]), "big")


def _parse_ipv6(text: str) -> Address:
    """netip's IPv6 grammar: up to 8 groups of 1-4 hex digits, one ``::``, an optional dotted
    quad in place of the last two groups, an optional non-empty ``%zone``."""
    rest, _, zone = text.partition("%")
    if "%" in text and not zone:
        raise _addr_error(text, "zone must be a non-empty string")
    address = bytearray(16)
    ellipsis = -1   # where "::" stands, as a byte offset into address
    if rest.startswith("::"):
        ellipsis, rest = 0, rest[2:]
        if not rest:
            return Address(0, 128, zone)
    filled = 0
    while filled < 16:
        digits = 0
        while digits < len(rest) and rest[digits] in _HEX:
            digits += 1
            if digits > 4:
                raise _addr_error(text, "each group must have 4 or less digits", rest)
        if digits == 0:
            raise _addr_error(text, "each colon-separated field must have at least one digit", rest)
        if digits < len(rest) and rest[digits] == ".":
            if ellipsis < 0 and filled != 12:
                raise _addr_error(text, "embedded IPv4 address must replace the final 2 fields of the address",
                                  rest)
            if filled + 4 > 16:
                raise _addr_error(text, "too many hex fields to fit an embedded IPv4 at the end of the address",
                                  rest)
            address[filled:filled + 4] = _ipv4_value(text, rest).to_bytes(4, "big")
            rest, filled = "", filled + 4
            break
        address[filled:filled + 2] = int(rest[:digits], 16).to_bytes(2, "big")
        rest, filled = rest[digits:], filled + 2
        if not rest:
            break
        if rest[0] != ":":
            raise _addr_error(text, "unexpected character, want colon", rest)
        if len(rest) == 1:
            raise _addr_error(text, "colon must be followed by more characters", rest)
        rest = rest[1:]
        if rest[0] == ":":
            if ellipsis >= 0:
                raise _addr_error(text, "multiple :: in address", rest)
            ellipsis, rest = filled, rest[1:]
            if not rest:
                break
    if rest:
        raise _addr_error(text, "trailing garbage after address", rest)
    if filled < 16:
        if ellipsis < 0:
            raise _addr_error(text, "address string too short")
        gap = 16 - filled
        address[ellipsis + gap:] = address[ellipsis:filled]
        address[ellipsis:ellipsis + gap] = bytes(gap)
    elif ellipsis >= 0:
        raise _addr_error(text, "the :: must expand to at least one field of zeros")
    return Address(int.from_bytes(address, "big"), 128, zone)


def parse_prefix(text: str) -> Prefix:
    """``netip.ParsePrefix``: an address (no zone), '/', and a length written without sign or
    leading zero."""
    def error(message: str) -> NetipError:
        return NetipError(f"netip.ParsePrefix({quote(text)}): {message}")

    slash = text.rfind("/")
    if slash < 0:
        raise error("no '/'")
    try:
        address = parse_addr(text[:slash])
    except NetipError as exc:
        raise error(str(exc)) from None
    if address.zone:
        raise error("IPv6 zones cannot be present in a prefix")
    length = text[slash + 1:]
    bad_bits = error(f"bad bits after slash: {quote(length)}")
    if not length or not all("0" <= char <= "9" for char in length) or (len(length) > 1 and length[0] == "0"):
        raise bad_bits
    if len(length) > len(str(_INT64_MAX)) or int(length) > _INT64_MAX:   # strconv.Atoi's range error
        raise bad_bits
    if int(length) > address.bits:
        raise error("prefix length out of range")
    return Prefix(address, int(length))


# --- Kubernetes' stricter parsing, and its error texts ---------------------------------------

@functools.lru_cache(maxsize=1024)
def kubernetes_ip(text: str) -> Address:
    """An address as ``ip()`` accepts it; ValueError in Kubernetes' words otherwise."""
    try:
        address = parse_addr(text)
    except NetipError as exc:
        raise ValueError(f"IP Address {quote(text)} parse error during conversion from string: {exc}") from None
    if address.zone:
        raise ValueError(f"IP address {quote(text)} with zone value is not allowed")
    if address.is4in6:
        raise ValueError(f"IPv4-mapped IPv6 address {quote(text)} is not allowed")
    return address


@functools.lru_cache(maxsize=1024)
def kubernetes_cidr(text: str) -> Prefix:
    """A prefix as ``cidr()`` accepts it; ValueError in Kubernetes' words otherwise (which say
    "network address parse error" twice for a netip error: Kubernetes wraps it twice)."""
    context = "network address parse error during conversion from string"
    try:
        prefix = parse_prefix(text)
    except NetipError as exc:
        raise ValueError(f"{context}: {context}: {exc}") from None
    if prefix.address.is4in6:
        raise ValueError(f"{context}: IPv4-mapped IPv6 address {quote(text)} is not allowed")
    return prefix


# --- the CEL functions ------------------------------------------------------------------------

def _address(value: Any) -> Address:
    if not IP.is_value(value):
        raise ValueError(_NO_SUCH_OVERLOAD)
    return kubernetes_ip(IP.state(value))


def _prefix(value: Any) -> Prefix:
    if not CIDR.is_value(value):
        raise ValueError(_NO_SUCH_OVERLOAD)
    return kubernetes_cidr(CIDR.state(value))


def _ip(text: str) -> Any:
    return IP.of(kubernetes_ip(text).text())


def _cidr(text: str) -> Any:
    return CIDR.of(kubernetes_cidr(text).text())


def _is_canonical(text: str) -> bool:
    return kubernetes_ip(text).text() == text


def _to_string(value: Any) -> str:
    """``string()`` of either type: the runtime keeps one ``string`` per kind of argument, and
    every opaque type is the same kind (a message), so this one serves both."""
    if IP.is_value(value) or CIDR.is_value(value):
        return str(value.state)
    raise ValueError(_NO_SUCH_OVERLOAD)


def _contains_ip_text(value: Any, text: str) -> bool:
    # Kubernetes loses the parse error here and reports a type mismatch instead; so does this.
    prefix = _prefix(value)
    try:
        address = kubernetes_ip(text)
    except ValueError:
        raise ValueError(_NO_SUCH_OVERLOAD) from None
    return prefix.contains(address)


def _member(name: str, overload_id: str, result: cel.Type, params: list[cel.Type], impl: Any) -> Function:
    return function(name, overload(overload_id, result, params, impl, member=True))


def _functions() -> tuple[Function, ...]:
    string, boolean, integer = cel.Type.STRING, cel.Type.BOOL, cel.Type.INT
    ip, cidr = IP.type, CIDR.type
    classifications = {
        "isUnspecified": ("ip_is_unspecified", Address.is_unspecified),
        "isLoopback": ("ip_is_loopback", Address.is_loopback),
        "isLinkLocalMulticast": ("ip_is_link_local_multicast", Address.is_link_local_multicast),
        "isLinkLocalUnicast": ("ip_is_link_local_unicast", Address.is_link_local_unicast),
        "isGlobalUnicast": ("ip_is_global_unicast", Address.is_global_unicast),
    }
    return (
        function("ip",
                 overload("string_to_ip", ip, [string], _ip),
                 overload("cidr_ip", ip, [cidr], lambda v: IP.of(_prefix(v).address.text()), member=True)),
        function("isIP", overload("is_ip", boolean, [string], accepts(kubernetes_ip))),
        function("ip.isCanonical", overload("ip_is_canonical", boolean, [string], _is_canonical)),
        _member("family", "ip_family", integer, [ip], lambda v: 4 if _address(v).is4 else 6),
        *(_member(name, overload_id, boolean, [ip], lambda v, test=test: test(_address(v)))
          for name, (overload_id, test) in classifications.items()),
        # Kubernetes also has string(net.CIDR) ("cidr_to_string"); see _to_string for why it is not
        # declared: the runtime refuses a second string() over messages.
        function("string", overload("ip_to_string", string, [ip], _to_string)),
        function("cidr", overload("string_to_cidr", cidr, [string], _cidr)),
        function("isCIDR", overload("is_cidr", boolean, [string], accepts(kubernetes_cidr))),
        function("containsIP",
                 overload("cidr_contains_ip_string", boolean, [cidr, string], _contains_ip_text, member=True),
                 overload("cidr_contains_ip_ip", boolean, [cidr, ip],
                          lambda v, other: _prefix(v).contains(_address(other)), member=True)),
        function("containsCIDR",
                 overload("cidr_contains_cidr_string", boolean, [cidr, string],
                          lambda v, text: _prefix(v).contains_prefix(kubernetes_cidr(text)), member=True),
                 overload("cidr_contains_cidr", boolean, [cidr, cidr],
                          lambda v, other: _prefix(v).contains_prefix(_prefix(other)), member=True)),
        _member("prefixLength", "cidr_prefix_length", integer, [cidr], lambda v: _prefix(v).length),
        _member("masked", "cidr_masked", cidr, [cidr], lambda v: CIDR.of(_prefix(v).masked().text())),
    )


LIBRARY: Final = Library(
    "net", "1.30", _functions(),
    "ip(), cidr() and their tests (family, loopback, containsIP …), with Go netip's rules and errors")
