"""A checked CEL tree (``cel.syntax``) for the rewrites of ``compat`` and ``lists``: the types the
checker gave its nodes, where their text is, and new nodes.

A rewritten program is not checked again: cel-expr-python plans it from the tree, resolving a
call by its function's name and its arguments' runtime kinds. So a node built here needs only
an id unique in its tree; the names it binds start with ``@`` so no expression can read them.
"""
from __future__ import annotations

import dataclasses
import itertools
import struct
from typing import Final

from ..syntax import Checked, Entry, Expr, field, fields, walk


class Nodes:
    """Builds nodes whose ids follow the largest one in ``checked``'s tree."""

    def __init__(self, checked: Checked) -> None:
        self._ids = itertools.count(max(node.id for node in walk(checked.root)) + 1)

    def _new(self, kind: str, **values: object) -> Expr:
        return Expr(next(self._ids), kind, **values)  # type: ignore[arg-type]

    def call(self, name: str, *args: Expr, target: Expr | None = None) -> Expr:
        return self._new("call", name=name, args=list(args), target=target)

    def ident(self, name: str) -> Expr:
        return self._new("ident", name=name)

    def integer(self, value: int) -> Expr:
        return self._new("const", raw=field(3, 0, value))

    def unsigned(self, value: int) -> Expr:
        return self._new("const", raw=field(4, 0, value))

    def double(self, value: float) -> Expr:
        return self._new("const", raw=field(5, 1, struct.pack("<d", value)))

    def string(self, value: str) -> Expr:
        return self._new("const", raw=field(6, 2, value.encode()))

    def boolean(self, value: bool) -> Expr:
        return self._new("const", raw=field(2, 0, int(value)))

    def null(self) -> Expr:
        return self._new("const", raw=field(1, 0, 0))

    def list(self, *items: Expr) -> Expr:
        return self._new("list", args=list(items))

    def map(self, key: Expr, value: Expr) -> Expr:
        """A map literal of one entry."""
        return self._new("struct", entries=[Entry(next(self._ids), None, key, value, False)])

    def fold(self, items: Expr, item: str, accu: str, init: Expr, step: Expr, result: Expr,
             condition: Expr | None = None, index: str | None = None) -> Expr:
        """A comprehension over ``items`` (with ``index``: over index and item, or key and value)."""
        parts: dict[str, object] = {
            "iter_var": index or item, "iter_range": items, "accu_var": accu, "accu_init": init,
            "loop_condition": condition or self.boolean(True), "loop_step": step, "result": result}
        if index is not None:
            parts["iter_var2"] = item
        return self._new("comprehension", comprehension=parts)

    def bind(self, name: str, value: Expr, body: Expr) -> Expr:
        """``cel.bind(name, value, body)`` as the macro expands it: ``value`` is evaluated once."""
        return self._new("comprehension", comprehension={
            "iter_var": "#unused", "iter_range": self.list(), "accu_var": name, "accu_init": value,
            "loop_condition": self.boolean(False), "loop_step": self.ident(name), "result": body})

    def type_of(self, constant: Expr) -> Expr:
        """``type(constant)``: a type to compare with, without the type names the checker resolves."""
        return self.call("type", constant)

    def strictly_true(self, condition: Expr) -> Expr:
        """True only when ``condition`` is true: false when it is false or an error (the macros'
        ``@not_strictly_false`` turned around), as cel-go's ``Compare(...) == 1`` tests are."""
        return self.call("!_", self.call("@not_strictly_false", self.call("!_", condition)))

    def copy(self, node: Expr) -> Expr:
        """The same expression with new node ids (ids are unique within a program)."""
        return dataclasses.replace(
            node, id=next(self._ids), target=self.copy(node.target) if node.target is not None else None,
            args=[self.copy(arg) for arg in node.args],
            entries=[dataclasses.replace(entry, id=next(self._ids),
                                         key=self.copy(entry.key) if entry.key is not None else None,
                                         value=self.copy(entry.value)) for entry in node.entries],
            comprehension={name: self.copy(part) if isinstance(part, Expr) else part
                           for name, part in node.comprehension.items()})


def replace(node: Expr, new: Expr) -> None:
    """Make ``node`` (in place, so its parent sees it) the expression ``new``."""
    for item in dataclasses.fields(Expr):
        setattr(node, item.name, getattr(new, item.name))


def detached(node: Expr) -> Expr:
    """``node``'s expression as another node (the same id), so that ``node`` can be replaced by
    an expression that holds it."""
    return dataclasses.replace(node)


# cel.expr.Type's primitive and well-known kinds, by cel-go's names.
_PRIMITIVES: Final = {1: "bool", 2: "int", 3: "uint", 4: "double", 5: "string", 6: "bytes"}
_WELL_KNOWN: Final = {1: "dyn", 2: "google.protobuf.Timestamp", 3: "google.protobuf.Duration"}


def type_names(checked: Checked) -> dict[int, str]:
    """Node id → cel-go's name of the type the checker gave it (``int``, ``list``, ``map``,
    ``google.protobuf.Duration``, ``net.IP`` …; ``dyn`` for dyn and type parameters)."""
    names = {}
    for number, _, value in checked.fields:
        if number == 3:   # type_map entry
            entry = {key: item for key, _, item in fields(value)}
            names[entry.get(1, 0)] = _type_name(entry.get(2, b""))
    return names


def _type_name(data: bytes) -> str:
    for number, _, value in fields(data):
        if number == 2:
            return "null_type"
        if number in (3, 4):   # primitive, wrapper
            return _PRIMITIVES.get(value, "dyn")
        if number == 5:
            return _WELL_KNOWN.get(value, "dyn")
        if number in (6, 7, 11):
            return {6: "list", 7: "map", 11: "type"}[number]
        if number == 9:
            return bytes(value).decode()
        if number == 14:   # abstract type: its name
            return next((bytes(item).decode() for n, _, item in fields(value) if n == 1), "dyn")
    return "dyn"


def position(checked: Checked, node_id: int) -> tuple[int, int] | None:
    """(line, column) of a node in the source, both from 1, as the checker reports them."""
    for number, _, value in checked.fields:
        if number != 5:   # source_info
            continue
        offsets: list[int] = []
        where = None
        for field_number, wire, item in fields(value):
            if field_number == 3:   # line_offsets, packed or not
                offsets += [item] if wire == 0 else [v for _, _, v in fields(_as_varints(item))]
            elif field_number == 4:
                entry = {key: v for key, _, v in fields(item)}
                if entry.get(1) == node_id:
                    where = entry.get(2, 0)
        if where is None:
            return None
        line = 1 + sum(1 for offset in offsets if offset <= where)
        start = offsets[line - 2] if line >= 2 else 0
        return line, where - start + 1
    return None


def _as_varints(packed: bytes) -> bytes:
    """A packed repeated varint field's payload, as a message of field-1 varints (for ``fields``)."""
    out, index = bytearray(), 0
    while index < len(packed):
        end = index
        while packed[end] & 0x80:
            end += 1
        out += b"\x08" + packed[index:end + 1]
        index = end + 1
    return bytes(out)
