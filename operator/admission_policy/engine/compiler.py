"""spec → compiled policy: every CEL expression compiled and type-checked once, at load time."""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from .. import api, features
from .. import plugins as plugin_api
from ..cel import CelCompileError, CompiledExpression, compile_expression, estimation, referenced_variables
from ..errors import AdmissionPolicyError
from . import podcontrollers


class PolicyCompileError(AdmissionPolicyError, ValueError):
    """Every expression of a policy that failed to compile, each with its path and column."""

    def __init__(self, policy: str, errors: list[CelCompileError]) -> None:
        lines = "\n".join(f"  {error}" for error in errors)
        super().__init__(f"AdmissionPolicy {policy!r} has {len(errors)} invalid expression(s):\n{lines}")
        self.policy = policy
        self.errors = errors


@dataclasses.dataclass(frozen=True, eq=False)
class BoundPlugin:
    """A plugin as one policy uses it: its prepared config, and whether its gate is on."""
    plugin: plugin_api.Plugin
    config: Any
    path: str                  # spec.validations[1].plugin
    enabled: bool = True
    gate: str = ""

    @property
    def name(self) -> str:
        return self.plugin.name


@dataclasses.dataclass(frozen=True)
class CompiledValidation:
    """A validation with its programs: ``check`` must be true, ``message`` (a messageExpression)
    runs only once the check has failed."""
    spec: api.Validation
    check: CompiledExpression | None     # None: a plugin validation
    message: CompiledExpression | None
    plugin: BoundPlugin | None = None

    @property
    def path(self) -> str:
        return self.check.path if self.check is not None else self.spec.path


@dataclasses.dataclass(frozen=True)
class CompiledPatchOperation:
    """A JSON patch operation; ``value`` computes its value per request (valueExpression), None
    when the value is the fixed ``spec.value``."""
    spec: api.PatchOperation
    value: CompiledExpression | None


@dataclasses.dataclass(frozen=True)
class CompiledMutation:
    """A mutation with its programs; ``operations`` is empty for a merge patch or a plugin."""
    spec: api.Mutation
    condition: CompiledExpression | None
    operations: tuple[CompiledPatchOperation, ...]
    plugin: BoundPlugin | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledPolicy:
    """A policy ready to evaluate: every expression compiled and every plugin bound, once per
    generation, so that a request only evaluates. Built by ``compile_policy``, never by hand."""
    policy: api.AdmissionPolicy
    conditions: tuple[tuple[str, CompiledExpression], ...]
    variables: dict[str, CompiledExpression]   # in declaration order; read-only by convention
    validations: tuple[CompiledValidation, ...]
    mutations: tuple[CompiledMutation, ...]
    validation_batch: CompiledExpression | None = None   # see _validation_batch
    reads_managed_fields: bool = False   # see scope._bound
    reads_authorizer: bool = False       # bound only for the policies that name it (see scope.View)
    # Estimated cost of all expressions by request sizes (rounded up to powers of two): see cost().
    costs: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict, repr=False)
    # Pod controllers (``podcontrollers``): a Pod policy holds the policies derived from it for the
    # workloads' Pod templates, one per place a template sits, and what they cover (for status);
    # a derived policy has its ``template`` location, its rules name the workloads, and its
    # mutations write into the template. Same name, same programs.
    derived: tuple[CompiledPolicy, ...] = ()
    coverage: podcontrollers.Coverage | None = None
    template: podcontrollers.Location = ()
    # Plugin rules whose feature gate is off: skipped, and the policy reports them (Degraded).
    gated_off: tuple[str, ...] = ()

    def plugins(self) -> Iterator[BoundPlugin]:
        """Every plugin rule, gated off or not, in field order."""
        for validation in self.validations:
            if validation.plugin is not None:
                yield validation.plugin
        for mutation in self.mutations:
            if mutation.plugin is not None:
                yield mutation.plugin

    @property
    def name(self) -> str:
        return self.policy.name

    def expressions(self) -> Iterator[CompiledExpression]:
        """Every expression a request may run, variables first (in declaration order)."""
        yield from self.variables.values()
        for _, condition in self.conditions:
            yield condition
        for validation in self.validations:
            if validation.check is not None:
                yield validation.check
            if validation.message is not None:
                yield validation.message
        for mutation in self.mutations:
            if mutation.condition is not None:
                yield mutation.condition
            yield from (op.value for op in mutation.operations if op.value is not None)

    def cost(self, sizes: estimation.Sizes) -> float:
        """What evaluating the whole policy can cost on a request of at most ``sizes`` (``cel.estimation``):
        every expression once, each variable once. Cached by sizes rounded up to powers of two."""
        key = (_power_of_two(sizes.size), _power_of_two(sizes.items))
        if key not in self.costs:
            if len(self.costs) >= 64:
                self.costs.clear()
            self.costs[key] = _estimate_all(self, estimation.Sizes(*key))
        return self.costs[key]


def compile_policy(policy: api.AdmissionPolicy, *, registry: plugin_api.Registry | None = None,
                   gates: features.FeatureGates | None = None) -> CompiledPolicy:
    """Compile all expressions and bind every plugin to its checked config, collecting every error
    rather than stopping at the first. ``registry``/``gates``: the process's, by default."""
    errors: list[CelCompileError] = []
    plugins = registry if registry is not None else plugin_api.registry()
    gates = gates if gates is not None else features.current()

    def bind(ref: api.PluginRef | None, kind: str) -> BoundPlugin | None:
        if ref is None:
            return None
        plugin = plugins.get(ref.name)
        if plugin is None:
            errors.append(CelCompileError(f"{ref.path}.name", _missing_plugin(plugins, ref.name)))
            return None
        if plugin.kind != kind:
            errors.append(CelCompileError(f"{ref.path}.name", f"plugin {ref.name!r} is a {plugin.kind}, "
                                                                f"not a {kind}"))
            return None
        config, problems = plugin_api.check_config(plugin, ref.config)
        for where, message in problems:
            errors.append(CelCompileError(f"{ref.path}.config" + (f".{where}" if where and not where.startswith("[")
                                                                  else where), message))
        if problems:
            return None
        gate = plugin.gate_name()
        enabled = gates.enabled("PythonPlugins") and gates.enabled(gate)
        return BoundPlugin(plugin, config, ref.path, enabled, gate)

    # What each variable returns, estimated, for the expressions that read it (``cel.estimation``).
    results: dict[str, estimation.Value] = {}
    caps = context_caps(policy)

    def build(expression: api.Expression | None, kind: Any = "any") -> CompiledExpression | None:
        if expression is None:
            return None
        try:
            return compile_expression(expression, kind, variables=results, context=caps)
        except CelCompileError as exc:
            errors.append(exc)
            return None

    conditions = [(c.name, build(c.expression, "bool")) for c in policy.match.conditions]
    variables: dict[str, CompiledExpression | None] = {}
    for variable in policy.variables:
        variables[variable.name] = built = build(variable.expression)
        # One that failed still counts, as large as the request, for those that read it.
        results[variable.name] = built.result if built else estimation.Value(math.inf, math.inf)
    validations = [(v, build(v.expression, "bool"), build(v.message_expression, "string"),
                    bind(v.plugin, "validator")) for v in policy.validations]
    mutations = [(m, build(m.condition, "bool"),
                  [(op, build(op.value_expression)) for op in m.json_patch or ()], bind(m.plugin, "mutator"))
                 for m in policy.mutations]
    errors.extend(_undeclared_variables(policy))
    errors.extend(_undeclared_context(policy))
    if errors:
        raise PolicyCompileError(policy.name, errors)

    # No errors: every build() above returned a program.
    bound = [p for *_, p in validations if p is not None] + [p for *_, p in mutations if p is not None]
    gated_off = tuple(
        f"{p.path}: plugin {p.name!r} is switched off by feature gate "
        f"{'PythonPlugins' if not gates.enabled('PythonPlugins') else p.gate}=false; this rule is skipped"
        for p in bound if not p.enabled)
    compiled = CompiledPolicy(
        gated_off=gated_off,
        validation_batch=None if any(p for *_, p in validations) else _validation_batch(policy),
        reads_managed_fields=any("managedFields" in e.source for e in policy.expressions()),
        reads_authorizer=any("authorizer" in e.source for e in policy.expressions()),
        policy=policy,
        conditions=tuple((name, _ok(c)) for name, c in conditions),
        variables={name: _ok(v) for name, v in variables.items()},
        validations=tuple(CompiledValidation(spec, check if plugin else _ok(check), message, plugin)
                          for spec, check, message, plugin in validations),
        mutations=tuple(
            CompiledMutation(spec, condition, tuple(CompiledPatchOperation(op, value) for op, value in ops), plugin)
            for spec, condition, ops, plugin in mutations
        ),
    )
    _release_cold_programs(compiled)
    return _with_pod_controllers(compiled)


def load_policy(body: Mapping[str, Any], default_failure_policy: api.FailurePolicy,
                tenant_plugins: Collection[str] = ()) -> CompiledPolicy:
    """A policy object (``body``) → compiled policy, or PolicyCompileError / api.PolicyError with every
    problem: what the operator, the webhook that checks policies, the CLI and the conversions all
    load a policy with. A NamespacedAdmissionPolicy may call only the plugins the cluster admin
    allows (``tenant_plugins``: the operator's setting AP_TENANT_PLUGINS)."""
    compiled = compile_policy(api.parse_policy(body, default_failure_policy=default_failure_policy))
    if compiled.policy.namespace is not None:
        for bound in compiled.plugins():
            if bound.name not in tenant_plugins:
                allowed = ", ".join(tenant_plugins) or "none"
                raise api.PolicyError(bound.path, f"plugin {bound.name!r} is not allowed in a {api.NAMESPACED_KIND} "
                                                  f"(the cluster admin allows: {allowed}; setting AP_TENANT_PLUGINS)")
    return compiled


def _with_pod_controllers(compiled: CompiledPolicy) -> CompiledPolicy:
    """The policy with the policies that apply it to the Pod templates of workloads (see
    ``podcontrollers``): everything of it that can hold for a template, rewritten once, here."""
    policy = compiled.policy
    if not podcontrollers.pod_rules(policy):
        return compiled
    chosen = [c for c in podcontrollers.CONTROLLERS
              if policy.pod_controllers is None or c.kind in policy.pod_controllers]
    wanted = [c for c in chosen if not podcontrollers.already_matched(policy, c)]
    if not wanted:
        reason = ("spec.podControllers is empty" if not chosen else
               "spec.match.resources already names every workload kind chosen; they are judged as written")
        return dataclasses.replace(compiled, coverage=podcontrollers.Coverage((), reason=reason))

    not_applied: list[podcontrollers.NotApplied] = []
    why: str | None
    for _, condition in compiled.conditions:
        why = podcontrollers.pod_only_read(condition)
        if why:
            return dataclasses.replace(compiled, coverage=podcontrollers.Coverage(
                (), (podcontrollers.NotApplied(condition.path, why),),
                "a match condition cannot hold for a Pod template, so no part of the policy applies to one"))
    blocked: dict[str, str] = {}   # variable → why it cannot hold for a template
    for name, variable in compiled.variables.items():
        why = _blocked(variable, blocked)
        if why:
            blocked[name] = why

    validations = []
    for validation in compiled.validations:
        why = next((w for e in (validation.check, validation.message) if e and (w := _blocked(e, blocked))), None)
        if why:
            not_applied.append(podcontrollers.NotApplied(validation.path, why))
        else:
            validations.append(validation)
    mutations: list[tuple[CompiledMutation, str]] = []   # kept, with the path to report if a rewrite fails
    for mutation in compiled.mutations:
        expressions = [mutation.condition, *(op.value for op in mutation.operations)]
        why = next((w for e in expressions if e and (w := _blocked(e, blocked))), None)
        why = why or _unplaceable(mutation)
        if why:
            not_applied.append(podcontrollers.NotApplied(mutation.spec.path, why))
        else:
            mutations.append((mutation, mutation.spec.path))
    if not validations and not mutations:
        return dataclasses.replace(compiled, coverage=podcontrollers.Coverage(
            (), tuple(not_applied), "no validation or mutation can hold for a Pod template"))

    specs = [v.spec for v in validations]
    batch = compiled.validation_batch if len(validations) == len(compiled.validations) else None
    derived = []
    for location in dict.fromkeys(c.location for c in wanted):
        here = [c for c in wanted if c.location == location]
        rewritten = tuple(_rewritten(mutation, location) for mutation, _ in mutations)
        spec = dataclasses.replace(
            policy, validations=tuple(specs), mutations=tuple(m.spec for m in rewritten),
            match=dataclasses.replace(policy.match, resources=podcontrollers.controller_rules(policy, here)))
        derived.append(dataclasses.replace(
            compiled, policy=spec, validations=tuple(validations), mutations=rewritten,
            validation_batch=batch if batch is not None or not specs else _validation_batch(spec),
            costs={}, derived=(), coverage=None, template=location))
    coverage = podcontrollers.Coverage(tuple(c.kind for c in wanted), tuple(not_applied))
    return dataclasses.replace(compiled, derived=tuple(derived), coverage=coverage)


def _blocked(expression: CompiledExpression, blocked: dict[str, str]) -> str | None:
    """Why an expression cannot hold for a Pod template: it reads what only a Pod has, or a
    variable that does."""
    why = podcontrollers.pod_only_read(expression)
    if why:
        return why
    reads = blocked if expression.variables is None else [n for n in blocked if n in expression.variables]
    for name in reads:
        return f"reads variables.{name}, which {blocked[name]}"
    return None


def _unplaceable(mutation: CompiledMutation) -> str | None:
    """Why a mutation has no place in a template (it writes the Pod's name, status...), or None."""
    spec = mutation.spec
    if spec.plugin is not None:
        return "a mutation plugin changes whole objects; it is not applied to Pod templates"
    if spec.merge is not None:
        if podcontrollers.rewrite_merge(spec.merge, podcontrollers.POD_TEMPLATE) is None:
            return ("its merge patch sets more than metadata (labels, annotations) and spec, "
                    "which is all a Pod template has")
        return None
    for op in spec.json_patch or ():
        for pointer in (op.path, op.from_):
            if pointer is not None and podcontrollers.rewrite_pointer(pointer, podcontrollers.POD_TEMPLATE) is None:
                return (f"it writes {pointer}, which has no place in a Pod template (only /spec and "
                        "/metadata fields other than the name, namespace and server-set ones)")
    return None


def _rewritten(mutation: CompiledMutation, location: podcontrollers.Location) -> CompiledMutation:
    """The mutation writing into the template at ``location`` (checked by _unplaceable)."""
    spec = mutation.spec
    if spec.merge is not None:
        return dataclasses.replace(mutation, spec=dataclasses.replace(
            spec, merge=podcontrollers.rewrite_merge(spec.merge, location)))
    operations = tuple(CompiledPatchOperation(dataclasses.replace(
        op.spec, path=podcontrollers.rewrite_pointer(op.spec.path, location) or op.spec.path,
        from_=None if op.spec.from_ is None else podcontrollers.rewrite_pointer(op.spec.from_, location)),
        op.value) for op in mutation.operations)
    return dataclasses.replace(mutation, spec=dataclasses.replace(
        spec, json_patch=tuple(op.spec for op in operations)), operations=operations)


def context_caps(policy: api.AdmissionPolicy) -> dict[str, int]:
    """Each context entry's maxObjects, by name: how long ``context.<name>`` is at most, for the
    cost estimates."""
    return {entry.name: entry.max_objects for entry in policy.context}


def _estimate_all(policy: CompiledPolicy, sizes: estimation.Sizes) -> float:
    results: dict[str, estimation.Value] = {}
    caps = context_caps(policy.policy)
    total = 0.0
    for name, variable in policy.variables.items():
        cost, results[name] = variable.estimate(sizes, results, caps)
        total += cost
    variables = set(policy.variables.values())
    return total + sum(expression.estimate(sizes, results, caps)[0]
                       for expression in policy.expressions() if expression not in variables)


def _power_of_two(value: float) -> int:
    """The least power of two at or above ``value`` (at least 1)."""
    return 1 << (max(math.ceil(value), 1) - 1).bit_length()


def _release_cold_programs(policy: CompiledPolicy) -> None:
    """Let go of the programs a request runs only after a failure or an error: messages, and what
    the validation batch covers (mutations read conditions and variables one program at a time)."""
    cold = [validation.message for validation in policy.validations if validation.message is not None]
    if policy.validation_batch is not None:
        cold += [validation.check for validation in policy.validations if validation.check is not None]
        if not policy.mutations:
            cold += [condition for _, condition in policy.conditions] + list(policy.variables.values())
    for expression in cold:
        expression.release()


def _missing_plugin(plugins: plugin_api.Registry, name: str) -> str:
    """Why no plugin ``name`` can be bound: none is installed, or its entry point failed to load."""
    broken = next((entry for entry in plugins.broken if entry.name == name), None)
    if broken is not None:
        return f"plugin {name!r} is installed (by {broken.source}) but failed to load: {broken.error}"
    installed = ", ".join(sorted(plugins.plugins)) or "none"
    return f"no plugin named {name!r} is installed (installed: {installed})"


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


_CONTEXT_REFERENCE = re.compile(r"\bcontext\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_PARAMS_REFERENCE = re.compile(r"\bparams\b")
_REBOUND = re.compile(r"\(\s*(context|params)\s*,")
_STRING_LITERAL = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\"""")


def _undeclared_context(policy: api.AdmissionPolicy) -> list[CelCompileError]:
    """``context.x`` must name an entry of spec.context; ``params`` needs spec.paramKind."""
    declared = {entry.name for entry in policy.context}
    errors = []
    for expression in policy.expressions():
        source = _STRING_LITERAL.sub("''", expression.source)   # 'no params here' names nothing
        # A policy may name its own loop or cel.bind variable `context` (older ones do): then
        # `context.x` is that variable's field, and nothing is checked here.
        rebound = set(_REBOUND.findall(source))
        for name in sorted(set(_CONTEXT_REFERENCE.findall(source)) - declared if policy.context
                           and "context" not in rebound else ()):
            known = ", ".join(sorted(declared)) or "none"
            errors.append(CelCompileError(expression.path, f"context.{name} is not declared in spec.context "
                                                           f"(declared: {known})"))
        if policy.param_kind is None and "params" not in rebound and _PARAMS_REFERENCE.search(source):
            errors.append(CelCompileError(expression.path, "reads params, but the policy sets no spec.paramKind "
                                                           "and spec.paramRef"))
    return errors


def _validation_batch(policy: api.AdmissionPolicy) -> CompiledExpression | None:
    """The match conditions and every validation as one program: ``false`` when a condition does
    not hold, else one item per validation: a boolean, or for a validation with a
    messageExpression, ``[]`` when it holds and ``[message]`` when it fails (the message computed
    only then, within the same program). The variables they read are bound inside it once each
    (``cel.bind``, in declaration order), and every expression sees the ones it reads as its
    ``variables`` map, typed ``dyn`` as when evaluated alone.

    A variable computed by its own program comes back as a Python value, which every program that
    reads it converts for CEL again; inside one program it is computed and converted once.
    The engine falls back to one program per expression (exact error paths, lazy variables)
    when this one errs, and so does a policy whose batch does not type-check (None here).
    """
    if not policy.validations:
        return None
    if any(v.expression is None for v in policy.validations):
        return None   # plugins run one at a time, in order
    pairs = [(v.expression.source, v.message_expression.source if v.message_expression is not None else None)
             for v in policy.validations if v.expression is not None]
    needed: set[str] = set()
    for source in [check for check, _ in pairs] + [message for _, message in pairs if message is not None]:
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

    def item(check: str, message: str | None) -> str:
        return scoped(check) if message is None else f"dyn({scoped(check)} ? [] : [{scoped(message)}])"

    def program(items: list[str]) -> str:
        body = "[" + ", ".join(items) + "]"
        for variable in reversed([v for v in policy.variables if v.name in needed]):
            body = f"cel.bind({_BOUND_PREFIX}{variable.name}, dyn({scoped(variable.expression.source)}), {body})"
        if policy.match.conditions:
            conditions = " && ".join(f"({c.expression.source}\n)" for c in policy.match.conditions)
            body = f"({conditions}) ? dyn({body}) : false"
        return body

    # With the messages, unless that nests deeper than CEL's parser goes: then without them
    # (a failure's message is then a program of its own).
    for items in ([item(check, message) for check, message in pairs], [scoped(check) for check, _ in pairs]):
        try:   # its parts are within their budgets; the whole is their sum
            batch = compile_expression(api.Expression(program(items), "spec.validations"), limit=math.inf)
        except CelCompileError:
            continue
        return dataclasses.replace(batch, variables=frozenset())   # it binds its own variables
    return None


# Names the batch binds variables to; a policy's own expressions cannot use them (they would not
# compile on their own, which every expression must first).
_BOUND_PREFIX = "policy_variable__"


def _ok(compiled: CompiledExpression | None) -> CompiledExpression:
    assert compiled is not None
    return compiled
