"""Where cel-expr-python computes differently from cel-go as Kubernetes (1.34) configures it, and
what makes its results and errors Kubernetes' again.

- ``CONFIG``, ``declarations``: the environment's libraries as Kubernetes has them: cel-go's
  lists (version 3; cel-cpp numbers it 2), sets and two-variable comprehensions, and ``<``,
  ``<=``, ``>``, ``>=`` across int, uint and double (``cel.CrossTypeNumericComparisons``). The
  runtime has those comparisons, its checker does not: CONFIG drops the standard declarations
  of the orderings, which ``declarations`` makes again with them.
- ``rewrite``: the checked tree, before the program is built. ``transformMap`` and
  ``transformMapEntry`` (whose map insertion has no runtime here) accumulate a list that
  ``@maps.merge`` makes a map; ``lists.range(n)`` refuses an n Kubernetes' cost limit would,
  and takes a negative one as 0 (cel-cpp fails); ``optional.ofNonZeroValue`` takes Go's zero
  time (0001-01-01) as zero, not 1970's; the strings functions and conversions cel-cpp words
  differently go to ``gostrings`` and ``strformat``; Kubernetes' lists library becomes loops.
- ``check``: cel-go's compile-time check of ``'<literal>'.format([<literal list>])``.
- ``respell``: ``x.existsOne(v, p)`` (cel-go's macro; cel-cpp has only ``exists_one`` with two
  arguments) and ``x.exists_one(k, v, p)`` (cel-go's alias; cel-cpp has only ``existsOne``).
- ``translate``: cel-cpp's words for a runtime error, in cel-go's.

Still different: ordering NaN (cel-go: an error, here false), and the values converted to Python
for ``format`` or ``transformMap`` (a uint becomes an int; timestamps and durations keep microseconds).
"""
from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from cel_expr_python import cel
from google.protobuf import duration_pb2, timestamp_pb2

from ..syntax import Checked, Expr, walk
from . import gostrings, lists, strformat
from .library import Function, function, overload
from .nodes import Nodes, detached, position, replace, type_names

# Kubernetes' runtime cost limit per expression (celconfig.PerCallLimit): lists.range(n) costs
# about n, so a larger n stops there, with its message.
RANGE_LIMIT: Final = 1_000_000
COST_LIMIT_EXCEEDED: Final = "operation cancelled: actual cost limit exceeded"

_ORDERINGS: Final = {"_<_": "less", "_<=_": "less_equals", "_>_": "greater", "_>=_": "greater_equals"}
_ORDERED: Final = {"bool": cel.Type.BOOL, "int64": cel.Type.INT, "uint64": cel.Type.UINT, "double": cel.Type.DOUBLE,
                   "string": cel.Type.STRING, "bytes": cel.Type.BYTES, "timestamp": cel.Type.TIMESTAMP,
                   "duration": cel.Type.DURATION}
_ACROSS: Final = (("int64", "uint64"), ("int64", "double"), ("uint64", "int64"), ("uint64", "double"),
                  ("double", "int64"), ("double", "uint64"))

CONFIG: Final = ('extensions:\n  - name: "lists"\n    version: 2\n  - name: "sets"\n'
                 '  - name: "two-var-comprehensions"\nstdlib:\n  exclude_functions:\n'
                 + "".join(f"    - name: {json.dumps(name)}\n" for name in _ORDERINGS))
ORDERING_NAMES: Final = frozenset(_ORDERINGS)

_FAIL, _RANGE_SIZE, _MERGE, _FORMAT = lists.FAIL, "@lists.range_size", "@maps.merge", "@strings.format"
_DOUBLE_TEXT, _DURATION_TEXT, _TIMESTAMP_TEXT = "@go.double_string", "@go.duration_string", "@go.timestamp_string"
# cel-cpp's overload → the function of ours that computes cel-go's result.
_RENAMED: Final = {
    "string_char_at_int": "@strings.charAt", "string_index_of_string_int": "@strings.indexOf",
    "string_last_index_of_string_int": "@strings.lastIndexOf", "string_substring_int": "@strings.substring",
    "string_substring_int_int": "@strings.substring", "string_split_string": "@strings.split",
    "string_split_string_int": "@strings.split", "string_format": _FORMAT,
}
_GO_ZERO_TIME: Final = -62_135_596_800   # 0001-01-01T00:00:00Z, Go's time.Time{}, in Unix seconds
_VALUE: Final = "@compat.value"


# --- the environment ---------------------------------------------------------------------------

def declarations(functions: Sequence[Function]) -> list[cel.FunctionDecl]:
    """The orderings, for the checker only: the standard overloads (CONFIG drops them), the
    cross-type ones, and those ``functions`` add (quantities'). One declaration per name: the
    environment refuses a second."""
    def overloads(name: str, prefix: str) -> Iterator[cel.Overload]:
        for left, right in [*((kind, kind) for kind in _ORDERED), *_ACROSS]:
            overload_id = f"{prefix}_{left}" if left == right else f"{prefix}_{left}_{right}"
            yield cel.Overload(overload_id, return_type=cel.Type.BOOL, parameters=[_ORDERED[left], _ORDERED[right]])
        for added in functions:
            if added.name == name:
                yield from (cel.Overload(one.id, return_type=one.result, parameters=list(one.params),
                                         is_member=one.member) for one in added.overloads)
    return [cel.FunctionDecl(name, list(overloads(name, prefix))) for name, prefix in _ORDERINGS.items()]


def implementations(functions: Sequence[Function]) -> dict[str, Callable[..., Any]]:
    """The runtime's implementations of the overloads ``functions`` add to the orderings (the
    standard ones are the runtime's own)."""
    return {one.id: one.impl for added in functions if added.name in ORDERING_NAMES for one in added.overloads}


def _fail(message: str) -> Any:
    raise ValueError(message)


def _range_size(count: int) -> int:
    if count > RANGE_LIMIT:
        raise ValueError(COST_LIMIT_EXCEEDED)
    return max(count, 0)


def extension() -> cel.CelExtension:
    """The Python functions the rewritten programs call (in every environment: a program that
    calls none of them costs nothing more for their being there)."""
    s, i, d, dyn = cel.Type.STRING, cel.Type.INT, cel.Type.DOUBLE, cel.Type.DYN
    functions = [
        function(_FAIL, overload("compat_fail_string", dyn, [s], _fail)),
        function(_RANGE_SIZE, overload("compat_range_size_int", i, [i], _range_size)),
        function(_MERGE, overload("compat_merge_list", dyn, [cel.Type.List(dyn)], merge)),
        function(_DOUBLE_TEXT, overload("compat_double_string", s, [d], gostrings.double_text)),
        function(_DURATION_TEXT, overload("compat_duration_string", s, [s], gostrings.duration_text)),
        function(_TIMESTAMP_TEXT, overload("compat_timestamp_string", s, [s], gostrings.timestamp_text)),
        function("@strings.charAt", overload("compat_char_at", s, [s, i], gostrings.char_at, member=True)),
        function("@strings.indexOf", overload("compat_index_of", i, [s, s, i], gostrings.index_of, member=True)),
        function("@strings.lastIndexOf",
                 overload("compat_last_index_of", i, [s, s, i], gostrings.last_index_of, member=True)),
        function("@strings.substring",
                 overload("compat_substring", s, [s, i], gostrings.substring, member=True),
                 overload("compat_substring_range", s, [s, i, i], gostrings.substring, member=True)),
        function("@strings.split",
                 overload("compat_split", cel.Type.List(s), [s, s], gostrings.split, member=True),
                 overload("compat_split_limit", cel.Type.List(s), [s, s, i], gostrings.split, member=True)),
        function(_FORMAT, overload("compat_format", s, [s, cel.Type.List(dyn)], strformat.format_string,
                                   member=True)),
    ]
    return cel.CelExtension("compat", [
        cel.FunctionDecl(declared.name, [cel.Overload(one.id, return_type=one.result, parameters=list(one.params),
                                                      is_member=one.member, impl=one.impl)
                                         for one in declared.overloads])
        for declared in functions])


# --- transformMap and transformMapEntry --------------------------------------------------------

def merge(parts: list[dict[Any, Any]]) -> dict[Any, Any]:
    """The map of ``transformMap``/``transformMapEntry``: the entries of ``parts`` in order; a key
    met twice is cel-go's insertion error."""
    result: dict[Any, Any] = {}
    seen: set[tuple[bool, Any]] = set()
    for part in parts:
        for key, value in part.items():
            identity = (isinstance(key, bool), key)   # true and 1 are different keys in CEL
            if identity in seen:
                raise ValueError(f"insert failed: key {_go_text(key)} already exists")
            if key in result:   # a bool and an int, equal in Python: a map Python cannot hold
                other = next(known for known in result if known == key)
                raise ValueError(f"cannot build a map with both {_go_text(key)} and {_go_text(other)} as keys here")
            seen.add(identity)
            result[key] = _returnable(value)
    return result


def _go_text(key: Any) -> str:
    return ("true" if key else "false") if isinstance(key, bool) else str(key)


def _returnable(value: Any) -> Any:
    """A value converted to Python, in a form that converts back to the same CEL value: timestamps
    and durations as their protobuf messages (Python's own are refused on the way back)."""
    if isinstance(value, list):
        return [_returnable(item) for item in value]
    if isinstance(value, dict):
        return {key: _returnable(item) for key, item in value.items()}
    if isinstance(value, datetime.datetime):
        stamp = timestamp_pb2.Timestamp()
        stamp.FromDatetime(value)
        return stamp
    if isinstance(value, datetime.timedelta):
        span = duration_pb2.Duration()
        span.FromTimedelta(value)
        return span
    if gostrings.type_name(value) == "type":
        raise ValueError("a map built by transformMap cannot hold type values here")
    return value


def _map_insertions(node: Expr) -> list[Expr]:
    """A ``transformMap``/``transformMapEntry`` expansion's ``cel.@mapInsert`` calls (else [])."""
    parts = node.comprehension
    init, step, accu = parts.get("accu_init"), parts.get("loop_step"), parts.get("accu_var")
    if node.kind != "comprehension" or init is None or step is None or init.kind != "struct" or init.name \
            or init.entries:
        return []
    return [call for call in walk(step) if call.kind == "call" and call.name == "cel.@mapInsert" and call.args
            and call.args[0].kind == "ident" and call.args[0].name == accu]


def _accumulate_entries(node: Expr, insertions: list[Expr], nodes: Nodes) -> Expr:
    """The comprehension accumulating a list of one-entry maps (which ``cel.syntax.linearize`` makes
    linear), inside ``@maps.merge``."""
    for call in insertions:
        accu, *rest = call.args
        entry = rest[0] if len(rest) == 1 else nodes.map(rest[0], rest[1])
        replace(call, nodes.call("_+_", accu, nodes.list(entry)))
    node.comprehension["accu_init"] = nodes.list()
    return nodes.call(_MERGE, detached(node))


# --- the other rewrites ------------------------------------------------------------------------

def _text_of(node: Expr, overloads: tuple[str, ...], nodes: Nodes) -> Expr | None:
    """``string(x)`` of a double, duration or timestamp: Go's text (see ``gostrings``)."""
    if node.name != "string" or len(node.args) != 1 or node.target is not None:
        return None
    value = node.args[0]
    if overloads == ("double_to_string",):
        return nodes.call(_DOUBLE_TEXT, value)
    if overloads == ("duration_to_string",):
        return nodes.call(_DURATION_TEXT, nodes.call("string", value))
    if overloads == ("timestamp_to_string",):
        return nodes.call(_TIMESTAMP_TEXT, nodes.call("string", value))
    if not {"double_to_string", "duration_to_string", "timestamp_to_string"} & set(overloads):
        return None

    def is_a(sample: Expr) -> Expr:   # x typed dyn: by its type at run time
        return nodes.call("_==_", nodes.type_of(nodes.ident(_VALUE)), nodes.type_of(sample))
    chosen = nodes.call("_?_:_", is_a(nodes.call("timestamp", nodes.integer(0))),
                        nodes.call(_TIMESTAMP_TEXT, nodes.call("string", nodes.ident(_VALUE))),
                        nodes.call("string", nodes.ident(_VALUE)))
    chosen = nodes.call("_?_:_", is_a(nodes.call("duration", nodes.string("0s"))),
                        nodes.call(_DURATION_TEXT, nodes.call("string", nodes.ident(_VALUE))), chosen)
    chosen = nodes.call("_?_:_", is_a(nodes.double(0.0)), nodes.call(_DOUBLE_TEXT, nodes.ident(_VALUE)), chosen)
    return nodes.bind(_VALUE, value, chosen)


def _non_zero(node: Expr, types: dict[int, str], nodes: Nodes) -> Expr | None:
    """``optional.ofNonZeroValue(t)``: none for Go's zero time, a value for 1970's (cel-cpp has
    them the other way round); other values as before."""
    if node.name != "optional.ofNonZeroValue" or len(node.args) != 1 \
            or types.get(node.args[0].id) not in ("dyn", "google.protobuf.Timestamp"):
        return None

    def equals(seconds: int) -> Expr:
        return nodes.call("_==_", nodes.ident(_VALUE), nodes.call("timestamp", nodes.integer(seconds)))
    epoch = nodes.call("_?_:_", equals(0), nodes.call("optional.of", nodes.ident(_VALUE)),
                       nodes.call("optional.ofNonZeroValue", nodes.ident(_VALUE)))
    return nodes.bind(_VALUE, node.args[0],
                      nodes.call("_?_:_", equals(_GO_ZERO_TIME), nodes.call("optional.none"), epoch))


def _rewritten(node: Expr, overloads: tuple[str, ...], types: dict[int, str], nodes: Nodes) -> Expr | None:
    """The expression to put in ``node``'s place, or None to keep it (renamed perhaps)."""
    if node.kind == "comprehension":
        insertions = _map_insertions(node)
        return _accumulate_entries(node, insertions, nodes) if insertions else None
    if node.kind != "call":
        return None
    if len(overloads) == 1 and overloads[0] in _RENAMED:
        node.name = _RENAMED[overloads[0]]
        return None
    if node.name == "lists.range" and len(node.args) == 1:
        return nodes.call("lists.range", nodes.call(_RANGE_SIZE, node.args[0]))
    return lists.expand(node, overloads, nodes) or _text_of(node, overloads, nodes) or _non_zero(node, types, nodes)


def rewrite(checked: Checked) -> bool:
    """Make the program compute what cel-go computes (see the module doc); True if it changed."""
    nodes, types = Nodes(checked), type_names(checked)
    changed = False
    # Children first: an operand a rewrite copies has been rewritten already.
    for node in reversed(list(walk(checked.root))):
        name = node.name
        new = _rewritten(node, checked.overloads.get(node.id, ()), types, nodes)
        if new is not None:
            replace(node, new)
        changed |= new is not None or node.name != name
    return changed


# --- compile-time checks -----------------------------------------------------------------------

def check(checked: Checked) -> str | None:
    """The first of cel-go's compile-time errors the program has, worded as the checker words its
    own (``<input>:line:column: message``); None if none."""
    types = type_names(checked)
    for node in walk(checked.root):
        target = node.target
        if node.kind != "call" or target is None or target.kind != "const" or len(node.args) != 1 \
                or node.args[0].kind != "list" or "string_format" not in checked.overloads.get(node.id, ()):
            continue
        template = target.constant()
        if not isinstance(template, str):
            continue
        items = node.args[0].args
        problem = strformat.check(template, [_argument(item, types) for item in items])
        if problem is not None:
            message, index = problem
            line, column = position(checked, items[index].id if index is not None else node.id) or (-1, -1)
            return f"<input>:{line}:{column}: {message}"
    return None


def _argument(node: Expr, types: dict[int, str]) -> strformat.Argument:
    items: list[Expr] = list(node.args) if node.kind == "list" else []
    for entry in node.entries if node.kind == "struct" and not node.name else ():
        items += [entry.key, entry.value] if entry.key is not None else [entry.value]
    return strformat.Argument(types.get(node.id, "dyn"), tuple(_argument(item, types) for item in items))


# --- the source --------------------------------------------------------------------------------

_MACRO_NAME: Final = re.compile(r"\.\s*(existsOne|exists_one)\s*\(")
_STRING: Final = re.compile(r"""(?<![A-Za-z0-9_])([rRbB]{0,2})('''|\"\"\"|'|")""")


def _literals(source: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each string literal and comment in ``source``."""
    index = 0
    while index < len(source):
        if source.startswith("//", index):
            end = source.find("\n", index)
            end = len(source) if end < 0 else end
        else:
            found = _STRING.match(source, index)
            if found is None:
                index += 1
                continue
            raw, quote = "r" in found[1].lower(), found[2]
            end = found.end()
            while end < len(source) and not source.startswith(quote, end):
                end += 2 if source[end] == "\\" and not raw else 1
            end = min(end + len(quote), len(source))
        yield index, end
        index = end


def _arguments(source: str, start: int, literals: Sequence[tuple[int, int]]) -> int:
    """How many arguments the call whose ``(`` is at ``start`` has."""
    depth, count, empty = 0, 1, True
    ends = dict(literals)
    index = start
    while index < len(source):
        if index in ends:
            index, empty = ends[index], False
            continue
        char = source[index]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return 0 if empty else count
        elif char == "," and depth == 1:
            count += 1
        elif not char.isspace():
            empty = False
        index += 1
    return count


def respell(source: str) -> str:
    """``x.existsOne(v, p)`` → ``x.exists_one(v, p)`` and ``x.exists_one(k, v, p)`` →
    ``x.existsOne(k, v, p)``, outside string literals: cel-go has both names for both forms.
    (Columns after one on its line then read one off in an error.)"""
    if "exists" not in source:
        return source
    literals = list(_literals(source))
    out, last = [], 0
    for found in _MACRO_NAME.finditer(source):
        if any(start <= found.start() < end for start, end in literals):
            continue
        count = _arguments(source, found.end() - 1, literals)
        wanted = {("existsOne", 2): "exists_one", ("exists_one", 3): "existsOne"}.get((found[1], count))
        if wanted is not None:
            out += [source[last:found.start(1)], wanted]
            last = found.end(1)
    return "".join(out) + source[last:]


# --- runtime errors ----------------------------------------------------------------------------

_MESSAGES: Final = (
    (re.compile(r"sort\(\): list elements must have the same type"), "list elements must have the same type"),
    (re.compile(r"sort\(\): unsupported type .*"), "list elements must be comparable"),
    (re.compile(r"flatten\(\): level must be non-negative"), "level must be non-negative"),
    (re.compile(r"malformed UTF-8 bytes"), "invalid UTF-8 in bytes, cannot convert to string"),
)


def translate(message: str) -> str:
    """cel-go's words for a runtime error cel-cpp words otherwise (else the message as it is)."""
    for pattern, words in _MESSAGES:
        if pattern.fullmatch(message):
            return words
    return message
