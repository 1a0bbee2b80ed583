"""Which verdicts the AdmissionPolicyExceptions in force waive on one request.

``exceptions.ExceptionSet`` says which exceptions could cover a policy here (no CEL); a
``Waiver`` evaluates their conditions with the policy's own bindings and remembers what it
waived (``Decision.exempted``); ``waive`` drops a policy's waived verdicts by rule identity,
whatever field an error names (a variable the rule read).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..cel import CelEvaluationError
from .compiler import CompiledPolicy
from .exceptions import CompiledException, ExceptionSet, Exemption, exemption
from .podcontrollers import pod_view
from .scope import View
from .verdicts import PolicyVerdict, rule_of

_Covering = list[tuple[CompiledException, frozenset[str] | None]]


class Waiver:
    """The exceptions in force at ``now`` (seconds since the epoch) on one request."""

    def __init__(self, exceptions: ExceptionSet, now: float) -> None:
        self.exceptions = exceptions
        self.now = now
        self.exempted: dict[Exemption, None] = {}   # in the order waived, each once

    def waived(self, view: View, policy: CompiledPolicy, rule: str) -> bool:
        """Whether an exception in force covers this rule's verdict here; if so, it is recorded."""
        covering = view.kept(("exceptions", policy.name, policy.template), lambda: self._covering(view, policy))
        for compiled, rules in covering:
            if rules is None or rule in rules:
                self.exempted[exemption(compiled, policy.name, rule)] = None
                return True
        return False

    def _covering(self, view: View, policy: CompiledPolicy) -> _Covering:
        """The exceptions covering the policy on the object as it is now (a mutation may relabel it),
        their conditions evaluated with the policy's own bindings: a workload's Pod template as a Pod."""
        new, old = view.object, view.context.request.old_object
        if policy.template:
            new, old = pod_view(new, policy.template), pod_view(old, policy.template)
        found = []
        for compiled, rules in self.exceptions.candidates(policy, view.context.request, new, old, self.now):
            try:
                view.work.evaluations += len(compiled.conditions)
                if all(condition.evaluate(view.activation(policy)) is True for _, condition in compiled.conditions):
                    found.append((compiled, rules))
            except CelEvaluationError:   # an exception that cannot be judged does not apply
                continue
        return found


def waive(policy: CompiledPolicy, verdict: PolicyVerdict, covers: Callable[[str], bool]) -> PolicyVerdict:
    """The verdict without the failed validations, and the evaluation errors of the rules, that
    ``covers`` (by the validation's name); the reason then is the first kept failure's."""
    rules = dict.fromkeys([finding.rule for finding in verdict.findings] + [error.rule for error in verdict.errors])
    if not rules:
        return verdict
    names = {rule_of(validation.path): validation for validation in policy.policy.validations}
    dropped = {rule for rule in rules if rule in names and covers(names[rule].name)}
    if not dropped:
        return verdict
    kept = [finding for finding in verdict.findings if finding.rule not in dropped]
    first = names.get(kept[0].rule) if kept else None
    return dataclasses.replace(
        verdict, findings=kept, errors=[error for error in verdict.errors if error.rule not in dropped],
        reason=first.reason if first is not None and not kept[0].error else "Forbidden")
