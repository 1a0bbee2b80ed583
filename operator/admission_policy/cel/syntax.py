"""The checked syntax tree of a compiled CEL program, read from and written back to its serialised form.

cel-expr-python gives no access to a program's tree, but ``Expression.serialize()`` returns it
as a ``cel.expr.CheckedExpr`` protocol buffer and ``Env.deserialize()`` builds a program from
one. The few message types involved are decoded here by hand (protobuf's Python runtime is not
a dependency), which serves two ends:

- ``linearize`` rewrites the list accumulation of ``map``/``filter``: the runtime appends to
  the accumulated list by copying it, and never frees the copies before the evaluation ends,
  so a ``map`` over n items costs n²/2 item copies in time and memory (5,000 items: 400 MB,
  0.5 s). cel-cpp's own fix (``enable_comprehension_list_append``) is a runtime option that
  cel-expr-python does not expose.
- ``cel.estimation`` estimates a program's cost from the tree, with the overloads the checker chose.

Only what these need is modelled; every other field is carried through untouched.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any, Final

from ..errors import AdmissionPolicyError

# Items per chunk of a linearized accumulation: an append copies at most one chunk, and the list
# of full chunks is copied once per chunk. n items cost about n·CHUNK/2 + (n/CHUNK)²/2 copies,
# linear within the runtime's iteration budget (10,000), where a plain append costs n²/2.
CHUNK: Final = 32

_COMPREHENSION_NAMES: Final = {1: "iter_var", 3: "accu_var", 8: "iter_var2"}
_COMPREHENSION_EXPRS: Final = {2: "iter_range", 4: "accu_init", 5: "loop_condition", 6: "loop_step", 7: "result"}
_COMPREHENSION_ORDER: Final = (
    (1, "iter_var"), (2, "iter_range"), (3, "accu_var"), (4, "accu_init"), (5, "loop_condition"),
    (6, "loop_step"), (7, "result"), (8, "iter_var2"))


class AstError(AdmissionPolicyError, ValueError):
    """A serialised program this module cannot read (a format it does not know)."""


# --- the wire format ------------------------------------------------------------------------

def _varint(data: bytes, index: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if index >= len(data):
            raise AstError("truncated varint")
        byte = data[index]
        index += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, index


def fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field: an int, or bytes for the other types."""
    index = 0
    while index < len(data):
        key, index = _varint(data, index)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, index = _varint(data, index)
        elif wire == 2:
            size, index = _varint(data, index)
            value, index = data[index:index + size], index + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, index = data[index:index + width], index + width
        else:
            raise AstError(f"unsupported wire type {wire}")
        yield number, wire, value


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def field(number: int, wire: int, value: Any) -> bytes:
    """One field, encoded as ``fields`` reads it."""
    key = _encode_varint(number << 3 | wire)
    if wire == 0:
        return key + _encode_varint(value)
    if wire == 2:
        return key + _encode_varint(len(value)) + bytes(value)
    return key + bytes(value)


def _string(number: int, text: str) -> bytes:
    return field(number, 2, text.encode())


def _message(number: int, body: bytes) -> bytes:
    return field(number, 2, body)


# --- expressions ----------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class Expr:
    """One node of ``cel.expr.Expr``; ``kind`` says which of the fields apply."""
    id: int
    kind: str                          # const | ident | select | call | list | struct | comprehension
    name: str = ""                     # ident name, select field, call function, struct message name
    target: Expr | None = None         # select operand, call receiver
    args: list[Expr] = dataclasses.field(default_factory=list)   # call arguments, list elements
    raw: bytes = b""                   # const: the Constant message; list: its optional_indices
    test_only: bool = False            # select: has()
    entries: list[Entry] = dataclasses.field(default_factory=list)
    comprehension: dict[str, Any] = dataclasses.field(default_factory=dict)

    def children(self) -> Iterator[Expr]:
        """The direct sub-expressions, whatever the kind: what a walk over the tree needs."""
        if self.target is not None:
            yield self.target
        yield from self.args
        for entry in self.entries:
            if entry.key is not None:
                yield entry.key
            yield entry.value
        for name in _COMPREHENSION_EXPRS.values():
            if name in self.comprehension:
                yield self.comprehension[name]

    def optional_indices(self) -> list[int]:
        """A list literal's elements written ``?x`` (its ``optional_indices``, packed or not)."""
        found: list[int] = []
        for number, _, value in fields(self.raw):
            if number == 2 and isinstance(value, int):
                found.append(value)
            elif number == 2:
                index = 0
                while index < len(value):
                    item, index = _varint(value, index)
                    found.append(item)
        return found

    def constant(self) -> Any:
        """The value of a ``const`` node: None, bool, int, str or bytes (a double reads as 0.0:
        only strings and their lengths matter here)."""
        for number, _, value in fields(self.raw):
            if number == 2:
                return bool(value)
            if number == 3:   # int64, two's complement
                return value - (1 << 64) if value >> 63 else value
            if number == 4:
                return value
            if number == 5:
                return 0.0
            if number == 6:
                return value.decode(errors="replace")
            if number == 7:
                return bytes(value)
        return None


@dataclasses.dataclass(eq=False)
class Entry:
    """One entry of a map literal (``key``) or a message literal (``field_key``), ``optional``
    for CEL's ``?key: value``."""
    id: int
    field_key: str | None
    key: Expr | None
    value: Expr
    optional: bool


def decode_expr(data: bytes) -> Expr:
    """A serialised ``cel.expr.Expr`` as a tree to read or rewrite; ``encode_expr`` writes it back."""
    node = Expr(0, "unset")
    for number, _, value in fields(data):
        if number == 2:
            node.id = value
        elif number == 3:
            node.kind, node.raw = "const", value
        elif number == 4:
            node.kind = "ident"
            node.name = next((v.decode() for n, _, v in fields(value) if n == 1), "")
        elif number in (5, 6):   # Select and Call: operand/target, field/function, then test_only/args
            node.kind = "select" if number == 5 else "call"
            for n, _, v in fields(value):
                if n == 1:
                    node.target = decode_expr(v)
                elif n == 2:
                    node.name = v.decode()
                elif n == 3 and number == 5:
                    node.test_only = bool(v)
                elif n == 3:
                    node.args.append(decode_expr(v))
        elif number == 7:
            node.kind = "list"
            for n, w, v in fields(value):
                if n == 1:
                    node.args.append(decode_expr(v))
                else:
                    node.raw += field(n, w, v)
        elif number == 8:
            node.kind = "struct"
            for n, _, v in fields(value):
                if n == 1:
                    node.name = v.decode()
                elif n == 2:
                    node.entries.append(_decode_entry(v))
        elif number == 9:
            node.kind = "comprehension"
            for n, _, v in fields(value):
                if n in _COMPREHENSION_NAMES:
                    node.comprehension[_COMPREHENSION_NAMES[n]] = v.decode()
                elif n in _COMPREHENSION_EXPRS:
                    node.comprehension[_COMPREHENSION_EXPRS[n]] = decode_expr(v)
    return node


def _decode_entry(data: bytes) -> Entry:
    entry = Entry(0, None, None, Expr(0, "unset"), False)
    for number, _, value in fields(data):
        if number == 1:
            entry.id = value
        elif number == 2:
            entry.field_key = value.decode()
        elif number == 3:
            entry.key = decode_expr(value)
        elif number == 4:
            entry.value = decode_expr(value)
        elif number == 5:
            entry.optional = bool(value)
    return entry


def encode_expr(node: Expr) -> bytes:
    """The tree serialised again, field by field as the runtime expects, so a rewritten tree
    deserialises into a program."""
    out = field(2, 0, node.id) if node.id else b""
    if node.kind == "const":
        return out + _message(3, node.raw)
    if node.kind == "ident":
        return out + _message(4, _string(1, node.name))
    if node.kind == "select":
        body = _message(1, encode_expr(_given(node.target))) + _string(2, node.name)
        return out + _message(5, body + (field(3, 0, 1) if node.test_only else b""))
    if node.kind == "call":
        body = _message(1, encode_expr(node.target)) if node.target is not None else b""
        body += _string(2, node.name) + b"".join(_message(3, encode_expr(arg)) for arg in node.args)
        return out + _message(6, body)
    if node.kind == "list":
        return out + _message(7, b"".join(_message(1, encode_expr(item)) for item in node.args) + node.raw)
    if node.kind == "struct":
        body = _string(1, node.name) if node.name else b""
        return out + _message(8, body + b"".join(_message(2, _encode_entry(entry)) for entry in node.entries))
    if node.kind == "comprehension":
        body = b""
        for number, name in _COMPREHENSION_ORDER:
            if name in node.comprehension:
                value = node.comprehension[name]
                body += _string(number, value) if isinstance(value, str) else _message(number, encode_expr(value))
        return out + _message(9, body)
    return out


def _encode_entry(entry: Entry) -> bytes:
    out = field(1, 0, entry.id)
    if entry.field_key is not None:
        out += _string(2, entry.field_key)
    if entry.key is not None:
        out += _message(3, encode_expr(entry.key))
    out += _message(4, encode_expr(entry.value))
    return out + (field(5, 0, 1) if entry.optional else b"")


def _given(node: Expr | None) -> Expr:
    if node is None:
        raise AstError("a select without an operand")
    return node


# --- a whole checked program ----------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class Checked:
    """A serialised program: its tree, the overloads the checker chose, and the rest as it was."""
    type_url: bytes
    root: Expr
    overloads: dict[int, tuple[str, ...]]    # call node id → overload ids (``add_string``, …)
    fields: list[tuple[int, int, Any]]       # CheckedExpr's fields in order (``root`` is field 4)
    names: dict[int, str] = dataclasses.field(default_factory=dict)      # ident node id → the variable it names
    positions: dict[int, int] = dataclasses.field(default_factory=dict)  # node id → offset in the source

    @classmethod
    def decode(cls, serialized: bytes) -> Checked:
        """From ``Expression.serialize()``; AstError when it is not a checked program."""
        envelope = {number: value for number, _, value in fields(serialized)}   # google.protobuf.Any
        if 1 not in envelope or 2 not in envelope:
            raise AstError("not a serialised program")
        root: Expr | None = None
        overloads: dict[int, tuple[str, ...]] = {}
        names: dict[int, str] = {}
        positions: dict[int, int] = {}
        kept = []
        for number, wire, value in fields(envelope[2]):
            if number == 4:
                root = decode_expr(value)
            if number == 2:   # reference_map entry: key = node id, value = Reference (name 1, overload_id 3)
                key, reference = _map_entry(value)
                overloads[key] = tuple(v.decode() for n, _, v in fields(reference) if n == 3)
                names.update((key, v.decode()) for n, _, v in fields(reference) if n == 1)
            if number == 5:   # source_info: positions (4) is a map<int64, int32>
                positions.update(_map_entry(v) for n, _, v in fields(value) if n == 4)
            kept.append((number, wire, value))
        if root is None:
            raise AstError("a serialised program without an expression")
        return cls(envelope[1], root, overloads, kept, names, positions)

    def encode(self) -> bytes:
        """The program serialised again, for ``Env.deserialize()``: the tree as it is now,
        every other field as it was read."""
        body = b"".join(_message(4, encode_expr(self.root)) if number == 4 else field(number, wire, value)
                        for number, wire, value in self.fields)
        return _message(1, self.type_url) + _message(2, body)


def _map_entry(data: bytes) -> tuple[Any, Any]:
    """A protobuf map entry: (key, value), fields 1 and 2, each 0 (or empty) when left out."""
    key: Any = 0
    value: Any = b""
    for number, _, found in fields(data):
        if number == 1:
            key = found
        elif number == 2:
            value = found
    return key, value


# --- types ----------------------------------------------------------------------------------

Type = tuple[Any, ...]   # ("dyn",), ("null",), ("primitive", n), ("wrapper", n), ("list", elem), ("map", k, v), ...
_TYPE_FIELDS: Final = {1: "dyn", 2: "null", 3: "primitive", 4: "wrapper", 5: "well_known", 6: "list", 7: "map",
                       8: "function", 9: "message", 10: "param", 11: "type", 12: "error", 14: "abstract"}


def decode_type(data: bytes) -> Type:
    """One ``cel.expr.Type``: its kind, then what distinguishes it (an enum, a name, element types)."""
    for number, _, value in fields(data):
        kind = _TYPE_FIELDS.get(number, "other")
        if kind in ("list", "type"):
            inner = [decode_type(v) for n, _, v in fields(value) if n == 1] if kind == "list" else [decode_type(value)]
            return (kind, inner[0] if inner else ("dyn",))
        if kind == "map":
            sides = {n: decode_type(v) for n, _, v in fields(value)}
            return ("map", sides.get(1, ("dyn",)), sides.get(2, ("dyn",)))
        if kind == "abstract":
            return ("abstract", *(v.decode() if n == 1 else decode_type(v) for n, _, v in fields(value)))
        if kind in ("message", "param"):
            return (kind, value.decode())
        return (kind, value) if isinstance(value, int) else (kind,)
    return ("dyn",)


def types(checked: Checked) -> dict[int, Type]:
    """Node id → the type the checker gave it (``CheckedExpr.type_map``, field 3)."""
    found: dict[int, Type] = {}
    for number, _, value in checked.fields:
        if number == 3:
            key, data = _map_entry(value)
            found[key] = decode_type(data if isinstance(data, bytes) else b"")
    return found


def walk(root: Expr) -> Iterator[Expr]:
    """Every node, parents before children (iteratively: a tree can be deep)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children())


# --- bound maps of variables ----------------------------------------------------------------

def inline_bound_maps(checked: Checked) -> bool:
    """Rewrite ``cel.bind(m, {'a': x, 'b': y}, body)`` so that ``body`` reads ``x`` where it read
    ``m.a``, and drop the bind when nothing else in ``body`` reads ``m``; True if any was.

    A policy's validations batched into one program see the variables bound before them through
    such a map (``engine.compiler``): built at every evaluation, and read through a lookup each
    time, for nothing. Applied only where it cannot change a result: the map's keys are distinct
    strings, its values plain identifiers that no comprehension inside ``body`` binds again, and
    a ``m`` bound again inside ``body`` is left alone there.
    """
    changed = False
    for node in walk(checked.root):   # parents first; a node replaced by its body is looked at again
        while node.kind == "comprehension" and _is_bind(node) and (fields := _bound_fields(node)):
            parts = node.comprehension
            replaced, still_read = _read_through(parts["result"], parts["accu_var"], fields)
            changed |= replaced
            if still_read:
                break
            body = parts["result"]
            for field_ in dataclasses.fields(Expr):
                setattr(node, field_.name, getattr(body, field_.name))
            changed = True
    return changed


def _is_bind(node: Expr) -> bool:
    """``cel.bind(var, init, result)`` as the macro expands it: a loop over no items."""
    parts = node.comprehension
    empty = parts.get("iter_range")
    return (node.kind == "comprehension" and parts.get("iter_var") == "#unused" and "result" in parts
            and "accu_init" in parts and empty is not None and empty.kind == "list" and not empty.args)


def _bound_fields(node: Expr) -> dict[str, str]:
    """A bind of a map literal of distinct string keys to identifiers: key → identifier (else none)."""
    init = node.comprehension["accu_init"]
    if init.kind != "struct" or init.name:
        return {}
    fields: dict[str, str] = {}
    for entry in init.entries:
        key = entry.key.constant() if entry.key is not None and entry.key.kind == "const" else None
        if not isinstance(key, str) or key in fields or entry.optional or entry.value.kind != "ident":
            return {}
        fields[key] = entry.value.name
    body = node.comprehension["result"]
    rebound = {name for inner in walk(body) if inner.kind == "comprehension"
               for name in (inner.comprehension.get(k) for k in ("iter_var", "iter_var2", "accu_var")) if name}
    return {} if rebound & set(fields.values()) else fields


def _read_through(body: Expr, name: str, fields: dict[str, str]) -> tuple[bool, bool]:
    """Replace ``name.key`` by its identifier in ``body``, except where a comprehension binds
    ``name`` again: (any replaced, ``name`` still read some other way)."""
    replaced = still_read = False
    stack = [body]
    while stack:
        node = stack.pop()
        target = node.target
        if node.kind == "select" and not node.test_only and target is not None and _is_ident(target, name) \
                and node.name in fields:
            node.kind, node.name, node.target = "ident", fields[node.name], None
            replaced = True
        elif _is_ident(node, name):
            still_read = True
        elif node.kind == "comprehension":
            parts = node.comprehension
            stack.extend(parts[k] for k in ("iter_range", "accu_init") if k in parts)
            if name not in (parts.get("iter_var"), parts.get("iter_var2"), parts.get("accu_var")):
                stack.extend(parts[k] for k in ("loop_condition", "loop_step", "result") if k in parts)
        else:
            stack.extend(node.children())
    return replaced, still_read


# --- linear accumulation --------------------------------------------------------------------

def linearize(checked: Checked) -> bool:
    """Rewrite every ``map``/``filter`` to accumulate in chunks (see ``CHUNK``); True if any was.

    The macros expand to a comprehension whose accumulator starts as ``[]``, grows by
    ``@result + [item]`` (under a condition for ``filter``) and is the result. Here it becomes
    ``[full_chunks, chunk]``: an item is appended to ``chunk`` (at most CHUNK items to copy);
    a full chunk moves to ``full_chunks`` (whose handles are copied once per CHUNK items); the
    result is ``(full_chunks + [chunk]).flatten()``, which builds the list once. The items and
    their order are the same.

    Chunks cost a few operations more per step, which a small list (nearly every list a request
    holds) does not need: where the range is a plain field or variable, cheap to read twice,
    the comprehension becomes ``size(range) <= CHUNK ? <as written> : <chunked>``.
    """
    nodes = list(walk(checked.root))
    ids = itertools.count(max(node.id for node in nodes) + 1)
    changed = False
    for node in reversed(nodes):   # inner comprehensions first: the outer ones copy them rewritten
        if node.kind == "comprehension" and _collects(node):
            _linearize(node, ids)
            changed = True
    return changed


def _collects(node: Expr) -> bool:
    """A ``map``/``filter`` expansion: starts with ``[]``, appends (maybe under a condition), returns it."""
    parts = node.comprehension
    accu = parts.get("accu_var", "")
    init, step, result = parts.get("accu_init"), parts.get("loop_step"), parts.get("result")
    if init is None or step is None or result is None:
        return False
    if not (init.kind == "list" and not init.args and not init.raw and _is_ident(result, accu)):
        return False
    return _is_append(step, accu) or (
        step.kind == "call" and step.name == "_?_:_" and len(step.args) == 3 and _is_append(step.args[1], accu)
        and _is_ident(step.args[2], accu))


def _linearize(node: Expr, ids: Iterator[int]) -> None:
    def new(kind: str, **values: Any) -> Expr:
        return Expr(next(ids), kind, **values)

    as_written = _copy(node, ids) if _cheap(node.comprehension["iter_range"]) else None
    parts = node.comprehension
    accu, step = parts["accu_var"], parts["loop_step"]
    if _is_append(step, accu):
        parts["loop_step"] = _chunked_append(step, accu, ids)
    else:
        step.args[1] = _chunked_append(step.args[1], accu, ids)
    parts["accu_init"] = new("list", args=[new("list"), new("list")])
    # size(accu[0]) == 0 ? accu[1] : (accu[0] + [accu[1]]).flatten(): most lists fit in one chunk.
    chunks = new("call", name="_+_", args=[_item(accu, 0, new), new("list", args=[_item(accu, 1, new)])])
    one_chunk = new("call", name="_==_", args=[new("call", name="size", args=[_item(accu, 0, new)]), _int(0, new)])
    parts["result"] = new("call", name="_?_:_", args=[
        one_chunk, _item(accu, 1, new), new("call", name="flatten", target=chunks)])
    if as_written is None:
        return
    chunked = Expr(node.id, "comprehension", comprehension=dict(parts))
    small = new("call", name="_<=_", args=[new("call", name="size", args=[_copy(parts["iter_range"], ids)]),
                                           _int(CHUNK, new)])
    node.id, node.kind, node.comprehension = next(ids), "call", {}
    node.name, node.args = "_?_:_", [small, as_written, chunked]


def _cheap(node: Expr) -> bool:
    """A field path (``object.spec.?volumes.orValue([])``) or a variable: no cost to read twice."""
    if node.kind in ("ident", "const"):
        return True
    if node.kind == "select":
        return node.target is not None and _cheap(node.target)
    if node.kind == "list":
        return not node.args
    if node.kind == "call" and node.name in ("_?._", "orValue", "_[_]", "_[?_]"):
        operands = ([node.target] if node.target is not None else []) + node.args
        return all(_cheap(operand) for operand in operands)
    return False


def _is_ident(node: Expr, name: str) -> bool:
    return node.kind == "ident" and node.name == name


def _is_append(node: Expr, accu: str) -> bool:
    """``accu + [item]``, as the macros write it."""
    return (node.kind == "call" and node.name == "_+_" and node.target is None and len(node.args) == 2
            and _is_ident(node.args[0], accu) and node.args[1].kind == "list" and len(node.args[1].args) == 1
            and not node.args[1].raw)


def _chunked_append(append: Expr, accu: str, ids: Iterator[int]) -> Expr:
    """``size(accu[1]) < CHUNK - 1 ? [accu[0], accu[1] + [item]] : [accu[0] + [accu[1] + [item]], []]``.

    ``item`` is written in both branches (with new node ids), and only one of them runs. Not a
    ``cel.bind``: cel-expr-python 0.1.3 misreads an enclosing comprehension's variable in a
    comprehension that follows one over a map (``v.exists(k, …) && cel.bind(q, v, q.name)``
    fails on its own), which a bound chunk would run into inside ``filter``.
    """
    def new(kind: str, **values: Any) -> Expr:
        return Expr(next(ids), kind, **values)

    item = append.args[1].args[0]

    def chunk(item: Expr) -> Expr:
        return new("call", name="_+_", args=[_item(accu, 1, new), new("list", args=[item])])

    fits = new("call", name="_<_", args=[new("call", name="size", args=[_item(accu, 1, new)]), _int(CHUNK - 1, new)])
    kept = new("list", args=[_item(accu, 0, new), chunk(item)])
    moved = new("list", args=[
        new("call", name="_+_", args=[_item(accu, 0, new), new("list", args=[chunk(_copy(item, ids))])]),
        new("list")])
    return new("call", name="_?_:_", args=[fits, kept, moved])


def _copy(node: Expr, ids: Iterator[int]) -> Expr:
    """The same expression with new node ids (ids must be unique within a program)."""
    copied = dataclasses.replace(
        node, id=next(ids), target=_copy(node.target, ids) if node.target is not None else None,
        args=[_copy(arg, ids) for arg in node.args],
        entries=[dataclasses.replace(entry, id=next(ids), key=_copy(entry.key, ids) if entry.key is not None else None,
                                     value=_copy(entry.value, ids)) for entry in node.entries],
        comprehension={name: _copy(part, ids) if isinstance(part, Expr) else part
                       for name, part in node.comprehension.items()})
    return copied


def _item(accu: str, index: int, new: Any) -> Expr:
    return new("call", name="_[_]", args=[new("ident", name=accu), _int(index, new)])  # type: ignore[no-any-return]


def _int(value: int, new: Any) -> Expr:
    return new("const", raw=field(3, 0, value))  # type: ignore[no-any-return]


