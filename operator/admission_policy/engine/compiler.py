"""spec → compiled policy: every CEL expression compiled and type-checked once, at load time."""
from __future__ import annotations

import dataclasses
from typing import Any

from .. import api
from ..cel import CelCompileError, CompiledExpression, compile_expression, referenced_variables


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

    @property
    def name(self) -> str:
        return self.policy.name


def compile_policy(policy: api.AdmissionPolicy) -> CompiledPolicy:
    """Compile all expressions, collecting every error rather than stopping at the first."""
    errors: list[CelCompileError] = []

    def build(expression: api.Expression | None, kind: Any = "any") -> CompiledExpression | None:
        if expression is None:
            return None
        try:
            return compile_expression(expression, kind)
        except CelCompileError as exc:
            errors.append(exc)
            return None

    conditions = [(c.name, build(c.expression, "bool")) for c in policy.match.conditions]
    variables = {v.name: build(v.expression) for v in policy.variables}
    validations = [(v, build(v.expression, "bool"), build(v.message_expression, "string"))
                   for v in policy.validations]
    mutations = [(m, build(m.condition, "bool"),
                  [(op, build(op.value_expression)) for op in m.json_patch or ()])
                 for m in policy.mutations]
    errors.extend(_undeclared_variables(policy))
    if errors:
        raise PolicyCompileError(policy.name, errors)

    # No errors: every build() above returned a program.
    return CompiledPolicy(
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


def _ok(compiled: CompiledExpression | None) -> CompiledExpression:
    assert compiled is not None
    return compiled
