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
from typing import Any, Final

from cel_expr_python import cel

from ...errors import AdmissionPolicyError
from .gostrings import quote
from .library import Library, accepts, function, overload
from .net import NetipError, parse_addr
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


class UrlError(AdmissionPolicyError, ValueError):
    """A string Go's parser refuses; the message is Go's error text."""


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
                raise UrlError("invalid URL escape " + quote(text[index:index + 3]))
            escape = text[index:index + 3]
            value = int(escape[1:], 16)
            if mode is _Mode.HOST and value < 0x80 and escape != b"%25":
                raise UrlError("invalid URL escape " + quote(escape))
            if (mode is _Mode.ZONE and escape != b"%25" and value != ord(" ")
                    and _should_escape(value, _Mode.HOST)):
                raise UrlError("invalid URL escape " + quote(escape))
            index += 3
            continue
        if mode in (_Mode.HOST, _Mode.ZONE) and byte < 0x80 and _should_escape(byte, mode):
            raise UrlError(f"invalid character {quote(bytes([byte]))} in host name")
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


def _spells(raw: bytes, decoded: bytes, mode: _Mode) -> bool:
    """Whether ``raw``, a part as it was written, may stand for ``decoded``: Go keeps the
    writer's spelling when it holds only bytes Go leaves as they are and decodes back to it."""
    if not raw or not all(byte in b"!$&'()*+,;=:@[]%" or not _should_escape(byte, mode) for byte in raw):
        return False
    try:
        return _unescape(raw, mode) == decoded
    except UrlError:
        return False


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
        """Go's ``URL.EscapedPath()``: the path as it was written when that is a valid spelling of it."""
        if _spells(self.raw_path, self.path, _Mode.PATH):
            return self.raw_path
        if self.path == b"*":
            return b"*"
        return _escape(self.path, _Mode.PATH)

    def escaped_fragment(self) -> bytes:
        """Go's ``URL.EscapedFragment()``: likewise for the fragment."""
        if _spells(self.raw_fragment, self.fragment, _Mode.FRAGMENT):
            return self.raw_fragment
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
            raise UrlError(f"invalid port {quote(colon_port)} after host")
        port = _unescape(colon_port, _Mode.HOST)
        name = host[1:closing]
        zone = name.find(b"%25")
        if zone >= 0:
            address = _unescape(name[:zone], _Mode.HOST) + _unescape(name[zone:], _Mode.ZONE)
        else:
            address = _unescape(name, _Mode.HOST)
        try:   # a byte that is not UTF-8 stays one character, which netip's error quotes as Go: \xNN
            is_ipv4 = parse_addr(address.decode("utf-8", "surrogateescape")).is4
        except NetipError as error:
            raise UrlError(f"invalid host: {error}") from None
        if is_ipv4:   # brackets are for IPv6 only (RFC 3986)
            raise UrlError("invalid IP-literal")
        return b"[" + address + b"]" + port
    colon = host.find(b":")
    if colon != -1:
        # A second colon is an error for http(s); other schemes (databases) list hosts so.
        if host.rfind(b":") != colon and scheme not in (b"http", b"https"):
            colon = host.rfind(b":")
        if not _valid_port(host[colon:]):
            raise UrlError(f"invalid port {quote(host[colon:])} after host")
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
    return UrlError(f"parse {quote(raw)}: {error}")


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
    function("isURL", overload("is_url_string", cel.Type.BOOL, [_S],
                               accepts(lambda text: parse_request_uri(text.encode())))),
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
