"""spec → compiled policy: every CEL expression compiled and type-checked once, at load time."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from .. import api, celcost
from ..cel import (
    POLICY_BUDGET,
    REFERENCE,
    CelCompileError,
    CompiledExpression,
    compile_expression,
    referenced_variables,
)


class PolicyCompileError(ValueError):
    """Every expression of a policy that failed to compile, each with its path and column."""

    def __init__(self, policy: str, errors: list[CelCompileError]) -> None:
        lines = "\n".join(f"  {error}" for error in errors)
        super().__init__(f"AdmissionPolicy {policy!r} has {len(errors)} invalid expression(s):\n{lines}")
        self.policy = policy
        self.errors = errors


@dataclasses.dataclass(frozen=True)
class CompiledValidation:
    spec: api.Validation
    check: CompiledExpression
    message: CompiledExpression | None


@dataclasses.dataclass(frozen=True)
class CompiledPatchOperation:
    spec: api.PatchOperation
    value: CompiledExpression | None


@dataclasses.dataclass(frozen=True)
class CompiledMutation:
    spec: api.Mutation
    condition: CompiledExpression | None
    operations: tuple[CompiledPatchOperation, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledPolicy:
    policy: api.AdmissionPolicy
    conditions: tuple[tuple[str, CompiledExpression], ...]
    variables: dict[str, CompiledExpression]   # in declaration order; read-only by convention
    validations: tuple[CompiledValidation, ...]
    mutations: tuple[CompiledMutation, ...]
    validation_batch: CompiledExpression | None = None   # see _validation_batch
    reads_managed_fields: bool = False   # see evaluation._bound
    # Estimated cost of all expressions by request sizes (rounded up to powers of two): see cost().
    costs: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.policy.name

    def expressions(self) -> Iterator[CompiledExpression]:
        """Every expression a request may run, variables first (in declaration order)."""
        yield from self.variables.values()
        for _, condition in self.conditions:
            yield condition
        for validation in self.validations:
            yield validation.check
            if validation.message is not None:
                yield validation.message
        for mutation in self.mutations:
            if mutation.condition is not None:
                yield mutation.condition
            yield from (op.value for op in mutation.operations if op.value is not None)

    def cost(self, sizes: celcost.Sizes) -> float:
        """What evaluating the whole policy can cost on a request of at most ``sizes`` (``celcost``):
        every expression once, each variable once. Cached by sizes rounded up to powers of two."""
        key = (_power_of_two(sizes.size), _power_of_two(sizes.items))
        if key not in self.costs:
            if len(self.costs) >= 64:
                self.costs.clear()
            self.costs[key] = _estimate_all(self, celcost.Sizes(*key))
        return self.costs[key]


def compile_policy(policy: api.AdmissionPolicy) -> CompiledPolicy:
    """Compile all expressions, collecting every error rather than stopping at the first."""
    errors: list[CelCompileError] = []

    # What each variable returns, estimated, for the expressions that read it (``celcost``).
    results: dict[str, celcost.Value] = {}

    def build(expression: api.Expression | None, kind: Any = "any") -> CompiledExpression | None:
        if expression is None:
            return None
        try:
            return compile_expression(expression, kind, variables=results)
        except CelCompileError as exc:
            errors.append(exc)
            return None

    conditions = [(c.name, build(c.expression, "bool")) for c in policy.match.conditions]
    variables: dict[str, CompiledExpression | None] = {}
    for variable in policy.variables:
        variables[variable.name] = built = build(variable.expression)
        # One that failed still counts, as large as the request, for those that read it.
        results[variable.name] = built.result if built else celcost.Value(math.inf, math.inf)
    validations = [(v, build(v.expression, "bool"), build(v.message_expression, "string"))
                   for v in policy.validations]
    mutations = [(m, build(m.condition, "bool"),
                  [(op, build(op.value_expression)) for op in m.json_patch or ()])
                 for m in policy.mutations]
    errors.extend(_undeclared_variables(policy))
    if errors:
        raise PolicyCompileError(policy.name, errors)

    # No errors: every build() above returned a program.
    compiled = CompiledPolicy(
        validation_batch=_validation_batch(policy),
        reads_managed_fields=any("managedFields" in e.source for e in policy.expressions()),
        policy=policy,
        conditions=tuple((name, _ok(c)) for name, c in conditions),
        variables={name: _ok(v) for name, v in variables.items()},
        validations=tuple(CompiledValidation(spec, _ok(check), message)
                          for spec, check, message in validations),
        mutations=tuple(
            CompiledMutation(spec, condition, tuple(CompiledPatchOperation(op, value) for op, value in ops))
            for spec, condition, ops in mutations
        ),
    )
    total = sum(expression.cost for expression in compiled.expressions())
    if total > POLICY_BUDGET:
        raise PolicyCompileError(policy.name, [CelCompileError("spec", (
            f"the expressions together have an estimated cost of {total:,.0f}, over the budget of "
            f"{POLICY_BUDGET:,} per policy (for a request of {REFERENCE.size // 1024} KiB with "
            f"{REFERENCE.items:.0f} items per list: see 'Writing policies' in the README)"))])
    _release_cold_programs(compiled)
    return compiled


def _estimate_all(policy: CompiledPolicy, sizes: celcost.Sizes) -> float:
    results: dict[str, celcost.Value] = {}
    total = 0.0
    for name, variable in policy.variables.items():
        cost, results[name] = variable.estimate(sizes, results)
        total += cost
    variables = set(policy.variables.values())
    return total + sum(expression.estimate(sizes, results)[0]
                       for expression in policy.expressions() if expression not in variables)


def _power_of_two(value: float) -> int:
    """The least power of two at or above ``value`` (at least 1)."""
    return 1 << (max(math.ceil(value), 1) - 1).bit_length()


def _release_cold_programs(policy: CompiledPolicy) -> None:
    """Let go of the programs a request runs only after a failure or an error: messages, and what
    the validation batch covers (mutations read conditions and variables one program at a time)."""
    cold = [validation.message for validation in policy.validations if validation.message is not None]
    if policy.validation_batch is not None:
        cold += [validation.check for validation in policy.validations]
        if not policy.mutations:
            cold += [condition for _, condition in policy.conditions] + list(policy.variables.values())
    for expression in cold:
        expression.release()


def _undeclared_variables(policy: api.AdmissionPolicy) -> list[CelCompileError]:
    """``variables.x`` must name a declared variable, and a variable may only read earlier ones."""
    declared = [v.name for v in policy.variables]
    errors = []
    for expression in policy.expressions():
        earlier = set(declared)
        if expression.path.startswith("spec.variables["):
            index = int(expression.path.split("[", 1)[1].split("]", 1)[0])
            earlier = set(declared[:index])
        referenced = referenced_variables(expression.source)
        if referenced is None and expression.path.startswith("spec.variables["):
            errors.append(CelCompileError(expression.path, "a variable must read others by name (variables.x)"))
            continue
        for name in sorted((referenced or frozenset()) - earlier):
            hint = "is declared later" if name in declared else "is not declared in spec.variables"
            errors.append(CelCompileError(expression.path, f"variables.{name} {hint}"))
    return errors


def _validation_batch(policy: api.AdmissionPolicy) -> CompiledExpression | None:
    """The match conditions and every validation as one program: ``false`` when a condition does
    not hold, else a list of booleans. The variables the validations read are bound inside it
    once each (``cel.bind``, in declaration order), and every expression sees the ones it reads
    as its ``variables`` map, typed ``dyn`` as when evaluated alone.

    A variable computed by its own program comes back as a Python value, which every program that
    reads it converts for CEL again; inside one program it is computed and converted once.
    The engine falls back to one program per expression (exact error paths, lazy variables)
    when this one errs, and so does a policy whose batch does not type-check (None here).
    """
    if not policy.validations:
        return None
    sources = [v.expression.source for v in policy.validations]
    needed: set[str] = set()
    for source in sources:
        needed |= set(referenced_variables(source) or (v.name for v in policy.variables))
    for variable in reversed(policy.variables):   # a variable may read earlier ones
        if variable.name in needed:
            needed |= set(referenced_variables(variable.expression.source) or ())
    bound = [v.name for v in policy.variables if v.name in needed]

    def scoped(source: str) -> str:
        # Newlines before closing parentheses keep a trailing // comment from swallowing them.
        reads = referenced_variables(source)
        names = [name for name in bound if reads is None or name in reads]
        if not names:
            return f"({source}\n)"
        entries = ", ".join(f"'{name}': {_BOUND_PREFIX}{name}" for name in names)
        return f"cel.bind(variables, {{{entries}}}, {source}\n)"

    body = "[" + ", ".join(scoped(source) for source in sources) + "]"
    for variable in reversed([v for v in policy.variables if v.name in needed]):
        body = f"cel.bind({_BOUND_PREFIX}{variable.name}, dyn({scoped(variable.expression.source)}), {body})"
    if policy.match.conditions:
        conditions = " && ".join(f"({c.expression.source}\n)" for c in policy.match.conditions)
        body = f"({conditions}) ? dyn({body}) : false"
    try:   # its parts are within their budgets; the whole is their sum
        batch = compile_expression(api.Expression(body, "spec.validations"), budget=math.inf)
    except CelCompileError:
        return None
    return dataclasses.replace(batch, variables=frozenset())   # it binds its own variables


# Names the batch binds variables to; a policy's own expressions cannot use them (they would not
# compile on their own, which every expression must first).
_BOUND_PREFIX = "policy_variable__"


def _ok(compiled: CompiledExpression | None) -> CompiledExpression:
    assert compiled is not None
    return compiled
