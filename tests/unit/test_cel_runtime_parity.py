"""Where the C++ runtime computes differently from cel-go as Kubernetes (1.34) configures it, the
results and errors are Kubernetes': cross-type numeric comparisons, two-variable comprehensions,
``optional.ofNonZeroValue`` of timestamps, the strings extension version 2 (``format`` above all)
and ``string()`` of doubles, durations and timestamps.

Expected values are cel-go's (ext/strings.go and ext/formatting.go at v0.26.0, Kubernetes 1.34's,
and their tests), Go's ``fmt``/``strconv`` and golang.org/x/text's en-US number printer.
"""
from __future__ import annotations

from typing import Any

import pytest
from celcases import compile_error, evaluate, evaluation_error

COMPARISONS = [
    ("1 < 1.5", True),
    ("2 <= 1.5", False),
    ("1u < 2", True),
    ("3 >= 2u", True),
    ("1.5 > 1u", True),
    ("-1 < 0u", True),                      # a negative int is below every uint
    ("1u > -1", True),
    ("2.0 >= 2", True),
    ("18446744073709551615u > 9223372036854775807", True),
    ("9223372036854775807 < 9223372036854775808.0", False),   # the int is compared as a double, as in Go
    ("9007199254740993 > 9007199254740992.0", False),
    ("object.replicas < 2.5", True),
    ("'a' < 'b'", True),
    ("timestamp('2024-01-01T00:00:00Z') < timestamp('2024-01-02T00:00:00Z')", True),
    ("duration('1s') <= duration('1s')", True),
    ("quantity('1') < quantity('2Ki')", True),  # the quantity library's own comparisons remain
]


@pytest.mark.parametrize(("source", "expected"), COMPARISONS)
def test_cross_type_numeric_comparisons(source: str, expected: bool) -> None:
    assert evaluate(source, object={"replicas": 2}) is expected


@pytest.mark.parametrize("source", ["1 == 1.0", "'a' < 1", "true < 1"])
def test_equality_and_other_mixed_comparisons_do_not_type_check(source: str) -> None:
    assert "no matching overload" in compile_error(source)


TWO_VARIABLE_COMPREHENSIONS = [
    ("[1, 2].all(i, v, v > i)", True),
    ("{'a': 1, 'b': 2}.exists(k, v, k == 'b' && v == 2)", True),
    ("[1, 2, 1, 3, 1, 4].existsOne(i, v, i == 1 || v == 1)", False),
    ("[1, 1, 2, 2, 3, 3].existsOne(i, v, i == 2 && v == 2)", True),
    ("{'i': 0, 'j': 1, 'k': 2}.existsOne(i, v, i == 'l' || v == 1)", True),
    ("[1, 2].exists_one(i, v, v == 2)", True),          # cel-go's other spelling, with two variables
    ("[1, 2, 3].existsOne(x, x > 2)", True),            # and its one-variable macro
    ("[1, 2, 3].existsOne(x, x > 1)", False),
    ("'x.existsOne(y, z)'.size()", 17),                 # not inside a string
    ("[1, 2, 3].transformList(i, v, v * i)", [0, 2, 6]),
    ("[1, 2, 3].transformList(i, v, i > 0, v)", [2, 3]),
    ("{'a': 1}.transformMap(k, v, v + 1)", {"a": 2}),
    ("{'a': 1, 'b': 2}.transformMap(k, v, v > 1, v * 10)", {"b": 20}),
    ("[1, 2].transformMap(i, v, v * 2)", {0: 2, 1: 4}),
    ("[1, 2].transformMapEntry(i, v, {string(i): v})", {"0": 1, "1": 2}),
    ("{'a': 1}.transformMapEntry(k, v, v > 0, {k + 'x': v, k + 'y': v})", {"ax": 1, "ay": 1}),
    ("{'a': 'x'}.transformMap(k, v, duration('1s')).a == duration('1s')", True),
    ("{'a': 'x'}.transformMap(k, v, timestamp(1)).a == timestamp(1)", True),
    ("{'a': 'x'}.transformMap(k, v, [v, {'n': null}])", {"a": ["x", {"n": None}]}),
    ("{'a': 'x'}.transformMap(k, v, 2u).a == 2u", True),
]


@pytest.mark.parametrize(("source", "expected"), TWO_VARIABLE_COMPREHENSIONS)
def test_two_variable_comprehensions(source: str, expected: Any) -> None:
    assert evaluate(source) == expected


@pytest.mark.parametrize(("source", "expected"), [
    ("object.transformList(i, v, v * 2)", [v * 2 for v in range(100)]),
    ("object.transformList(i, v, v % 2 == 0, i)", list(range(0, 100, 2))),
    ("object.transformMap(i, v, v).size()", 100),
    ("object.transformMapEntry(i, v, {string(v): i})['99']", 99),
    ("lists.range(40).map(x, object.transformList(i, v, v)[x]) == object.slice(0, 40)", True),
])
def test_two_variable_comprehensions_over_long_lists(source: str, expected: Any) -> None:
    assert evaluate(source, object=list(range(100))) == expected


def test_transform_map_entry_refuses_a_key_twice() -> None:
    assert evaluation_error("[1, 2].transformMapEntry(i, v, {'same': v})") == "insert failed: key same already exists"


OPTIONALS = [
    ("optional.ofNonZeroValue(timestamp('0001-01-01T00:00:00Z')).hasValue()", False),   # Go's zero time
    ("optional.ofNonZeroValue(timestamp('1970-01-01T00:00:00Z')).hasValue()", True),
    ("optional.ofNonZeroValue(dyn(timestamp('0001-01-01T00:00:00Z'))).hasValue()", False),
    ("optional.ofNonZeroValue(timestamp(1)).value() == timestamp(1)", True),
    ("optional.ofNonZeroValue(0).hasValue()", False),
    ("optional.ofNonZeroValue('').hasValue()", False),
    ("optional.ofNonZeroValue([]).hasValue()", False),
    ("optional.ofNonZeroValue(duration('0s')).hasValue()", False),
    ("optional.ofNonZeroValue('a').value()", "a"),
]


@pytest.mark.parametrize(("source", "expected"), OPTIONALS)
def test_non_zero_values(source: str, expected: Any) -> None:
    assert evaluate(source) == expected


STRINGS = [
    ("'hello'.charAt(4)", "o"),
    ("'hello'.charAt(5)", ""),
    ("'hello mellow'.indexOf('')", 0),
    ("'hello mellow'.indexOf('ello', 2)", 7),
    ("'hello mellow'.indexOf('ello', 20)", -1),      # past the end: not found (cel-cpp: an error)
    ("'hello mellow'.indexOf('', 2)", 2),
    ("'hello mellow'.indexOf('', 20)", 20),
    ("'hello mellow'.lastIndexOf('')", 12),
    ("'hello mellow'.lastIndexOf('ello', 6)", 1),
    ("'hello mellow'.lastIndexOf('ello', 20)", -1),
    ("'hello'.lastIndexOf('hello world')", -1),
    ("'TacoCÆt Xii'.lowerAscii()", "tacocÆt xii"),
    ("'TacoCÆt Xii'.upperAscii()", "TACOCÆT XII"),
    ("'hello hello'.replace('he', 'we', 1)", "wello hello"),
    ("'hello hello'.replace('', '_')", "_h_e_l_l_o_ _h_e_l_l_o_"),
    ("'hello hello hello'.split(' ', 2)", ["hello", "hello hello"]),
    ("'hello hello hello'.split(' ', 0)", []),
    ("'hello'.split('')", ["h", "e", "l", "l", "o"]),
    ("'hello'.split('', 2)", ["h", "ello"]),
    ("''.split('')", []),                             # Go: no pieces (cel-cpp: one empty one)
    ("''.split(',')", [""]),
    ("'tacocat'.substring(4)", "cat"),
    ("'tacocat'.substring(0, 4)", "taco"),
    ("'tacocat'.substring(7)", ""),
    ("'  \\ttrim\\n    '.trim()", "trim"),
    ("'\\u200btrim'.trim()", "\u200btrim"),            # a zero-width space is not white space
    ("['hello', 'mellow'].join(' ')", "hello mellow"),
    ("[].join('/')", ""),
    ("strings.quote('two escape sequences \\a\\n')", '"two escape sequences \\a\\n"'),
    ("strings.quote('single-quote with \"double quote\"')", '"single-quote with \\"double quote\\""'),
]


@pytest.mark.parametrize(("source", "expected"), STRINGS)
def test_strings_extension(source: str, expected: Any) -> None:
    assert evaluate(source) == expected


STRING_ERRORS = [
    ("'hello'.charAt(6)", "index out of range: 6"),
    ("'hello'.charAt(-1)", "index out of range: -1"),
    ("'hello mellow'.indexOf('ello', -1)", "index out of range: -1"),
    ("'hello mellow'.lastIndexOf('ello', -1)", "index out of range: -1"),
    ("'tacocat'.substring(-1)", "index out of range: -1"),
    ("'tacocat'.substring(8)", "index out of range: 8"),
    ("'tacocat'.substring(2, 1)", "invalid substring range. start: 2, end: 1"),
    ("'tacocat'.substring(2, 8)", "index out of range: 8"),
    ("string(b'\\xff')", "invalid UTF-8 in bytes, cannot convert to string"),
]


@pytest.mark.parametrize(("source", "message"), STRING_ERRORS)
def test_strings_extension_errors(source: str, message: str) -> None:
    assert evaluation_error(source).startswith(message)


def test_string_reverse_is_not_in_version_2() -> None:
    assert "no matching overload" in compile_error("'gums'.reverse()")
    assert evaluate("[1, 2].reverse()") == [2, 1]


CONVERSIONS = [
    ("string(1.5)", "1.5"),
    ("string(1.0)", "1"),
    ("string(1234567.0)", "1.234567e+06"),
    ("string(0.00001)", "1e-05"),
    ("string(-0.0)", "-0"),
    ("string(1.0 / 0.0)", "+Inf"),
    ("string(-1.0 / 0.0)", "-Inf"),
    ("string(0.0 / 0.0)", "NaN"),
    ("string(duration('1.5s'))", "1.5s"),
    ("string(duration('1h45m47s'))", "6347s"),
    ("string(duration('2ns'))", "0.000000002s"),
    ("string(duration('-1.25s'))", "-1.25s"),
    ("string(timestamp('2023-02-03T23:31:20.120Z'))", "2023-02-03T23:31:20.12Z"),
    ("string(timestamp('2023-02-03T23:31:20.000Z'))", "2023-02-03T23:31:20Z"),
    ("string(object.ratio)", "+Inf"),                  # typed dyn: by the value's type
    ("string(object.name)", "web"),
    ("string(dyn(duration('90s')))", "90s"),
    ("string(18446744073709551615u)", "18446744073709551615"),
]


@pytest.mark.parametrize(("source", "expected"), CONVERSIONS)
def test_string_conversions_read_as_go_writes_them(source: str, expected: str) -> None:
    assert evaluate(source, object={"ratio": float("inf"), "name": "web"}) == expected


FORMATS = [
    ("'no substitution'.format([])", "no substitution"),
    ("'str is %s and some more'.format(['filler'])", "str is filler and some more"),
    ("'%% and also %%'.format([])", "% and also %"),
    ("'%%%s%%'.format(['text'])", "%text%"),
    ("'%d %d %d, %s %s %s'.format([1, 2, 3, 'A', 'B', 'C'])", "1 2 3, A B C"),
    ("'%.3f'.format([1.2345])", "1.234"),
    ("'%f'.format([2.71828])", "2.718280"),
    ("'%f'.format([1234567.0])", "1,234,567.000000"),       # x/text's en-US grouping
    ("'%f'.format([-1234.5])", "-1,234.500000"),
    ("'%.0f'.format([2.5])", "2"),
    ("'%e'.format([2.71828])", "2.718280\u202f\u00d7\u202f10\u2070\u2070"),
    ("'%.6e'.format([1052.032911275])", "1.052033\u202f\u00d7\u202f10\u2070\u00b3"),
    ("'%e'.format([0.00314])", "3.140000\u202f\u00d7\u202f10\u207b\u2070\u00b3"),
    ("'%f'.format(['NaN'])", "NaN"),
    ("'%f'.format(['Infinity'])", "∞"),
    ("'%f'.format(['-Infinity'])", "-∞"),
    ("'%b'.format([5])", "101"),
    ("'%b'.format([-5])", "-101"),
    ("'%b'.format([uint(64)])", "1000000"),
    ("'%b'.format([true])", "1"),
    ("'%o'.format([11])", "13"),
    ("'%o'.format([uint(65535)])", "177777"),
    ("'%x is 30 in hexadecimal'.format([30])", "1e is 30 in hexadecimal"),
    ("'%X'.format([30])", "1E"),
    ("'%x'.format([-30])", "-1e"),
    ("'%x'.format(['Hello world!'])", "48656c6c6f20776f726c6421"),
    ("'%X'.format([b'byte string'])", "6279746520737472696E67"),
    ("'%x'.format([b'\\x00\\x00byte string\\x00'])", "00006279746520737472696e6700"),
    ("'%s'.format([2.71])", "2.71"),
    ("'%s'.format([[2.71]])", "[2.710000]"),
    ("'%s'.format([0.000000002])", "2e-09"),
    ("'%s'.format([double('NaN')])", "NaN"),
    ("'%s'.format([double('Inf')])", "+Inf"),
    ("'%s'.format([[double('NaN'), double('+Inf'), double('-Inf')]])", '["NaN", "+Inf", "-Inf"]'),
    ("'%d'.format([uint(64)])", "64"),
    ("'null: %s'.format([null])", "null: null"),
    ("'%s'.format([999999999999])", "999999999999"),
    ("'some bytes: %s'.format([b'xyz'])", "some bytes: xyz"),
    ("'type is %s'.format([type('test string')])", "type is string"),
    ("'%s %s'.format([type([]), type(timestamp(1))])", "list google.protobuf.Timestamp"),
    ("'%s'.format([timestamp('2023-02-03T23:31:20+00:00')])", "2023-02-03T23:31:20Z"),
    ("'%s'.format([duration('1h45m47s')])", "6347s"),
    ("'%s'.format([['abc', 3.14, null, [9, 8, 7, 6], timestamp('2023-02-03T23:31:20Z')]])",
     '["abc", 3.140000, null, [9, 8, 7, 6], timestamp("2023-02-03T23:31:20Z")]'),
    ("'%s'.format([{'key1': b'xyz', 'key5': null, 'key2': duration('2h'), 'key4': true, 'key3': 2.71828}])",
     '{"key1":b"xyz", "key2":duration("7200s"), "key3":2.718280, "key4":true, "key5":null}'),
    ("'%s'.format([{'b': 1, 'a': 2}])", '{"a":2, "b":1}'),
    ("'true bool: %s, false bool: %s'.format([true, false])", "true bool: true, false bool: false"),
    ("'dynamic: %d %s %.3f'.format([object.n, object.s, object.d])", "dynamic: 128 a string 4.500"),
    ("'%s'.format([object])", '{"d":4.500000, "n":128, "s":"a string"}'),
]


@pytest.mark.parametrize(("source", "expected"), FORMATS)
def test_format(source: str, expected: str) -> None:
    assert evaluate(source, object={"n": 128, "s": "a string", "d": 4.5}) == expected


FORMAT_RUNTIME_ERRORS = [
    # Arguments the checker cannot see (typed dyn): the error comes when the expression runs.
    ("'%d'.format([object.d])", "error during formatting: decimal clause can only be used on integers, "
                                "was given double"),
    ("'%x'.format([object.d])", "error during formatting: only integers, byte buffers, and strings can be "
                                "formatted as hex, was given double"),
    ("'%b'.format([object.s])", "error during formatting: only integers and bools can be formatted as binary, "
                                "was given string"),
    ("'%o'.format([object.s])", "error during formatting: octal clause can only be used on integers, was given "
                                "string"),
    ("'%f'.format([object.n])", "error during formatting: fixed-point clause can only be used on doubles, "
                                "was given int"),
    ("'%e'.format([object.none])", "error during formatting: scientific clause can only be used on doubles, "
                                   "was given null_type"),
    ("'%d'.format([dyn(duration('30m2s'))])", "error during formatting: decimal clause can only be used on "
                                              "integers, was given google.protobuf.Duration"),
    ("'%s'.format([dyn(quantity('1'))])", "error during formatting: string clause can only be used on strings, "
                                          "bools, bytes, ints, doubles, maps, lists, types, durations, and "
                                          "timestamps, was given kubernetes.Quantity"),
    ("object.two.format([object.n])", "index 1 out of range"),
    ("object.bad.format([object.n])", 'could not parse formatting clause: unrecognized formatting clause "q"'),
]


@pytest.mark.parametrize(("source", "message"), FORMAT_RUNTIME_ERRORS)
def test_format_errors_at_run_time(source: str, message: str) -> None:
    bindings = {"d": 4.5, "s": "a string", "n": 1, "none": None, "two": "%d %d", "bad": "%q"}
    assert evaluation_error(source, object=bindings).startswith(message)   # a hint may follow


FORMAT_COMPILE_ERRORS = [
    # A literal format string with a literal list is checked as Kubernetes checks it.
    ("'%d'.format([1.0])", "error during formatting: decimal clause can only be used on integers, was given double"),
    ("'int is %d'.format([5.2])", "error during formatting: decimal clause can only be used on integers, "
                                  "was given double"),
    ("'double is %f'.format([true])", "error during formatting: fixed-point clause can only be used on doubles, "
                                      "was given bool"),
    ("'double is %e'.format([true])", "error during formatting: scientific clause can only be used on doubles, "
                                      "was given bool"),
    ("'string is %b'.format(['a string'])", "error during formatting: only integers and bools can be formatted "
                                            "as binary, was given string"),
    ("'%X is a double'.format([2.5])", "error during formatting: only integers, byte buffers, and strings can be "
                                       "formatted as hex, was given double"),
    ("'an octal: %o'.format([3.14])", "error during formatting: octal clause can only be used on integers, "
                                      "was given double"),
    ("'list is %s'.format([[1, 2, quantity('1')]])",
     "error during formatting: string clause can only be used on strings, bools, bytes, ints, doubles, maps, "
     "lists, types, durations, and timestamps, was given kubernetes.Quantity"),
    ("'%s %s'.format(['abc'])", "index 1 out of range"),
    ("'%s %s'.format(['abc', 'def', 'ghi'])", "too many arguments supplied to string.format (expected 2, got 3)"),
    ("'filler %'.format([])", "index 0 out of range"),
    ("'%a'.format([1])", 'could not parse formatting clause: unrecognized formatting clause "a"'),
    ("'double is %E'.format([0.5])", 'could not parse formatting clause: unrecognized formatting clause "E"'),
    ("'double is %.34'.format([5.0])", "could not parse formatting clause: error while parsing precision: "
                                       "could not find end of precision specifier"),
]


@pytest.mark.parametrize(("source", "message"), FORMAT_COMPILE_ERRORS)
def test_format_errors_at_compile_time(source: str, message: str) -> None:
    assert compile_error(source) == message


def test_format_error_names_the_argument_at_fault() -> None:
    try:
        evaluate("'%s %d'.format(['a',\n 1.5])")
    except Exception as error:   # CelCompileError: line 2, column of the 1.5
        assert (getattr(error, "line", None), getattr(error, "column", None)) == (2, 2)
    else:
        raise AssertionError("compiled")


def test_format_of_a_non_literal_list_is_checked_when_it_runs() -> None:
    assert evaluate("'%s-%d'.format(object)", object=["a", 1]) == "a-1"
    assert evaluation_error("'%s-%d'.format(object)", object=["a", "b"]).startswith(
        "error during formatting: decimal clause")
