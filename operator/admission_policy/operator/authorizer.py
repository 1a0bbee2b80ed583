"""Policies' authorizer checks, answered by the API server: one SubjectAccessReview per check.

Kubernetes answers ``authorizer.….check(verb)`` with its own authorizer in the middle of the CEL
evaluation, each distinct check once per request. The engine cannot wait (``authorization``):
it stops and names the checks it needs. ``decide`` then asks the API server for all of them at
once, concurrently, and evaluates again with the answers; a few rounds, since which checks an
expression makes can depend on an earlier answer. Everything is bounded by the request's deadline.

A SubjectAccessReview carries the attributes Kubernetes' check hands its authorizer (user,
groups, uid, extra; version "*"; selectors as written, which the API server parses and ignores
when they do not parse), and the API server answers it with that same authorizer: allowed, its
reason, and an evaluation error. A review that fails — RBAC refusing ``create`` on
subjectaccessreviews, the API server down, no answer before the deadline — is what an authorizer
error is in Kubernetes: ``errored()`` true, ``error()`` saying why, ``allowed()`` false.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from kubernetes_asyncio import client

from ..authorization import Answer, Answers, Authorization, Check
from ..cluster.client import call_json, message_of
from ..engine import Decision

logger = logging.getLogger(__name__)

REVIEWS_PATH: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
# Rounds of reviews per request: a check made only once another one is answered needs a second.
MAX_ROUNDS: Final = 4
# Reviews per request. Kubernetes' cost limits allow ~28 checks per policy (350,000 each within
# 10,000,000); beyond this many, a check is an authorizer error rather than one more API call.
MAX_REVIEWS: Final = 64

Evaluate = Callable[[Authorization], Awaitable[Decision]]
Answerer = Callable[[Sequence[Check]], Awaitable[Mapping[Check, Answer]]]


async def decide(evaluate: Evaluate, answer: Answerer) -> Decision:
    """``evaluate``'s decision once every check it makes is answered (see the module doc).

    ``evaluate`` runs the engine with the answers known so far; ``answer`` answers a round's
    checks (``reviewer``). After ``MAX_ROUNDS`` rounds, a check still unanswered is an
    authorizer error."""
    known: dict[Check, Answer] = {}
    for _ in range(MAX_ROUNDS):
        decision = await evaluate(Answers(known))
        if not decision.unanswered:
            return decision
        known.update(await answer(decision.unanswered))
    late = Answer(False, error=f"authorization check not made: the policies asked for checks in more than "
                               f"{MAX_ROUNDS} rounds, each depending on the answers of the one before")
    return await evaluate(Answers(known, otherwise=late))


def reviewer(api: client.ApiClient, deadline: float) -> Answerer:
    """One request's answerer: SubjectAccessReviews, each round within half of what is left
    before ``deadline`` (on ``time.monotonic``; the rest is the evaluations'), at most
    ``MAX_REVIEWS`` in all."""
    made = 0

    async def answer(checks: Sequence[Check]) -> Mapping[Check, Answer]:
        nonlocal made
        room = max(MAX_REVIEWS - made, 0)
        made += min(room, len(checks))
        return await review_all(api, checks, deadline, room)
    return answer


async def review_all(api: client.ApiClient, checks: Sequence[Check], deadline: float, room: int) -> dict[Check, Answer]:
    """An answer to every check: reviews for the first ``room`` of them, concurrently, within
    half of what is left before ``deadline``; an authorizer error for the others."""
    asked = list(checks[:room])
    answers: dict[Check, Answer] = {}
    if asked:
        tasks = [asyncio.ensure_future(review(api, check)) for check in asked]
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()) / 2)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for check, task in zip(asked, tasks, strict=True):
            answers[check] = task.result() if task in done else Answer(
                False, error="the SubjectAccessReview had no answer before the request's deadline")
    for check in checks[room:]:
        answers[check] = Answer(False, error=f"authorization check not made: more than {MAX_REVIEWS} distinct "
                                             "checks for one request")
    return answers


async def review(api: client.ApiClient, check: Check) -> Answer:
    """The API server's answer to one check; a failed review is an authorizer error."""
    try:
        status, body = await call_json(api, "POST", REVIEWS_PATH, body=review_body(check))
    except Exception as exc:   # whatever the client raises: an answer, never an escape
        status, body = 0, {"message": f"{type(exc).__name__}: {exc}"}
    result = body.get("status") if isinstance(body, Mapping) else None
    if status not in (200, 201) or not isinstance(result, Mapping):
        code = f"{status} " if status else ""
        error = f"SubjectAccessReview failed: {code}{message_of(body)}".strip()
        logger.warning("Authorizer check %s: %s", check.describe(), error)
        return Answer(False, error=error)
    return Answer(allowed=result.get("allowed") is True, reason=str(result.get("reason") or ""),
                  error=str(result.get("evaluationError") or ""))


def review_body(check: Check) -> dict[str, Any]:
    """The SubjectAccessReview that asks ``check`` (authorization.k8s.io/v1)."""
    subject = check.subject
    spec: dict[str, Any] = {"user": subject.user, "groups": list(subject.groups)}
    if subject.uid:
        spec["uid"] = subject.uid
    if subject.extra:
        spec["extra"] = {key: list(values) for key, values in subject.extra}
    if check.is_path:
        spec["nonResourceAttributes"] = {"path": check.path, "verb": check.verb}
    else:
        attributes: dict[str, Any] = {"verb": check.verb, "group": check.group, "version": "*",
                                      "resource": check.resource}
        for key, value in (("subresource", check.subresource), ("namespace", check.namespace),
                           ("name", check.name)):
            if value:
                attributes[key] = value
        if check.field_selector:
            attributes["fieldSelector"] = {"rawSelector": check.field_selector}
        if check.label_selector:
            attributes["labelSelector"] = {"rawSelector": check.label_selector}
        spec["resourceAttributes"] = attributes
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
