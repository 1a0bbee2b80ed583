"""An AdmissionPolicyException's status: its state, conditions and record, and events as it changes.

Status is observation only. Whether an exception applies is decided per request from the exception
itself, the policies and the clock (``engine.exceptions``), so it ends at its ``expiresAt`` whether
or not this status has caught up. The status says the same thing for `kubectl get ape`:

    Valid        the policies and rules it names exist and allow it (and its expiry is within their caps)
    Approved     True when approved for this generation by someone other than who created it or last
                 changed its spec, or when no policy it names requires approval
    Active       in force now; False with reason Expired, PendingApproval or Invalid
    state        the summary: Active | PendingApproval | Invalid | Expired

One task (``follow_exceptions``) on the replica that reconciles writes them: at a change of an
exception, every ``FOLLOW_INTERVAL`` for changes of the policies it names, and at the next expiry
to the second. Not a Kopf timer or daemon per exception: those make Kopf put a finalizer on each
one, and an exception must stay deletable while the operator is down.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Literal

from kubernetes_asyncio import client

from .. import api
from ..policyexception import KIND, PLURAL, PolicyException, check_exception, format_time
from .conditions import Condition, condition_entry
from .exceptionreview import approve_command
from .state import Operator

logger = logging.getLogger(__name__)

State = Literal["Active", "PendingApproval", "Invalid", "Expired"]
VALID: Final = "Valid"
APPROVED: Final = "Approved"
ACTIVE: Final = "Active"
FOLLOW_INTERVAL: Final = 5.0
# The record's fields, as status mirrors them (None removes one a merge patch wrote before).
_RECORD_FIELDS: Final = ("createdBy", "createdAt", "specChangedBy", "approvedBy", "approvedAt", "approvedGeneration")


def judge(exception: PolicyException, policies: Iterable[api.AdmissionPolicy],
          now: float) -> tuple[State, tuple[Condition, ...]]:
    """The state and conditions of a parsed exception, against the policies enforced now."""
    by_name = {policy.name: policy for policy in policies}
    problems = check_exception(exception, by_name.values(), now, expiry=False)
    valid = (Condition(VALID, "False", "Invalid", "; ".join(problems)) if problems else
             Condition(VALID, "True", "Valid", "the policies and rules it names exist and allow it"))
    requiring = [ref.name for ref in exception.policies
                 if ref.name in by_name and by_name[ref.name].exceptions.approval == "Required"]
    approved = _approved(exception, requiring)
    until = format_time(exception.expires_at)
    state: State
    if now >= exception.expires_at:
        state, active = "Expired", Condition(ACTIVE, "False", "Expired", f"expired at {until}")
    elif problems:
        state, active = "Invalid", Condition(ACTIVE, "False", "Invalid", "not applied: it is not valid")
    elif approved.status != "True":
        state, active = "PendingApproval", Condition(ACTIVE, "False", "PendingApproval",
                                                     "not applied until approved")
    else:   # the event of the change to Active says this, so `kubectl describe ape` names the approver
        by = f", approved by {exception.record.approved_by}" if approved.reason == "Approved" else ""
        state, active = "Active", Condition(ACTIVE, "True", "Active", f"applied until {until}{by}")
    return state, (valid, approved, active)


def _approved(exception: PolicyException, requiring: list[str]) -> Condition:
    record = exception.record
    if not requiring:
        return Condition(APPROVED, "True", "NotRequired", "no policy it names requires approval")
    if exception.approved:
        when = format_time(record.approved_at) if record.approved_at is not None else "an unrecorded time"
        return Condition(APPROVED, "True", "Approved", f"approved by {record.approved_by} at {when} "
                                                         f"for generation {exception.generation}")
    authors = " or ".join(sorted(record.authors))
    who = f"someone allowed to approve other than {authors}" if authors else "someone allowed to approve"
    how = (f"required by AdmissionPolicy {', '.join(requiring)}: {who} runs "
           f"`{approve_command(exception.namespace, exception.name)}`")
    if record.self_approved:   # the webhook refuses it; an older operator did not
        return Condition(APPROVED, "False", "SelfApproved", f"approved by {record.approved_by}, who created it "
                                                            f"or last changed its spec; an approval by someone "
                                                            f"else is {how}")
    if record.approved_by:
        return Condition(APPROVED, "False", "SpecChanged", f"approved by {record.approved_by} for generation "
                                                          f"{record.approved_generation}, not for generation "
                                                          f"{exception.generation}; a new approval is {how}")
    return Condition(APPROVED, "False", "PendingApproval", f"approval is {how}")


def status_patch(old: Mapping[str, Any], exception: PolicyException | None, invalid: str, generation: int,
                 policies: Iterable[api.AdmissionPolicy], now: float) -> dict[str, Any]:
    """The status to write (a merge patch); transition times move only when a condition's status
    does. ``exception`` None: it does not parse, for the reason ``invalid``."""
    moment = datetime.datetime.fromtimestamp(now, datetime.UTC)
    previous = {c.get("type"): c for c in old.get("conditions") or [] if isinstance(c, Mapping)}
    record: dict[str, Any] = dict.fromkeys(_RECORD_FIELDS)
    if exception is None:
        state: State = "Invalid"
        found: tuple[Condition, ...] = (
            Condition(VALID, "False", "Invalid", invalid),
            Condition(APPROVED, "Unknown", "Invalid", "not judged: it is not valid"),
            Condition(ACTIVE, "False", "Invalid", "not applied: it is not valid"))
        summary = expires = None
    else:
        state, found = judge(exception, policies, now)
        summary = "; ".join(f"{ref.name}/{','.join(ref.rules)}" if ref.rules else ref.name
                            for ref in exception.policies)
        expires = format_time(exception.expires_at)
        r = exception.record
        record.update({
            "createdBy": r.created_by or None,
            "createdAt": format_time(r.created_at) if r.created_at is not None else None,
            "specChangedBy": r.spec_changed_by or None,
        })
        if exception.approved:   # the APPROVED column shows an approval that counts
            record.update({"approvedBy": r.approved_by,
                           "approvedAt": format_time(r.approved_at) if r.approved_at is not None else None,
                           "approvedGeneration": r.approved_generation})
    return {"state": state, "policies": summary, "expiresAt": expires, **record, "observedGeneration": generation,
            "conditions": [condition_entry(previous.get(c.type), c, generation, moment) for c in found]}


def states(op: Operator) -> Iterator[str]:
    """Each exception's state now, for the metrics."""
    policies = [compiled.policy for compiled in op.store.policies]
    now = time.time()
    for key in list(op.exceptions.seen):
        exception = op.exceptions.get(key)
        yield "Invalid" if exception is None else judge(exception, policies, now)[0]


def _next_change(exceptions: Iterable[PolicyException], now: float) -> float | None:
    """Seconds until the next exception expires (None: none will)."""
    ahead = [e.expires_at - now for e in exceptions if e.expires_at > now]
    return min(ahead) if ahead else None


async def follow_exceptions(op: Operator) -> None:
    """Keep every exception's status true (see the module doc); only the reconciling replica
    writes, and it asks whether it is that replica only when there is something to write."""
    written: dict[str, Mapping[str, Any]] = {}    # what this replica last wrote, until the watch shows it
    while True:
        changed = op.exceptions.changed()
        now = time.time()
        try:
            await _write_changed(op, written, now)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("Updating the AdmissionPolicyExceptions' status failed: %s", exc)
        ahead = _next_change((c.exception for c in op.exceptions.current), time.time())
        wait = min(FOLLOW_INTERVAL, ahead or FOLLOW_INTERVAL)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(wait, 0.0)):
                await changed.wait()


async def _write_changed(op: Operator, written: dict[str, Mapping[str, Any]], now: float) -> None:
    policies = [compiled.policy for compiled in op.store.policies]
    leads: bool | None = None
    for key, seen in list(op.exceptions.seen.items()):
        patch = status_patch(seen.status, op.exceptions.get(key), op.exceptions.invalid.get(key, ""),
                             seen.generation, policies, now)
        if _holds(seen.status, patch) or written.get(key) == patch:
            continue
        if leads is None:
            leads = await op.reconciles()
        if not leads:
            return
        exception = api.PolicyKey.parse(key, KIND)
        await client.CustomObjectsApi(op.api_client).patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, exception.namespace or "", PLURAL, exception.name, {"status": patch},
            _content_type="application/merge-patch+json")  # type: ignore[call-arg]  # a dict is not a JSON Patch
        written[key] = patch
        old_state = seen.status.get("state")
        if old_state != patch["state"]:
            await _announce(op, key, seen.uid, old_state, patch)
    for key in set(written) - set(op.exceptions.seen):
        del written[key]


def _holds(status: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether the status already says what the patch would write."""
    return all(status.get(field) == value for field, value in patch.items())


async def _announce(op: Operator, key: str, uid: str, old_state: Any, patch: Mapping[str, Any]) -> None:
    """One event and one log line per change of state: where `kubectl describe ape` shows them."""
    exception = api.PolicyKey.parse(key, KIND)
    state = patch["state"]
    active = next(c for c in patch["conditions"] if c["type"] == ACTIVE)
    message = f"{old_state or '(new)'} → {state}: {active['message']}"
    reason = {"Active": "Activated"}.get(state, state)
    logger.info("AdmissionPolicyException %s: %s", key, message)
    await op.events.post(op.api_client, exception.name, uid, type_="Warning" if state == "Invalid" else "Normal",
                         reason=reason, message=message, kind=KIND, namespace=exception.namespace or "")
