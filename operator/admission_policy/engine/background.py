"""Audit: the admission engine run over an object that already exists, not over a request.

The operator's background scan and ``admission-policy audit`` both call :func:`audit_object`,
which calls the very ``evaluate`` the webhooks call, on a synthetic request:

- ``request.operation`` is ``CREATE`` and ``oldObject`` is null: "would this object be admitted
  if it were created now?". A policy audits a resource only when a rule of it names that resource
  for CREATE (or ``*``); one that judges UPDATE, DELETE or CONNECT only has no existing object to
  judge (an UPDATE rule compares two versions the scan does not have).
- ``request.dryRun`` is true and ``request.uid`` starts with ``background-``.
- ``request.userInfo`` is empty (username ``""``, no groups): nobody is making the request, so
  what depends on the requester is not applicable in the background (as in Kyverno). A match
  condition that exempts users (``!request.userInfo.username.startsWith('system:')``) holds; one
  that selects users does not, and the policy reports nothing for the object.
  :func:`user_info_reads` lists such expressions so that the policy's status can say so.
- Validations judge the object as stored. Mutations are not applied: they run only to tell
  which objects the policy *would* mutate on their next write.
- An AdmissionPolicyException in force that waives a policy's failures on the object makes its
  result ``skip``, naming the exception; once it has expired, the next scan says ``fail`` again.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from ..authorization import Authorization, Unanswered
from .compiler import CompiledPolicy
from .evaluation import Phase, evaluate
from .exceptions import ExceptionSet, Exemption
from .inputs import Inputs
from .policyset import PolicySet
from .request import AdmissionRequest
from .verdicts import Finding

OPERATION: Final = "CREATE"
UID_PREFIX: Final = "background-"
USER_INFO: Final[Mapping[str, Any]] = {"username": "", "uid": "", "groups": []}
MUTATION_RULE: Final = "spec.mutations"
WOULD_MUTATE: Final = "would be mutated by this policy on its next write (the audit applies no mutation)"

PASS, FAIL, WARN, ERROR, SKIP = "pass", "fail", "warn", "error", "skip"


@dataclasses.dataclass(frozen=True)
class Resource:
    """What the API server calls a kind of object: the request's ``resource`` and ``kind``."""
    group: str
    version: str
    resource: str    # plural, no subresource
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """What one policy says about one existing object.

    ``result``: ``fail`` (a validation fails; ``warn`` for a Warn policy), ``error`` (it could not
    be evaluated), ``skip`` (an exception waived every failure), else ``pass``. ``findings``: each
    failed validation, and a ``spec.mutations`` one when the policy would mutate the object;
    ``exempted``: what exceptions waived.
    """
    policy: str
    enforcement: str
    result: str
    findings: tuple[Finding, ...] = ()
    would_mutate: bool = False
    template_of: str = ""     # 'Deployment "web"': a Pod policy judged this workload's Pod template
    exempted: tuple[Exemption, ...] = ()

    @property
    def violates(self) -> bool:
        """A failure the policy would report (a warning included); an error is not one."""
        return self.result in (FAIL, WARN)

    @property
    def message(self) -> str:
        """The failures in one line, as a denial would list them."""
        about = f"the Pod template of {self.template_of}: " if self.template_of else ""
        texts = [f.message for f in self.findings if f.rule != MUTATION_RULE or self.result == PASS]
        return about + "; ".join(texts) if texts else ""


def background_request(body: Mapping[str, Any], resource: Resource) -> AdmissionRequest:
    """The request the audit evaluates an existing object as (see the module doc)."""
    metadata = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    assert isinstance(metadata, Mapping)
    name, uid = str(metadata.get("name") or ""), str(metadata.get("uid") or "")
    namespace = str(metadata.get("namespace") or "") if resource.namespaced else ""
    kind = {"group": resource.group, "version": resource.version, "kind": resource.kind}
    gvr = {"group": resource.group, "version": resource.version, "resource": resource.resource}
    request_uid = f"{UID_PREFIX}{uid or name}"
    raw = {
        "uid": request_uid,
        "kind": kind, "resource": gvr, "requestKind": kind, "requestResource": gvr,
        "name": name, "namespace": namespace, "operation": OPERATION,
        "userInfo": dict(USER_INFO), "dryRun": True,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    return AdmissionRequest(uid=request_uid, group=resource.group, version=resource.version,
                            resource=resource.resource, sub_resource="", operation=OPERATION,
                            namespace=namespace, name=name, object=body, old_object=None, dry_run=True, raw=raw)


class Forks(Exception):
    """A policy must run in a child process on this object, and the caller may not wait for one
    where it is (``may_fork``): call again where it may."""


def audit_object(policies: PolicySet, request: AdmissionRequest, namespace_object: Mapping[str, Any] | None = None,
                 inputs: Inputs | None = None, authorization: Authorization | None = None,
                 exceptions: ExceptionSet | None = None, now: float | None = None,
                 may_fork: bool = True) -> tuple[AuditResult, ...]:
    """Every matching policy's result for one existing object, in name order.

    Two calls of ``evaluate``: the validating phase on the object as stored, and the mutating
    phase only to learn which policies would change it. A policy that does not select the
    object (selectors, excluded namespaces, match conditions) has no result. ``inputs``: the
    params and context, as at admission (``engine.inputs``). ``authorization``: answers to the
    policies' authorizer checks (none: each check is an evaluation error, nobody is asking);
    Unanswered when it has no answer to one. ``exceptions``, ``now`` and ``may_fork``: as
    ``evaluate`` takes them; Forks when a policy must run in a child and ``may_fork`` is False.
    """
    validated = evaluate(policies, request, namespace_object, Phase.VALIDATE, inputs=inputs,
                         authorization=authorization, exceptions=exceptions, now=now, may_fork=may_fork)
    mutated = evaluate(policies, request, namespace_object, Phase.MUTATE, inputs=inputs, authorization=authorization,
                       exceptions=exceptions, now=now, may_fork=may_fork)
    if validated.forks or mutated.forks:
        raise Forks()
    if validated.unanswered or mutated.unanswered:
        raise Unanswered(dict.fromkeys(validated.unanswered + mutated.unanswered))
    if not validated.outcomes and validated.code == 500:   # the engine failed: say so, never a silent pass
        return tuple(AuditResult(p.name, p.policy.enforcement, ERROR, (Finding("", validated.message, True),))
                     for p in policies.candidates(request))
    would_mutate = {o.policy for o in mutated.outcomes if o.mutated}
    results: dict[str, AuditResult] = {}
    for outcome in validated.outcomes:
        findings = outcome.findings
        if not findings and outcome.errors:    # not evaluated: a match condition or limit erred
            findings = tuple(Finding("", error, True) for error in outcome.errors)
        result = _result(outcome.enforcement, findings, bool(outcome.errors))
        results[outcome.policy] = AuditResult(outcome.policy, outcome.enforcement,
                                              SKIP if result == PASS and outcome.exempted else result,
                                              findings, template_of=outcome.template_of, exempted=outcome.exempted)
    for outcome in mutated.outcomes:
        before = results.get(outcome.policy)
        if outcome.policy in would_mutate:
            findings = (*(before.findings if before else ()), Finding(MUTATION_RULE, WOULD_MUTATE))
            results[outcome.policy] = AuditResult(
                outcome.policy, outcome.enforcement, before.result if before else PASS, findings, True,
                before.template_of if before else outcome.template_of, before.exempted if before else ())
        elif before is None:   # a policy that only mutates, and would not change this object (or erred)
            findings = tuple(Finding(MUTATION_RULE, error, True) for error in outcome.errors)
            result = ERROR if findings else SKIP if outcome.exempted else PASS
            results[outcome.policy] = AuditResult(outcome.policy, outcome.enforcement, result,
                                                  findings, template_of=outcome.template_of,
                                                  exempted=outcome.exempted)
        elif outcome.exempted:   # its mutations waived: said beside what its validations found
            results[outcome.policy] = dataclasses.replace(
                before, exempted=before.exempted + outcome.exempted,
                result=SKIP if before.result == PASS else before.result)
    return tuple(results[name] for name in sorted(results))


def _result(enforcement: str, findings: tuple[Finding, ...], errors: bool) -> str:
    if any(not finding.error for finding in findings):
        return WARN if enforcement == "Warn" else FAIL
    return ERROR if findings or errors else PASS


def audits(policy: CompiledPolicy) -> bool:
    """Whether the scan has anything to judge for this policy: a validation or a mutation, and
    a rule that names CREATE."""
    return bool(policy.validations or policy.mutations) and any(
        OPERATION in rule.operations or "*" in rule.operations for rule in policy.policy.match.resources)


def user_info_reads(policy: CompiledPolicy) -> tuple[str, ...]:
    """Paths of the policy's expressions that read ``request.userInfo``, empty in the background."""
    return tuple(e.path for e in policy.policy.expressions() if "userInfo" in e.source)
