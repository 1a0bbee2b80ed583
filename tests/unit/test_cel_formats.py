"""Kubernetes' format library: ``format.<name>().validate(s)`` and ``format.named(name)``.

Cases come from Kubernetes' library tests (``format_test.go``) and from the rules and messages of
the validations the formats name: apimachinery's DNS names, label keys and values; kube-openapi's
uuid, byte, date and datetime; Go's ``url.ParseRequestURI``.
"""
from __future__ import annotations

import pytest
from celcases import compile_error, evaluate, evaluation_error

from admission_policy.cel.lib.formats import FORMATS


def errors(name: str, value: str) -> list[str]:
    """What ``format.<name>().validate(value)`` holds: [] for ``optional.none()``."""
    found: list[str] = evaluate(f"format.{name}().validate(object).orValue([])", object=value)
    return found


LABEL = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
         "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
         "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
SUBDOMAIN = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
             "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
             r"'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
DNS1035 = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
           "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
           "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")
NAME_PART = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
             "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
             "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
LABEL_KEY = ("a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
             "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
             "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and "
             "'/' (e.g. 'example.com/MyName')")
LABEL_VALUE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
               "must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', "
               "regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


def uri(text: str, reason: str) -> list[str]:
    return [f'parse "{text}": {reason}']


VALID = [
    # Kubernetes' examples
    ("dns1123Label", "my-label-name"),
    ("dns1123Subdomain", "apiextensions.k8s.io"),
    ("dns1035Label", "my-label-name"),
    ("qualifiedName", "apiextensions.k8s.io/v1beta1"),
    ("qualifiedName", "my.name"),
    ("dns1123LabelPrefix", "my-label-prefix-"),
    ("dns1123SubdomainPrefix", "mysubdomain.prefix.-"),
    ("dns1035LabelPrefix", "my-label-prefix-"),
    ("labelValue", "my-cool-label-Value"),
    ("uri", "http://example.com"),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000"),
    ("byte", "aGVsbG8="),
    ("date", "2021-01-01"),
    ("datetime", "2021-01-01T00:00:00Z"),
    # edges of each rule
    ("dns1123Label", "0"),
    ("dns1123Label", "a" * 63),
    ("dns1123Subdomain", ".".join(["a" * 63] * 3) + "." + "a" * 61),   # 253 characters
    ("dns1035Label", "a" * 63),
    ("qualifiedName", "Example_Name.1"),
    ("qualifiedName", "a" * 63),
    ("labelValue", ""),
    ("labelValue", "a" * 63),
    ("dns1123LabelPrefix", "a-"),
    ("dns1123LabelPrefix", "abc_-"),     # the two last bytes become "a": Kubernetes' maskTrailingDash
    ("uri", "/"),
    ("uri", "*"),
    ("uri", "mailto:someone@example.com"),
    ("uri", "http://user:pass@example.com:8080/a%20b?q=1"),
    ("uri", "http://[fe80::1%25en0]:8080/"),
    ("uri", "ftp://a:b:21/"),            # not http(s): the last colon starts the port
    ("uuid", "123E4567E89B12D3A456426614174000"),
    ("byte", "aGVsbA=="),
    ("date", "2020-02-29"),
    ("date", "0000-01-01"),
    ("datetime", "2020-01-01t23:59:59.123456+05:30"),
    ("datetime", "2020-01-01T00:00:00ZtXYZ"),   # after a second "t", nothing is looked at
]


@pytest.mark.parametrize(("name", "value"), VALID)
def test_valid_values_give_none(name: str, value: str) -> None:
    assert evaluate(f"format.{name}().validate(object).hasValue()", object=value) is False


INVALID = [
    # Kubernetes' examples
    ("dns1123Label", "contains a space", [LABEL]),
    ("dns1123Subdomain", "contains a space", [SUBDOMAIN]),
    ("dns1035Label", "contains a space", [DNS1035]),
    ("qualifiedName", "contains a space", [NAME_PART]),
    ("dns1123LabelPrefix", "contains a space-", [LABEL]),
    ("dns1123SubdomainPrefix", "contains a space-", [SUBDOMAIN]),
    ("dns1035LabelPrefix", "contains a space-", [DNS1035]),
    ("labelValue", "my-cool-label-Value!!\n\n!!!", [LABEL_VALUE]),
    ("byte", "aGVsbG8", ["invalid base64"]),
    ("date", "2020-01-32", ["invalid date"]),
    ("datetime", "2020-01-32T00:00:00Z", ["invalid datetime"]),
    # DNS names: length (in bytes) and pattern are both reported
    ("dns1123Label", "", [LABEL]),
    ("dns1123Label", "a" * 64, ["must be no more than 63 characters"]),
    ("dns1123Label", "A" * 64, ["must be no more than 63 characters", LABEL]),
    ("dns1123Label", "my.name", ["must not contain dots"]),
    ("dns1123Label", "name\n", [LABEL]),              # Go's "$" is the end of the text
    ("dns1123Label", "é", [LABEL]),
    ("dns1123Subdomain", "a" * 254, ["must be no more than 253 characters"]),
    ("dns1123Subdomain", "-a.b", [SUBDOMAIN]),
    ("dns1035Label", "1abc", [DNS1035]),
    ("dns1035Label", "a" * 64, ["must be no more than 63 characters"]),
    ("dns1123LabelPrefix", "-", [LABEL]),             # one byte: not masked
    ("dns1123LabelPrefix", "a.b-", ["must not contain dots"]),   # checked as "a.a"
    # qualified names (label keys)
    ("qualifiedName", "", ["name part must be non-empty", NAME_PART]),
    ("qualifiedName", "/name", ["prefix part must be non-empty"]),
    ("qualifiedName", "example.com/", ["name part must be non-empty", NAME_PART]),
    ("qualifiedName", "a/b/c", [LABEL_KEY]),
    ("qualifiedName", "Example.com/name", ["prefix part " + SUBDOMAIN]),
    ("qualifiedName", "a" * 254 + "/name", ["prefix part must be no more than 253 bytes"]),
    ("qualifiedName", "a" * 64, ["name part must be no more than 63 bytes"]),
    ("qualifiedName", "_name", [NAME_PART]),
    # label values
    ("labelValue", "a" * 64, ["must be no more than 63 bytes"]),
    ("labelValue", "é" * 32, ["must be no more than 63 bytes", LABEL_VALUE]),
    ("labelValue", "-a", [LABEL_VALUE]),
    # URIs, as Go's url.ParseRequestURI words them
    ("uri", "", uri("", "empty url")),
    ("uri", "example.com", uri("example.com", "invalid URI for request")),
    ("uri", "../dir/", uri("../dir/", "invalid URI for request")),
    ("uri", "://x", uri("://x", "missing protocol scheme")),
    ("uri", "http://a b.com/", uri("http://a b.com/", 'invalid character " " in host name')),
    ("uri", "http://example.com#frag", uri("http://example.com#frag", 'invalid character "#" in host name')),
    ("uri", "http://x:port/", uri("http://x:port/", 'invalid port ":port" after host')),
    ("uri", "http://localhost:80:80/", uri("http://localhost:80:80/", 'invalid port ":80:80" after host')),
    ("uri", "http://::1/", uri("http://::1/", 'invalid port "::1" after host')),
    ("uri", "http://[::1/", uri("http://[::1/", "missing ']' in host")),
    ("uri", "http://a[::1]/", uri("http://a[::1]/", "invalid IP-literal")),
    ("uri", "https://[1.2.3.4]/", uri("https://[1.2.3.4]/", "invalid IP-literal")),
    ("uri", "https://[v1.x]/", uri("https://[v1.x]/", 'invalid host: ParseAddr("v1.x"): unexpected character '
                                                      '(at "v1.x")')),
    ("uri", "http://[%ff::1]/", uri("http://[%ff::1]/", r'invalid host: ParseAddr("\xff::1"): each colon-separated '
                                                        r'field must have at least one digit (at "\xff::1")')),
    ("uri", "http://%41:8080/", uri("http://%41:8080/", 'invalid URL escape "%41"')),
    ("uri", "http://x/%zz", uri("http://x/%zz", 'invalid URL escape "%zz"')),
    ("uri", "http://x/%zé", uri("http://x/%zé", r'invalid URL escape "%z\xc3"')),   # Go cuts bytes, not runes
    ("uri", "http://ü@x/", uri("http://ü@x/", "net/url: invalid userinfo")),
    ("uri", "http://x/\ty", [r'parse "http://x/\ty": net/url: invalid control character in URL']),
    # the other string formats
    ("uuid", "123e4567-e89b-12d3-a456-42661417400", ["does not match the UUID format"]),
    ("uuid", "123e4567-e89b-12d3-a456-42661417400g", ["does not match the UUID format"]),
    ("byte", "", ["invalid base64"]),
    ("byte", "aGV-bG8_", ["invalid base64"]),         # the URL-safe alphabet is not base64 here
    ("byte", "A===", ["invalid base64"]),
    ("date", "2021-02-29", ["invalid date"]),
    ("date", "2020-13-01", ["invalid date"]),
    ("date", "2020-1-01", ["invalid date"]),
    ("date", "2020-01-01T00:00:00Z", ["invalid date"]),
    ("datetime", "2020-01-01T24:00:00Z", ["invalid datetime"]),
    ("datetime", "2020-01-01T00:00:60Z", ["invalid datetime"]),
    ("datetime", "2020-01-01T00:00:00", ["invalid datetime"]),
    ("datetime", "2020-01-01 00:00:00Z", ["invalid datetime"]),
    ("datetime", "", ["invalid datetime"]),
]


@pytest.mark.parametrize(("name", "value", "expected"), INVALID)
def test_invalid_values_give_what_is_wrong(name: str, value: str, expected: list[str]) -> None:
    assert errors(name, value) == expected


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_has_a_name(name: str) -> None:
    assert evaluate(f'format.named("{name}").hasValue()') is True
    assert evaluate(f'format.named("{name}").value() == format.{name}()') is True


@pytest.mark.parametrize(("left", "right"), [("dns1123Label", "dns1123LabelPrefix"), ("uri", "uuid"),
                                             ("date", "datetime"), ("qualifiedName", "labelValue")])
def test_different_formats_are_not_equal(left: str, right: str) -> None:
    assert evaluate(f"format.{left}() == format.{right}()") is False


@pytest.mark.parametrize("name", ["unknown", "", "DNS1123Label", "dns1123label", "url"])
def test_an_unknown_name_gives_none(name: str) -> None:
    assert evaluate("format.named(object).hasValue()", object=name) is False


USES = [
    ('format.named("dns1123Label").value().validate("Bad").value()', [LABEL]),
    ('format.named("uri").orValue(format.uuid()).validate("http://x").hasValue()', False),
    ('format.named("nope").orValue(format.uuid()).validate("x").value()', ["does not match the UUID format"]),
    ('format.dns1123Label().validate("a b").value().join("; ")', LABEL),
    ('["ok", "Not OK", "fine"].filter(n, format.dns1123Label().validate(n).hasValue())', ["Not OK"]),
    ('["ok", "a.b"].map(n, format.dns1123Label().validate(n).orValue([]))', [[], ["must not contain dots"]]),
    ('cel.bind(f, format.named("byte"), f.hasValue() && !f.value().validate("aGk=").hasValue())', True),
    ("format.labelValue()", "labelValue"),
]


@pytest.mark.parametrize(("source", "expected"), USES)
def test_formats_compose_with_optionals(source: str, expected: object) -> None:
    assert evaluate(source) == expected


def test_value_of_an_unknown_format_is_an_error() -> None:
    assert "optional.none() dereference" in evaluation_error('format.named("nope").value().validate("x")')


def test_a_format_built_by_hand_must_name_a_format() -> None:
    assert evaluation_error('kubernetes.NamedFormat{state: "nope"}.validate("x").hasValue()') == 'unknown format "nope"'


@pytest.mark.parametrize(("source", "message"), [
    ("format.unknown()", "undeclared reference to 'unknown'"),
    ("format.named(1)", "found no matching overload for 'format.named'"),
    ('format.dns1123Label().validate(1)', "found no matching overload for 'validate'"),
    ('"x".validate("y")', "found no matching overload for 'validate'"),
])
def test_misuse_does_not_compile(source: str, message: str) -> None:
    assert message in compile_error(source)
