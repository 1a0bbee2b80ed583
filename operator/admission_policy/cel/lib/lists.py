"""Kubernetes' lists library, version 0 as in 1.34: ``isSorted``, ``sum``, ``min``, ``max``,
``indexOf`` and ``lastIndexOf`` on lists.

Declared with Kubernetes' overloads, so the checker types a result as Kubernetes' does
(``[1, 2].sum()`` is an int, ``['a'].sum()`` does not compile); ``expand`` then turns each call
into a native CEL loop before the program is built (``compat.rewrite``). A Python implementation
would receive the list converted to Python, losing what Python cannot hold: uint (it comes as
int), the nanoseconds of timestamps and durations. The loops compute what Kubernetes' Go does,
errors included: an empty list's ``sum()`` is the zero of its type, its ``min()`` the error "min
called on empty list"; a list typed ``dyn`` is taken by its first item's type, as cel-go
chooses the overload at run time.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from cel_expr_python import cel

from ..syntax import Expr
from .library import Function, Library, function, overload
from .nodes import Nodes

# Kubernetes' names for the types its overloads are made for, and their CEL types.
_SUMMABLE: Final = {"int": cel.Type.INT, "uint": cel.Type.UINT, "double": cel.Type.DOUBLE,
                    "duration": cel.Type.DURATION}
_COMPARABLE: Final = {**_SUMMABLE, "bool": cel.Type.BOOL, "timestamp": cel.Type.TIMESTAMP,
                      "string": cel.Type.STRING, "bytes": cel.Type.BYTES}

FAIL: Final = "@kubernetes.fail"   # compat's function whose result is the error its argument names
NO_SUCH_OVERLOAD: Final = "no such overload"
_ITEM, _INDEX, _ACCU = "@lists.item", "@lists.index", "@lists.accu"
_TARGET, _WANTED = "@lists.target", "@lists.wanted"


def _no_such_overload(*operands: Any) -> Any:
    """What the runtime runs for a call ``expand`` leaves to it: a list typed dyn whose first item
    is of none of this library's types (another library's overload, if any, is tried first)."""
    raise ValueError(NO_SUCH_OVERLOAD)


def _per_type(name: str, types: dict[str, cel.Type], id_format: str, result: cel.Type | None = None) -> Function:
    """One overload per element type T: ``list(T).name() -> result`` (-> T without one)."""
    return function(name, *(overload(id_format.format(type_name), result or element, [cel.Type.List(element)],
                                     _no_such_overload, member=True) for type_name, element in types.items()))


def _search(name: str, overload_id: str) -> Function:
    return function(name, overload(overload_id, cel.Type.INT, [cel.Type.List(cel.Type.DYN), cel.Type.DYN],
                                   _no_such_overload, member=True))


LIBRARY: Final = Library(
    "lists", "1.26",
    functions=(
        _per_type("isSorted", _COMPARABLE, "list_{}_is_sorted_bool", cel.Type.BOOL),
        _per_type("sum", _SUMMABLE, "list_{0}_sum_{0}"),
        _per_type("max", _COMPARABLE, "list_{0}_max_{0}"),
        _per_type("min", _COMPARABLE, "list_{0}_min_{0}"),
        _search("indexOf", "list_a_index_of_int"),
        _search("lastIndexOf", "list_a_last_index_of_int"),
    ),
    summary="isSorted, sum, min, max, indexOf and lastIndexOf on lists")
_OURS: Final = frozenset(one.id for declared in LIBRARY.functions for one in declared.overloads)

_Rule = Callable[[Expr, list[Expr], tuple[str, ...], Nodes], Expr]


def expand(call: Expr, overloads: tuple[str, ...], nodes: Nodes) -> Expr | None:
    """The native expression computing ``call``, if the checker chose an overload of this library."""
    rule = _RULES.get(call.name)
    ours = tuple(chosen for chosen in overloads if chosen in _OURS)
    if call.kind != "call" or call.target is None or rule is None or not ours:
        return None
    if len(ours) == len(overloads):
        return rule(call.target, call.args, ours, nodes)
    # The receiver is typed dyn and another library has overloads too (strings' indexOf, say):
    # the loop when the value is one this library is for, the runtime's function otherwise.
    if call.name in ("indexOf", "lastIndexOf"):
        is_ours = nodes.call("_==_", nodes.type_of(nodes.ident(_TARGET)), nodes.type_of(nodes.list()))
    else:
        first = nodes.call("_[_]", nodes.ident(_TARGET), nodes.integer(0))
        kinds = tuple(_SUMMABLE if call.name == "sum" else _COMPARABLE)
        is_ours = nodes.call("_||_", nodes.call("_==_", nodes.call("size", nodes.ident(_TARGET)), nodes.integer(0)),
                             nodes.call("@in", nodes.type_of(first), _types_of(kinds, nodes)))
    other = nodes.call(call.name, *(nodes.copy(arg) for arg in call.args), target=nodes.ident(_TARGET))
    loop = rule(nodes.ident(_TARGET), call.args, ours, nodes)
    return nodes.bind(_TARGET, call.target, nodes.call("_?_:_", is_ours, loop, other))


def _element(overloads: tuple[str, ...]) -> str | None:
    """The item type of the overload the checker chose (``int`` in ``list_int_sum_int``); None
    for a list typed dyn, for which cel-go chooses by the first item at run time."""
    names = {chosen.split("_")[1] for chosen in overloads}
    return names.pop() if len(names) == 1 else None


def _zero(type_name: str, nodes: Nodes) -> Expr:
    if type_name == "uint":
        return nodes.unsigned(0)
    if type_name == "double":
        return nodes.double(0.0)
    if type_name == "duration":
        return nodes.call("duration", nodes.string("0s"))
    return nodes.integer(0)


def _sample(type_name: str, nodes: Nodes) -> Expr:
    """A constant of that type, for ``type(…)``."""
    if type_name == "bool":
        return nodes.boolean(False)
    if type_name == "string":
        return nodes.string("")
    if type_name == "bytes":
        return nodes.call("bytes", nodes.string(""))
    if type_name == "timestamp":
        return nodes.call("timestamp", nodes.integer(0))
    return _zero(type_name, nodes)


def _types_of(type_names: tuple[str, ...], nodes: Nodes) -> Expr:
    """``[type(<a value of each>)…]``, to test a value's type with ``in``."""
    return nodes.list(*(nodes.type_of(_sample(name, nodes)) for name in type_names))


def _guarded(step: Expr, types: dict[str, cel.Type], overloads: tuple[str, ...], nodes: Nodes) -> Expr:
    """``step``; for a dyn list, unless the item is of one of ``types``: cel-go's error for a value
    its overload cannot take (a typed list needs no test: the checker made sure)."""
    if _element(overloads) is not None:
        return step
    return nodes.call("_?_:_", nodes.call("@in", nodes.type_of(nodes.ident(_ITEM)), _types_of(tuple(types), nodes)),
                      step, nodes.call(FAIL, nodes.string(NO_SUCH_OVERLOAD)))


def _none_yet(nodes: Nodes) -> Expr:
    return nodes.call("_==_", nodes.ident(_ACCU), nodes.null())


def _sum(target: Expr, args: list[Expr], overloads: tuple[str, ...], nodes: Nodes) -> Expr:
    """Kubernetes adds the items to the zero of the overload's type, in order."""
    typed = _element(overloads)
    add = nodes.call("_+_", nodes.ident(_ACCU), nodes.ident(_ITEM))
    if typed is not None:
        return nodes.fold(target, _ITEM, _ACCU, _zero(typed, nodes), add, nodes.ident(_ACCU))
    # A dyn list: the first item's type picks the zero (null until then); an empty list's is int's.
    is_double = nodes.call("_==_", nodes.type_of(nodes.ident(_ITEM)), nodes.type_of(nodes.double(0.0)))
    first = nodes.call("_?_:_", is_double, nodes.call("_+_", nodes.double(0.0), nodes.ident(_ITEM)),
                       nodes.ident(_ITEM))
    step = nodes.call("_?_:_", _none_yet(nodes), _guarded(first, _SUMMABLE, overloads, nodes), add)
    result = nodes.call("_?_:_", _none_yet(nodes), nodes.integer(0), nodes.ident(_ACCU))
    return nodes.fold(target, _ITEM, _ACCU, nodes.null(), step, result)


def _extreme(operator: str, name: str) -> _Rule:
    """min (``operator`` ``_>_``) or max (``_<_``): the first item, replaced by each later one that
    the kept one compares ``operator`` to; a comparison that fails (NaN, mixed types) keeps it, as
    cel-go's ``Compare`` does."""
    def rule(target: Expr, args: list[Expr], overloads: tuple[str, ...], nodes: Nodes) -> Expr:
        replaces = nodes.strictly_true(nodes.call(operator, nodes.ident(_ACCU), nodes.ident(_ITEM)))
        kept = nodes.call("_?_:_", _none_yet(nodes), nodes.ident(_ITEM),
                          nodes.call("_?_:_", replaces, nodes.ident(_ITEM), nodes.ident(_ACCU)))
        empty = nodes.call(FAIL, nodes.string(f"{name} called on empty list"))
        result = nodes.call("_?_:_", _none_yet(nodes), empty, nodes.ident(_ACCU))
        return nodes.fold(target, _ITEM, _ACCU, nodes.null(), _guarded(kept, _COMPARABLE, overloads, nodes), result)
    return rule


def _is_sorted(target: Expr, args: list[Expr], overloads: tuple[str, ...], nodes: Nodes) -> Expr:
    """The accumulator is ``[]`` before the first item, ``[previous]`` after, and ``false`` once an
    item is less than the one before it (which ends the loop)."""
    previous = nodes.call("_[_]", nodes.ident(_ACCU), nodes.integer(0))
    descends = nodes.strictly_true(nodes.call("_>_", previous, nodes.ident(_ITEM)))
    is_first = nodes.call("_==_", nodes.call("size", nodes.ident(_ACCU)), nodes.integer(0))
    kept = nodes.call("_?_:_", is_first, nodes.list(nodes.ident(_ITEM)),
                      nodes.call("_?_:_", descends, nodes.boolean(False), nodes.list(nodes.ident(_ITEM))))
    in_order = nodes.call("_!=_", nodes.ident(_ACCU), nodes.boolean(False))
    return nodes.fold(target, _ITEM, _ACCU, nodes.list(), _guarded(kept, _COMPARABLE, overloads, nodes), in_order,
                      condition=nodes.call("_!=_", nodes.ident(_ACCU), nodes.boolean(False)))


def _index_of(last: bool) -> _Rule:
    """The index of the first (or last) item equal to the argument (CEL's ``==``, which is Go's
    ``Equal``), or -1; the argument is evaluated once."""
    def rule(target: Expr, args: list[Expr], overloads: tuple[str, ...], nodes: Nodes) -> Expr:
        found = nodes.call("_==_", nodes.ident(_ITEM), nodes.ident(_WANTED))
        step = nodes.call("_?_:_", found, nodes.ident(_INDEX), nodes.ident(_ACCU))
        condition = None if last else nodes.call("_<_", nodes.ident(_ACCU), nodes.integer(0))
        loop = nodes.fold(target, _ITEM, _ACCU, nodes.integer(-1), step, nodes.ident(_ACCU), condition=condition,
                          index=_INDEX)
        return nodes.bind(_WANTED, args[0], loop)
    return rule


_RULES: Final[dict[str, _Rule]] = {
    "sum": _sum, "min": _extreme("_>_", "min"), "max": _extreme("_<_", "max"), "isSorted": _is_sorted,
    "indexOf": _index_of(last=False), "lastIndexOf": _index_of(last=True),
}
