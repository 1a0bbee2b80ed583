"""The CEL environment: compile once per policy, evaluate per request.

cel-expr-python reports most runtime errors as values of type ERROR and a few (the iteration
budget) as exceptions; both, and any other exception (``MemoryError`` included), become
``CelEvaluationError`` here, so nothing escapes to callers.

A program is compiled (parsed and type-checked) as written, then rewritten to compute what
Kubernetes' cel-go computes where the C++ runtime differs (``cel.lib.compat``), its ``map``/``filter``
accumulations to cost linear time and memory (``cel.syntax.linearize``), and its cost
is estimated (``cel.estimation``). Kubernetes refuses no ValidatingAdmissionPolicy for its estimated
cost, so neither is one refused here for what it would cost on a large object; only an
expression that is unbounded by construction is: one whose estimate on an object of one
character already exceeds Kubernetes' per-call limit (a value doubled at each of many steps),
which Kubernetes would stop on every request. Large requests are the engine's concern at run
time (``engine.scope``, ``cel.fork``).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, Literal

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

from ..api import Expression
from ..errors import AdmissionPolicyError
from . import estimation, lib, syntax
from .lib import compat, lists, regex, rewrite

VARIABLES: Final = ("object", "oldObject", "request", "namespaceObject", "params", "context", "variables",
                    "authorizer", "authorizer.requestResource")
# Declared with their types, as Kubernetes does, so that authorizer.group(…)…check(…) resolves when
# checked (and .allowed() is a bool); the others are dyn.
VARIABLE_TYPES: Final = {"authorizer": lib.opaque("kubernetes.authorization.Authorizer").type,
                          "authorizer.requestResource": lib.opaque("kubernetes.authorization.ResourceCheck").type}
ResultKind = Literal["bool", "string", "any"]

# Compile time: the estimate (``cel.estimation``, about Kubernetes' cost units) on an object of one
# character, one item per list, against Kubernetes' per-call cost limit (celconfig.PerCallLimit).
UNIT: Final = estimation.Sizes(size=1, items=1)
PER_CALL_LIMIT: Final = 1_000_000
# Run time: all of a policy's expressions together, estimated for the request at hand before the
# policy runs; over it, the policy runs apart, bounded in memory and time (engine/scope.py).
POLICY_BUDGET: Final = 50_000_000
# The parser's nesting limit (cel-cpp's default): parentheses, calls, operators in a chain.
PARSER_DEPTH: Final = 32

_LOCATION = re.compile(r"<input>:(-?\d+):(-?\d+): (.*)")
_RECURSION = re.compile(r"recursion (limit|depth)", re.IGNORECASE)
_VARIABLE_REFERENCE = re.compile(r"\bvariables\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_WHOLE_VARIABLES = re.compile(r"\bvariables\b(?!\s*\.)")


class CelCompileError(AdmissionPolicyError):
    """An expression that does not compile or type-check, located by field path and column."""

    def __init__(self, path: str, message: str, line: int | None = None, column: int | None = None) -> None:
        where = f"{path}" + (f" (line {line}, column {column})" if column is not None else "")
        super().__init__(f"{where}: {message}")
        self.path = path
        self.message = message
        self.line = line
        self.column = column


class CelEvaluationError(AdmissionPolicyError):
    """An expression that failed on this request (missing field, wrong type, budget)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


# Environments from the lightest to the fullest, each created when an expression first needs it.
# Every extension is a native module of its own (ext_math and ext_encoders: ~5 MB of RSS between
# them), and the Python-backed Kubernetes functions make every evaluation of a program about twice
# as slow. An expression compiles in the first one that has what it uses; activations work with
# programs of any of them.
_TIERS: Final = 3


def new_environment(functions: Sequence[lib.Function], extra: Sequence[cel.CelExtensionBase] = (),
                    hidden: Collection[str] = (), types: Mapping[str, cel.Type] | None = None) -> cel.Env:
    """An environment of Kubernetes' CEL (``compat`` makes cel-expr-python's base Kubernetes'),
    with ``functions`` from ``cel.lib``, the ``extra`` extensions and every policy variable but the
    ``hidden`` ones. ``vap.portability`` builds Kubernetes' own with it, without our additions;
    ``engine.typecheck`` declares ``types`` for some variables (``object``, ``variables.x`` …)."""
    extensions: list[cel.CelExtensionBase] = [ext_strings.ExtStrings(version=2), ext_optional.ExtOptional(),
                                              compat.extension(), *extra]
    others = [declared for declared in functions if declared.name not in compat.ORDERING_NAMES]
    extensions.append(lib.extension(others))
    return cel.NewEnv(descriptor_pool=lib.pool(), config=cel.NewEnvConfigFromYaml(compat.CONFIG),
                      variables={**{name: VARIABLE_TYPES.get(name, cel.Type.DYN) for name in VARIABLES
                                    if name not in hidden}, **(types or {})},
                      extensions=extensions, functions=[*lib.declarations(others), *compat.declarations(functions)],
                      function_impls={**lib.implementations(others), **compat.implementations(functions)})


@functools.cache
def _environment(tier: int) -> cel.Env:
    """The environment of tier ``tier`` (see _TIERS)."""
    return _tier_environment(tier)


def _tier_environment(tier: int, types: Mapping[str, cel.Type] | None = None) -> cel.Env:
    extra: list[cel.CelExtensionBase] = [ext_bindings.ExtBindings()]   # cel.bind: ours, not Kubernetes'
    if tier >= 1:
        from cel_expr_python.ext import ext_encoders, ext_math
        extra += [ext_encoders.ExtEncoders(), ext_math.ExtMath()]
    # Kubernetes' lists library runs as native loops (``lists.expand``): in every environment, so
    # that ``x.indexOf(y)`` means the same wherever it compiles.
    return new_environment(lib.functions() if tier >= 2 else list(lists.LIBRARY.functions), extra, types=types)


def typed_environment(types: Mapping[str, cel.Type]) -> cel.Env:
    """The fullest environment with some variables typed (``engine.typecheck``): for checking only."""
    return _tier_environment(_TIERS - 1, types)


def type_of(environment: cel.Env, expression: Expression) -> tuple[cel.Type, list[CelCompileError]]:
    """The type ``expression`` checks to in ``environment`` (``dyn`` if it does not), and each of
    the checker's errors apart, at its own line and column."""
    try:
        return check(environment, expression.source).return_type(), []
    except RuntimeError as exc:
        found = _messages(str(exc))
        if not found:
            line, column, message = _locate(str(exc))
            return cel.Type.DYN, [CelCompileError(expression.path, message, line, column)]
        return cel.Type.DYN, [CelCompileError(expression.path, message, *where) for message, where in found.items()]


def check(environment: cel.Env, source: str) -> Any:
    """Parse and type-check ``source`` in ``environment`` as Kubernetes would: the checked
    program, or RuntimeError with the checker's message."""
    checked_program = environment.compile(compat.respell(source))
    problem = compat.check(syntax.Checked.decode(checked_program.serialize()))
    if problem is not None:   # worded as the checker's own errors
        raise RuntimeError(problem)
    return checked_program


def _build(source: str, tier: int) -> tuple[Any, syntax.Checked]:
    """The program to run, and the tree it was checked as (for estimates)."""
    checked_program = check(_environment(tier), source)
    serialized = checked_program.serialize()
    tree, linear = syntax.Checked.decode(serialized), syntax.Checked.decode(serialized)
    # The rewrite of optional results first: the others copy nodes under ids the checker never saw.
    if not (rewrite.optional_results(linear) | compat.rewrite(linear) | syntax.inline_bound_maps(linear)
            | syntax.linearize(linear)):
        return checked_program, tree
    return _environment(tier).deserialize(linear.encode()), tree


@functools.lru_cache(maxsize=256)
def _tree(source: str, tier: int) -> syntax.Checked:
    """The checked tree of an expression, for the estimates of large requests
    (rebuilt rather than held: a thousand policies' trees would take tens of MB)."""
    return syntax.Checked.decode(_environment(tier).compile(compat.respell(source)).serialize())


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
    cost: float = 0.0                 # estimated for a request of UNIT sizes
    result: estimation.Value = estimation.SCALAR   # what it returns, estimated likewise
    opaque: bool = True               # its type may hold an opaque value (lib.to_plain has work)

    @property
    def path(self) -> str:
        return self.expression.path

    def release(self) -> None:
        """Drop the program to save memory (``engine.compiler`` does it for the ones a request
        rarely runs); it is built again, from the source, when next needed."""
        self.program = None

    def tree(self) -> syntax.Checked:
        """The checked syntax tree (rebuilt and cached by source, not held: see ``_tree``)."""
        return _tree(self.expression.source, self.tier)

    def estimate(self, sizes: estimation.Sizes, variables: Mapping[str, estimation.Value] | None = None,
                 context: Mapping[str, int] | None = None) -> tuple[float, estimation.Value]:
        """(cost, result) for a request of at most ``sizes`` (``cel.estimation``)."""
        return estimation.estimate(_tree(self.expression.source, self.tier), sizes, variables, context)

    def evaluate(self, activation: Any, *, plain: bool = True) -> Any:
        """The plain Python result, or CelEvaluationError; never another exception. ``plain=False``
        keeps opaque values (``net.IP``, ``kubernetes.Quantity`` …) as they are, for a variable
        whose value other expressions call methods on."""
        # The error is raised after the ``except`` blocks, not inside them: raised there, it would
        # keep the C++ core's exception as its context, whose traceback holds the activation
        # (and its arena, megabytes for a large object) in a reference cycle until a full GC.
        problem: str | None = None
        try:
            if self.program is None:
                self.program = _build(self.expression.source, self.tier)[0]
            result = self.program.eval(activation)
            failed = result.type() == cel.Type.ERROR
            value = str(result.value()) if failed else result.plain_value()
            if plain and not failed and self.opaque:
                value = lib.to_plain(value)
        except MemoryError:
            problem = "ran out of memory (the expression builds too much)"
        except Exception as exc:   # RuntimeError from the C++ core, and anything else: never escapes
            problem = explain(_clean(str(exc)))
        if problem is None and failed:
            problem = explain(compat.translate(_clean(value)))
        if problem is not None:
            raise CelEvaluationError(self.path, problem)
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


def compile_expression(expression: Expression, kind: ResultKind = "any", *,
                       variables: Mapping[str, estimation.Value] | None = None,
                       context: Mapping[str, int] | None = None,
                       limit: float = PER_CALL_LIMIT) -> CompiledExpression:
    """Parse and type-check once; errors name the field path and the column.

    ``variables``: the estimated results of the policy variables it may read (see ``cel.estimation``);
    ``context``: the declared maxObjects of each ``context.<name>`` it may read;
    an expression whose estimated cost for a request of UNIT sizes is over ``limit`` is
    refused like one that does not compile.
    """
    if not expression.source.isascii():
        try:
            expression.source.encode("utf-8")
        except UnicodeEncodeError as exc:   # JSON's "\ud800" escape decodes to one; CEL's binding refuses it
            raise CelCompileError(expression.path, f"is not valid Unicode: a lone surrogate {exc.object[exc.start]!r} "
                                  f"at offset {exc.start}") from None
    for tier in range(_TIERS):
        try:
            program, tree = _build(expression.source, tier)
            break
        except RuntimeError as exc:
            if tier == _TIERS - 1:   # the fullest environment's message says what is wrong
                line, column, message = _locate(str(exc))
                raise CelCompileError(expression.path, message, line, column) from None
        except syntax.AstError as exc:   # a program cel-expr-python serialised in a way not known here
            raise CelCompileError(expression.path, f"cannot be analysed for cost: {exc}") from None
    if kind in _EXPECTED_TYPES:
        returned = program.return_type()
        if not any(returned == allowed for allowed in _EXPECTED_TYPES[kind]):
            raise CelCompileError(expression.path, f"must evaluate to a {kind}, but its type is {returned}")
    for problem in regex.constant_pattern_errors(tree):   # Kubernetes refuses these when it builds the program
        raise CelCompileError(expression.path, problem)
    cost, result = estimation.estimate(tree, UNIT, variables, context)
    if cost > limit:
        raise CelCompileError(expression.path, unbounded(cost, limit))
    return CompiledExpression(expression, program, kind, referenced_variables(expression.source), tier,
                              cost, result, lib.may_hold_opaque(program.return_type()))


def unbounded(cost: float, limit: float) -> str:
    """The message for an expression over the cost limit on the smallest object: no request
    could pass it, so it is refused at compile time rather than failing on each request."""
    return (f"is unbounded by construction: its estimated cost is {_amount(cost)} even on an object of one "
            f"character, over Kubernetes' limit of {_amount(limit)} per expression, so Kubernetes would stop "
            "every evaluation of it; a value that grows at each step (a string or list doubled through "
            "cel.bind or spec.variables, say) does that (see docs/policies.md, 'Cost')")


def _amount(cost: float) -> str:
    return "unbounded" if cost == float("inf") else f"{cost:,.0f}"


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
    if _RECURSION.search(error):   # reported at no position ("<input>:-1:-1"), or with none at all
        return None, None, (f"nests too deeply: CEL's parser allows {PARSER_DEPTH} levels of parentheses, "
                            "calls and chained operators (each + in a + b + c … is one more); split it into "
                            "spec.variables")
    messages = _messages(error)
    if not messages:
        return None, None, _clean(error)
    position = next((p for p in messages.values() if p[0] is not None), (None, None))
    return (*position, "; ".join(messages))


def _messages(error: str) -> dict[str, tuple[int | None, int | None]]:
    """Each distinct message of the compiler's "<input>:L:C: msg" lines, in order, at its (line,
    column); (None, None) where it names none."""
    messages: dict[str, tuple[int | None, int | None]] = {}
    for line in error.splitlines():
        found = _LOCATION.search(line)
        if found and _clean(found[3]) not in messages:
            messages[_clean(found[3])] = (int(found[1]), int(found[2])) if int(found[1]) > 0 else (None, None)
    return messages


# What a runtime error means for the policy's author, by the C++ core's wording.
_HINTS: Final = (
    (re.compile(r"no such key|key not found", re.IGNORECASE),
     "the field is absent: test it with has(x.field), or read it with x.?field.orValue(default)"),
    (re.compile(r"non-message type|null_type|on null|of null", re.IGNORECASE),
     "a field was read from a value that is not an object; often null: object is null on DELETE, oldObject "
     "on CREATE, namespaceObject for cluster-scoped objects"),
    (re.compile(r"no matching overload", re.IGNORECASE),
     "the operands' types do not go together: compare like types (convert with int(), double() or string())"),
    (re.compile(r"iteration budget", re.IGNORECASE),
     f"more than {estimation.ITERATION_LIMIT:,} loop steps in one evaluation, loops within loops counted"),
    (re.compile(r"index error|index out of (range|bounds)|invalid index", re.IGNORECASE),
     "no item at that index: check size() first"),
)


def explain(message: str) -> str:
    """The runtime's message, with what it usually means for the expression's author."""
    for pattern, hint in _HINTS:
        if pattern.search(message):
            return f"{message} ({hint})"
    return message


def _clean(message: str) -> str:
    """Drop the status-code prefix and suffix the C++ core adds ("INVALID_ARGUMENT: … [X]")."""
    message = re.sub(r"^[A-Z_]+: ", "", message.strip())
    message = re.sub(r"^ERROR: ", "", message)
    return re.sub(r" \[[A-Z_]+\]$", "", message)
