"""A static estimate of what a CEL expression can cost, from its checked tree (``cel.syntax``).

cel-expr-python neither estimates nor meters cost (Kubernetes' CEL, cel-go, does both), and its
only limit is 10,000 comprehension iterations per evaluation, which stops a loop but not what
one step does: a string that doubles at each of 25 nested ``cel.bind``s takes seconds and
gigabytes without a single iteration. So the engine bounds cost the way Kubernetes' estimator
does, over the tree, in the same units (about Kubernetes' cost units: 1 per operation, 0.1 per
character or item an operation traverses), and against the sizes of what the request holds:

- ``size``: an upper bound of the largest object bound to the expression (``object``,
  ``oldObject``, ``request``, ``namespaceObject``), counted as its characters plus one per value
  (its JSON text is never smaller);
- ``items``: an upper bound of the most items one list or map of theirs holds.

Every value read from the request is then at most ``size`` large, and a list or map of it holds
at most ``items``. What an expression builds is bounded from what it reads (``a + b`` holds at
most both; ``s.split(',')`` at most ``s``'s characters), so a bound grows with the expression,
and doubling a string 25 times multiplies it by 2**25. A comprehension's steps cost at most
what one step costs on the whole list plus, per item, what it costs on an item of size 1: the
steps' costs grow with their item's size, and the items' sizes add up to the list's.

It is an upper bound, loose where the tree cannot tell (an ``a == b`` inside a loop is charged
as if ``b`` could be the whole request each time). Used twice: at compile time against
reference sizes (the policy is refused if it is over budget there), and, for a request larger
than those, before each expression runs, against the request's actual sizes.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Final

from .syntax import Checked, Expr

ITERATION_LIMIT: Final = 10_000     # cel-expr-python's comprehension budget per evaluation (not settable)
TRAVERSAL: Final = 0.1              # per character or item an operation reads or writes


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the request holds, as bounds (see the module doc)."""
    size: float
    items: float


@dataclasses.dataclass(frozen=True)
class Value:
    """What the estimate knows of a value: its size (characters + values) and items, bounded."""
    size: float
    items: float
    from_request: bool = False   # a list or map read from the request holds at most Sizes.items
    fields: Mapping[str, Value] | None = None   # a map with these constant keys (``variables``)
    is_list: bool = False        # known to be a list: concatenating copies item handles, not items

    def element(self, sizes: Sizes, name: str | None = None) -> Value:
        """An item of this value, or its field ``name``."""
        if name is not None and self.fields is not None and name in self.fields:
            return self.fields[name]
        items = min(self.size, sizes.items) if self.from_request else self.size
        return Value(self.size, items, self.from_request)


SCALAR: Final = Value(1, 1)
_NUMERIC_ADDITIONS: Final = frozenset({
    "add_int64", "add_uint64", "add_double", "add_duration_duration", "add_timestamp_duration",
    "add_duration_timestamp"})
REQUEST_VARIABLES: Final = frozenset({"object", "oldObject", "request", "namespaceObject"})


@dataclasses.dataclass
class _Scope:
    sizes: Sizes
    overloads: Mapping[int, tuple[str, ...]]
    names: dict[str, Value]
    # (path of a comprehension's range, its item variable) → that item: ``m.exists(k, m[k] …)``
    # reads the value paired with the key, which is no larger than the item it stands for.
    partners: dict[tuple[str, str], Value] = dataclasses.field(default_factory=dict)


def estimate(checked: Checked, sizes: Sizes, variables: Mapping[str, Value] | None = None,
             context: Mapping[str, int] | None = None) -> tuple[float, Value]:
    """(cost, result) of one evaluation against a request of at most ``sizes``.

    ``variables``: what each policy variable's expression returns (its own estimate), for
    ``variables.<name>``; one not given is taken as large as the request.
    ``context``: each context entry's declared maxObjects, for ``context.<name>``: a list of that
    many objects, each as large as the request's (``params`` is one object of that size).
    """
    request = Value(sizes.size, min(sizes.size, sizes.items), True)
    names = {name: request for name in REQUEST_VARIABLES}
    names["params"] = request
    lists = {name: context_list(count, sizes) for name, count in (context or {}).items()}
    names["context"] = Value(sum(v.size for v in lists.values()) + len(lists) + 1, len(lists), fields=lists)
    given = dict(variables or {})
    names["variables"] = Value(sum(v.size for v in given.values()) + len(given) + 1, len(given), fields=given)
    try:
        return _estimate(checked.root, _Scope(sizes, checked.overloads, names))
    except RecursionError:   # the parser nests 32 deep at most; a rewritten tree a little more
        return math.inf, Value(math.inf, math.inf)


def context_list(count: int, sizes: Sizes) -> Value:
    """A context entry's list: ``count`` objects at most, each at most as large as the request's."""
    return Value(count * (sizes.size + 1) + 1, count, is_list=True)


def _estimate(node: Expr, scope: _Scope) -> tuple[float, Value]:
    if node.kind == "const":
        constant = node.constant()
        return 1, Value(len(constant), len(constant)) if isinstance(constant, (str, bytes)) else SCALAR
    if node.kind == "ident":
        return 1, scope.names.get(node.name, Value(scope.sizes.size, scope.sizes.items, True))
    if node.kind == "select":
        assert node.target is not None
        cost, target = _estimate(node.target, scope)
        return cost + 1, SCALAR if node.test_only else target.element(scope.sizes, node.name)
    if node.kind == "list":
        results = [_estimate(item, scope) for item in node.args]
        size = sum(value.size for _, value in results) + 1
        return 1 + len(results) + sum(cost for cost, _ in results), Value(size, len(results), is_list=True)
    if node.kind == "struct":
        cost, size, known = 1.0, 1.0, {}
        for entry in node.entries:
            key = entry.field_key
            if entry.key is not None:
                key_cost, key_value = _estimate(entry.key, scope)
                cost, size = cost + key_cost, size + key_value.size
                key = entry.key.constant() if entry.key.kind == "const" else None
            value_cost, value = _estimate(entry.value, scope)
            cost, size = cost + value_cost + 1, size + value.size
            if isinstance(key, str):
                known[key] = value
        return cost, Value(size, len(node.entries), fields=known)
    if node.kind == "comprehension":
        return _comprehension(node, scope)
    if node.kind == "call":
        return _call(node, scope)
    return 1, SCALAR


def _call(node: Expr, scope: _Scope) -> tuple[float, Value]:
    operands = ([node.target] if node.target is not None else []) + node.args
    if node.name in ("_&&_", "_||_", "_?_:_"):
        results = [_estimate(operand, scope) for operand in operands]
        cost = 1 + sum(c for c, _ in results)
        if node.name != "_?_:_":
            return cost, SCALAR
        # Either branch may be taken: pay both, keep the larger.
        return cost, _larger(results[1][1], results[2][1])
    results = [_estimate(operand, scope) for operand in operands]
    cost = 1 + sum(c for c, _ in results)
    values = [value for _, value in results]
    if node.name in ("_[_]", "_[?_]") and len(node.args) == 2 and node.args[1].kind == "ident":
        partner = scope.partners.get((_path(node.args[0]), node.args[1].name))
        if partner is not None:
            return cost + TRAVERSAL * values[1].size, partner
    rule = _FUNCTIONS.get(node.name, _unknown)
    extra, value = rule(values, scope.sizes, scope.overloads.get(node.id, ()))
    return cost + extra, value


def _larger(a: Value, b: Value) -> Value:
    return Value(max(a.size, b.size), max(a.items, b.items), a.from_request or b.from_request)


def _comprehension(node: Expr, scope: _Scope) -> tuple[float, Value]:
    parts = node.comprehension
    range_cost, range_value = _estimate(parts["iter_range"], scope)
    init_cost, accumulator = _estimate(parts["accu_init"], scope)
    iterations = min(range_value.items, ITERATION_LIMIT)
    accu_var = parts.get("accu_var", "")
    collects = parts["accu_init"].kind == "list" and not parts["accu_init"].args
    if iterations == 0:   # cel.bind (a comprehension over []): the result sees the bound value
        result_cost, result = _estimate(parts["result"], _bind(scope, {accu_var: accumulator}))
        return range_cost + init_cost + result_cost + 1, result

    path = _path(parts["iter_range"])

    def step(item: Value) -> tuple[float, Value]:
        names = {parts.get("iter_var", ""): item, accu_var: SCALAR}
        if parts.get("iter_var2"):
            names[parts["iter_var2"]] = item
        inner = _bind(scope, names)
        if path:
            inner.partners[(path, parts.get("iter_var", ""))] = item
        condition_cost, _ = _estimate(parts["loop_condition"], inner)
        step_cost, step_value = _estimate(parts["loop_step"], inner)
        return condition_cost + step_cost, step_value

    whole = range_value.element(scope.sizes)
    big_cost, big = step(whole)
    small_cost, small = step(Value(1, 1))
    steps_cost = big_cost + iterations * small_cost
    if collects:   # map/filter: the list of what the steps appended, built once (syntax.linearize)
        collected = Value(big.size + iterations * small.size, iterations, is_list=True)
        result_cost, result = _estimate(parts["result"], _bind(scope, {accu_var: collected}))
        result_cost += iterations
    else:
        result_cost, result = _estimate(parts["result"], _bind(scope, {accu_var: _larger(accumulator, big)}))
    return range_cost + init_cost + steps_cost + result_cost + 1, result


def _bind(scope: _Scope, names: Mapping[str, Value]) -> _Scope:
    merged = dict(scope.names)
    merged.update(names)
    partners = {key: value for key, value in scope.partners.items() if key[1] not in names}
    return _Scope(scope.sizes, scope.overloads, merged, partners)


def _path(node: Expr) -> str:
    """``object.metadata.annotations`` for that, its ``.?`` form and its ``.orValue(…)``; else ""."""
    if node.kind == "ident":
        return node.name
    if node.kind == "select" and node.target is not None and not node.test_only:
        base = _path(node.target)
        return f"{base}.{node.name}" if base else ""
    if node.kind == "call" and node.name == "_?._" and len(node.args) == 2 and node.args[1].kind == "const":
        base, name = _path(node.args[0]), node.args[1].constant()
        return f"{base}.{name}" if base and isinstance(name, str) else ""
    if node.kind == "call" and node.name == "orValue" and node.target is not None:
        return _path(node.target)
    if node.kind == "comprehension" and _is_filter(node):
        return _path(node.comprehension["iter_range"])   # its items are the range's
    return ""


def _is_filter(node: Expr) -> bool:
    """``range.filter(x, …)``: the step appends the item variable itself, under a condition."""
    step, item = node.comprehension.get("loop_step"), node.comprehension.get("iter_var", "")
    if step is None or step.kind != "call" or step.name != "_?_:_" or len(step.args) != 3:
        return False
    append = step.args[1]
    return (append.kind == "call" and append.name == "_+_" and len(append.args) == 2
            and append.args[1].kind == "list" and len(append.args[1].args) == 1
            and append.args[1].args[0].kind == "ident" and append.args[1].args[0].name == item)


# --- functions: (extra cost, result) from the operands' values ----------------------------------

_Rule = Callable[[list[Value], Sizes, tuple[str, ...]], tuple[float, Value]]


def _unknown(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    """A function not listed: reads everything it is given, returns at most as much."""
    total = sum(value.size for value in values)
    return TRAVERSAL * total, Value(total + 1, total + 1)


def _scalar(cost: float = 0) -> _Rule:
    return lambda values, sizes, overloads: (cost, SCALAR)


def _reads(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    return TRAVERSAL * sum(value.size for value in values), SCALAR


def _same(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    """Reads its receiver and returns something as large (lowerAscii, trim, substring, …)."""
    return TRAVERSAL * values[0].size, Value(values[0].size, values[0].size)


def _compare(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    return TRAVERSAL * min(value.size for value in values), SCALAR


def _add(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    if overloads and all(overload in _NUMERIC_ADDITIONS for overload in overloads):
        return 0, SCALAR
    size, items = sum(value.size for value in values), sum(value.items for value in values)
    if any(value.is_list for value in values) or overloads == ("add_list",):
        return items, Value(size, items, is_list=True)
    return TRAVERSAL * size, Value(size, items)   # strings and bytes: Kubernetes charges 0.1 a character


def _contains(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    """``x in list`` compares with every item, each comparison stopping at the shorter of the two;
    ``in`` a map hashes ``x`` (no longer than the longest key to find)."""
    item, container = values
    return container.items + TRAVERSAL * min(container.size, item.size * max(container.items, 1)), SCALAR


def _index(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    return TRAVERSAL * values[-1].size, values[0].element(sizes)


def _passthrough(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    value = values[0]
    for other in values[1:]:
        value = _larger(value, other)
    return 0, value


def _string_of(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    return TRAVERSAL * values[0].size, Value(values[0].size + 32, values[0].size + 32)


def _split(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    text = values[0].size
    return TRAVERSAL * text, Value(2 * text + 1, text + 1)


def _join(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    items = values[0]
    separator = values[1].size if len(values) > 1 else 0
    size = items.size + items.items * separator
    return TRAVERSAL * size, Value(size, size)


def _replace(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    """Every match (with an empty ``old``, every position) becomes ``new``."""
    text, new = values[0].size, values[2].size if len(values) > 2 else 0
    size = text + (text + 1) * new
    return TRAVERSAL * size, Value(size, size)


def _format(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    size = values[0].size + 8 * sum(value.size for value in values[1:]) + 32
    return TRAVERSAL * size, Value(size, size)


def _base64(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    size = values[0].size * 4 / 3 + 4
    return TRAVERSAL * size, Value(size, size)


def _quote(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    size = 6 * values[0].size + 2   # \uXXXX escapes at worst
    return TRAVERSAL * size, Value(size, size)


def _of_list(values: list[Value], sizes: Sizes, overloads: tuple[str, ...]) -> tuple[float, Value]:
    """math.greatest/least over a list, and similar: one step per item."""
    return sum(value.items for value in values), SCALAR


_PYTHON_CALL: Final = 10   # the Kubernetes quantity functions run in Python


_FUNCTIONS: Final[Mapping[str, _Rule]] = {
    **{name: _scalar() for name in (
        "!_", "-_", "_-_", "_*_", "_/_", "_%_", "@not_strictly_false", "not_strictly_false", "size",
        "int", "uint", "double", "bool", "duration", "timestamp", "type", "optional.none", "hasValue",
        "getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getHours",
        "getMinutes", "getSeconds", "getMilliseconds", "math.ceil", "math.floor", "math.round", "math.trunc",
        "math.abs", "math.sign", "math.isInf", "math.isNaN", "math.isFinite", "math.bitAnd", "math.bitOr",
        "math.bitXor", "math.bitNot", "math.bitShiftLeft", "math.bitShiftRight", "math.sqrt")},
    **{name: _compare for name in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_")},
    **{name: _reads for name in ("matches", "contains", "charAt", "indexOf", "lastIndexOf")},
    **{name: _compare for name in ("startsWith", "endsWith")},
    **{name: _same for name in ("lowerAscii", "upperAscii", "trim", "reverse", "substring", "bytes")},
    **{name: _passthrough for name in ("dyn", "optional.of", "optional.ofNonZeroValue", "value", "orValue",
                                       "or", "_?._")},
    **{name: _scalar(_PYTHON_CALL) for name in (
        "quantity", "isQuantity", "formatQuantity", "isGreaterThan", "isLessThan", "compareTo", "add", "sub",
        "asApproximateFloat", "asInteger", "isInteger", "sign")},
    "_+_": _add,
    "@in": _contains,
    "_in_": _contains,
    "_[_]": _index,
    "_[?_]": _index,
    "string": _string_of,
    "split": _split,
    "join": _join,
    "replace": _replace,
    "format": _format,
    "strings.quote": _quote,
    "base64.encode": _base64,
    "base64.decode": _base64,
    "math.greatest": _of_list,
    "sum": _of_list,
    "math.least": _of_list,
}

