"""What evaluating a request finds, typed: each rule's failure or error, each policy's verdict,
and the ``Decision`` the stages of ``evaluation`` assemble from them.

A rule is named by its field path (``spec.validations[2]``), whatever field of it an error
names (its messageExpression, a variable it read): that identity is what an exception waives
and what reports list, so no caller ever parses error text to find whose verdict it is.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..authorization import Check
from .compiler import CompiledPolicy
from .exceptions import Exemption


@dataclasses.dataclass(frozen=True)
class Finding:
    """One failed validation, for reports that say which rule failed: ``rule`` is the
    validation's path (``spec.validations[2]``); ``error`` when it could not be evaluated
    (failurePolicy Fail) rather than evaluated false."""
    rule: str
    message: str
    error: bool = False


@dataclasses.dataclass(frozen=True)
class RuleError:
    """An evaluation error and the rule whose verdict it is: ``spec.validations[2]``, or "" when
    it is the whole policy's (a match condition, a mutation, a limit)."""
    rule: str
    text: str


@dataclasses.dataclass(slots=True)
class PolicyVerdict:
    """What one policy's stages found on one request; filled in as they run, so that a policy
    stopped half-way (its deadline) keeps what it had found."""
    findings: list[Finding] = dataclasses.field(default_factory=list)
    errors: list[RuleError] = dataclasses.field(default_factory=list)
    applies: bool = False   # the policy matched (and ran), whatever it found
    mutated: bool = False
    fatal: bool = False     # an error under failurePolicy Fail outside validations: deny
    reason: str = ""

    def failed(self, path: str, message: str, error: bool = False) -> None:
        self.findings.append(Finding(rule_of(path), message, error))

    def erred(self, policy: CompiledPolicy, rule: str, text: str) -> bool:
        """Record an evaluation error; True when the policy's failurePolicy says to stop (Fail)."""
        self.errors.append(RuleError(rule, text))
        return policy.policy.failure_policy == "Fail"

    def texts(self) -> tuple[str, ...]:
        return tuple(error.text for error in self.errors)


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


@dataclasses.dataclass(slots=True)
class Work:
    """What evaluating one request cost, for the metrics: CEL programs run, plugins called."""
    evaluations: int = 0
    plugin_calls: list[PluginCall] = dataclasses.field(default_factory=list)


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


def rule_of(path: str) -> str:
    """``spec.validations[2]`` of ``spec.validations[2].messageExpression`` (or of ``.plugin``)."""
    end = path.find("]")
    return path[:end + 1] if path.startswith("spec.validations[") and end > 0 else path
