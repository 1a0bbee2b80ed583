"""The CEL environment: compile once per policy, evaluate per request.

cel-expr-python reports most runtime errors as values of type ERROR and a few (the iteration
budget) as exceptions; both become ``CelEvaluationError`` here, so nothing escapes to callers.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

from . import quantity
from .api import Expression

VARIABLES: Final = ("object", "oldObject", "request", "namespaceObject", "variables")
ResultKind = Literal["bool", "string", "any"]

_LOCATION = re.compile(r"<input>:(\d+):(\d+): (.*)")
_VARIABLE_REFERENCE = re.compile(r"\bvariables\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_WHOLE_VARIABLES = re.compile(r"\bvariables\b(?!\s*\.)")


class CelCompileError(Exception):
    """An expression that does not compile or type-check, located by field path and column."""

    def __init__(self, path: str, message: str, line: int | None = None, column: int | None = None) -> None:
        where = f"{path}" + (f" (line {line}, column {column})" if column is not None else "")
        super().__init__(f"{where}: {message}")
        self.path = path
        self.message = message
        self.line = line
        self.column = column


class CelEvaluationError(Exception):
    """An expression that failed on this request (missing field, wrong type, budget)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _quantity(text: str) -> float:
    try:
        return float(quantity.parse_quantity(text))
    except quantity.QuantityError as exc:
        raise ValueError(str(exc)) from None


def _format_quantity(value: float) -> str:
    return quantity.format_quantity(value)


def _compare(a: float, b: float) -> int:
    return (a > b) - (a < b)


def _as_integer(value: float) -> int:
    if value != int(value):
        raise ValueError(f"quantity {value} is not an integer")
    return int(value)


def _overload(name: str, result: cel.Type, params: list[cel.Type], impl: Any, member: bool = False) -> Any:
    return cel.FunctionDecl(name, [cel.Overload(
        f"{name}_{'_'.join(p.name().lower() for p in params)}",
        return_type=result, parameters=params, is_member=member, impl=impl)])


def _kubernetes_library() -> cel.CelExtension:
    """Kubernetes' quantity helpers, with quantities as doubles (see ``quantity``)."""
    d, s, b, i = cel.Type.DOUBLE, cel.Type.STRING, cel.Type.BOOL, cel.Type.INT
    return cel.CelExtension("kubernetes", [
        _overload("quantity", d, [s], _quantity),
        _overload("isQuantity", b, [s], quantity.is_quantity),
        _overload("formatQuantity", s, [d], _format_quantity),
        _overload("isGreaterThan", b, [d, d], lambda a, c: a > c, member=True),
        _overload("isLessThan", b, [d, d], lambda a, c: a < c, member=True),
        _overload("compareTo", i, [d, d], _compare, member=True),
        _overload("add", d, [d, d], lambda a, c: a + c, member=True),
        _overload("sub", d, [d, d], lambda a, c: a - c, member=True),
        _overload("asApproximateFloat", d, [d], lambda a: a, member=True),
        _overload("asInteger", i, [d], _as_integer, member=True),
    ])


# Environments from the lightest to the fullest, each created when an expression first needs it.
# Every extension is a native module of its own (ext_math and ext_encoders: ~5 MB of RSS between
# them), and the Python-backed Kubernetes functions make every evaluation of a program about twice
# as slow. An expression compiles in the first one that has what it uses; activations work with
# programs of any of them.
_TIERS: Final = 3


@functools.cache
def _environment(tier: int) -> cel.Env:
    extensions: list[cel.CelExtensionBase] = [ext_strings.ExtStrings(), ext_optional.ExtOptional(),
                                              ext_bindings.ExtBindings()]
    if tier >= 1:
        from cel_expr_python.ext import ext_encoders, ext_math
        extensions += [ext_encoders.ExtEncoders(), ext_math.ExtMath()]
    if tier >= 2:
        extensions.append(_kubernetes_library())
    return cel.NewEnv(variables={name: cel.Type.DYN for name in VARIABLES}, extensions=extensions)


@dataclasses.dataclass(eq=False)
class CompiledExpression:
    """A type-checked program, plus the policy variables it reads (evaluated lazily).

    ``program`` is a cache: an expression the request path rarely runs (a message, or one that a
    policy's single program also covers) is released after type-checking and rebuilt on first
    use. A program takes a few kB, and a thousand policies would otherwise hold each twice.
    """
    expression: Expression
    program: Any | None
    kind: ResultKind
    variables: frozenset[str] | None  # None: reads the whole ``variables`` map
    tier: int = 0                     # the environment it compiles in

    @property
    def path(self) -> str:
        return self.expression.path

    def release(self) -> None:
        self.program = None

    def evaluate(self, activation: Any) -> Any:
        """The plain Python result, or CelEvaluationError; never another exception."""
        try:
            if self.program is None:
                self.program = _environment(self.tier).compile(self.expression.source)
            result = self.program.eval(activation)
        except RuntimeError as exc:
            raise CelEvaluationError(self.path, _clean(str(exc))) from None
        if result.type() == cel.Type.ERROR:
            raise CelEvaluationError(self.path, _clean(str(result.value())))
        value = result.plain_value()
        if self.kind == "bool" and not isinstance(value, bool):
            raise CelEvaluationError(self.path, f"must evaluate to a bool, got {type(value).__name__}")
        if self.kind == "string" and not isinstance(value, str):
            raise CelEvaluationError(self.path, f"must evaluate to a string, got {type(value).__name__}")
        if isinstance(value, (bytes, bytearray)):
            raise CelEvaluationError(self.path, "evaluated to bytes, which JSON cannot carry; use string()")
        return value


_EXPECTED_TYPES: Final[Mapping[ResultKind, tuple[cel.Type, ...]]] = {
    "bool": (cel.Type.BOOL, cel.Type.DYN),
    "string": (cel.Type.STRING, cel.Type.DYN),
}


def compile_expression(expression: Expression, kind: ResultKind = "any") -> CompiledExpression:
    """Parse and type-check once; errors name the field path and the column."""
    for tier in range(_TIERS):
        try:
            program = _environment(tier).compile(expression.source)
            break
        except RuntimeError as exc:
            if tier == _TIERS - 1:   # the fullest environment's message says what is wrong
                line, column, message = _locate(str(exc))
                raise CelCompileError(expression.path, message, line, column) from None
    if kind in _EXPECTED_TYPES:
        returned = program.return_type()
        if not any(returned == allowed for allowed in _EXPECTED_TYPES[kind]):
            raise CelCompileError(expression.path, f"must evaluate to a {kind}, but its type is {returned}")
    return CompiledExpression(expression, program, kind, referenced_variables(expression.source), tier)


def referenced_variables(source: str) -> frozenset[str] | None:
    """The policy variables an expression reads, or None when it reads the whole map."""
    if _WHOLE_VARIABLES.search(source):
        return None
    return frozenset(_VARIABLE_REFERENCE.findall(source))


def new_activation(data: Mapping[str, Any]) -> Any:
    """Bindings for one evaluation state; cheap, the values are wrapped rather than copied."""
    return _environment(0).Activation(data)


def _locate(error: str) -> tuple[int | None, int | None, str]:
    """Pull (line, column, message) from the compiler's "<input>:L:C: msg" text."""
    messages = []
    position: tuple[int, int] | None = None
    for line in error.splitlines():
        found = _LOCATION.search(line)
        if found:
            if position is None:
                position = (int(found[1]), int(found[2]))
            messages.append(_clean(found[3]))
    if not messages:
        return None, None, _clean(error)
    assert position is not None
    return position[0], position[1], "; ".join(messages)


def _clean(message: str) -> str:
    """Drop the status-code prefix and suffix the C++ core adds ("INVALID_ARGUMENT: … [X]")."""
    message = re.sub(r"^[A-Z_]+: ", "", message.strip())
    message = re.sub(r"^ERROR: ", "", message)
    return re.sub(r" \[[A-Z_]+\]$", "", message)
