"""Kubernetes' URL library: ``url()``, ``isURL()`` and the ``get…()`` accessors of ``kubernetes.URL``.

Kubernetes checks a string with Go's ``url.ParseRequestURI`` (an absolute URI, or an absolute
path) and then keeps what ``url.Parse`` makes of it; both follow Go's ``net/url`` rules, which
are not Python's ``urllib``: a host is only checked for the characters it may hold (and a
bracketed one must be an IPv6 address), a port is digits, ``%`` escapes are checked everywhere,
``+`` means a space only in a query. So the parser here is Go's, step for step, over bytes (a
``%FF`` escape decodes to a byte that is not text), with Go's error texts.

A value's canonical text is Go's ``URL.String()`` of the parsed URL: Kubernetes compares URLs by
it (``url('HTTP://x/a b') == url('http://x/a%20b')``), and parsing it again yields the same
components, so the accessors re-parse it.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import unicodedata
from typing import Any, Final

from cel_expr_python import cel

from .library import Library, function, overload
from .types import opaque

URL: Final = opaque("kubernetes.URL")

# Go's net/url caps a query at this many '&'-separated parameters (GODEBUG urlmaxqueryparams).
_MAX_QUERY_PARAMETERS: Final = 10_000


class _Mode(enum.Enum):
    """The part of a URL being escaped or unescaped: each allows different bytes unescaped."""
    PATH = enum.auto()
    PATH_SEGMENT = enum.auto()
    HOST = enum.auto()
    ZONE = enum.auto()
    USER_PASSWORD = enum.auto()
    QUERY_COMPONENT = enum.auto()
    FRAGMENT = enum.auto()


class UrlError(ValueError):
    """A string Go's parser refuses; the message is Go's error text."""


# --- Go's text helpers -------------------------------------------------------------------------

def go_quote(data: bytes) -> str:
    """Go's ``strconv.Quote``: how Go's errors print the text they quote (a byte that is not
    UTF-8 as ``\\xff``, a non-printable rune as ``\\u…``)."""
    out = ['"']
    index = 0
    while index < len(data):
        rune, width = _decode_rune(data, index)
        if rune is None:
            out.append(f"\\x{data[index]:02x}")
        else:
            out.append(_quote_rune(rune))
        index += width
    out.append('"')
    return "".join(out)


def _decode_rune(data: bytes, index: int) -> tuple[int | None, int]:
    """(the rune at index, its width), or (None, 1) where the bytes are not UTF-8."""
    for width in (1, 2, 3, 4):
        try:
            text = data[index:index + width].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return ord(text), width
    return None, 1


_ESCAPES: Final = {0x07: "\\a", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x0B: "\\v"}


def _quote_rune(rune: int) -> str:
    char = chr(rune)
    if char in '"\\':
        return "\\" + char
    if char == " " or unicodedata.category(char)[0] in "LMNPS":   # Go's unicode.IsPrint
        return char
    if rune in _ESCAPES:
        return _ESCAPES[rune]
    if rune < 0x20 or rune == 0x7F:
        return f"\\x{rune:02x}"
    return f"\\u{rune:04x}" if rune < 0x10000 else f"\\U{rune:08x}"


# --- escaping ------------------------------------------------------------------------------------

_ALNUM: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")


def _should_escape(byte: int, mode: _Mode) -> bool:
    """Whether Go writes this byte %-escaped in that part of a URL (RFC 3986, as Go reads it)."""
    if byte in _ALNUM:
        return False
    if mode in (_Mode.HOST, _Mode.ZONE) and byte in b"!$&'()*+,;=:[]<>\"":
        return False
    if byte in b"-_.~":
        return False
    if byte in b"$&+,/:;=?@":
        if mode is _Mode.PATH:
            return byte == ord("?")
        if mode is _Mode.PATH_SEGMENT:
            return byte in b"/;,?"
        if mode is _Mode.USER_PASSWORD:
            return byte in b"@/?:"
        if mode is _Mode.QUERY_COMPONENT:
            return True
        if mode is _Mode.FRAGMENT:
            return False
    return not (mode is _Mode.FRAGMENT and byte in b"!()*")


def _unescape(text: bytes, mode: _Mode) -> bytes:
    """Go's ``unescape``: every ``%`` must start two hex digits; a host allows only ``%25``
    and escapes of non-ASCII bytes, and none of the characters a host cannot hold."""
    index = 0
    while index < len(text):
        byte = text[index]
        if byte == ord("%"):
            if index + 2 >= len(text) or text[index + 1] not in _HEX or text[index + 2] not in _HEX:
                raise UrlError("invalid URL escape " + go_quote(text[index:index + 3]))
            escape = text[index:index + 3]
            value = int(escape[1:], 16)
            if mode is _Mode.HOST and value < 0x80 and escape != b"%25":
                raise UrlError("invalid URL escape " + go_quote(escape))
            if (mode is _Mode.ZONE and escape != b"%25" and value != ord(" ")
                    and _should_escape(value, _Mode.HOST)):
                raise UrlError("invalid URL escape " + go_quote(escape))
            index += 3
            continue
        if mode in (_Mode.HOST, _Mode.ZONE) and byte < 0x80 and _should_escape(byte, mode):
            raise UrlError(f"invalid character {go_quote(bytes([byte]))} in host name")
        index += 1
    out = bytearray()
    index = 0
    while index < len(text):
        byte = text[index]
        if byte == ord("%"):
            out.append(int(text[index + 1:index + 3], 16))
            index += 3
            continue
        out.append(ord(" ") if byte == ord("+") and mode is _Mode.QUERY_COMPONENT else byte)
        index += 1
    return bytes(out)


def _escape(text: bytes, mode: _Mode) -> bytes:
    out = bytearray()
    for byte in text:
        if byte == ord(" ") and mode is _Mode.QUERY_COMPONENT:
            out.append(ord("+"))
        elif _should_escape(byte, mode):
            out += b"%%%02X" % byte
        else:
            out.append(byte)
    return bytes(out)


def _valid_encoded(text: bytes, mode: _Mode) -> bool:
    """Whether text holds only bytes Go leaves as they are in that part (so it can stand as
    the part's own spelling)."""
    return all(byte in b"!$&'()*+,;=:@[]%" or not _should_escape(byte, mode) for byte in text)


# --- IP literals ---------------------------------------------------------------------------------

def _addr_error(given: bytes, message: str, at: bytes = b"") -> UrlError:
    where = f" (at {go_quote(at)})" if at else ""
    return UrlError(f"invalid host: ParseAddr({go_quote(given)}): {message}{where}")


def _is_ipv4(text: bytes) -> bool:
    """Go's ``netip.ParseAddr`` as far as a bracketed host needs it: True for an IPv4 address,
    False for an IPv6 one, UrlError (Go's message) for anything else."""
    for byte in text:
        if byte == ord("."):
            _check_ipv4(text, text)
            return True
        if byte == ord(":"):
            _check_ipv6(text)
            return False
        if byte == ord("%"):
            raise _addr_error(text, "missing IPv6 address")
    raise _addr_error(text, "unable to parse IP")


def _check_ipv4(given: bytes, part: bytes) -> None:
    value = digits = dots = 0
    for index, byte in enumerate(part):
        if 0x30 <= byte <= 0x39:
            if digits == 1 and value == 0:
                raise _addr_error(given, "IPv4 field has octet with leading zero")
            value, digits = value * 10 + byte - 0x30, digits + 1
            if value > 255:
                raise _addr_error(given, "IPv4 field has value >255")
        elif byte == ord("."):
            if index == 0 or index == len(part) - 1 or part[index - 1] == ord("."):
                raise _addr_error(given, "IPv4 field must have at least one digit", part[index:])
            if dots == 3:
                raise _addr_error(given, "IPv4 address too long")
            dots, value, digits = dots + 1, 0, 0
        else:
            raise _addr_error(given, "unexpected character", part[index:])
    if dots < 3:
        raise _addr_error(given, "IPv4 address too short")


def _check_ipv6(given: bytes) -> None:
    rest, _, zone = given.partition(b"%")
    if b"%" in given and not zone:
        raise _addr_error(given, "zone must be a non-empty string")
    ellipsis = -1
    if rest.startswith(b"::"):
        ellipsis, rest = 0, rest[2:]
        if not rest:
            return
    filled = 0
    while filled < 16:
        count = value = 0
        while count < len(rest) and rest[count] in _HEX:
            value = value * 16 + int(rest[count:count + 1], 16)
            if count > 3:
                raise _addr_error(given, "each group must have 4 or less digits", rest)
            count += 1
        if count == 0:
            raise _addr_error(given, "each colon-separated field must have at least one digit", rest)
        if count < len(rest) and rest[count] == ord("."):
            if ellipsis < 0 and filled != 12:
                raise _addr_error(given, "embedded IPv4 address must replace the final 2 fields of the address",
                                  rest)
            if filled + 4 > 16:
                raise _addr_error(given, "too many hex fields to fit an embedded IPv4 at the end of the address",
                                  rest)
            _check_ipv4(given, rest)
            rest, filled = b"", filled + 4
            break
        filled, rest = filled + 2, rest[count:]
        if not rest:
            break
        if rest[0] != ord(":"):
            raise _addr_error(given, "unexpected character, want colon", rest)
        if len(rest) == 1:
            raise _addr_error(given, "colon must be followed by more characters", rest)
        rest = rest[1:]
        if rest[0] == ord(":"):
            if ellipsis >= 0:
                raise _addr_error(given, "multiple :: in address", rest)
            ellipsis, rest = filled, rest[1:]
            if not rest:
                break
    if rest:
        raise _addr_error(given, "trailing garbage after address", rest)
    if filled < 16 and ellipsis < 0:
        raise _addr_error(given, "address string too short")
    if filled == 16 and ellipsis >= 0:
        raise _addr_error(given, "the :: must expand to at least one field of zeros")


# --- the parser ----------------------------------------------------------------------------------

@dataclasses.dataclass
class GoUrl:
    """Go's ``url.URL``, as bytes (Go's strings are bytes, and unescaping may leave any)."""
    scheme: bytes = b""
    opaque: bytes = b""
    user: tuple[bytes, bytes | None] | None = None   # (username, password or None)
    host: bytes = b""
    path: bytes = b""
    raw_path: bytes = b""
    omit_host: bool = False
    force_query: bool = False
    raw_query: bytes = b""
    fragment: bytes = b""
    raw_fragment: bytes = b""

    def escaped_path(self) -> bytes:
        if self.raw_path and _valid_encoded(self.raw_path, _Mode.PATH):
            try:
                if _unescape(self.raw_path, _Mode.PATH) == self.path:
                    return self.raw_path
            except UrlError:
                pass
        if self.path == b"*":
            return b"*"
        return _escape(self.path, _Mode.PATH)

    def escaped_fragment(self) -> bytes:
        if self.raw_fragment and _valid_encoded(self.raw_fragment, _Mode.FRAGMENT):
            try:
                if _unescape(self.raw_fragment, _Mode.FRAGMENT) == self.fragment:
                    return self.raw_fragment
            except UrlError:
                pass
        return _escape(self.fragment, _Mode.FRAGMENT)

    def string(self) -> bytes:
        """Go's ``URL.String()``."""
        out = bytearray()
        if self.scheme:
            out += self.scheme + b":"
        if self.opaque:
            out += self.opaque
        else:
            if (self.scheme or self.host or self.user is not None) and not (
                    self.omit_host and not self.host and self.user is None):
                if self.host or self.path or self.user is not None:
                    out += b"//"
                if self.user is not None:
                    name, password = self.user
                    out += _escape(name, _Mode.USER_PASSWORD)
                    if password is not None:
                        out += b":" + _escape(password, _Mode.USER_PASSWORD)
                    out += b"@"
                out += _escape(self.host, _Mode.HOST)
            path = self.escaped_path()
            if path and not path.startswith(b"/") and self.host:
                out += b"/"
            if not out and b":" in path.partition(b"/")[0]:
                out += b"./"
            out += path
        if self.force_query or self.raw_query:
            out += b"?" + self.raw_query
        if self.fragment:
            out += b"#" + self.escaped_fragment()
        return bytes(out)

    def split_host(self) -> tuple[bytes, bytes]:
        """(hostname, port): Go's ``Hostname()`` and ``Port()``."""
        host, port = self.host, b""
        colon = host.rfind(b":")
        if colon != -1 and _valid_port(host[colon:]):
            host, port = host[:colon], host[colon + 1:]
        if host.startswith(b"[") and host.endswith(b"]"):
            host = host[1:-1]
        return host, port

    def query(self) -> dict[bytes, list[bytes]]:
        """Go's ``Query()``: the parameters that decode; a malformed one is left out, and a query
        of too many parameters reads as none."""
        values: dict[bytes, list[bytes]] = {}
        if self.raw_query.count(b"&") + 1 > _MAX_QUERY_PARAMETERS:
            return values
        for setting in self.raw_query.split(b"&"):
            if not setting or b";" in setting:
                continue
            key, _, value = setting.partition(b"=")
            try:
                key, value = _unescape(key, _Mode.QUERY_COMPONENT), _unescape(value, _Mode.QUERY_COMPONENT)
            except UrlError:
                continue
            values.setdefault(key, []).append(value)
        return values


def _valid_port(port: bytes) -> bool:
    """Go's ``validOptionalPort``: empty, or a colon and digits (none at all is allowed)."""
    return not port or (port[:1] == b":" and all(0x30 <= byte <= 0x39 for byte in port[1:]))


def _split_scheme(raw: bytes) -> tuple[bytes, bytes]:
    for index, byte in enumerate(raw):
        if byte in _ALNUM and not 0x30 <= byte <= 0x39:
            continue
        if 0x30 <= byte <= 0x39 or byte in b"+-.":
            if index == 0:
                return b"", raw
            continue
        if byte == ord(":"):
            if index == 0:
                raise UrlError("missing protocol scheme")
            return raw[:index], raw[index + 1:]
        return b"", raw
    return b"", raw


def _parse_host(scheme: bytes, host: bytes) -> bytes:
    opening = host.rfind(b"[")
    if opening > 0:
        raise UrlError("invalid IP-literal")
    if opening == 0:
        closing = host.rfind(b"]")
        if closing < 0:
            raise UrlError("missing ']' in host")
        colon_port = host[closing + 1:]
        if not _valid_port(colon_port):
            raise UrlError(f"invalid port {go_quote(colon_port)} after host")
        port = _unescape(colon_port, _Mode.HOST)
        name = host[1:closing]
        zone = name.find(b"%25")
        if zone >= 0:
            address = _unescape(name[:zone], _Mode.HOST) + _unescape(name[zone:], _Mode.ZONE)
        else:
            address = _unescape(name, _Mode.HOST)
        if _is_ipv4(address):   # brackets are for IPv6 only (RFC 3986)
            raise UrlError("invalid IP-literal")
        return b"[" + address + b"]" + port
    colon = host.find(b":")
    if colon != -1:
        # A second colon is an error for http(s); other schemes (databases) list hosts so.
        if host.rfind(b":") != colon and scheme not in (b"http", b"https"):
            colon = host.rfind(b":")
        if not _valid_port(host[colon:]):
            raise UrlError(f"invalid port {go_quote(host[colon:])} after host")
    return _unescape(host, _Mode.HOST)


_USERINFO: Final = frozenset(b"-._:~!$&'()*+,;=%@") | _ALNUM


def _parse_authority(scheme: bytes, authority: bytes) -> tuple[tuple[bytes, bytes | None] | None, bytes]:
    at = authority.rfind(b"@")
    host = _parse_host(scheme, authority[at + 1:])
    if at < 0:
        return None, host
    userinfo = authority[:at]
    if not all(byte in _USERINFO for byte in userinfo):
        raise UrlError("net/url: invalid userinfo")
    name, colon, password = userinfo.partition(b":")
    name = _unescape(name, _Mode.USER_PASSWORD)
    return (name, _unescape(password, _Mode.USER_PASSWORD) if colon else None), host


def _parse(raw: bytes, via_request: bool) -> GoUrl:
    """Go's ``parse``; ``via_request``: as ``ParseRequestURI`` (absolute URI or path only)."""
    if any(byte < 0x20 or byte == 0x7F for byte in raw):
        raise UrlError("net/url: invalid control character in URL")
    if not raw and via_request:
        raise UrlError("empty url")
    url = GoUrl()
    if raw == b"*":
        url.path = b"*"
        return url
    scheme, rest = _split_scheme(raw)
    url.scheme = scheme.lower()
    if rest.endswith(b"?") and rest.count(b"?") == 1:
        url.force_query, rest = True, rest[:-1]
    else:
        rest, _, url.raw_query = rest.partition(b"?")
    if not rest.startswith(b"/"):
        if url.scheme:
            url.opaque = rest   # a rootless path: mailto:x@y
            return url
        if via_request:
            raise UrlError("invalid URI for request")
        if b":" in rest.partition(b"/")[0]:
            raise UrlError("first path segment in URL cannot contain colon")
    if (url.scheme or (not via_request and not rest.startswith(b"///"))) and rest.startswith(b"//"):
        authority, slash, path = rest[2:].partition(b"/")
        url.user, url.host = _parse_authority(url.scheme, authority)
        rest = slash + path
    elif url.scheme and rest.startswith(b"/"):
        url.omit_host = True
    url.path = _unescape(rest, _Mode.PATH)
    url.raw_path = b"" if _escape(url.path, _Mode.PATH) == rest else rest
    return url


def _error(raw: bytes, error: UrlError) -> UrlError:
    return UrlError(f"parse {go_quote(raw)}: {error}")


def parse_request_uri(raw: bytes) -> GoUrl:
    """Go's ``url.ParseRequestURI``."""
    try:
        return _parse(raw, via_request=True)
    except UrlError as error:
        raise _error(raw, error) from None


def parse(raw: bytes) -> GoUrl:
    """Go's ``url.Parse``: a ``#fragment`` is cut off first, and relative references parse."""
    before, _, fragment = raw.partition(b"#")
    try:
        url = _parse(before, via_request=False)
    except UrlError as error:
        raise _error(before, error) from None
    if fragment:
        try:
            url.fragment = _unescape(fragment, _Mode.FRAGMENT)
        except UrlError as error:
            raise _error(raw, error) from None
        url.raw_fragment = b"" if _escape(url.fragment, _Mode.FRAGMENT) == fragment else fragment
    return url


# --- the CEL functions ---------------------------------------------------------------------------

def _text(data: bytes) -> str:
    # An escape can decode to bytes that are not UTF-8; CEL strings are text.
    return data.decode("utf-8", errors="replace")


def _to_url(text: str) -> Any:
    raw = text.encode()
    try:
        parse_request_uri(raw)   # what Kubernetes (and OpenAPI's "uri" format) accepts
        url = parse(raw)         # what it keeps: ParseRequestURI mistakes a #fragment for path or query
    except UrlError as error:
        raise ValueError(f"URL parse error during conversion from string: {error}") from None
    return URL.of(_text(url.string()))


def _is_url(text: str) -> bool:
    try:
        parse_request_uri(text.encode())
    except UrlError:
        return False
    return True


@functools.lru_cache(maxsize=1024)
def _parsed(state: str) -> GoUrl:
    return parse(state.encode())


def _of(value: Any) -> GoUrl:
    return _parsed(URL.state(value))


def _query(value: Any) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for key, values in _of(value).query().items():
        result.setdefault(_text(key), []).extend(_text(item) for item in values)
    return result


_S: Final = cel.Type.STRING

LIBRARY: Final = Library("urls", "1.0", functions=(
    function("url", overload("string_to_url", URL.type, [_S], _to_url)),
    function("isURL", overload("is_url_string", cel.Type.BOOL, [_S], _is_url)),
    function("getScheme", overload("url_get_scheme", _S, [URL.type], lambda u: _text(_of(u).scheme), member=True)),
    function("getHost", overload("url_get_host", _S, [URL.type], lambda u: _text(_of(u).host), member=True)),
    function("getHostname", overload("url_get_hostname", _S, [URL.type],
                                     lambda u: _text(_of(u).split_host()[0]), member=True)),
    function("getPort", overload("url_get_port", _S, [URL.type], lambda u: _text(_of(u).split_host()[1]),
                                 member=True)),
    function("getEscapedPath", overload("url_get_escaped_path", _S, [URL.type],
                                        lambda u: _text(_of(u).escaped_path()), member=True)),
    function("getQuery", overload("url_get_query", cel.Type.Map(_S, cel.Type.List(_S)), [URL.type], _query,
                                  member=True)),
), summary="url(), isURL() and the parts of a URL, as Go's net/url parses it")
