"""Lists in Kubernetes' CEL: its lists library (isSorted, sum, min, max, indexOf, lastIndexOf),
cel-go's lists extension version 3 and sets extension, as a ValidatingAdmissionPolicy (1.34) has them.

Cases come from the libraries' documentation (Kubernetes' pkg/cel/library/lists.go, cel-go's
ext/lists.go and ext/sets.go) and from what their Go code does at the edges: empty lists, a list
typed dyn (taken by its first item), overflow, the errors' exact words.
"""
from __future__ import annotations

from typing import Any

import pytest
from celcases import compile_error, evaluate, evaluation_error

KUBERNETES_LISTS = [
    # isSorted: comparable items in non-decreasing order
    ("[1, 2, 3].isSorted()", True),
    ("['a', 'b', 'b', 'c'].isSorted()", True),
    ("[2.0, 1.0].isSorted()", False),
    ("[1].isSorted()", True),
    ("[].isSorted()", True),
    ("[1u, 3u, 2u].isSorted()", False),
    ("[false, true].isSorted()", True),
    ("[duration('1s'), duration('1m')].isSorted()", True),
    ("[timestamp('2024-01-02T00:00:00Z'), timestamp('2024-01-01T00:00:00Z')].isSorted()", False),
    ("[b'a', b'b'].isSorted()", True),
    # sum: the items added to the zero of the list's type
    ("[1, 3].sum()", 4),
    ("[1.0, 3.0].sum()", 4.0),
    ("[].sum()", 0),
    ("[1u, 2u].sum() == 3u", True),
    ("type([1u].sum()) == uint", True),
    ("type([0.5].sum()) == double", True),
    ("[duration('1m'), duration('1s')].sum() == duration('1m1s')", True),
    ("[duration('0.000000001s'), duration('1s')].sum() == duration('1.000000001s')", True),
    ("[-2, 1].sum()", -1),
    # min / max: the first of the least (greatest) items
    ("[1, 3].min()", 1),
    ("[1, 3].max()", 3),
    ("[1].min()", 1),
    ("([0] + []).min()", 0),
    ("['b', 'a', 'c'].max()", "c"),
    ("[2.5, -1.5].min()", -1.5),
    ("[true, false].min()", False),
    ("[18446744073709551615u, 1u].max() == 18446744073709551615u", True),
    ("[timestamp('2024-01-01T00:00:00.000000002Z'), timestamp('2024-01-01T00:00:00.000000001Z')].min()"
     " == timestamp('2024-01-01T00:00:00.000000001Z')", True),
    ("[duration('1h'), duration('90m')].max() == duration('90m')", True),
    # indexOf / lastIndexOf: by CEL's equality, -1 when absent
    ("[1, 2, 2, 3].indexOf(2)", 1),
    ("['a', 'b', 'b', 'c'].lastIndexOf('b')", 2),
    ("[1.0].indexOf(1.1)", -1),
    ("[].indexOf('string')", -1),
    ("[[1], [2]].indexOf([2])", 1),
    ("[{'a': 1}, {'a': 1}].lastIndexOf({'a': 1})", 1),
    ("[1, 2, 3].lastIndexOf(4)", -1),
    # the strings extension's indexOf still answers for strings
    ("'hello'.indexOf('l')", 2),
    ("'hello'.lastIndexOf('l')", 3),
]


@pytest.mark.parametrize(("source", "expected"), KUBERNETES_LISTS)
def test_kubernetes_lists_library(source: str, expected: Any) -> None:
    assert evaluate(source) == expected


DYN_LISTS = [
    # Read from the request, a list is typed dyn: cel-go picks the overload by its first item.
    ("object.sum()", [1, 2, 3], 6),
    ("object.sum()", [1.5, 2.5], 4.0),
    ("object.sum()", [], 0),
    ("object.max()", ["b", "c", "a"], "c"),
    ("object.min()", [3, 1, 2], 1),
    ("object.min()", [1, 0.5], 0.5),            # int and double compare across types
    ("object.min()", [1, "a", 0], 0),           # an item the kept one cannot compare with is passed over
    ("object.isSorted()", [1, 2, 2], True),
    ("object.isSorted()", [3, 1], False),
    ("object.indexOf('b')", ["a", "b", "b"], 1),
    ("object.lastIndexOf('b')", ["a", "b", "b"], 2),
    ("object.indexOf('l')", "hello", 2),        # a string receiver: the strings extension's
    ("object.lastIndexOf('l')", "hello", 3),
]


@pytest.mark.parametrize(("source", "value", "expected"), DYN_LISTS)
def test_dyn_lists_take_the_first_items_type(source: str, value: Any, expected: Any) -> None:
    assert evaluate(source, object=value) == expected


KUBERNETES_LIST_ERRORS = [
    ("[].min()", None, "min called on empty list"),
    ("[].max()", None, "max called on empty list"),
    ("object.min()", [], "min called on empty list"),
    ("[9223372036854775807, 1].sum()", None, "integer overflow"),
    ("[18446744073709551615u, 1u].sum()", None, "unsigned integer overflow"),
    ("object.sum()", ["a", "b"], "no such overload"),
    ("object.min()", [{"a": 1}], "no such overload"),
    ("object.max()", [1, {"a": 1}], "no such overload"),
    ("object.isSorted()", [1, None], "no such overload"),
]


@pytest.mark.parametrize(("source", "value", "message"), KUBERNETES_LIST_ERRORS)
def test_kubernetes_lists_library_errors(source: str, value: Any, message: str) -> None:
    assert evaluation_error(source, object=value).startswith(message)


@pytest.mark.parametrize("source", [
    "['a'].sum()",            # sum is for numbers and durations
    "[[1]].min()",            # min, max and isSorted for comparable types
    "[{'a': 1}].isSorted()",
    "[true].sum()",
])
def test_kubernetes_lists_library_types_are_checked(source: str) -> None:
    assert "no matching overload" in compile_error(source)


def test_kubernetes_lists_library_results_are_typed() -> None:
    # ``[1, 2].sum() + 1.5`` does not type-check in Kubernetes either: sum of list(int) is an int
    assert "no matching overload" in compile_error("[1, 2].sum() + 1.5")
    assert evaluate("[1, 2].sum() + 1") == 4


CEL_GO_LISTS = [
    # slice(start, end): end excluded
    ("[1, 2, 3, 4].slice(1, 3)", [2, 3]),
    ("[1, 2, 3, 4].slice(2, 4)", [3, 4]),
    ("[1, 2, 3].slice(0, 0)", []),
    # flatten: one level, or as many as asked
    ("[1, [2, 3], [4]].flatten()", [1, 2, 3, 4]),
    ("[1, [2, [3, 4]]].flatten()", [1, 2, [3, 4]]),
    ("[1, 2, [], [], [3, 4]].flatten()", [1, 2, 3, 4]),
    ("[1, [2, [3, [4]]]].flatten(2)", [1, 2, 3, [4]]),
    ("[1, [2, [3]]].flatten(0)", [1, [2, [3]]]),
    ("[[1, [2]]].flatten(10)", [1, 2]),
    # distinct: by CEL's equality, first occurrence kept
    ("[1, 2, 2, 3, 3, 3].distinct()", [1, 2, 3]),
    ("['b', 'b', 'c', 'a', 'c'].distinct()", ["b", "c", "a"]),
    ("[1, 2.0, 1u, 2].distinct()", [1, 2.0]),
    ("[].distinct()", []),
    # reverse, sort, sortBy
    ("[5, 3, 1, 2].reverse()", [2, 1, 3, 5]),
    ("[3, 2, 1].sort()", [1, 2, 3]),
    ("['b', 'c', 'a'].sort()", ["a", "b", "c"]),
    ("[].sort()", []),
    ("[true, false].sort()", [False, True]),
    ("[{'n': 'foo', 's': 0}, {'n': 'bar', 's': -10}, {'n': 'baz', 's': 1000}].sortBy(e, e.s).map(e, e.n)",
     ["bar", "foo", "baz"]),
    ("[3, 1, 2].sortBy(x, -x)", [3, 2, 1]),
    # first / last: optionals
    ("[1, 2, 3].first().value()", 1),
    ("[1, 2, 3].last().value()", 3),
    ("[].first().hasValue()", False),
    ("[].last().orValue('none')", "none"),
    # lists.range
    ("lists.range(5)", [0, 1, 2, 3, 4]),
    ("lists.range(0)", []),
    ("lists.range(-3)", []),                    # cel-go's loop never runs
    ("lists.range(3).map(i, i * 2)", [0, 2, 4]),
    # sets: CEL's equality, numbers across types
    ("sets.contains([1, 2, 3, 4], [2, 3])", True),
    ("sets.contains([1, 2, 3], [4])", False),
    ("sets.contains([], [])", True),
    ("sets.contains([1, 2u], [1.0, 2])", True),
    ("sets.equivalent([1, 1], [1])", True),
    ("sets.equivalent([1, 2.0], [2u, 1u])", True),
    ("sets.equivalent([1, 2], [1, 2, 3])", False),
    ("sets.intersects([1], [1, 2])", True),
    ("sets.intersects([], [1])", False),
]


@pytest.mark.parametrize(("source", "expected"), CEL_GO_LISTS)
def test_cel_go_lists_and_sets(source: str, expected: Any) -> None:
    assert evaluate(source) == expected


CEL_GO_LIST_ERRORS = [
    ("[1, 2, 3].slice(2, 1)", None, "cannot slice(2, 1), start index must be less than or equal to end index"),
    ("[1, 2, 3].slice(1, 5)", None, "cannot slice(1, 5), list is length 3"),
    ("[1, 2, 3].slice(-1, 2)", None, "cannot slice(-1, 2), negative indexes not supported"),
    ("[1, [2]].flatten(-1)", None, "level must be non-negative"),
    ("object.sort()", [3, "a"], "list elements must have the same type"),
    ("object.sort()", [1, 2.0], "list elements must have the same type"),
    ("object.sort()", [{}, {}], "list elements must be comparable"),
    ("object.sortBy(x, x)", [1, "a"], "list elements must have the same type"),
    # Kubernetes' per-call cost limit stops what lists.range(n) would build beyond it
    ("lists.range(1000001).size()", None, "operation cancelled: actual cost limit exceeded"),
    ("lists.range(object).size()", 2**40, "operation cancelled: actual cost limit exceeded"),
]


@pytest.mark.parametrize(("source", "value", "message"), CEL_GO_LIST_ERRORS)
def test_cel_go_lists_errors(source: str, value: Any, message: str) -> None:
    assert evaluation_error(source, object=value) == message


def test_lists_range_up_to_the_cost_limit() -> None:
    assert evaluate("lists.range(1000000).size()") == 1_000_000


@pytest.mark.parametrize("source", [
    "[[1], [2]].sort()",          # sort is for comparable items
    "[1].sortBy(x, [x])",
    "[1].slice('a', 2)",
    "lists.range('3')",
])
def test_cel_go_lists_types_are_checked(source: str) -> None:
    assert "no matching overload" in compile_error(source)


LONG = list(range(100))   # more than one chunk of syntax.linearize's accumulation


@pytest.mark.parametrize(("source", "expected"), [
    ("object.map(x, x * 2).sum()", sum(LONG) * 2),
    ("object.filter(x, x % 2 == 0).max()", 98),
    ("object.map(x, x).isSorted()", True),
    ("object.map(x, -x).isSorted()", False),
    ("object.map(x, x).indexOf(70)", 70),
    ("object.map(x, [x]).flatten() == object", True),
    ("object.map(x, x).reverse().first().value()", 99),
    ("object.map(x, object.indexOf(x)).sum()", sum(LONG)),
])
def test_list_functions_over_long_accumulated_lists(source: str, expected: Any) -> None:
    assert evaluate(source, object=LONG) == expected

