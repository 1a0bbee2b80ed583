"""Kubernetes' quantity library: ``quantity()``, ``isQuantity()``, exact arithmetic, comparisons.

Cases come from Kubernetes' library tests (``quantity_test.go`` of the CEL library), from
``resource.Quantity``'s own (what it parses, refuses, rounds and how it prints a value), and from
the library's documentation. A quantity result reads as its canonical text.
"""
from __future__ import annotations

import gc
import math
from decimal import Decimal

import pytest
from celcases import compile_error, evaluate, evaluation_error

from admission_policy.api import Expression
from admission_policy.cel import compile_expression, new_activation
from admission_policy.cel.lib.quantity import FORMAT_WRONG, MAX_DIGITS, NUMERIC, SUFFIX, canonical, parse_quantity

INT64_MAX = 2**63 - 1

# (written, canonical text of the value Kubernetes parses it as)
PARSED = [
    # suffixes
    ("0", "0"), ("0n", "0"), ("0Ki", "0"), ("0T", "0"), ("1", "1"), ("9", "9"),
    ("1Ki", "1024"), ("8Ki", "8192"), ("7Mi", str(7 * 2**20)), ("12Mi", str(12 * 2**20)), ("6Gi", str(6 * 2**30)),
    ("5Ti", str(5 * 2**40)), ("4Pi", str(4 * 2**50)), ("3Ei", str(3 * 2**60)),
    ("5n", "5n"), ("4u", "4u"), ("3m", "3m"), ("8k", "8k"), ("50k", "50k"), ("7M", "7M"), ("6G", "6G"),
    ("5T", "5T"), ("40T", "40T"), ("300T", "300T"), ("2P", "2P"), ("1E", "1E"), ("12E", "12E"),
    # exponents
    ("1E-3", "1m"), ("1e3", "1k"), ("1E6", "1M"), ("1e14", "100T"), ("1.2e3", "1200"), ("1.3E+6", "1300k"),
    ("1.40e9", "1400M"), ("1.53E12", "1530G"), ("0.5e-1", "50m"), ("0.5e0", "500m"),
    # the canonical form: an integer mantissa, the exponent a multiple of 3 and as large as can be
    ("100.035k", "100035"), ("0.0005k", "500m"), ("10.035M", "10035k"), ("7.123456M", "7123456"),
    ("6.987654321G", "6987654321"), ("1.01E", "1010P"), ("1.08", "1080m"), ("1000M", "1G"), ("0.001T", "1G"),
    ("1024Mi", "1073741824"), ("0.50000", "500m"), ("-1.5", "-1500m"), ("10000000000000000000", "10E"),
    ("999999999999999999.1", "999999999999999999100m"), ("-9223372036854775808.1", "-9223372036854775808100m"),
    ("9999999999999999999999999999999999999", "9999999999999999999999999999999999999"),
    ("1000E", "1e21"), ("1e3000", "1e3000"),   # beyond E, an exponent: "1000E" is not "1"
    ("1e" + "0" * 5000 + "1", "10"),            # an exponent with leading zeros: Go reads 1
    # finer than a nano-unit: rounded away from zero, so that a request gets something
    ("3.001n", "4n"), ("1.1E-9", "2n"), ("0.0000000001", "1n"), ("0.00000000050", "1n"), ("0.5e-9", "1n"),
    ("0.9n", "1n"), ("-0.9n", "-1n"), ("0.00000012345", "124n"), ("0.000000000001Ki", "2n"),
    # binary suffixes with fractions, and their cap at 2^63-1
    ("100.035Ki", "102435840m"), ("0.5Mi", "524288"), ("0.05Gi", "53687091200m"), (".001Ki", "1024m"),
    ("9Ei", str(INT64_MAX)), ("9223372036854775807Ki", str(INT64_MAX)), ("-9Ei", str(-INT64_MAX)),
    # signs, and what Kubernetes' scanner takes for zero
    ("+1", "1"), ("-0", "0"), ("-000", "0"), (".001", "1m"), (".0001k", "100m"), ("1.", "1"), ("1.G", "1G"),
    (".", "0"), ("-.", "0"), ("+", "0"), ("Mi", "0"), ("m", "0"),
    # Kubernetes keeps the exponent in an int32, which wraps
    ("1e4294967296", "1"), ("1e4294967299", "1k"), ("1e9223372036854775807", "100m"),
]

REFUSED = [
    ("", FORMAT_WRONG), ("10Mo", FORMAT_WRONG), ("Three", FORMAT_WRONG), ("1,3G", FORMAT_WRONG),
    ("1.1.M", FORMAT_WRONG), ("1+1.0M", FORMAT_WRONG), ("aoeu", FORMAT_WRONG), (" 1", FORMAT_WRONG),
    ("1 ", FORMAT_WRONG), ("1e3 ", FORMAT_WRONG), ("\u0661", FORMAT_WRONG),
    ("10Mm", SUFFIX), ("200K", SUFFIX), ("0.1mi", SUFFIX), (".5i", SUFFIX), ("1i", SUFFIX), ("1e", SUFFIX),
    ("1e+", SUFFIX), ("-3.01e-", SUFFIX), ("1ee3", SUFFIX), ("1Ki5", SUFFIX), ("1e9223372036854775808", SUFFIX),
    ("1e" + "9" * 5000, SUFFIX),
    ("Ei", NUMERIC), (".Ei", NUMERIC), ("-Ei", NUMERIC),   # no digits, where Go parses the number in full
]


@pytest.mark.parametrize(("text", "expected"), PARSED)
def test_a_quantity_is_its_exact_value_in_canonical_form(text: str, expected: str) -> None:
    assert evaluate(f"quantity({text!r})") == expected
    assert evaluate(f"isQuantity({text!r})") is True


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_what_kubernetes_refuses_is_refused_with_its_message(text: str, message: str) -> None:
    assert evaluation_error(f"quantity({text!r})") == message
    assert evaluate(f"isQuantity({text!r})") is False


@pytest.mark.parametrize(("text", "expected"), PARSED)
def test_the_canonical_text_reads_back_as_the_same_value(text: str, expected: str) -> None:
    value = parse_quantity(expected)
    assert canonical(value) == expected and value == parse_quantity(text)


VALUES = [
    # == compares values, whatever the writing
    ('quantity("200M") == quantity("200M")', True),
    ('quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")', True),
    ('quantity("2M") == quantity("0.002G") && quantity("2000k") == quantity("2M")', True),
    ('quantity("1Ki") == quantity("1024")', True),
    ('quantity("1.5Gi") == quantity("1536Mi")', True),
    ('quantity("200M") == quantity("0.3G")', False),
    ('quantity("200M") != quantity("0.3G")', True),
    ('quantity("1") in [quantity("500m"), quantity("1000m")]', True),
    ('type(quantity("1")) == kubernetes.Quantity', True),
    # comparisons
    ('quantity("50M").isLessThan(quantity("50Mi"))', True),
    ('quantity("100M").isLessThan(quantity("50M"))', False),
    ('quantity("50M").isLessThan(quantity("50M"))', False),
    ('quantity("50Mi").isGreaterThan(quantity("50M"))', True),
    ('quantity("50M").isGreaterThan(quantity("100M"))', False),
    ('quantity("200M").compareTo(quantity("0.2G"))', 0),
    ('quantity("50M").compareTo(quantity("50Mi"))', -1),
    ('quantity("50Mi").compareTo(quantity("50M"))', 1),
    ('quantity("-1n").compareTo(quantity("0"))', -1),
    ('quantity("1e3000").compareTo(quantity("1"))', 1),
    # arithmetic: exact, however large; the receiver is never changed
    ('quantity("50k").add(quantity("20")) == quantity("50.02k")', True),
    ('quantity("50k").add(20).isLessThan(quantity("50020"))', False),
    ('quantity("50k").sub(quantity("20")) == quantity("49.98k")', True),
    ('quantity("50k").sub(20) == quantity("49980")', True),
    ('quantity("50k").add(20).sub(quantity("100k")).asInteger()', -49980),
    ('quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger()', 20),
    ('quantity("9999999999999999999999999999999999999").add(quantity("1"))', "10e36"),
    ('quantity("9999999999999999999999999999999999999").add(quantity("1")) == quantity("1e37")', True),
    ('quantity("9999999999999999999999999999999999999").sub(quantity("9999999999999999999999999999999999998"))',
     "1"),
    ('[quantity("9999999999999999999999999999999999999")].all(x, '
     'x.add(quantity("1")).compareTo(x.add(quantity("2"))) == -1)', True),
    ('quantity("1").add(9223372036854775807).add(9223372036854775807)', "18446744073709551615"),
    ('quantity("0").sub(-9223372036854775807 - 1)', "9223372036854775808"),
    ('quantity("1n").add(quantity("1E"))', "1000000000000000000000000001n"),
    ('quantity("500m").sub(quantity("500m"))', "0"),
    ('quantity("1e99999").add(quantity("1")).compareTo(quantity("1e99999"))', 1),
    # sign() is a global function in Kubernetes
    ('sign(quantity("-1n"))', -1),
    ('sign(quantity("0"))', 0),
    ('sign(quantity("-0"))', 0),
    ('sign(quantity("1E"))', 1),
    # to numbers: an integer within int64, or a double
    ('quantity("50k").asInteger()', 50000),
    ('quantity("1Gi").asInteger()', 2**30),
    ('quantity("9223372036854775807").asInteger()', INT64_MAX),
    ('quantity("-9223372036854775808").asInteger()', -(2**63)),
    ('quantity("50").isInteger()', True),
    ('quantity("50000000G").isInteger()', True),
    ('quantity("-9223372036854775808").isInteger()', True),
    ('quantity("1.5").isInteger()', False),
    ('quantity("1n").isInteger()', False),
    ('quantity("9223372036854775808").isInteger()', False),
    ('quantity("-9223372036854775809").isInteger()', False),
    ('quantity("9999999999999999999999999999999999999G").isInteger()', False),
    ('quantity("50.703k").asApproximateFloat()', 50703.0),
    ('quantity("1m").asApproximateFloat()', 0.001),
    ('quantity("0.3").asApproximateFloat()', 0.3),   # the nearest double
    ('quantity("9999999999999999999").asApproximateFloat()', 1e19),
    ('quantity("1e400").asApproximateFloat()', math.inf),
    ('quantity("-1e400").asApproximateFloat()', -math.inf),
    ('quantity("50k").sub(20000).asApproximateFloat() == 30000.0', True),
    # this project's additions: operators, the canonical text, and formatQuantity of a double as before
    ('quantity("50M") < quantity("50Mi")', True),
    ('quantity("50M") <= quantity("0.05G")', True),
    ('quantity("50M") > quantity("50Mi")', False),
    ('quantity("1") >= quantity("1000m")', True),
    ('formatQuantity(quantity("1.5Gi"))', "1610612736"),
    ('formatQuantity(quantity("3800m").add(quantity("4")))', "7800m"),
    ("formatQuantity(8.0)", "8"),
    ("formatQuantity(8000.0)", "8000"),
    ("formatQuantity(7.8)", "7800m"),
    ("formatQuantity(0.25)", "250m"),
    ("formatQuantity(1e-7)", "100n"),
]


@pytest.mark.parametrize(("source", "expected"), VALUES)
def test_values(source: str, expected: object) -> None:
    assert evaluate(source) == expected


ERRORS = [
    ('quantity("9999999999999999999999999999999999999G").asInteger()', "cannot convert value to integer"),
    ('quantity("9223372036854775808").asInteger()', "cannot convert value to integer"),
    ('quantity("1.5").asInteger()', "cannot convert value to integer"),
    ('quantity("1e100000").add(quantity("1"))',
     f"the quantities' exact sum would have more than {MAX_DIGITS:,} digits"),
    ("formatQuantity(0.0 / 0.0)", "formatQuantity: nan is not a quantity"),
    ("formatQuantity(1.0 / 0.0)", "formatQuantity: inf is not a quantity"),
    ("kubernetes.Quantity{state: '1000m'}.isInteger()", "'1000m' is not the text of a kubernetes.Quantity"),
    ("kubernetes.Quantity{}.add(1)", "'' is not the text of a kubernetes.Quantity"),
]


@pytest.mark.parametrize(("source", "message"), ERRORS)
def test_errors(source: str, message: str) -> None:
    assert evaluation_error(source) == message


def test_a_comparison_with_another_opaque_type_is_no_overload_at_run_time() -> None:
    assert "no such overload" in evaluation_error('quantity("1").isLessThan(dyn(semver("1.0.0")))')


COMPILE_ERRORS = [
    ("isQuantity([1, 2, 3])", "found no matching overload for 'isQuantity'"),
    ('quantity("1").sign()', "undeclared reference to 'sign'"),   # a global function, as in Kubernetes
    ('quantity("50k").add("20k")', "found no matching overload for 'add'"),
    ('quantity("1").isLessThan(semver("1.0.0"))', "found no matching overload for 'isLessThan'"),
    ('quantity("1") + quantity("2")', "found no matching overload for '_+_'"),
    ('quantity("1") < 2', "found no matching overload for '_<_'"),
    ('quantity("1").asInteger() == quantity("1")', "found no matching overload for '_==_'"),
]


@pytest.mark.parametrize(("source", "message"), COMPILE_ERRORS)
def test_compile_errors(source: str, message: str) -> None:
    assert message in compile_error(source)


@pytest.mark.parametrize(("text", "exact"), [
    ("9999999999999999999999999999999999999", Decimal("9999999999999999999999999999999999999")),
    ("0.00000012345", Decimal("0.000000124")),
    ("1" * 5000, Decimal("1" * 5000)),   # past Python's int-to-text digit limit
])
def test_values_are_exact_at_any_size(text: str, exact: Decimal) -> None:
    assert parse_quantity(text) == exact


def test_a_library_functions_results_do_not_pile_up_in_memory() -> None:
    """cel-expr-python 0.1.3 keeps a reference to every message a Python function returns to CEL:
    a quantity built per call stayed in memory for good (~1 KB per request of default-resources,
    issue 33). Equal values are one message now, so repeating an evaluation leaves nothing behind.
    (The binding also leaks the copy of a message it passes to a function as an argument, which
    no code of ours can free: docs/design.md, "Known limits".)"""
    compiled = compile_expression(Expression("quantity('1') == quantity('1000m') && ip('10.0.0.1') != ip('::1')",
                                             "spec.validations[0].expression"))
    activation = new_activation({})
    for _ in range(100):
        assert compiled.evaluate(activation) is True
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(2000):
        compiled.evaluate(activation)
    gc.collect()
    assert len(gc.get_objects()) - before < 100   # was 8,000 (four per evaluation)
