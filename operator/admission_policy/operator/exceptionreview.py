"""The webhook's review of an AdmissionPolicyException write: who created it, who approved it.

An exception's record (``policyexception.CREATED_BY`` … ``APPROVED_GENERATION``) lives in
annotations, because an admission webhook cannot write ``status``: the API server drops status
from a create or update of an object that has a status subresource (the operator mirrors the
record into status). So the record must be guarded where it is written:

- the mutating phase (``stamp``) writes it from the request: the creator and the time on CREATE
  (and keeps them as they were on UPDATE, with a warning when the request wrote others); who last
  changed the spec; the approver, the time and the generation approved, in place of the
  ``APPROVE`` annotation, when the requester may approve and is neither the creator nor who last
  changed the spec (four eyes: "approval required" means a second person);
- the validating phase (``refusal``) refuses any record the mutating phase did not write for this
  very request: a record set by hand, an approval by someone who may not approve or by an author
  of what is approved, an approval that arrived with a change of the spec (a spec not seen by the
  approver) or with the creation (created approved: nobody else saw it).

Approving is a permission of its own, never granted by creating or editing: the verb ``approve``
on ``admissionpolicyexceptions/approval`` in the exception's namespace, which the operator asks
the API server about with a SubjectAccessReview (``approval_check``). Both functions are pure:
the caller answers that check only when ``wants_approval_check`` says the request needs it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from .. import api
from ..authorization import Check, Subject
from ..engine.request import AdmissionRequest
from ..policyexception import (
    APPROVED_AT,
    APPROVED_BY,
    APPROVED_GENERATION,
    CREATED_AT,
    CREATED_BY,
    PLURAL,
    SPEC_CHANGED_BY,
    format_time,
    parse_time,
)

# What an approver sets to approve: `kubectl annotate ape NAME policy-operator.dev/approve=true`.
APPROVE: Final = f"{api.GROUP}/approve"
APPROVAL_SUBRESOURCE: Final = "approval"
CREATION: Final = (CREATED_BY, CREATED_AT)
APPROVAL: Final = (APPROVED_BY, APPROVED_AT, APPROVED_GENERATION)
# How far a recorded time may be from the validating webhook's clock: the mutating phase wrote it
# moments earlier, perhaps on another replica.
CLOCK_SLACK: Final = 120.0
_UNSTAMPED: Final = ("the operator's mutating webhook did not record it (is the operator's "
                     "MutatingWebhookConfiguration in place?)")


@dataclasses.dataclass(frozen=True)
class Stamp:
    """What the mutating phase does to a write: the JSON patch that writes the record (none when
    there is nothing to write), and a warning for each value of the record the request wrote and
    the patch puts back (``kubectl`` prints them: the write is not refused, but nor is it kept)."""
    patch: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()


def stamp(request: AdmissionRequest, now: float, *, may_approve: bool) -> Stamp:
    """The record this request leaves in the object the API server will store. ``may_approve``:
    the requester's answer to ``approval_check`` (asked only when ``wants_approval_check``)."""
    new, old = _annotations(request.object), _annotations(request.old_object)
    user = _user(request)
    record: dict[str, str | None]
    if request.operation == "CREATE":
        record = {CREATED_BY: user, CREATED_AT: format_time(now), SPEC_CHANGED_BY: user}
    else:   # kept as they were: a later writer is not the creator
        record = {key: old.get(key) for key in CREATION}
        record[SPEC_CHANGED_BY] = _spec_author(request, old)
    wanted = dict(new)
    warnings = []
    for key, value in record.items():
        if key in new and new[key] != value:
            warnings.append(f"{key} is the operator's record and was not changed: it says "
                            f"{value or 'nothing'!r}, not {new[key]!r}")
        if value is None:
            wanted.pop(key, None)
        else:
            wanted[key] = value
    if APPROVE in new and may_approve and _may_record_approval(request):
        del wanted[APPROVE]
        wanted.update({APPROVED_BY: user, APPROVED_AT: format_time(now),
                       APPROVED_GENERATION: str(_generation(request.old_object))})
    if wanted == new:
        return Stamp(warnings=tuple(warnings))
    return Stamp(({"op": "add", "path": "/metadata/annotations", "value": wanted},), tuple(warnings))


def wants_approval_check(request: AdmissionRequest) -> bool:
    """Whether the request asks to approve, or writes an approval record: only then is the
    requester's permission to approve asked of the API server."""
    new, old = _annotations(request.object), _annotations(request.old_object)
    return request.operation == "UPDATE" and (APPROVE in new or _approval_written(new, old))


def approval_check(request: AdmissionRequest) -> Check:
    """May the requester approve this exception: verb ``approve`` on its ``approval`` subresource."""
    return Check(Subject.of(request.raw.get("userInfo")), "approve", group=api.GROUP, resource=PLURAL,
                 subresource=APPROVAL_SUBRESOURCE, namespace=request.namespace, name=request.name)


def refusal(request: AdmissionRequest, now: float, *, may_approve: bool) -> str:
    """Why the record this request would store was not written by the operator for this request
    ("" when it was, or when the request leaves it as it was)."""
    new, old = _annotations(request.object), _annotations(request.old_object)
    user = _user(request)
    if request.operation == "CREATE":
        if APPROVE in new or any(new.get(key) for key in APPROVAL):
            return (f"an exception is created unapproved, and approved afterwards by someone other than its "
                    f"creator: create it without {APPROVE} or an approval record, then another approver runs "
                    f"`{_approve_command(request)}`")
        if (new.get(CREATED_BY) != user or new.get(SPEC_CHANGED_BY) != user
                or not _recent(new.get(CREATED_AT), now)):
            return (f"the creation record ({CREATED_BY}, {CREATED_AT}, {SPEC_CHANGED_BY}) does not name this "
                    f"request: {_UNSTAMPED}")
        return ""
    if APPROVE in new:
        if _spec_changed(request):
            return (f"approve in a request of its own: this one also changes the spec, which the approver "
                    f"has not seen (remove {APPROVE}, apply the change, then approve it)")
        if not may_approve:
            return _not_an_approver(request)
        if not _may_record_approval(request):
            return _self_approval(request)
        return f"the approval was not recorded: {_UNSTAMPED}"
    if any(new.get(key) != old.get(key) for key in CREATION):
        return f"{CREATED_BY} and {CREATED_AT} record who created the exception, and cannot change"
    if new.get(SPEC_CHANGED_BY) != _spec_author(request, old):
        return f"{SPEC_CHANGED_BY} records who last changed the spec: {_UNSTAMPED}"
    if _approval_written(new, old):
        recorded = (new.get(APPROVED_BY) == user and new.get(APPROVED_GENERATION) == str(_generation(request.object))
                    and _recent(new.get(APPROVED_AT), now))
        if not may_approve:
            return _not_an_approver(request)
        if not _may_record_approval(request):
            return _self_approval(request)
        if not recorded:
            return (f"{', '.join(APPROVAL)} are recorded by the operator when someone allowed to approve sets "
                    f"{APPROVE}=true ({_approve_command(request)}); they cannot be written by hand")
    return ""


def _may_record_approval(request: AdmissionRequest) -> bool:
    """An approval of what is stored, by someone other than who wrote it: its creator and whoever
    last changed its spec (as recorded before this request)."""
    old = _annotations(request.old_object)
    return (request.operation == "UPDATE" and not _spec_changed(request)
            and _user(request) not in {old.get(CREATED_BY), old.get(SPEC_CHANGED_BY)})


def _spec_author(request: AdmissionRequest, old: Mapping[str, str]) -> str | None:
    """Who the record says last changed the spec once this UPDATE is stored."""
    return _user(request) if _spec_changed(request) else old.get(SPEC_CHANGED_BY)


def _self_approval(request: AdmissionRequest) -> str:
    return (f"{_user(request)} created this exception or last changed its spec, and an approval counts only "
            f"from someone else (four eyes): another approver runs `{_approve_command(request)}`")


def _approve_command(request: AdmissionRequest) -> str:
    return approve_command(request.namespace, request.name)


def approve_command(namespace: str, name: str) -> str:
    """How an approver approves the exception ``namespace/name``."""
    return f"kubectl annotate ape -n {namespace} {name} {APPROVE}=true"


def _not_an_approver(request: AdmissionRequest) -> str:
    return (f"{_user(request) or 'the requester'} may not approve AdmissionPolicyExceptions in namespace "
            f"{request.namespace}: approving needs the verb 'approve' on {PLURAL}/{APPROVAL_SUBRESOURCE} "
            f"(group {api.GROUP}), as the chart's exception-approver ClusterRole grants; creating or editing "
            "an exception never approves it")


def _approval_written(new: Mapping[str, str], old: Mapping[str, str]) -> bool:
    """An approval record that differs from the stored one (removing it is not: anyone who may
    edit the exception may also void its approval by editing its spec)."""
    return any(new.get(key) for key in APPROVAL) and any(new.get(key) != old.get(key) for key in APPROVAL)


def _recent(value: str | None, now: float) -> bool:
    try:
        return value is not None and abs(parse_time(value, "") - now) <= CLOCK_SLACK
    except api.PolicyError:
        return False


def _spec_changed(request: AdmissionRequest) -> bool:
    if request.operation != "UPDATE":
        return False
    return bool(_field(request.object, "spec") != _field(request.old_object, "spec"))


def _annotations(obj: Any) -> dict[str, str]:
    metadata = _field(obj, "metadata")
    found = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, Mapping) else {}


def _generation(obj: Any) -> int:
    metadata = _field(obj, "metadata")
    value = metadata.get("generation") if isinstance(metadata, Mapping) else None
    return value if isinstance(value, int) else 0


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def _user(request: AdmissionRequest) -> str:
    return Subject.of(request.raw.get("userInfo")).user
