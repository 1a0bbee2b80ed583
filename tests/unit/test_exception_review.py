"""The operator's side of AdmissionPolicyExceptions, without a cluster: the record the webhook writes
and guards (who created, who approved), the status it reports, and the replica's store of them.

The same flows run on a real API server, under users' own identities, in tests/e2e/test_e2e_exceptions.py.
"""
from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from admission_policy import api, policyexception
from admission_policy.operator import exceptionreview, exceptionstatus
from admission_policy.operator.exceptionreview import APPROVE, approval_check, refusal, stamp, wants_approval_check
from admission_policy.operator.store import ExceptionStore
from admission_policy.policyexception import (
    APPROVED_AT,
    APPROVED_BY,
    APPROVED_GENERATION,
    CREATED_AT,
    CREATED_BY,
    SPEC_CHANGED_BY,
    format_time,
    parse_exception,
    parse_time,
)
from builders import policy, request

NOW = parse_time("2026-11-01T12:00:00Z", "")
EXPIRES = "2026-12-31T00:00:00Z"
TENANT = {"username": "tenant-admin", "groups": ["team-a"]}
APPROVER = {"username": "security-lead", "groups": ["security"]}


def exception_body(*, annotations: dict[str, str] | None = None, generation: int = 1,
                   **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": policyexception.KIND,
            "metadata": {"name": "legacy", "namespace": "team-a", "generation": generation, "uid": "u-1",
                         "annotations": dict(annotations or {})},
            "spec": {"policies": [{"name": "no-privileged"}], "reason": "migration", "expiresAt": EXPIRES, **spec}}


def created(by: str = "tenant-admin", at: float = NOW - 3600) -> dict[str, str]:
    return {CREATED_BY: by, CREATED_AT: format_time(at), SPEC_CHANGED_BY: by}


def write(obj: dict[str, Any], *, operation: str = "CREATE", old: dict[str, Any] | None = None,
          user: dict[str, Any] = TENANT) -> Any:
    return request(obj, operation=operation, old=old, resource=policyexception.PLURAL, group=api.GROUP,
                   version=api.VERSION, name="legacy", namespace="team-a", user_info=user)


def stored(review: Any, may_approve: bool) -> dict[str, Any]:
    """The object as the API server stores it after the mutating phase."""
    patch = stamp(review, NOW, may_approve=may_approve).patch
    return jsonpatch.apply_patch(copy.deepcopy(review.object), list(patch)) if patch else copy.deepcopy(review.object)


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


# --- the creation record -------------------------------------------------------------------------------------

def test_create_records_the_creator_and_the_time_from_the_request() -> None:
    review = write(exception_body())
    after = stored(review, may_approve=False)
    assert annotations(after) == created(at=NOW)
    assert refusal(write(after), NOW, may_approve=False) == ""
    assert stamp(review, NOW, may_approve=False).warnings == ()


def test_a_creation_record_written_by_hand_is_overwritten_with_the_requester_and_a_warning() -> None:
    review = write(exception_body(annotations=created(by="someone-else")))
    after = stored(review, may_approve=False)
    assert annotations(after) == created(at=NOW)
    warnings = stamp(review, NOW, may_approve=False).warnings
    assert len(warnings) == 3    # the two names and the time
    assert warnings[0] == (f"{CREATED_BY} is the operator's record and was not changed: it says 'tenant-admin', "
                           "not 'someone-else'")


def test_a_create_that_the_mutating_webhook_did_not_stamp_is_refused() -> None:
    message = refusal(write(exception_body(annotations=created(by="someone-else"))), NOW, may_approve=False)
    assert "does not name this request" in message and "MutatingWebhookConfiguration" in message


def test_an_update_keeps_the_creation_record_and_refuses_a_change_of_it() -> None:
    old = exception_body(annotations=created())
    edited = exception_body(annotations=created(by="tenant-b"), reason="still migrating")
    review = write(edited, operation="UPDATE", old=old, user=APPROVER)
    after = stored(review, may_approve=False)
    assert annotations(after) == {**created(), SPEC_CHANGED_BY: "security-lead"}   # who changed the spec
    assert any(w.startswith(f"{CREATED_BY} is the operator's record") and "'tenant-b'" in w
               for w in stamp(review, NOW, may_approve=False).warnings)
    message = refusal(write(edited, operation="UPDATE", old=old), NOW, may_approve=False)
    assert CREATED_BY in message and "cannot change" in message


def test_who_last_changed_the_spec_is_recorded_and_cannot_be_written_by_hand() -> None:
    old = exception_body(annotations=created())
    relabelled = exception_body(annotations={**created(), SPEC_CHANGED_BY: "someone-else"})
    review = write(relabelled, operation="UPDATE", old=old, user=APPROVER)   # no spec change
    assert annotations(stored(review, may_approve=False))[SPEC_CHANGED_BY] == "tenant-admin"
    assert SPEC_CHANGED_BY in refusal(review, NOW, may_approve=False)


# --- approval ------------------------------------------------------------------------------------------------

def test_an_approver_approves_with_an_annotation_that_becomes_the_record() -> None:
    old = exception_body(annotations=created(), generation=3)
    asked = exception_body(annotations={**created(), APPROVE: "true"}, generation=3)
    review = write(asked, operation="UPDATE", old=old, user=APPROVER)
    assert wants_approval_check(review)
    after = stored(review, may_approve=True)
    assert annotations(after) == {**created(), APPROVED_BY: "security-lead", APPROVED_AT: "2026-11-01T12:00:00Z",
                                  APPROVED_GENERATION: "3"}
    assert refusal(write(after, operation="UPDATE", old=old, user=APPROVER), NOW, may_approve=True) == ""
    assert parse_exception(after).approved


def test_someone_who_may_not_approve_is_refused_naming_the_permission() -> None:
    old = exception_body(annotations=created())
    review = write(exception_body(annotations={**created(), APPROVE: "true"}), operation="UPDATE", old=old)
    after = stored(review, may_approve=False)
    assert APPROVE in annotations(after) and APPROVED_BY not in annotations(after)
    message = refusal(write(after, operation="UPDATE", old=old), NOW, may_approve=False)
    assert "tenant-admin may not approve" in message
    assert "'approve' on admissionpolicyexceptions/approval" in message


def test_an_exception_cannot_be_created_approved() -> None:
    """Neither with a record written by hand nor by an approver asking to approve at once: nobody
    else would have seen what is approved."""
    forged = exception_body(annotations={APPROVED_BY: "tenant-admin", APPROVED_AT: format_time(NOW),
                                         APPROVED_GENERATION: "1"})
    asked = exception_body(annotations={APPROVE: "true"})
    for body, user in ((forged, TENANT), (asked, APPROVER)):
        review = write(body, user=user)
        assert not wants_approval_check(review)
        after = stored(review, may_approve=True)
        assert annotations(after).get(APPROVED_BY) in (None, "tenant-admin")   # nothing recorded
        message = refusal(write(after, user=user), NOW, may_approve=True)
        assert message.startswith("an exception is created unapproved"), message
        assert f"kubectl annotate ape -n team-a legacy {APPROVE}=true" in message


def test_an_approver_cannot_approve_what_they_created_or_last_changed() -> None:
    """Four eyes: an approval counts only from someone other than the spec's authors."""
    lead_created = exception_body(annotations=created(by="security-lead"))
    lead_edited = exception_body(annotations={**created(), SPEC_CHANGED_BY: "security-lead"}, generation=2)
    for old in (lead_created, lead_edited):
        asked = copy.deepcopy(old)
        asked["metadata"]["annotations"][APPROVE] = "true"
        review = write(asked, operation="UPDATE", old=old, user=APPROVER)
        after = stored(review, may_approve=True)
        assert APPROVED_BY not in annotations(after)
        message = refusal(write(after, operation="UPDATE", old=old, user=APPROVER), NOW, may_approve=True)
        assert "security-lead created this exception or last changed its spec" in message
        assert "four eyes" in message
        forged = copy.deepcopy(old)
        forged["metadata"]["annotations"].update({APPROVED_BY: "security-lead", APPROVED_AT: format_time(NOW),
                                                  APPROVED_GENERATION: str(old["metadata"]["generation"])})
        assert "four eyes" in refusal(write(forged, operation="UPDATE", old=old, user=APPROVER), NOW,
                                      may_approve=True)
    # A second approver can.
    asked = copy.deepcopy(lead_edited)
    asked["metadata"]["annotations"][APPROVE] = "true"
    other = {"username": "second-lead", "groups": ["security"]}
    after = stored(write(asked, operation="UPDATE", old=lead_edited, user=other), may_approve=True)
    assert annotations(after)[APPROVED_BY] == "second-lead" and annotations(after)[APPROVED_GENERATION] == "2"
    assert refusal(write(after, operation="UPDATE", old=lead_edited, user=other), NOW, may_approve=True) == ""
    assert parse_exception(after).approved


def test_even_an_approver_cannot_write_the_record_by_hand() -> None:
    old = exception_body(annotations=created())
    forged = exception_body(annotations={**created(), APPROVED_BY: "someone-else", APPROVED_AT: format_time(NOW),
                                         APPROVED_GENERATION: "1"})
    message = refusal(write(forged, operation="UPDATE", old=old, user=APPROVER), NOW, may_approve=True)
    assert "cannot be written by hand" in message


def test_an_approval_arriving_with_a_spec_change_is_refused() -> None:
    old = exception_body(annotations=created())
    asked = exception_body(annotations={**created(), APPROVE: "true"}, reason="a different reason")
    review = write(asked, operation="UPDATE", old=old, user=APPROVER)
    after = stored(review, may_approve=True)
    assert APPROVED_BY not in annotations(after)
    assert "changes the spec" in refusal(write(after, operation="UPDATE", old=old, user=APPROVER), NOW,
                                         may_approve=True)


def test_editing_the_spec_keeps_the_record_which_then_no_longer_counts() -> None:
    record = {**created(), APPROVED_BY: "security-lead", APPROVED_AT: format_time(NOW), APPROVED_GENERATION: "1"}
    old = exception_body(annotations=record)
    edited = exception_body(annotations=record, generation=2, reason="broader")
    review = write(edited, operation="UPDATE", old=old)
    assert not wants_approval_check(review)
    assert refusal(review, NOW, may_approve=False) == ""
    assert not parse_exception(edited).approved


def test_removing_an_approval_needs_no_permission() -> None:
    record = {**created(), APPROVED_BY: "security-lead", APPROVED_AT: format_time(NOW), APPROVED_GENERATION: "1"}
    review = write(exception_body(annotations=created()), operation="UPDATE", old=exception_body(annotations=record))
    assert not wants_approval_check(review)
    assert refusal(review, NOW, may_approve=False) == ""


def test_a_plain_create_asks_no_authorization_question() -> None:
    assert not wants_approval_check(write(exception_body()))


def test_the_approval_check_is_the_approve_verb_on_the_approval_subresource() -> None:
    check = approval_check(write(exception_body(), user=APPROVER))
    assert (check.verb, check.group, check.resource, check.subresource, check.namespace, check.name) == (
        "approve", api.GROUP, "admissionpolicyexceptions", "approval", "team-a", "legacy")
    assert check.subject.user == "security-lead" and check.subject.groups == ("security",)


def test_a_recorded_time_far_from_now_is_not_the_webhooks() -> None:
    stale = exception_body(annotations=created(by="tenant-admin", at=NOW - 3 * exceptionreview.CLOCK_SLACK))
    assert "does not name this request" in refusal(write(stale), NOW, may_approve=False)


# --- status --------------------------------------------------------------------------------------------------

APPROVAL_REQUIRED = {"exceptions": {"approval": "Required"}}
APPROVAL_NONE = {"exceptions": {"approval": "None"}}


def no_privileged(**spec: Any) -> api.AdmissionPolicy:
    return policy("no-privileged", validations=[{"expression": "true"}], **spec).policy


def judged(body: dict[str, Any], now: float = NOW, **spec: Any) -> tuple[str, dict[str, Any]]:
    found = [no_privileged(**spec)]
    patch = exceptionstatus.status_patch({}, parse_exception(body), "", body["metadata"]["generation"], found, now)
    return patch["state"], {c["type"]: c for c in patch["conditions"]}


def test_status_active_until_expiry_to_the_second() -> None:
    body = exception_body(annotations=created())
    end = parse_time(EXPIRES, "")
    assert judged(body, end - 1, **APPROVAL_NONE)[0] == "Active"
    state, conditions = judged(body, end, **APPROVAL_NONE)
    assert state == "Expired"
    assert conditions["Active"]["reason"] == "Expired" and EXPIRES in conditions["Active"]["message"]


def test_status_pending_approval_names_the_policy_and_how_to_approve() -> None:
    for spec in ({}, APPROVAL_REQUIRED):   # Required is the default
        state, conditions = judged(exception_body(annotations=created()), **spec)
        assert state == "PendingApproval"
        assert conditions["Approved"]["status"] == "False"
        assert "no-privileged" in conditions["Approved"]["message"]
        assert ("someone allowed to approve other than tenant-admin runs "
                f"`kubectl annotate ape -n team-a legacy {APPROVE}=true`") in conditions["Approved"]["message"]


def test_status_names_the_approver_and_refuses_a_self_approval_an_older_operator_recorded() -> None:
    record = {**created(), APPROVED_BY: "security-lead", APPROVED_AT: format_time(NOW), APPROVED_GENERATION: "1"}
    state, conditions = judged(exception_body(annotations=record))
    assert state == "Active" and conditions["Active"]["message"].endswith(", approved by security-lead")
    own = {**record, APPROVED_BY: "tenant-admin"}
    state, conditions = judged(exception_body(annotations=own))
    assert state == "PendingApproval" and conditions["Approved"]["reason"] == "SelfApproved"
    assert "approved by tenant-admin, who created it or last changed its spec" in conditions["Approved"]["message"]


def test_status_after_a_spec_edit_says_the_approval_was_for_another_generation() -> None:
    record = {**created(), APPROVED_BY: "security-lead", APPROVED_AT: format_time(NOW), APPROVED_GENERATION: "1"}
    assert judged(exception_body(annotations=record), **APPROVAL_REQUIRED)[0] == "Active"
    state, conditions = judged(exception_body(annotations=record, generation=2), **APPROVAL_REQUIRED)
    assert state == "PendingApproval" and conditions["Approved"]["reason"] == "SpecChanged"


def test_status_invalid_names_the_unknown_policy() -> None:
    body = exception_body(annotations=created(), policies=[{"name": "no-such-policy"}])
    state, conditions = judged(body)
    assert state == "Invalid"
    assert "no AdmissionPolicy 'no-such-policy'" in conditions["Valid"]["message"]


def test_status_mirrors_the_record_and_shows_only_an_approval_that_counts() -> None:
    record = {**created(), APPROVED_BY: "security-lead", APPROVED_AT: format_time(NOW), APPROVED_GENERATION: "1"}
    patch = exceptionstatus.status_patch({}, parse_exception(exception_body(annotations=record, generation=2)), "",
                                         2, [no_privileged()], NOW)
    assert patch["createdBy"] == "tenant-admin" and patch["approvedBy"] is None   # void: generation 2
    assert patch["policies"] == "no-privileged" and patch["expiresAt"] == EXPIRES


def test_status_keeps_transition_times_while_a_condition_holds() -> None:
    body = exception_body(annotations=created())
    first = exceptionstatus.status_patch({}, parse_exception(body), "", 1, [no_privileged()], NOW)
    again = exceptionstatus.status_patch(first, parse_exception(body), "", 1, [no_privileged()],
                                         NOW + 60)
    assert again == first


def test_status_of_an_exception_that_does_not_parse() -> None:
    patch = exceptionstatus.status_patch({}, None, "spec.reason: must say why", 1, [], NOW)
    assert patch["state"] == "Invalid"
    assert patch["conditions"][0]["message"] == "spec.reason: must say why"


# --- the replica's store -------------------------------------------------------------------------------------

def test_store_applies_valid_exceptions_and_says_why_it_skips_others() -> None:
    store = ExceptionStore("admission-policy-system")
    store.observe(exception_body(annotations=created()))
    broken = exception_body()
    broken["metadata"]["name"] = "broken"
    broken["spec"]["reason"] = ""
    store.observe(broken)
    assert [c.key for c in store.current] == ["team-a/legacy"]
    assert "spec.reason" in store.invalid["team-a/broken"]
    assert set(store.seen) == {"team-a/legacy", "team-a/broken"}
    store.sync({"team-a/broken"})
    assert len(store.current) == 0 and set(store.seen) == {"team-a/broken"}


def test_store_signals_a_change_but_not_a_status_only_event() -> None:
    store = ExceptionStore("admission-policy-system")
    body = exception_body(annotations=created())
    store.observe(body)
    changed = store.changed()
    with_status = {**body, "status": {"state": "Active"}}
    store.observe(with_status)
    assert not changed.is_set() and store.seen["team-a/legacy"].status == {"state": "Active"}
    store.forget("team-a/legacy")
    assert changed.is_set() and len(store.current) == 0


def test_store_reloads_an_approval() -> None:
    key = "team-a/legacy"
    store = ExceptionStore("admission-policy-system")
    store.observe(exception_body(annotations=created()))
    exception = store.get(key)
    assert exception is not None and not exception.approved
    record = {**created(), APPROVED_BY: "security-lead", APPROVED_AT: format_time(NOW), APPROVED_GENERATION: "1"}
    store.observe(exception_body(annotations=record))
    exception = store.get(key)
    assert exception is not None and exception.approved
