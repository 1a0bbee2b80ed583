"""compiled policies + request → Decision. Pure and synchronous: no I/O, no Kopf, no clients.

The evaluation is a composition of stages, each with typed results (``verdicts``):
``PolicySet.candidates`` (cluster policies and the namespace's tenant policies that match the
resource), then per policy ``selection`` and its ``mutation`` or ``validation`` stage, filling in
its ``PolicyVerdict``; the ``waiver`` drops what exceptions in force cover, by rule identity; and
``assembly`` makes the ``Decision``. What the stages read is a ``scope.RequestContext`` (the
request, never changed) and a ``scope.View`` (the object as the mutations have left it).

The API server calls mutating webhooks first and validating ones on the final object, so
``Phase.ALL`` (the CLI) runs every mutation of every matching policy, in name order, and then
every validation; the webhook handlers run one phase each.
"""
from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..authorization import Authorization, answering
from .assembly import decide
from .compiler import CompiledPolicy
from .exceptions import ExceptionSet
from .inputs import Inputs, InputsError, NoInputs, context_lists, select_params
from .mutation import mutate
from .policyset import PolicySet
from .request import AdmissionRequest
from .scope import Abort, Deadline, MustFork, RequestContext, View
from .selection import selected
from .validation import validate
from .verdicts import Decision, PolicyVerdict, Work
from .waiver import Waiver, waive

# One policy's stage on the view: it fills in the policy's verdict (and a mutation, the view).
_Stage = Callable[[View, CompiledPolicy, PolicyVerdict], None]
_Verdicts = dict[str, tuple[CompiledPolicy, PolicyVerdict]]


class Phase(enum.Enum):
    """Which webhook is asking: the API server calls the mutating one and, later, the validating
    one on the final object; ALL runs both in that order, for the CLI."""
    MUTATE = "mutate"
    VALIDATE = "validate"
    ALL = "all"


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
    process (``cel.fork``), which this thread then waits for. The event loop must not wait, so the
    webhook passes False: the result is then no decision but ``forks``, as soon as a policy needs
    a child, and the webhook evaluates again with True on a thread of its own.
    """
    try:
        candidates = policies.candidates(request)
        if not candidates:
            return Decision(allowed=True, patched_object=request.object)
        context = RequestContext(request, namespace_object, namespace_error, NoInputs() if inputs is None else inputs,
                                 Deadline.start(deadline, clock), may_fork)
        work = Work()
        view = View(context, work, request.object)
        waiver = Waiver(exceptions, time.time() if now is None else now) if exceptions else None   # none: no cost
        verdicts: _Verdicts = {}
        with answering(authorization) as asking:
            if phase in (Phase.MUTATE, Phase.ALL):
                stage = functools.partial(mutate, waiver=waiver)
                _mutate_all(view, [policy for policy in candidates if policy.mutations], verdicts, stage)
            if phase in (Phase.VALIDATE, Phase.ALL):
                for policy in candidates:
                    if policy.validations:
                        _judge(validate, view, policy, verdicts)
        unanswered = asking.unanswered(text for _, verdict in verdicts.values() for text in verdict.texts())
        if unanswered:
            return Decision(allowed=False, code=500, reason="InternalError", patched_object=request.object,
                            message="authorizer checks without an answer: "
                                    + "; ".join(check.describe() for check in unanswered),
                            unanswered=unanswered)
        judged = list(verdicts.values())
        if waiver is not None:
            judged = [(policy, waive(policy, verdict, functools.partial(waiver.waived, view, policy)))
                      for policy, verdict in judged]
        return decide(request, view.object, judged, work, tuple(waiver.exempted) if waiver else ())
    except MustFork:
        return Decision(allowed=False, code=500, reason="InternalError", patched_object=request.object, forks=True,
                        message="a policy must be evaluated in a child process, which this caller does not allow")
    except Exception as exc:   # a defect of ours; still an answer, never a 500
        return Decision(allowed=False, code=500, reason="InternalError",
                        message=f"the admission policy engine failed: {type(exc).__name__}: {exc}",
                        patched_object=request.object)


def _judge(stage: _Stage, view: View, policy: CompiledPolicy, verdicts: _Verdicts) -> None:
    """Run one policy's stage; whatever stops it is an evaluation error of that policy. A policy
    that reads params or context runs once per param found, as a ValidatingAdmissionPolicy does
    (not at all when none is and paramRef says Allow), each on a view with its own inputs."""
    found = verdicts.get(policy.name)
    verdict = found[1] if found is not None else PolicyVerdict()
    at = view
    try:
        spec = policy.policy
        if spec.param_kind is None and not spec.context:
            stage(view, policy, verdict)
        elif (view.object is not None or stage is validate) and selected(view, policy):
            lists = context_lists(spec, view.context.request, view.context.inputs) if spec.context else {}
            params: list[Mapping[str, Any]] | list[None] = [None]
            if spec.param_kind is not None:
                params = select_params(spec, view.context.request, view.context.inputs) or []
            for param in params:
                at = at.with_inputs(param, lists)
                stage(at, policy, verdict)
    except (Abort, InputsError) as stop:
        _abort(policy, verdict, str(stop) + at.with_param())
    except MustFork:
        raise
    except Exception as exc:   # never escapes evaluate(): the policy's failurePolicy decides
        _abort(policy, verdict, f"internal error: {type(exc).__name__}: {exc}" + at.with_param())
    finally:
        view.replace(at.object)   # what a mutation made with a param is the object from now on
    if verdict.applies or verdict.errors:
        verdicts.setdefault(policy.name, (policy, verdict))


def _abort(policy: CompiledPolicy, verdict: PolicyVerdict, message: str) -> None:
    if verdict.erred(policy, "", message):
        verdict.fatal = True


def _mutate_all(view: View, policies: list[CompiledPolicy], verdicts: _Verdicts, stage: _Stage) -> None:
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
        before = view.object
        _judge(stage, view, policy, verdicts)
        if view.object is not before:
            last = index
    tenant_changed = False
    for policy in policies[:last]:
        if policy.policy.reinvocation_policy != "IfNeeded":
            continue
        before = view.object
        _mutate_again(stage, view, policy, verdicts)
        tenant_changed |= view.object is not before and policy.policy.namespace is not None
    if tenant_changed:
        for policy in policies:
            if policy.policy.namespace is None:
                _mutate_again(stage, view, policy, verdicts)


def _mutate_again(stage: _Stage, view: View, policy: CompiledPolicy, verdicts: _Verdicts) -> None:
    found = verdicts.get(policy.name)
    if found is None or not found[1].errors:   # an error is said once, from the first pass
        _judge(stage, view, policy, verdicts)
