"""Admission: Kopf's validating and mutating handlers, answered from the engine.

Every replica serves, whether or not it reconciles. The webhook server (``webhook.py``) parses
each request; these handlers only decide, storing the ``Decision`` on the exchange it answers.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import kopf

from .. import api
from ..cluster.client import call_json, message_of, resource_path
from ..cluster.routing import never_judged
from ..engine import Decision, Phase, PolicyCompileError, evaluate
from . import authorizer, metrics
from .state import Operator, operator
from .store import error_text, load_policy
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
    policies = op.store.policies
    decision = await authorizer.decide(   # the policies' authorizer checks, by SubjectAccessReviews
        lambda answers: evaluate(policies, request, namespace, phase, deadline=deadline, inputs=op.sources,
                                 namespace_error=namespace_error, authorization=answers),
        authorizer.reviewer(op.api_client, deadline))
    metrics.observe(decision, request.operation, webhook, time.perf_counter() - started)
    exchange.decision = decision
    op.decisions.record(request, decision, webhook)
    if phase is Phase.VALIDATE and decision.outcomes and op.auditor is not None:
        op.auditor.admitted(request, decision)   # spec.reportAdmission: Audit/Warn failures into the reports
    if not decision.allowed and not request.dry_run:
        for outcome in decision.outcomes:
            if outcome.denied:
                op.events.record_denial(outcome.policy, decision.message)


@kopf.on.validate(api.GROUP, api.VERSION, api.PLURAL, id="validate-policy", operations=["CREATE", "UPDATE"])
async def validate_policy(**_: Any) -> None:
    """Refuse an AdmissionPolicy whose spec or CEL is invalid, at `kubectl apply` time."""
    op = operator()
    exchange = current_exchange()
    request = exchange.request
    if request.operation == "UPDATE" and not _spec_written(request.object, request.old_object):
        # What the configuration's matchConditions already exclude, for API servers without them.
        exchange.decision = Decision(allowed=True)
        return
    try:
        load_policy(request.object, op.config.default_failure_policy)
    except (api.PolicyError, PolicyCompileError) as error:
        message = f"AdmissionPolicy {exchange.request.name!r} is invalid: {error_text(error)}"
        exchange.decision = Decision(allowed=False, code=422, reason="Invalid", message=message)
        op.decisions.refused_policy(request, message)
        return
    exchange.decision = Decision(allowed=True)


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
