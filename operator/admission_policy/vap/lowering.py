"""CEL's optional syntax rewritten into plain CEL, for Kubernetes before 1.29 (no optional types).

``lower_optionals(source)`` returns the expression with every optional chain replaced by what it
means, or raises ``NotLowerable`` naming the construct that has no such form. Each optional value
is read as a pair (presence condition, value expression), and its consumer is rewritten:

- ``e.?f``: present ``has(e.f)``, value ``e.f``;
- ``e[?k]``: a map's ``k in e``, a list's ``size(e) > i`` (a literal ``i``), by the checker's
  types of ``e`` and ``k``, else decided when it runs (``type(e) == list ? … : k in e``);
- on an optional (p, v): ``.?f`` and ``.f`` give (``p && has(v.f)``, ``v.f``), ``[?k]`` and
  ``[k]`` (``p && k in v``, ``v[k]``): once a chain is optional, cel-go qualifies the rest of it
  "if present" (``a.?b.c`` is ``a.?b.?c``);
- ``optional.of(x)``: (always, ``x``); ``optional.none()``: (never, nothing);
- ``o.or(o2)``: (``p ? true : p2``, ``p ? v : v2``); ``c ? o1 : o2``: (``c ? p1 : p2``, ``c ? v1 : v2``);
- the consumers: ``o.orValue(d)`` is ``p ? v : d``, ``o.hasValue()`` is ``p``, ``o.value()`` is
  ``v`` (which fails where ``p`` is false, as ``value()`` does); ``o.orValue({}).?f`` is ``o.?f``.

Not lowerable: an optional value that reaches anything but these consumers (a variable's or the
expression's result, a function's argument, ``==``), optional list elements and map or message
entries (``[?x]``, ``{?k: v}``), ``optMap``, ``optFlatMap``, ``optional.ofNonZeroValue``, and
``value()`` of ``optional.none()`` (which always fails: plain CEL has no way to write that).

The rewrite is a text edit: the source is parsed here (with exact spans, which the checked tree
of cel-expr-python does not give: its positions are start offsets, and its macros are expanded)
and only the consumers' text is replaced, so comments and layout elsewhere stay. The checker is
still consulted: its tree must hold the same optional constructs at the same offsets (else the
two parsers disagree, and nothing is rewritten), its types say whether ``[?k]`` reads a list or
a map, and the result must compile in an environment without optional syntax, with no value of
an optional type left.

Differences that remain: CEL's optional functions evaluate all their operands, a ternary only
the branch it takes; so an error in a default (``orValue(1/0)``) or in a key read after a
missing field no longer surfaces, and ``optional.of(x).hasValue()`` is ``true`` even where ``x``
fails. ``has(m.f)`` and ``m.?f`` agree on maps, which is what Kubernetes' objects are in CEL;
on a protocol buffer message ``value()`` of an unset field gives its default where the original
fails. A value read twice (``has(e.f) ? e.f : d``) costs twice: CEL is pure, so only the cost
changes, and a default read on (``a.?b.orValue({'c': 1}).?c``) doubles the text before it.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterator
from typing import Any, Final

from cel_expr_python import cel as cel_core
from cel_expr_python.ext import ext_bindings, ext_encoders, ext_math, ext_strings

from .. import cel
from ..cel import lib, syntax
from ..cel.lib import compat
from ..errors import AdmissionPolicyError

OPTIONAL_CALLS: Final = frozenset({"_?._", "_[?_]", "optional.of", "optional.ofNonZeroValue", "optional.none"})
_CONSUMERS: Final = {"orValue": 1, "hasValue": 0, "value": 0}   # method → its number of arguments
_CONSTRUCTORS: Final = frozenset({"of", "none", "ofNonZeroValue"})   # optional.<name>(…)
# Node kinds whose text can be the operand of a select, index or call without parentheses.
_MEMBER: Final = frozenset({"ident", "literal", "paren", "list", "map", "struct", "select", "index", "call"})


class NotLowerable(AdmissionPolicyError, ValueError):
    """An expression whose optional syntax has no plain CEL form; the message names the construct."""


@functools.lru_cache(maxsize=1024)
def lower_optionals(source: str) -> str:
    """``source`` without optional syntax (``.?f``, ``[?k]``, ``optional.*``, and ``orValue``,
    ``hasValue``, ``value``, ``or`` on them), deciding the same on every input (see the module
    doc for the few error cases that differ); ``source`` itself, unchanged, when it has none.

    ``source`` must compile in this project's CEL environment (else NotLowerable says why). The
    result compiles without CEL's optional extension (``plain_environment``) and holds no value
    of an optional type, so it runs on Kubernetes 1.28 wherever ``source`` runs on 1.29; whether
    its libraries are there is the caller's question, as for any expression. Text outside the
    rewritten parts stays as written, but for ``existsOne``/``exists_one``, spelled as
    ``cel.lib.compat.respell`` does. Pure and cached: it compiles the expression twice.
    """
    if "?" not in source and "optional" not in source:
        return source
    text = compat.respell(source)   # the checker's offsets are the respelled text's (cel-go has both names)
    checked = _checked(_full_environment(), text)
    if not any(is_optional_syntax(node) for node in syntax.walk(checked.root)):
        return source
    tree = _Parser(text).parse()
    for node in _walk(tree):   # macros the checker expands into optional calls: named before _agree counts
        if node.kind == "call" and node.receiver and node.name in ("optMap", "optFlatMap"):
            raise NotLowerable(f"{node.name} cannot be written without optional types")
    _agree(tree, checked)
    lowered = _Lowering(text, _index_types(checked)).render(tree, loose=True, where="the expression's result")
    _verify(lowered)
    return lowered


# --- the checker's view ------------------------------------------------------------------------

def _full_environment() -> Any:
    """Where ``source`` compiles: every library and extension this project has."""
    return _environments()[0]


@functools.cache
def _environments() -> tuple[Any, Any]:
    """(with optional syntax, without): the same libraries, variables and extensions, as
    ``cel.new_environment`` builds them, but for ``ext_optional`` in the second."""
    extra = [ext_bindings.ExtBindings(), ext_encoders.ExtEncoders(), ext_math.ExtMath()]
    functions = lib.functions()
    full = cel.new_environment(functions, extra)
    others = [declared for declared in functions if declared.name not in compat.ORDERING_NAMES]
    plain = cel_core.NewEnv(
        descriptor_pool=lib.pool(), config=cel_core.NewEnvConfigFromYaml(compat.CONFIG),
        variables={name: cel.VARIABLE_TYPES.get(name, cel_core.Type.DYN) for name in cel.VARIABLES},
        extensions=[ext_strings.ExtStrings(version=2), compat.extension(), *extra, lib.extension(others)],
        functions=[*lib.declarations(others), *compat.declarations(functions)],
        function_impls={**lib.implementations(others), **compat.implementations(functions)})
    return full, plain


def plain_environment() -> Any:
    """An environment of this project's CEL without the optional extension: it refuses optional
    syntax as Kubernetes 1.28 does (``unsupported syntax '.?'``); what ``lower_optionals``
    returns compiles in it."""
    return _environments()[1]


def _checked(environment: Any, text: str) -> syntax.Checked:
    try:
        return syntax.Checked.decode(cel.check(environment, text).serialize())
    except RuntimeError as exc:
        raise NotLowerable(f"does not compile: {exc}") from None


def is_optional_syntax(node: syntax.Expr) -> bool:
    """Whether this node is optional syntax: the calls the parser makes of it, optional entries."""
    return ((node.kind == "call" and node.name in OPTIONAL_CALLS) or any(e.optional for e in node.entries)
            or (node.kind == "list" and bool(node.raw)))


def _types(checked: syntax.Checked, unwrap: bool = False) -> dict[int, str]:
    """Node id → its checked type, coarsely: list, map, string, int, uint, double, optional, dyn
    or other; ``unwrap``: an optional's value type instead."""
    return {node: _kind(kind, unwrap) for node, kind in syntax.types(checked).items()}


def _kind(kind: syntax.Type, unwrap: bool) -> str:
    if kind[0] == "primitive":
        return {2: "int", 3: "uint", 4: "double", 5: "string"}.get(kind[1], "other")
    if kind[0] in ("dyn", "list", "map"):
        return str(kind[0])
    if kind[0] == "abstract" and kind[1] == "optional_type":
        return _kind(kind[2], unwrap) if unwrap and len(kind) > 2 else "optional"
    return "other"


def _index_types(checked: syntax.Checked) -> dict[int, tuple[str, str]]:
    """Offset of the ``[`` of each ``e[?k]``, and of each ``o[k]`` on an optional ``o`` → the
    checked types of (the value of ``e`` or ``o``, ``k``)."""
    types, inner = _types(checked), _types(checked, unwrap=True)
    found = {}
    for node in syntax.walk(checked.root):
        if node.kind == "call" and node.name in ("_[?_]", "_[_]") and len(node.args) == 2 \
                and node.id in checked.positions:
            found[checked.positions[node.id]] = (inner.get(node.args[0].id, "dyn"), types.get(node.args[1].id, "dyn"))
    return found


def _agree(tree: _Node, checked: syntax.Checked) -> None:
    """The parser here and CEL's must see the same optional selects and indexes, at the same
    offsets, and as many optional constructs in all: else nothing is rewritten."""
    ours = sorted((node.at, "_?._" if node.kind == "select" else "_[?_]") for node in _walk(tree)
                  if node.kind in ("select", "index") and node.optional)
    theirs = sorted((checked.positions.get(node.id, -1), node.name) for node in syntax.walk(checked.root)
                    if node.kind == "call" and node.name in ("_?._", "_[?_]"))
    ours_all = sum(_syntax_count(node) for node in _walk(tree))
    theirs_all = sum(_checked_count(node) for node in syntax.walk(checked.root))
    if ours != theirs or ours_all != theirs_all:
        raise NotLowerable("cannot be lowered: its optional syntax could not be located in the source")


def _syntax_count(node: _Node) -> int:
    if node.kind in ("select", "index"):
        return int(node.optional)
    if node.kind == "call" and _constructor(node) is not None:
        return 1
    return sum(node.flags)


def _checked_count(node: syntax.Expr) -> int:
    if node.kind == "call" and node.name in OPTIONAL_CALLS:
        return 1
    if node.kind == "list":   # optional_indices (field 2): packed varints, or one varint each
        count = 0
        for number, wire, value in syntax.fields(node.raw):
            if number == 2:
                count += len([b for b in value if b < 0x80]) if wire == 2 else 1
        return count
    return sum(e.optional for e in node.entries)


def _verify(lowered: str) -> None:
    """The result compiles without optional syntax and holds no optional value (a function
    declared to return one, say): else it is not the plain CEL promised."""
    checked = _checked_plain(lowered)
    types = _types(checked)
    for node in syntax.walk(checked.root):
        if types.get(node.id) == "optional":
            what = f"{node.name}()" if node.kind == "call" else node.name or node.kind
            raise NotLowerable(f"{what} returns an optional value, which cannot be written without optional types")


def _checked_plain(text: str) -> syntax.Checked:
    try:
        return syntax.Checked.decode(cel.check(plain_environment(), text).serialize())
    except RuntimeError as exc:   # a defect here, not the policy's: refused rather than handed on
        raise NotLowerable(f"cannot be lowered: the rewritten expression does not compile ({exc})") from None


# --- a parser with spans -----------------------------------------------------------------------

class _SyntaxError(NotLowerable):
    """What the parser here cannot read (CEL's own accepted it: a construct it does not know)."""


@dataclasses.dataclass(frozen=True)
class _Token:
    kind: str     # ident, literal, punct
    text: str
    start: int
    end: int


_SPACE = re.compile(r"(?:\s+|//[^\n]*)+")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+[uU]?|(?:\d*\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+[uU]?)")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|`[^`\n]*`")
_PUNCT = re.compile(r"==|!=|<=|>=|&&|\|\||[-+*/%!<>?:.,()\[\]{}]")
_STRING_PREFIX = re.compile(r"(?:[rR][bB]?|[bB][rR]?)?(?='|\")")


def _tokens(text: str) -> Iterator[_Token]:
    index = 0
    while index < len(text):
        space = _SPACE.match(text, index)
        if space:
            index = space.end()
            continue
        prefix = _STRING_PREFIX.match(text, index)
        if prefix:
            end = _string_end(text, prefix.end(), raw="r" in prefix.group().lower())
            yield _Token("literal", text[index:end], index, end)
            index = end
            continue
        for kind, pattern in (("literal", _NUMBER), ("ident", _IDENT), ("punct", _PUNCT)):
            found = pattern.match(text, index)
            if found:
                yield _Token(kind, found.group(), index, found.end())
                index = found.end()
                break
        else:
            raise _SyntaxError(f"cannot be lowered: unexpected {text[index]!r} at offset {index}")


def _string_end(text: str, index: int, raw: bool) -> int:
    """The offset after the string literal whose quote is at ``index``."""
    quote = text[index:index + 3] if text[index:index + 3] in ("'''", '"""') else text[index]
    index += len(quote)
    while index < len(text):
        if text.startswith(quote, index):
            return index + len(quote)
        index += 2 if text[index] == "\\" and not raw else 1
    raise _SyntaxError("cannot be lowered: an unterminated string")


@dataclasses.dataclass(eq=False)
class _Node:
    """One expression: ``kind``, its span [start, end), its sub-expressions in source order."""
    kind: str    # ident literal paren list map struct unary binary ternary select index call
    start: int
    end: int
    children: list[_Node] = dataclasses.field(default_factory=list)
    name: str = ""        # ident, select field, call function, operator, struct type
    optional: bool = False   # .?f, [?k]
    at: int = -1          # the offset of the select's '.' or the index's '[' (the checker's position)
    receiver: bool = False   # call: children[0] is the receiver
    flags: list[bool] = dataclasses.field(default_factory=list)   # list/map/struct: each entry optional


def _walk(node: _Node) -> Iterator[_Node]:
    yield node
    for child in node.children:
        yield from _walk(child)


_RELATIONS: Final = ("<", "<=", ">", ">=", "==", "!=", "in")


class _Parser:
    """CEL's grammar (cel-spec's ``CEL.g4``), recursive descent, for spans only."""

    def __init__(self, text: str) -> None:
        self.tokens = list(_tokens(text))
        self.index = 0

    def parse(self) -> _Node:
        node = self.expr()
        if self.index != len(self.tokens):
            raise _SyntaxError(f"cannot be lowered: unexpected {self.peek()!r}")
        return node

    # tokens
    def peek(self, ahead: int = 0) -> str:
        index = self.index + ahead
        return self.tokens[index].text if index < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> _Token:
        if self.index >= len(self.tokens) or (expected is not None and self.tokens[self.index].text != expected):
            raise _SyntaxError(f"cannot be lowered: expected {expected or 'more'!r}")
        self.index += 1
        return self.tokens[self.index - 1]

    def last_end(self) -> int:
        return self.tokens[self.index - 1].end

    # grammar
    def expr(self) -> _Node:
        condition = self.binary(0)
        if self.peek() != "?":
            return condition
        self.take("?")
        then = self.binary(0)
        self.take(":")
        otherwise = self.expr()
        return _Node("ternary", condition.start, otherwise.end, [condition, then, otherwise], "?:")

    _LEVELS: Final = (("||",), ("&&",), _RELATIONS, ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> _Node:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in self._LEVELS[level]:
            operator = self.take().text
            right = self.binary(level + 1)
            left = _Node("binary", left.start, right.end, [left, right], operator)
        return left

    def unary(self) -> _Node:
        if self.peek() in ("!", "-"):
            token = self.take()
            operand = self.unary()
            return _Node("unary", token.start, operand.end, [operand], token.text)
        return self.member()

    def member(self) -> _Node:
        node = self.primary()
        while True:
            if self.peek() == ".":
                dot = self.take()
                optional = self.peek() == "?"
                if optional:
                    self.take("?")
                name = self.take()
                if name.kind != "ident":
                    raise _SyntaxError(f"cannot be lowered: unexpected {name.text!r}")
                if self.peek() == "(" and not optional:
                    self.take("(")
                    args = self.arguments(")")
                    node = _Node("call", node.start, self.last_end(), [node, *args], name.text, receiver=True,
                                 at=dot.start)
                elif self.peek() == "{" and not optional and _qualified(node):
                    node = self.struct(node.start, f"{_qualified(node)}.{name.text}")
                else:
                    node = _Node("select", node.start, name.end, [node], name.text, optional, dot.start)
            elif self.peek() == "[":
                bracket = self.take()
                optional = self.peek() == "?"
                if optional:
                    self.take("?")
                key = self.expr()
                self.take("]")
                node = _Node("index", node.start, self.last_end(), [node, key], optional=optional, at=bracket.start)
            elif self.peek() == "{" and node.kind == "ident":
                node = self.struct(node.start, node.name)
            else:
                return node

    def primary(self) -> _Node:
        token = self.take()
        if token.text == "." and self.tokens[self.index:self.index + 1] and self.tokens[self.index].kind == "ident":
            name = self.take()
            if self.peek() == "(":
                self.take("(")
                args = self.arguments(")")
                return _Node("call", token.start, self.last_end(), args, "." + name.text)
            return _Node("ident", token.start, name.end, name="." + name.text)
        if token.kind == "ident":
            if self.peek() == "(":
                self.take("(")
                args = self.arguments(")")
                return _Node("call", token.start, self.last_end(), args, token.text)
            return _Node("ident", token.start, token.end, name=token.text)
        if token.kind == "literal":
            return _Node("literal", token.start, token.end, name=token.text)
        if token.text == "(":
            inner = self.expr()
            self.take(")")
            return _Node("paren", token.start, self.last_end(), [inner])
        if token.text == "[":
            items, flags = [], []
            while self.peek() != "]":
                flags.append(self.peek() == "?")
                if flags[-1]:
                    self.take("?")
                items.append(self.expr())
                if self.peek() != ",":
                    break
                self.take(",")
            self.take("]")
            return _Node("list", token.start, self.last_end(), items, flags=flags)
        if token.text == "{":
            entries, flags = [], []
            while self.peek() != "}":
                flags.append(self.peek() == "?")
                if flags[-1]:
                    self.take("?")
                key = self.expr()
                self.take(":")
                entries += [key, self.expr()]
                if self.peek() != ",":
                    break
                self.take(",")
            self.take("}")
            return _Node("map", token.start, self.last_end(), entries, flags=flags)
        raise _SyntaxError(f"cannot be lowered: unexpected {token.text!r}")

    def struct(self, start: int, name: str) -> _Node:
        self.take("{")
        values, flags = [], []
        while self.peek() != "}":
            flags.append(self.peek() == "?")
            if flags[-1]:
                self.take("?")
            self.take()   # the field name
            self.take(":")
            values.append(self.expr())
            if self.peek() != ",":
                break
            self.take(",")
        self.take("}")
        return _Node("struct", start, self.last_end(), values, name, flags=flags)

    def arguments(self, closing: str) -> list[_Node]:
        args = []
        while self.peek() != closing:
            args.append(self.expr())
            if self.peek() != ",":
                break
            self.take(",")
        self.take(closing)
        return args


def _qualified(node: _Node) -> str:
    """``a.b.c`` as a name (a message type's, before ``{``), else ''."""
    if node.kind == "ident":
        return node.name
    if node.kind == "select" and not node.optional:
        operand = _qualified(node.children[0])
        return f"{operand}.{node.name}" if operand else ""
    return ""


def _constructor(node: _Node) -> str | None:
    """``of``, ``none`` or ``ofNonZeroValue`` for a call ``optional.<that>(…)``, else None."""
    if node.kind == "call" and node.receiver and node.name in _CONSTRUCTORS:
        receiver = node.children[0]
        if receiver.kind == "ident" and receiver.name == "optional":
            return node.name
    return None


# --- the rewrite -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Optional:
    """An optional value as plain CEL: ``present`` (conditions that all hold when it has a value;
    none at all: always; None: never) and ``value`` (its value; None for ``optional.none()``).
    ``exact``: ``value`` fails wherever there is no value, as ``value()`` does."""
    present: tuple[str, ...] | None
    value: str | None
    exact: bool = True

    def condition(self) -> str:
        if self.present is None:
            return "false"
        return " && ".join(self.present) or "true"


class _Lowering:
    def __init__(self, text: str, index_types: dict[int, tuple[str, str]]) -> None:
        self.text = text
        self.index_types = index_types
        self._optional: dict[int, bool] = {}
        self._syntax: dict[int, bool] = {}

    def is_optional(self, node: _Node) -> bool:
        """Whether the node's value is an optional (from syntax alone; ``_verify`` checks the rest)."""
        if id(node) not in self._optional:
            self._optional[id(node)] = self._is_optional(node)
        return self._optional[id(node)]

    def _is_optional(self, node: _Node) -> bool:
        if node.kind in ("select", "index"):
            return node.optional or self.is_optional(node.children[0])
        if node.kind == "call":
            if _constructor(node) is not None:
                return True
            return node.receiver and node.name in ("or", "optMap", "optFlatMap") and self.is_optional(node.children[0])
        if node.kind == "paren":
            return self.is_optional(node.children[0])
        if node.kind == "ternary":
            return self.is_optional(node.children[1]) or self.is_optional(node.children[2])
        return False

    def has_syntax(self, node: _Node) -> bool:
        """Whether optional syntax is anywhere in the node (else its text stays as it is)."""
        if id(node) not in self._syntax:
            self._syntax[id(node)] = ((node.kind in ("select", "index") and node.optional)
                                      or _constructor(node) is not None or any(node.flags)
                                      or any(self.has_syntax(child) for child in node.children))
        return self._syntax[id(node)]

    # text of plain values

    def render(self, node: _Node, loose: bool, where: str) -> str:
        """The node's text with its optional syntax rewritten; ``loose``: where any expression
        fits without parentheses (an argument, an element, the whole); ``where``: how it is
        used, for the error when it is an optional value."""
        if not self.has_syntax(node):
            return self.text[node.start:node.end]
        if self.is_consumer(node):
            text = self.consume(node)
            return text if loose or _member(text) else f"({text})"
        if self.is_optional(node):
            if _constructor(node) == "ofNonZeroValue" or node.name in ("optMap", "optFlatMap"):
                self.optional(node)   # raises, naming the construct
            raise NotLowerable(f"an optional value ({self.snippet(node)}) as {where} cannot be written without "
                               "optional types: read it with orValue(), hasValue() or value()")
        if any(node.flags):
            what = {"list": "optional list elements ([?x])", "map": "optional map entries ({?k: v})",
                    "struct": "optional message fields (Msg{?f: v})"}[node.kind]
            raise NotLowerable(f"{what} cannot be written without optional types")
        out, position = [], node.start
        for index, child in enumerate(node.children):
            out += [self.text[position:child.start], self.render(child, *self.context(node, index))]
            position = child.end
        out.append(self.text[position:node.end])
        return "".join(out)

    @staticmethod
    def context(parent: _Node, index: int) -> tuple[bool, str]:
        """(loose, where) for the parent's index-th child."""
        if parent.kind == "call":
            if parent.receiver and index == 0:
                return False, f"the receiver of {parent.name}()"
            return True, f"an argument of {parent.name.lstrip('.')}()"
        if parent.kind in ("list", "map", "struct"):
            return True, f"an element of a {parent.kind} literal"
        if parent.kind == "paren":
            return True, "an expression in parentheses"
        if parent.kind == "index" and index == 1:
            return True, "an index"
        if parent.kind == "ternary":
            return index == 2, "a branch of ?:" if index else "the condition of ?:"
        return False, f"an operand of {parent.name or parent.kind}"

    def member(self, node: _Node, where: str) -> str:
        """The node's text where a select, index or call may follow it."""
        if node.kind in _MEMBER:
            return self.render(node, False, where)
        return f"({self.render(node, True, where)})"

    def snippet(self, node: _Node) -> str:
        text = " ".join(self.text[node.start:node.end].split())
        return text if len(text) <= 60 else text[:57] + "..."

    # consumers

    def is_consumer(self, node: _Node) -> bool:
        return (node.kind == "call" and node.receiver and _CONSUMERS.get(node.name) == len(node.children) - 1
                and self.is_optional(node.children[0]))

    def consume(self, node: _Node) -> str:
        """A consumer's replacement (``render`` adds parentheses where they are needed)."""
        optional = self.optional(node.children[0])
        if node.name == "hasValue":
            return optional.condition()
        if node.name == "value":
            if optional.value is None:
                raise NotLowerable(f"{self.snippet(node)} always fails, which plain CEL cannot write")
            if not optional.exact:
                raise NotLowerable(f"value() of {self.snippet(node.children[0])}, which is not a plain read "
                                   "of a field or key, cannot be written without optional types")
            return optional.value
        otherwise = self.render(node.children[1], True, "an argument of orValue()")
        if optional.present is None or optional.value is None:
            return otherwise
        if not optional.present:
            return optional.value
        return f"{optional.condition()} ? {optional.value} : {otherwise}"

    # optional values

    def optional(self, node: _Node) -> _Optional:
        """The node (an optional value) as a pair of plain expressions."""
        kind, children = node.kind, node.children
        if kind == "paren":
            return self.optional(children[0])
        if kind == "ternary":
            return self.choice(node)
        if kind in ("select", "index"):
            operand = children[0]
            emptied = _emptied(operand, node) if node.optional else None
            if emptied is not None and self.is_consumer(emptied):
                # o.orValue({}).?f: {}.?f is none, so this is o.?f (and o.orValue([])[?i] is o[?i]).
                base = self.optional(emptied.children[0])
            elif self.is_optional(operand):
                base = self.optional(operand)
            else:
                base = _Optional((), self.member(operand, f"the operand of {self.snippet(node)}"))
            if base.value is None:
                return base   # optional.none() stays none
            if kind == "select":
                if node.name.startswith("`"):
                    raise NotLowerable(f"the quoted field {node.name} cannot be tested with has()")
                value = f"{base.value}.{node.name}"
                test = f"has({value})"
            else:
                key = children[1]
                key_text = self.render(key, True, "an index")
                value = f"{base.value}[{key_text}]"
                test = self.presence(node, base.value, key, key_text)
            # A plain select or index on an optional tests presence too (cel-go qualifies the rest
            # of a chain "if present" once it is optional: a.?b.c is a.?b.?c).
            assert base.present is not None
            return _Optional((*base.present, test), value, base.exact)
        constructor = _constructor(node)
        if constructor == "of" and len(children) == 2:
            return _Optional((), self.member(children[1], "an argument of optional.of()"))
        if constructor == "none" and len(children) == 1:
            return _Optional(None, None)
        if constructor is not None:
            raise NotLowerable(f"optional.{constructor} cannot be written without optional types")
        if node.name == "or" and len(children) == 2 and self.is_optional(children[1]):
            return self.either(self.optional(children[0]), self.optional(children[1]))
        raise NotLowerable(f"{node.name or node.kind} cannot be written without optional types")

    def presence(self, node: _Node, value: str, key: _Node, key_text: str) -> str:
        """Whether ``value[?key]`` finds something: a map's key, or a list's index."""
        operand, key_type = self.index_types.get(node.at, ("dyn", "dyn"))
        literal = key.kind == "literal" and key.name.isdigit()
        operand_key = key_text if key.kind in _MEMBER else f"({key_text})"
        if operand == "map" or (operand != "list" and (key_type == "string" or _is_string(key))):
            return f"{operand_key} in {value}"
        if literal:
            return f"size({value}) > {key.name}"
        in_range = f"{operand_key} >= 0 && {operand_key} < size({value})"
        if operand == "list" or key_type in ("int", "uint"):
            return in_range
        # Unknown types on both sides: decided when it runs. A key of another type fails either way.
        return f"(type({value}) == list ? {in_range} : {operand_key} in {value})"

    def either(self, first: _Optional, second: _Optional) -> _Optional:
        """``first.or(second)``."""
        if first.present is None:
            return second
        if not first.present or second.present is None:
            return first
        # Not ``p || p2``: that is true where ``p`` fails and ``p2`` holds, and ``or`` fails there.
        condition = f"({first.condition()} ? true : {second.condition()})"
        value = f"({first.condition()} ? {first.value} : {second.value})"
        return _Optional((condition,), value, second.exact)

    def choice(self, node: _Node) -> _Optional:
        """``c ? o1 : o2``, both optional values."""
        condition, then, otherwise = node.children
        if not (self.is_optional(then) and self.is_optional(otherwise)):
            raise NotLowerable("a choice between an optional and a plain value cannot be written without "
                               "optional types")
        test = self.render(condition, False, "the condition of ?:")
        first, second = self.optional(then), self.optional(otherwise)
        present = (f"({test} ? {first.condition()} : {second.condition()})",)
        if first.value is None or second.value is None:
            return _Optional(present, first.value or second.value, exact=False)
        return _Optional(present, f"({test} ? {first.value} : {second.value})", first.exact and second.exact)


def _emptied(node: _Node, reader: _Node) -> _Node | None:
    """``o.orValue({})`` (in any parentheses) read by ``.?f`` or ``[?k]``, or ``o.orValue([])``
    by ``[?i]`` (a literal ``i``): what the empty default gives is none. Else None."""
    while node.kind == "paren":
        node = node.children[0]
    if node.kind == "call" and node.receiver and node.name == "orValue" and len(node.children) == 2:
        default = node.children[1]
        if default.kind == "map" and not default.children:
            return node
        key = reader.children[1] if reader.kind == "index" else None
        if default.kind == "list" and not default.children and key is not None and key.kind == "literal" \
                and key.name.isdigit():
            return node
    return None


def _is_string(node: _Node) -> bool:
    """A string literal (not bytes)."""
    prefix = _STRING_PREFIX.match(node.name)
    return node.kind == "literal" and prefix is not None and "b" not in prefix.group().lower()


def _member(text: str) -> bool:
    """Whether ``text`` parses as an operand a select, index or call may follow."""
    return _Parser(text).parse().kind in _MEMBER
