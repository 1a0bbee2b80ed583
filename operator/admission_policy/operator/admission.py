"""Admission: Kopf's validating and mutating handlers, answered from the engine.

Every replica serves, whether or not it reconciles. The webhook server (``webhook.py``) parses
each request; these handlers only decide, storing the ``Decision`` on the exchange it answers.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
from kubernetes_asyncio import client

from .. import api, policyexception
from ..authorization import Authorization
from ..cluster.client import call_json, message_of, resource_path
from ..cluster.discovery import DiscoveredResource
from ..cluster.routing import never_judged
from ..engine import Decision, Phase, PolicyCompileError, evaluate, load_policy
from ..engine.exceptions import compile_exception
from ..engine.request import AdmissionRequest
from . import authorizer, exceptionreview, metrics, typechecking
from .apart import run_apart
from .state import Operator, operator
from .store import error_text
from .tenancy import tenant_problems
from .webhook import current_exchange


@kopf.on.validate(kopf.EVERYTHING, id="validate", subresource="*")
async def validate(**_: Any) -> None:
    """Every routed request's validating phase: one handler for every resource, since the policies
    (not Kopf's handler list) decide what is routed, and change at run time."""
    await _decide(Phase.VALIDATE, "validate")


@kopf.on.mutate(kopf.EVERYTHING, id="mutate", subresource="*")
async def mutate(**_: Any) -> None:
    """The mutating phase, before validation, as the API server calls it (the patch goes in the answer)."""
    await _decide(Phase.MUTATE, "mutate")


async def _decide(phase: Phase, webhook: str) -> None:
    """The engine's decision, stored for the response (see ``webhook``)."""
    op = operator()
    arrived = time.monotonic()
    exchange = current_exchange()
    request = exchange.request
    if never_judged(op.config, request.group, request.resource, request.namespace, request.name):
        exchange.decision = Decision(allowed=True)   # the operator's own API and namespace (issue 18)
        return
    deadline = arrived + op.config.evaluation_deadline
    namespace, namespace_error = None, ""
    if request.namespace:
        namespace = op.store.namespaces.get(request.namespace)
        if namespace is None:
            namespace, namespace_error = await _fetch_namespace(op, request.namespace, deadline)
    started = time.perf_counter()
    policies, exceptions = op.store.serving, op.exceptions.current

    def judge(answers: Authorization, may_fork: bool) -> Decision:
        return evaluate(policies, request, namespace, phase, deadline=deadline, inputs=op.sources,
                        namespace_error=namespace_error, authorization=answers, exceptions=exceptions,
                        may_fork=may_fork)

    async def judged(answers: Authorization) -> Decision:
        decision = judge(answers, False)   # on the loop: what nearly every request needs
        return await run_apart(judge, answers, True) if decision.forks else decision

    # The policies' authorizer checks are answered by SubjectAccessReviews.
    decision = await authorizer.decide(judged, authorizer.reviewer(op.api_client, deadline))
    metrics.observe(decision, request.operation, webhook, time.perf_counter() - started)
    exchange.decision = decision
    op.decisions.record(request, decision, webhook)
    if phase is Phase.VALIDATE and decision.outcomes and op.auditor is not None:
        op.auditor.admitted(request, decision)   # spec.reportAdmission: Audit/Warn failures into the reports
    if not decision.allowed and not request.dry_run:
        for outcome in decision.outcomes:
            if outcome.denied:
                op.events.record_denial(outcome.policy, decision.message)


@kopf.on.validate("", "v1", "events", id="probe", operations=["CREATE"])
async def probe(**_: Any) -> None:
    """Refuse the probe, naming it: the API server called the operator by the configuration that
    routes this name alone (``webhookconfig.probe_name``), so it has loaded that configuration."""
    exchange = current_exchange()
    exchange.decision = Decision(allowed=False, code=409, reason="Conflict",
                                 message=f"probe {exchange.request.name}")


@kopf.on.validate(api.GROUP, api.VERSION, api.PLURAL, id="validate-policy", operations=["CREATE", "UPDATE"])
async def validate_policy(**_: Any) -> None:
    """Refuse an AdmissionPolicy whose spec or CEL is invalid, at `kubectl apply` time."""
    await _validate_policy(tenant=False)


@kopf.on.validate(api.GROUP, api.VERSION, api.NAMESPACED_PLURAL, id="validate-tenant-policy",
                  operations=["CREATE", "UPDATE"])
async def validate_tenant_policy(**_: Any) -> None:
    """Refuse a NamespacedAdmissionPolicy that is invalid, reaches beyond its namespace or goes
    over the namespace's limits (``tenancy``), at `kubectl apply` time."""
    await _validate_policy(tenant=True)


async def _validate_policy(*, tenant: bool) -> None:
    op = operator()
    exchange = current_exchange()
    request = exchange.request
    if request.operation == "UPDATE" and not _spec_written(request.object, request.old_object):
        # What the configuration's matchConditions already exclude, for API servers without them.
        exchange.decision = Decision(allowed=True)
        return
    try:
        compiled = load_policy(_with_namespace(request.object, request.namespace), op.config.default_failure_policy,
                               op.config.tenant_plugins)
        problems = tenant_problems(op.config, compiled, await _discovered(op), op.store.policies) if tenant else []
    except (api.PolicyError, PolicyCompileError, _NoDiscovery) as error:
        problems = [error_text(error)]
    key = api.PolicyKey(api.NAMESPACED_KIND, request.namespace, request.name) if tenant else \
        api.PolicyKey(api.KIND, None, request.name)
    warnings: tuple[str, ...] = ()
    if not problems:   # warnings, or with typeChecking: Deny refusals (a CRD that cannot be read: neither)
        checked = await typechecking.check(op, compiled.policy, op.config.evaluation_deadline)
        warnings = typechecking.admission_warnings(key, checked)
        if checked is not None and compiled.policy.type_checking == "Deny":
            problems = [str(warning) for warning in checked.warnings]
    if problems:
        message = f"{key.kind} {str(key)!r} is invalid: {'; '.join(problems)}"
        exchange.decision = Decision(allowed=False, code=422, reason="Invalid", message=message)
        op.decisions.refused_policy(request, message)
        return
    exchange.decision = Decision(allowed=True, warnings=warnings)


class _NoDiscovery(Exception):
    """Discovery could not be read in time: the kinds a tenant policy names cannot be checked."""


async def _discovered(op: Operator) -> tuple[DiscoveredResource, ...]:
    try:
        async with asyncio.timeout(op.config.evaluation_deadline):
            return await op.discovery.resources()
    except (TimeoutError, client.ApiException, aiohttp.ClientError) as exc:
        raise _NoDiscovery(f"cannot check the kinds it names, the API server's discovery did not answer "
                           f"({type(exc).__name__}: {exc}); try again") from None


@kopf.on.mutate(api.GROUP, api.VERSION, policyexception.PLURAL, id="mutate-exception",
                operations=["CREATE", "UPDATE"])
async def mutate_exception(**_: Any) -> None:
    """Write who created (and who approved) an AdmissionPolicyException, from the request."""
    exchange = current_exchange()
    may_approve, _error = await _may_approve(operator(), exchange.request)   # an error: no approval written
    stamped = exceptionreview.stamp(exchange.request, time.time(), may_approve=may_approve)
    exchange.decision = Decision(allowed=True, patch=stamped.patch, warnings=stamped.warnings)


@kopf.on.validate(api.GROUP, api.VERSION, policyexception.PLURAL, id="validate-exception",
                  operations=["CREATE", "UPDATE"])
async def validate_exception(**_: Any) -> None:
    """Refuse, at `kubectl apply`, an invalid AdmissionPolicyException (its fields, the policies and
    rules it names, its expiry) and a record of creation or approval the operator did not write."""
    op = operator()
    exchange = current_exchange()
    request = exchange.request
    now = time.time()
    problems: list[str] = []
    if request.operation == "CREATE" or _spec_written(request.object, request.old_object):
        try:
            exception = policyexception.parse_exception(_with_namespace(request.object, request.namespace))
            compile_exception(exception)
        except api.PolicyError as error:
            problems.append(str(error))
        else:
            problems += policyexception.check_exception(exception, (c.policy for c in op.store.policies), now)
    may_approve, review_error = await _may_approve(op, request)
    refusal = exceptionreview.refusal(request, now, may_approve=may_approve)
    key = api.PolicyKey(policyexception.KIND, request.namespace, request.name)
    if problems:
        message = f"AdmissionPolicyException {key} is invalid: {'; '.join(problems)}"
        exchange.decision = Decision(allowed=False, code=422, reason="Invalid", message=message)
    elif refusal:
        message = f"AdmissionPolicyException {key}: {refusal}"
        if review_error:
            message += f" (the permission to approve could not be checked: {review_error})"
        exchange.decision = Decision(allowed=False, code=403, reason="Forbidden", message=message)
    else:
        exchange.decision = Decision(allowed=True)
        return
    op.decisions.refused_policy(request, message)


async def _may_approve(op: Operator, request: AdmissionRequest) -> tuple[bool, str]:
    """Whether the requester may approve this exception (asked only when the request approves or
    writes an approval), and why that could not be answered ("" when it was)."""
    if not exceptionreview.wants_approval_check(request):
        return False, ""
    deadline = time.monotonic() + op.config.evaluation_deadline
    answers = await authorizer.review_all(op.api_client, [exceptionreview.approval_check(request)], deadline, 1)
    (answer,) = answers.values()
    return answer.allowed, answer.error


def _with_namespace(obj: Any, namespace: str) -> Any:
    """The object with the request's namespace, which a create's body may leave out."""
    if isinstance(obj, Mapping) and isinstance(obj.get("metadata"), Mapping) and namespace:
        return {**obj, "metadata": {"namespace": namespace, **obj["metadata"]}}
    return obj


def _spec_written(new: Any, old: Any) -> bool:
    """An UPDATE that changes the spec of a policy not being deleted."""
    meta = new.get("metadata") if isinstance(new, Mapping) else None
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return False
    return not (isinstance(new, Mapping) and isinstance(old, Mapping) and new.get("spec") == old.get("spec"))


async def _fetch_namespace(op: Operator, name: str, deadline: float) -> tuple[Mapping[str, Any] | None, str]:
    """A namespace the watcher has not delivered yet (created a moment ago), and why it could not
    be read ("" when read, or when it does not exist). Half of what is left before the request's
    deadline is given to it: the rest is the policies'."""
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic()) / 2):
            status, body = await call_json(op.api_client, "GET", resource_path("", "v1", "namespaces", name=name))
    except TimeoutError:
        return None, f"namespace {name} could not be read in time"
    if status == 404:
        return None, ""
    if status != 200 or not isinstance(body, Mapping):
        return None, f"reading namespace {name} failed: {status} {message_of(body)}".strip()
    op.store.namespaces.setdefault(name, body)
    return body, ""
