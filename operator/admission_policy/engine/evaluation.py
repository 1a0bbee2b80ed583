"""compiled policies + request → Decision. Pure and synchronous: no I/O, no Kopf, no clients.

The API server calls mutating webhooks first and validating ones on the final object, so
``Phase.ALL`` (the CLI) runs every mutation of every matching policy, in name order, and then
every validation; the webhook handlers run one phase each.

Before a policy runs, the request must fit it: objects CEL can read (``MAX_DEPTH``), and the
caller's deadline not passed (also checked before each expression); otherwise the policy's
failurePolicy decides, with a message that says which limit it was. Its size never refuses a
request: a policy whose estimated cost on it is over ``POLICY_BUDGET`` (``celcost``) runs apart,
in a child process bounded in memory and by the deadline (``celfork``), and is judged for real.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
import marshal
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeVar

from .. import celcost, celfork
from ..api import REASON_CODES, LabelSelector, non_finite
from ..authorization import Authorization, Check, answering
from ..cel import POLICY_BUDGET, CelEvaluationError, CompiledExpression, new_activation
from ..cellib import authz
from ..errors import AdmissionPolicyError
from . import plugincalls
from .compiler import BoundPlugin, CompiledMutation, CompiledPatchOperation, CompiledPolicy, CompiledValidation
from .exceptions import CompiledException, ExceptionSet, Exemption, exemption
from .inputs import Inputs, InputsError, NoInputs, context_lists, describe, labels_of, select_params
from .patching import PatchError, apply_operation, clone, diff, json_equal, merge
from .podcontrollers import BY_RESOURCE, pod_view, template_of
from .policyset import PolicySet
from .request import AdmissionRequest

# CEL converts a bound object recursively in C++ on first read: at ~5,000-10,000 levels that
# overflows the thread's stack (8 MB) and kills the process. The API server accepts custom
# resources up to 10,000 levels deep, so deeper than this a policy cannot read the object.
MAX_DEPTH: Final = 2_000
# How long an expression run apart (``celfork``) may take when the caller set no deadline (the CLI).
UNBOUNDED_SECONDS: Final = 60.0

_Answer = TypeVar("_Answer")


class Phase(enum.Enum):
    """Which webhook is asking: the API server calls the mutating one and, later, the validating
    one on the final object; ALL runs both in that order, for the CLI."""
    MUTATE = "mutate"
    VALIDATE = "validate"
    ALL = "all"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One failed validation, for reports that say which rule failed: ``rule`` is the
    validation's path (``spec.validations[2]``); ``error`` when it could not be evaluated
    (failurePolicy Fail) rather than evaluated false."""
    rule: str
    message: str
    error: bool = False


@dataclasses.dataclass(frozen=True)
class PolicyOutcome:
    """What one matching policy did to the request: for reports, metrics and events."""
    policy: str
    enforcement: str
    findings: tuple[Finding, ...] = ()   # failed validations (and errors under failurePolicy Fail)
    errors: tuple[str, ...] = ()      # evaluation errors, whatever the failure policy
    mutated: bool = False
    denied: bool = False              # this policy denies the request
    template_of: str = ""             # a Pod policy on a workload: 'Deployment "web"', whose Pod template it judged
    exempted: tuple[Exemption, ...] = ()   # its verdicts an exception waived (``findings`` no longer holds them)

    @property
    def failures(self) -> tuple[str, ...]:
        """The failed validations' messages."""
        return tuple(finding.message for finding in self.findings)

    @property
    def result(self) -> str:
        """One word for metrics and reports: denied, warned, audited, mutated or allowed."""
        if self.denied:
            return "denied"
        if self.failures:
            return {"Warn": "warned", "Audit": "audited"}.get(self.enforcement, "denied")
        return "mutated" if self.mutated else "allowed"


@dataclasses.dataclass(frozen=True)
class PluginCall:
    """One plugin call, for the per-plugin metrics: passed, failed, error, mutated or unchanged."""
    plugin: str
    result: str
    seconds: float


class PluginCallError(AdmissionPolicyError):
    """A plugin that raised, overran its time budget or returned something else than documented."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclasses.dataclass(frozen=True)
class Decision:
    """The answer to one request, and what callers report about it. The webhook sends the
    answer fields (``response.build_response``); ``outcomes`` and ``plugin_calls`` are for
    metrics, audit reports and the CLI, and ``patched_object`` (the object as the mutations left
    it) for the CLI, which shows it and validates it. With ``unanswered`` it is no answer yet
    (see ``evaluate``)."""
    allowed: bool
    code: int = 200
    reason: str = ""
    message: str = ""
    warnings: tuple[str, ...] = ()
    audit_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    patch: tuple[Mapping[str, Any], ...] = ()
    patched_object: Any = None
    outcomes: tuple[PolicyOutcome, ...] = ()
    evaluations: int = 0              # CEL programs run for this request
    plugin_calls: tuple[PluginCall, ...] = ()
    unanswered: tuple[Check, ...] = ()   # not a decision: these authorizer checks need answers (evaluate)
    forks: bool = False   # not a decision: a policy must run in a child process, and may_fork was False
    exempted: tuple[Exemption, ...] = ()   # what exceptions waived (``engine.exceptions``)


def evaluate(
    policies: PolicySet,
    request: AdmissionRequest,
    namespace_object: Mapping[str, Any] | None = None,
    phase: Phase = Phase.ALL,
    *,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    inputs: Inputs | None = None,
    namespace_error: str = "",
    authorization: Authorization | None = None,
    exceptions: ExceptionSet | None = None,
    now: float | None = None,
    may_fork: bool = True,
) -> Decision:
    """Decide one admission request. Never raises for anything a request or policy contains.

    ``namespace_error``: why the request's namespace could not be read (``namespace_object`` is
    None then); a policy with a namespaceSelector gets its failurePolicy answer, never a pass.

    ``inputs``: where the policies' params and ``context`` lists come from (``engine.inputs``);
    a policy that reads them gets its failurePolicy answer when they are not supplied or not in sync.

    ``deadline``: a time on ``clock`` after which no more CEL runs (checked before each policy and
    each expression): the policy at hand, and every one after it, gets its failurePolicy answer.
    The webhook passes one below the API server's timeout, so a slow request still gets an
    answer in time and stops taking the event loop from the others.

    ``authorization``: the answers to the policies' authorizer checks (``authorization``). When
    a check has none yet, the result is no decision: ``unanswered`` lists the checks (and it
    denies, for a caller that does not look); answer them and evaluate again. None: every check
    is an evaluation error, as where Kubernetes binds no authorizer.

    ``exceptions``: the AdmissionPolicyExceptions to apply (``engine.exceptions``); a policy's
    failures and mutations that one in force covers are waived, and ``exempted`` says by which.
    ``now``: seconds since the epoch that expiry is judged at (the real time by default).

    ``may_fork``: whether a policy too costly on this request to run here may run in a child
    process (``celfork``), which this thread then waits for. The event loop must not wait, so the
    webhook passes False: the result is then no decision but ``forks``, as soon as a policy needs
    a child, and the webhook evaluates again with True on a thread of its own.
    """
    try:
        candidates = policies.candidates(request)
        if not candidates:
            return Decision(allowed=True, patched_object=request.object)
        run = _Run(request, namespace_object, deadline, clock, inputs, namespace_error)
        run.may_fork = may_fork
        if exceptions:   # none: nothing below costs a thing
            run.exceptions, run.now = exceptions, time.time() if now is None else now
        with answering(authorization) as asking:
            if phase in (Phase.MUTATE, Phase.ALL):
                run.mutate_all([policy for policy in candidates if policy.mutations])
            if phase in (Phase.VALIDATE, Phase.ALL):
                for policy in candidates:
                    if policy.validations:
                        run.guarded(policy, run.validate)
        unanswered = asking.unanswered(text for _, record in run.records.values() for text in record.texts())
        if unanswered:
            return Decision(allowed=False, code=500, reason="InternalError", patched_object=request.object,
                            message="authorizer checks without an answer: "
                                    + "; ".join(check.describe() for check in unanswered),
                            unanswered=unanswered)
        return run.decision()
    except _Forks:
        return Decision(allowed=False, code=500, reason="InternalError", patched_object=request.object, forks=True,
                        message="a policy must be evaluated in a child process, which this caller does not allow")
    except Exception as exc:   # a defect of ours; still an answer, never a 500
        return Decision(allowed=False, code=500, reason="InternalError",
                        message=f"the admission policy engine failed: {type(exc).__name__}: {exc}",
                        patched_object=request.object)


class _Abort(Exception):
    """Stop evaluating a policy (deadline, cost budget, unreadable object): its failurePolicy decides."""


class _Forks(Exception):
    """Stop evaluating the request: a policy must run in a child process, and the caller may not
    wait for one (``may_fork``)."""


@dataclasses.dataclass
class _Record:
    findings: list[Finding] = dataclasses.field(default_factory=list)
    # Evaluation errors, each with the rule whose verdict it is (``spec.validations[2]``; "" when
    # it is the whole policy's: a match condition, a mutation, a limit), so that an exception
    # waives a rule's errors by the rule, whatever field the error names (a variable it read).
    errors: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    mutated: bool = False
    fatal: bool = False    # an error under failurePolicy Fail outside validations: deny
    reason: str = ""

    def failed(self, path: str, message: str, error: bool = False) -> None:
        self.findings.append(Finding(_rule(path), message, error))

    def texts(self) -> tuple[str, ...]:
        return tuple(text for _, text in self.errors)


class _Run:
    """The state of one request's evaluation across policies."""

    def __init__(self, request: AdmissionRequest, namespace_object: Mapping[str, Any] | None,
                 deadline: float | None = None, clock: Callable[[], float] = time.monotonic,
                 inputs: Inputs | None = None, namespace_error: str = "") -> None:
        self.request = request
        self.namespace_error = namespace_error
        self.inputs: Inputs = inputs if inputs is not None else NoInputs()
        # The policy at hand's params object (one evaluation per param) and context lists.
        self.param: Mapping[str, Any] | None = None
        self.context: Mapping[str, Any] = {}
        self.namespace_object = namespace_object
        self.object: Any = request.object
        self.records: dict[str, tuple[CompiledPolicy, _Record]] = {}
        self.evaluations = 0
        # Shared by every policy while the object stays the same, keyed by reads_managed_fields,
        # the Pod template read as the object (podcontrollers) and reads_authorizer: an activation converts each value
        # for CEL once, on first read, and a Pod is ~40 µs.
        self.activations: dict[tuple[bool, tuple[str, ...], bool], Any] = {}
        self.deadline, self.clock = deadline, clock
        self.started = clock() if deadline is not None else 0.0
        self._bounds: dict[bool, celcost.Sizes | str] = {}   # see sizes()
        self._templates_changed: dict[tuple[str, ...], tuple[Any, bool]] = {}   # see _template_changed()
        self.plugin_calls: list[PluginCall] = []
        self.may_fork = True   # see evaluate()
        # AdmissionPolicyExceptions (see evaluate): which cover each policy, on which object.
        self.exceptions: ExceptionSet | None = None
        self.now = 0.0
        self.exempted: dict[Exemption, None] = {}
        self._covering: dict[tuple[str, tuple[str, ...]], tuple[Any, list[tuple[CompiledException,
                                                                              frozenset[str] | None]]]] = {}

    def guarded(self, policy: CompiledPolicy, action: Callable[[CompiledPolicy], None]) -> None:
        """Run one policy's phase; whatever stops it is an evaluation error of that policy."""
        try:
            spec = policy.policy
            if spec.param_kind is None and not spec.context:
                action(policy)
            elif (self.object is not None or action != self.mutate) and self.selected(policy):
                self._with_inputs(policy, action)
        except (_Abort, InputsError) as stop:
            self.abort(policy, str(stop))
        except _Forks:
            raise
        except Exception as exc:   # never escapes evaluate(): the policy's failurePolicy decides
            self.abort(policy, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            if self.param is not None or self.context:
                self.param, self.context = None, {}
                self.activations.clear()
                self._bounds.clear()

    def _with_inputs(self, policy: CompiledPolicy, action: Callable[[CompiledPolicy], None]) -> None:
        """Run a policy that reads params or context: once per param found, as a
        ValidatingAdmissionPolicy does; not at all when none is and paramRef says Allow."""
        spec = policy.policy
        self.context = context_lists(spec, self.request, self.inputs) if spec.context else {}
        params: list[Mapping[str, Any]] | list[None] = [None]
        if spec.param_kind is not None:
            params = select_params(spec, self.request, self.inputs) or []
        for param in params:
            self.param = param
            self.activations.clear()
            self._bounds.clear()
            action(policy)

    def mutate_all(self, policies: list[CompiledPolicy]) -> None:
        """Each policy's mutations in name order; then, once, those of the policies with
        ``reinvocationPolicy: IfNeeded`` before the last policy that changed the object, as the
        API server reinvokes such a webhook once when a later one changed the object: an earlier
        policy sees what a later one added (a sidecar injected after the default resources were
        set gets them too). Mutations are idempotent, so the second pass changes only what the
        first could not see. With ``Never`` (the default, as Kubernetes'), a policy runs once:
        the second pass costs nothing unless a policy asks for it.

        Tenant policies (NamespacedAdmissionPolicy) go first, and when one changed the object in
        the second pass the cluster policies' mutations run once more: what a cluster policy sets
        is what the object gets, whatever the policies' names."""
        if any(policy.policy.namespace is not None for policy in policies):
            policies = sorted(policies, key=lambda policy: policy.policy.namespace is None)   # stable
        last = -1
        for index, policy in enumerate(policies):
            before = self.object
            self.guarded(policy, self.mutate)
            if self.object is not before:
                last = index
        tenant_changed = False
        for policy in policies[:last]:
            if policy.policy.reinvocation_policy != "IfNeeded":
                continue
            before = self.object
            self._mutate_again(policy)
            tenant_changed |= self.object is not before and policy.policy.namespace is not None
        if tenant_changed:
            for policy in policies:
                if policy.policy.namespace is None:
                    self._mutate_again(policy)

    def _mutate_again(self, policy: CompiledPolicy) -> None:
        found = self.records.get(policy.name)
        if found is None or not found[1].errors:   # an error is said once, from the first pass
            self.guarded(policy, self.mutate)

    def abort(self, policy: CompiledPolicy, message: str) -> None:
        record = self.record(policy)
        record.errors.append(("", message + self._with_param()))
        if policy.policy.failure_policy == "Fail":
            record.fatal = True

    def time_left(self) -> float:
        """Seconds before the deadline; without one, what the webhook gives a request by default."""
        return self.deadline - self.clock() if self.deadline is not None else UNBOUNDED_SECONDS

    def check_deadline(self, before: str) -> None:
        if self.deadline is not None and self.clock() > self.deadline:
            raise _Abort(f"evaluation deadline exceeded before {before} ({self.clock() - self.started:.2f} s "
                         "spent on this request; answering now, within the webhook timeout)")

    def admit(self, policy: CompiledPolicy) -> bool:
        """Whether this policy runs apart on this request (``celfork``): when its estimated cost
        here is over POLICY_BUDGET. Never a refusal: the estimate is an upper bound, often far
        above what the evaluation really costs, and a legal object must be judged. _Abort only
        past the deadline or for an object CEL cannot read (see the module doc)."""
        self.check_deadline("the policy ran")
        upper = self.sizes(exact=False)
        if isinstance(upper, str):
            raise _Abort(upper)
        if policy.cost(upper) <= POLICY_BUDGET:
            return False
        exact = self.sizes(exact=True)
        assert not isinstance(exact, str)
        if policy.cost(exact) <= POLICY_BUDGET or not celfork.AVAILABLE:
            return False
        if not self.may_fork:
            raise _Forks()
        return True

    def sizes(self, exact: bool) -> celcost.Sizes | str:
        """Bounds of what the policies read: the largest bound object's size and, with ``exact``,
        the most items in one of its lists or maps (else the size bounds both); or why CEL cannot
        read them. ``marshal`` (C, ~3 µs/kB) bounds the size and the depth; the exact walk is
        Python, for the requests that need it (large ones, on costly policies)."""
        if exact not in self._bounds:
            bodies = (self.object, self.request.old_object, self.namespace_object, self.request.raw, self.param)
            self._bounds[exact] = _measure(bodies, exact)
        return self._bounds[exact]

    def record(self, policy: CompiledPolicy) -> _Record:
        if policy.name not in self.records:
            self.records[policy.name] = (policy, _Record())
        return self.records[policy.name][1]

    def fail(self, policy: CompiledPolicy, error: CelEvaluationError | PatchError | PluginCallError,
             path: str = "", rule: str = "") -> bool:
        """Record an evaluation error (of ``rule``, else of the whole policy); True when the failure
        policy says to stop (Fail)."""
        text = (f"{path}: {error}" if path else str(error)) + self._with_param()
        record = self.record(policy)
        record.errors.append((rule, text))
        return policy.policy.failure_policy == "Fail"

    def _with_param(self) -> str:
        """Which param an error happened with, for its message."""
        return f" (with param {describe(self.param)})" if self.param is not None else ""

    def selected(self, policy: CompiledPolicy) -> bool:
        """The checks that need no CEL: a tenant policy's own namespace, excluded namespaces and
        label selectors; and, for a Pod policy on a workload, that the Pod template is new or
        changed (see ``_template_changed``)."""
        match = policy.policy.match
        namespace = self.request.namespace
        if policy.policy.namespace is not None and (namespace != policy.policy.namespace or _is_namespace(
                self.request)):   # a Namespace's request carries its own name as namespace
            return False
        if namespace and namespace in match.exclude_namespaces:
            return False
        if policy.template and not self._template_changed(policy.template):
            return False
        if not match.namespace_selector.is_empty and not self._namespace_matches(match.namespace_selector):
            return False
        return match.object_selector.is_empty or any(
            match.object_selector.matches(labels) for labels in self._labels(policy.template))

    def _template_changed(self, location: tuple[str, ...]) -> bool:
        """An UPDATE of a workload that leaves its Pod template as it was makes no Pod unlike
        those it already has, which were judged (or admitted before the policy existed): scaling,
        relabelling the workload, a controller writing its annotations must keep working."""
        if self.request.operation != "UPDATE" or self.request.old_object is None:
            return True
        # Once per object (a mutation makes a new one), not once per Pod policy.
        cached = self._templates_changed.get(location)
        if cached is None or cached[0] is not self.object:
            changed = not json_equal(template_of(self.object, location), template_of(self.request.old_object, location))
            cached = self._templates_changed[location] = (self.object, changed)
        return cached[1]

    def conditions_hold(self, policy: CompiledPolicy, scope: _Scope) -> bool:
        for _name, condition in policy.conditions:
            try:
                if not scope.evaluate(condition):
                    return False
            except CelEvaluationError as error:
                if self.fail(policy, error):
                    self.record(policy).fatal = True
                return False
        return True

    def mutate(self, policy: CompiledPolicy) -> None:
        if self.object is None:
            return  # DELETE: nothing to mutate, and the API server ignores patches there
        if not self.selected(policy):
            return
        scope = _Scope(self, policy, apart=self.admit(policy))
        if not self.conditions_hold(policy, scope):
            return
        record = self.record(policy)
        for mutation in policy.mutations:
            try:
                changed = self._apply(mutation, scope, policy)
            except (CelEvaluationError, PatchError, PluginCallError) as error:
                if self.exceptions is not None and self.waived(policy, mutation.spec.name):
                    continue
                path = mutation.spec.path if isinstance(error, PatchError) else ""
                if self.fail(policy, error, path):
                    record.fatal = True
                    return
                continue
            if changed is not None and self.exceptions is not None and self.waived(policy, mutation.spec.name):
                continue
            if changed is not None:
                self.object = changed
                self.activations.clear()
                self._bounds.clear()
                record.mutated = True
                scope = _Scope(self, policy, apart=scope.apart)

    def _apply(self, mutation: CompiledMutation, scope: _Scope, policy: CompiledPolicy) -> Any:
        """The object after this mutation, or None when it does not apply or changes nothing."""
        if mutation.plugin is not None and not mutation.plugin.enabled:
            return None
        if mutation.condition is not None and not scope.evaluate(mutation.condition):
            return None
        result = self.object
        if mutation.plugin is not None:
            result = self._plugin_mutation(mutation.plugin, policy)
        elif mutation.spec.merge is not None:
            if_absent = mutation.spec.merge_mode == "IfAbsent"
            result = merge(result, clone(mutation.spec.merge), if_absent=if_absent)
        else:
            # Values are computed against the object as it was before this mutation.
            operations = [self._operation(op, scope) for op in mutation.operations]
            for operation in operations:
                result = apply_operation(result, operation)
        return None if json_equal(result, self.object) else result

    @staticmethod
    def _operation(compiled: CompiledPatchOperation, scope: _Scope) -> dict[str, Any]:
        """The RFC 6902 operation, its value computed now when it is an expression."""
        spec = compiled.spec
        operation: dict[str, Any] = {"op": spec.op, "path": spec.path}
        if spec.from_ is not None:
            operation["from"] = spec.from_
        if spec.has_value:
            # A copy of the policy's own value: the patched object must not share it (apply_operation).
            if compiled.value is None:
                operation["value"] = clone(spec.value)
            else:
                value = operation["value"] = scope.evaluate(compiled.value)
                if non_finite(value):
                    raise CelEvaluationError(compiled.value.path, f"evaluated to {non_finite(value)}, which is "
                                                                  "not a JSON number and cannot go into a patch")
        return operation

    def _call(self, bound: BoundPlugin, policy: CompiledPolicy, answer: Callable[..., _Answer],
              word: Callable[[_Answer], str]) -> _Answer:
        """``answer`` (``plugincalls.validate`` or ``mutate``: the plugin's checked answer) from a
        worker thread, on copies of the inputs: raising, answering other than documented, or not
        within the plugin's budget or the request's deadline, is a PluginCallError. The call is
        recorded with ``word(answer)`` (its result in the metrics), or "error"."""
        self.check_deadline(bound.path)
        plugin = bound.plugin
        bindings = self.bindings(policy)
        # A mutator changes the object itself (never a Pod template: compiler); a validator judges what CEL does.
        obj = self.object if plugin.kind == "mutator" else bindings["object"]
        request = plugincalls.IsolatedRequest(obj, bindings["oldObject"], self.request.raw, bindings["namespaceObject"],
                                              params=self.param, context=self.context)
        timeout, limit = plugin.time_budget, f"its budget of {plugin.time_budget * 1000:g} ms per call"
        left = self.deadline - self.clock() if self.deadline is not None else timeout
        if left < timeout:
            timeout, limit = left, "the request's evaluation deadline"
        started = time.perf_counter()
        try:
            call = functools.partial(answer, plugin, bound.config, request)
            result: _Answer = plugincalls.WORKERS.call(plugin.name, call, timeout, limit)
        except plugincalls.PluginFault as fault:
            self.plugin_calls.append(PluginCall(plugin.name, "error", time.perf_counter() - started))
            raise PluginCallError(bound.path, str(fault)) from None
        self.plugin_calls.append(PluginCall(plugin.name, word(result), time.perf_counter() - started))
        return result

    def _plugin_mutation(self, bound: BoundPlugin, policy: CompiledPolicy) -> Any:
        answer = self._call(bound, policy, plugincalls.mutate,
                            lambda found: "unchanged" if found is None else "mutated")
        if answer is None:
            return self.object
        if isinstance(answer, dict):
            return answer
        changed = self.object
        for operation in answer:   # JSON data the plugin no longer holds (plugincalls.mutate)
            changed = apply_operation(changed, operation)
        return changed

    def _plugin_validation(self, policy: CompiledPolicy, validation: CompiledValidation) -> None:
        bound = validation.plugin
        assert bound is not None
        if not bound.enabled:
            return
        record = self.record(policy)
        try:
            failures = self._call(bound, policy, plugincalls.validate, lambda found: "failed" if found else "passed")
        except PluginCallError as error:
            if self.fail(policy, error, rule=_rule(bound.path)):
                record.failed(bound.path, str(error), error=True)
                record.reason = record.reason or "Forbidden"
            return
        if failures:
            record.reason = record.reason or validation.spec.reason
            for failure in failures:
                record.failed(bound.path, failure)

    def validate(self, policy: CompiledPolicy) -> None:
        if not self.selected(policy):
            return
        scope = _Scope(self, policy, apart=self.admit(policy))
        if policy.validation_batch is not None:
            try:
                results = scope.evaluate(policy.validation_batch)
            except CelEvaluationError:
                results = None   # find out which expression erred, one program at a time
            if results is False:
                return           # a match condition does not hold
            if isinstance(results, list) and len(results) == len(policy.validations) and all(
                    isinstance(result, (bool, list)) for result in results):
                self.record(policy)
                for validation, result in zip(policy.validations, results, strict=True):
                    if result is False:   # with a messageExpression only when the batch could not hold it
                        self._failed(policy, validation, scope)
                    elif isinstance(result, list) and result:   # [messageExpression's result]
                        self._record_failure(policy, validation, result[0])
                return
        if not self.conditions_hold(policy, scope):
            return
        record = self.record(policy)
        for validation in policy.validations:
            if validation.check is None:
                self._plugin_validation(policy, validation)
                continue
            try:
                if scope.evaluate(validation.check):
                    continue
            except CelEvaluationError as error:
                if self.fail(policy, error, rule=_rule(validation.path)):
                    record.failed(validation.path, f"{error.path}: {error.message}{self._with_param()}", error=True)
                    record.reason = record.reason or "Forbidden"
                continue
            self._failed(policy, validation, scope)

    def _failed(self, policy: CompiledPolicy, validation: CompiledValidation, scope: _Scope) -> None:
        """Record a failed validation, with its messageExpression evaluated now."""
        text: Any = None
        if validation.message is not None:
            try:
                text = scope.evaluate(validation.message)
            except CelEvaluationError as error:
                self.record(policy).errors.append((_rule(validation.path), str(error)))
        self._record_failure(policy, validation, text)

    def _record_failure(self, policy: CompiledPolicy, validation: CompiledValidation, text: Any) -> None:
        """A failed validation with its message: ``text`` (its messageExpression's result) when that
        is a string with something in it, else its message, else its source."""
        record = self.record(policy)
        record.reason = record.reason or validation.spec.reason
        if not (isinstance(text, str) and text.strip()):
            source = validation.check.expression.source.strip() if validation.check is not None else validation.path
            text = validation.spec.message or f"failed expression: {source}"
        record.failed(validation.path, text)

    def bindings(self, policy: CompiledPolicy) -> dict[str, Any]:
        """The values a policy's expressions see (``variables`` apart); for a policy derived for
        Pod controllers, the objects are the Pods their templates stand for (``pod_view``)."""
        full = policy.reads_managed_fields
        new, old = self.object, self.request.old_object
        if policy.template:
            new, old = pod_view(new, policy.template), pod_view(old, policy.template)
        return {
            "object": _bound(new, full),
            "oldObject": _bound(old, full),
            "request": self.request.raw,
            "namespaceObject": _bound(self.namespace_object, full),
            "params": self.param,
            "context": self.context,
            **(self.authorizer if policy.reads_authorizer else {}),
        }

    @functools.cached_property
    def authorizer(self) -> dict[str, Any]:
        """``authorizer`` and ``authorizer.requestResource``: the requester, the request's resource
        (made once a request, for the policies that name ``authorizer``: most never do)."""
        return authz.bindings(self.request.raw)

    def activation(self, policy: CompiledPolicy) -> Any:
        """The shared activation, for programs that bind their own variables (or read none)."""
        key = (policy.reads_managed_fields, policy.template, policy.reads_authorizer)
        if key not in self.activations:
            self.activations[key] = new_activation({**self.bindings(policy), "variables": {}})
        return self.activations[key]

    def _labels(self, template: tuple[str, ...] = ()) -> Iterator[Mapping[str, Any]]:
        """The object's labels, old and new; a Pod template's for a Pod policy on a workload
        (the labels its Pods will have)."""
        for body in (self.object, self.request.old_object):
            if isinstance(body, Mapping):
                yield labels_of(template_of(body, template) if template else body)

    def _namespace_matches(self, selector: LabelSelector) -> bool:
        """A cluster-scoped object is not subject to a namespaceSelector; a Namespace is its own."""
        if self.request.group == "" and self.request.resource == "namespaces":
            return any(selector.matches(labels) for labels in self._labels())
        if not self.request.namespace:
            return True
        if self.namespace_error:   # unknown labels are no reason to skip the policy
            raise _Abort(f"spec.match.namespaceSelector cannot be judged: {self.namespace_error}")
        return selector.matches(labels_of(self.namespace_object))

    def waived(self, policy: CompiledPolicy, rule: str) -> bool:
        """Whether an exception in force covers this rule's verdict here; if so, it is recorded."""
        for compiled, rules in self._exceptions_covering(policy):
            if rules is None or rule in rules:
                self.exempted[exemption(compiled, policy.name, rule)] = None
                return True
        return False

    def _exceptions_covering(self, policy: CompiledPolicy) -> list[tuple[CompiledException, frozenset[str] | None]]:
        """The exceptions covering the policy on the object as it is now (a mutation may relabel it),
        their conditions evaluated with the policy's own bindings: a workload's Pod template as a Pod."""
        assert self.exceptions is not None
        key = (policy.name, policy.template)
        cached = self._covering.get(key)
        if cached is not None and cached[0] is self.object:
            return cached[1]
        new, old = self.object, self.request.old_object
        if policy.template:
            new, old = pod_view(new, policy.template), pod_view(old, policy.template)
        found = []
        for compiled, rules in self.exceptions.candidates(policy, self.request, new, old, self.now):
            try:
                self.evaluations += len(compiled.conditions)
                if all(condition.evaluate(self.activation(policy)) is True for _, condition in compiled.conditions):
                    found.append((compiled, rules))
            except CelEvaluationError:   # an exception that cannot be judged does not apply
                continue
        self._covering[key] = (self.object, found)
        return found

    def _waive_findings(self) -> None:
        """Drop the failed validations, and the evaluation errors of the rules, that an exception
        covers: by the rule, whatever field an error names."""
        for policy, record in self.records.values():
            rules = dict.fromkeys([finding.rule for finding in record.findings] + [rule for rule, _ in record.errors])
            if not rules:
                continue
            names = {_rule(v.path): v for v in policy.policy.validations}
            dropped = {rule for rule in rules if rule in names and self.waived(policy, names[rule].name)}
            if not dropped:
                continue
            record.findings = kept = [finding for finding in record.findings if finding.rule not in dropped]
            record.errors = [(rule, text) for rule, text in record.errors if rule not in dropped]
            first = names.get(kept[0].rule) if kept else None
            record.reason = first.reason if first is not None and not kept[0].error else "Forbidden"

    def decision(self) -> Decision:
        if self.exceptions is not None:
            self._waive_findings()
        outcomes: list[PolicyOutcome] = []
        denials: list[str] = []
        warnings: list[str] = []
        audit: dict[str, str] = {}
        reason = ""
        for name, (policy, record) in self.records.items():
            enforcement = policy.policy.enforcement
            failures = tuple(finding.message for finding in record.findings)
            denied = record.fatal or (enforcement == "Enforce" and bool(failures))
            # A Pod policy on a workload says whose Pod template it judged.
            workload = self._workload() if policy.template else ""
            about = f"the Pod template of {workload} would violate the policy: " if workload else ""
            kind = policy.policy.kind
            if record.fatal:
                what = f"the Pod template of {workload}" if workload else "the request"
                denials.append(f'{kind} "{name}" could not evaluate {what}: {record.errors[-1][1]}')
            elif denied:
                denials.append(f'{kind} "{name}" denied the request: {about}{"; ".join(failures)}')
            elif failures and enforcement == "Warn":
                warnings.extend(f'{kind} "{name}": {about}{failure}' for failure in failures)
            elif failures and enforcement == "Audit":
                # The API server prefixes the key with the webhook's name and a "/": one "/" only.
                audit[name.replace("/", ".")[:63]] = json.dumps([about + failure for failure in failures])
            if denied and not reason:
                reason = record.reason or "Forbidden"
            exempted = tuple(e for e in self.exempted if e.policy == name) if self.exempted else ()
            outcomes.append(PolicyOutcome(name, enforcement, tuple(record.findings), record.texts(),
                                          record.mutated, denied, workload, exempted))
        patch: tuple[Mapping[str, Any], ...] = ()
        if self.object is not self.request.object and not denials:
            # Every value a mutation adds is checked to be JSON (no NaN, no Infinity) where it comes from.
            patch = tuple(diff(self.request.object, self.object))
        if denials:
            return Decision(allowed=False, code=REASON_CODES.get(reason, 500), reason=reason,
                            message="\n".join(denials), warnings=tuple(warnings), audit_annotations=audit,
                            patched_object=self.request.object, outcomes=tuple(outcomes),
                            evaluations=self.evaluations, plugin_calls=tuple(self.plugin_calls),
                            exempted=tuple(self.exempted))
        # The person applying sees that only an exception let the request through, and until when.
        if self.exempted:
            warnings.extend(dict.fromkeys(e.warning for e in self.exempted))
        return Decision(allowed=True, warnings=tuple(warnings), audit_annotations=audit, patch=patch,
                        patched_object=self.object, outcomes=tuple(outcomes), evaluations=self.evaluations,
                        plugin_calls=tuple(self.plugin_calls), exempted=tuple(self.exempted))


    def _workload(self) -> str:
        """``Deployment "web"``: the kind and name of the workload a request writes."""
        controller = BY_RESOURCE.get((self.request.group, self.request.resource))
        kind = controller.kind if controller else self.request.resource
        name = self.request.name
        if not name:
            metadata = self.object.get("metadata") if isinstance(self.object, Mapping) else None
            found = metadata.get("name") or metadata.get("generateName") if isinstance(metadata, Mapping) else None
            name = found if isinstance(found, str) else ""
        return f'{kind} "{name}"' if name else kind


class _Scope:
    """One policy's bindings for one state of the object, with its variables computed lazily:
    an expression evaluates only the variables it reads, each at most once."""

    def __init__(self, run: _Run, policy: CompiledPolicy, apart: bool = False) -> None:
        self.run = run
        self.policy = policy
        self.apart = apart   # each expression runs in a child process (``celfork``)
        self.values: dict[str, Any] = {}
        self.failed: dict[str, tuple[str, str]] = {}   # (path, message): no exception, see _variable
        self.activation: Any = None   # with ``values`` as ``variables``

    def evaluate(self, expression: CompiledExpression, *, plain: bool = True) -> Any:
        """``plain=False`` for a variable: its opaque values stay typed for the expressions that read it."""
        self.run.check_deadline(expression.path)
        names = self.policy.variables if expression.variables is None else expression.variables
        if any(name not in self.values for name in names):
            for name in self.policy.variables:   # declaration order: dependencies come first
                if name in names:
                    self._variable(name)
        self.run.evaluations += 1
        if not names:
            activation = self.run.activation(self.policy)
        else:
            if self.activation is None:
                self.activation = new_activation({**self.run.bindings(self.policy), "variables": dict(self.values)})
            activation = self.activation
        if self.apart:
            return celfork.evaluate(expression, activation, self.run.time_left(), plain=plain)
        return expression.evaluate(activation, plain=plain)

    def _variable(self, name: str) -> None:
        if name in self.values:
            return
        if name in self.failed:
            raise CelEvaluationError(*self.failed[name])
        try:
            value = self.evaluate(self.policy.variables[name], plain=False)
        except CelEvaluationError as error:
            # Kept as text: an exception kept here would hold, through its traceback, this scope
            # and its activation (megabytes for a large object) in a cycle until a full GC.
            self.failed[name] = (error.path, error.message)
            raise
        self.values[name] = value
        self.activation = None


def _rule(path: str) -> str:
    """``spec.validations[2]`` of ``spec.validations[2].messageExpression`` (or of ``.plugin``)."""
    end = path.find("]")
    return path[:end + 1] if path.startswith("spec.validations[") and end > 0 else path


def _bound(body: Any, managed_fields: bool) -> Any:
    """An object as a policy sees it: without ``metadata.managedFields`` unless it names them.

    They are the API server's bookkeeping of who set which field, often the largest part of an
    object, and CEL converts a bound object whole on first read: most of a Pod's ~40 µs.
    """
    metadata = body.get("metadata") if isinstance(body, Mapping) and not managed_fields else None
    if not isinstance(metadata, Mapping) or "managedFields" not in metadata:
        return body
    return {**body, "metadata": {key: value for key, value in metadata.items() if key != "managedFields"}}


def _measure(bodies: tuple[Any, ...], exact: bool) -> celcost.Sizes | str:
    """See _Run.sizes. marshal (format 2: no back-references) writes at least one byte per value
    and per character, so its length bounds the size, and it refuses nesting beyond ~2,000."""
    size, items = 0.0, 0.0
    for body in bodies:
        if body is None:
            continue
        try:
            if not exact:
                size = max(size, len(marshal.dumps(body, 2)))
                continue
        except ValueError:   # too deep, or not plain JSON data: the walk tells which
            pass
        walked = _walk(body)
        if isinstance(walked, str):
            return walked
        size, items = max(size, walked.size), max(items, walked.items)
    return celcost.Sizes(size, items if exact else size)


def _walk(body: Any) -> celcost.Sizes | str:
    """Size and largest list or map of one object, iteratively (it may be deep), or why CEL
    cannot read it."""
    size, items = 0, 0
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return (f"the object nests deeper than {MAX_DEPTH:,} levels, more than CEL can read without "
                    "exhausting the stack")
        if isinstance(value, Mapping):
            size, items = size + 1, max(items, len(value))
            for key, item in value.items():
                size += len(key) if isinstance(key, str) else 1
                stack.append((item, depth + 1))
        elif isinstance(value, (list, tuple)):
            size, items = size + 1, max(items, len(value))
            stack.extend((item, depth + 1) for item in value)
        else:
            size += len(value) if isinstance(value, str) else 1
    return celcost.Sizes(size, items)


def _is_namespace(request: AdmissionRequest) -> bool:
    return request.resource == "namespaces" and request.group == ""
