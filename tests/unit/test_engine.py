"""The decision rules of docs/design.md ("Decisions"), through the engine's one entry point."""
from __future__ import annotations

import base64
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from admission_policy import api
from admission_policy.cel import environment, syntax
from admission_policy.cli.documents import load_policies
from admission_policy.config import OperatorConfig
from admission_policy.engine import (
    Phase,
    PolicySet,
    ReviewError,
    build_response,
    decode_review,
    evaluate,
)
from admission_policy.engine.background import FAIL, Forks, audit_object
from admission_policy.engine.request import MAX_JSON_DEPTH
from builders import POD_RULE, decide, namespace_object, pod, policy, request

NO_OFFENSIVE = {"expression": "!object.metadata.name.contains('offensive')", "message": "forbidden name"}


# --- validations and enforcement -------------------------------------------------------------------------

def test_enforce_denies_naming_policy_and_every_failing_message() -> None:
    p = policy("names", validations=[
        NO_OFFENSIVE,
        {"expression": "object.metadata.name.size() < 5", "message": "name too long"},
        {"expression": "true", "message": "never shown"},
    ])
    decision = decide([p], request(pod("offensive-pod")))
    assert not decision.allowed
    assert decision.code == 403 and decision.reason == "Forbidden"
    assert 'AdmissionPolicy "names"' in decision.message
    assert "forbidden name" in decision.message and "name too long" in decision.message
    assert "never shown" not in decision.message


def test_passing_validations_allow() -> None:
    decision = decide([policy(validations=[NO_OFFENSIVE])], request(pod("friendly")))
    assert decision.allowed and decision.message == "" and decision.patch == ()


@pytest.mark.parametrize(("reason", "code"), [("Forbidden", 403), ("Invalid", 422), ("Unauthorized", 401),
                                              ("RequestEntityTooLarge", 413)])
def test_reason_sets_the_http_code(reason: str, code: int) -> None:
    p = policy(validations=[{"expression": "false", "message": "no", "reason": reason}])
    decision = decide([p], request(pod()))
    assert (decision.code, decision.reason) == (code, reason)
    response = build_response(decision, "0000-1111")["response"]
    assert response["status"] == {"code": code, "message": decision.message, "reason": reason}


def test_message_expression_wins_over_message() -> None:
    p = policy(validations=[{**NO_OFFENSIVE, "messageExpression": "'pod ' + object.metadata.name + ' is rude'"}])
    assert 'pod offensive-1 is rude' in decide([p], request(pod("offensive-1"))).message


def test_failing_message_expression_falls_back_to_message() -> None:
    p = policy(validations=[{**NO_OFFENSIVE, "messageExpression": "object.metadata.missing"}])
    decision = decide([p], request(pod("offensive-1")))
    assert "forbidden name" in decision.message
    assert decision.outcomes[0].errors  # the broken messageExpression is reported, not hidden


def test_without_message_the_expression_is_shown() -> None:
    p = policy(validations=[{"expression": "object.metadata.name == 'x'"}])
    assert "failed expression: object.metadata.name == 'x'" in decide([p], request(pod())).message


def test_warn_allows_with_warnings() -> None:
    p = policy("team", enforcement="Warn", validations=[{"expression": "false", "message": "needs a team"}])
    decision = decide([p], request(pod()))
    assert decision.allowed
    assert decision.warnings == ('AdmissionPolicy "team": needs a team',)
    assert build_response(decision, "u")["response"]["warnings"] == list(decision.warnings)


def test_audit_allows_and_records_audit_annotations() -> None:
    p = policy("audited", enforcement="Audit", validations=[{"expression": "false", "message": "would deny"}])
    decision = decide([p], request(pod()))
    assert decision.allowed and not decision.warnings
    assert json.loads(decision.audit_annotations["audited"]) == ["would deny"]
    assert build_response(decision, "u")["response"]["auditAnnotations"] == {"audited": '["would deny"]'}
    assert decision.outcomes[0].result == "audited"


def test_any_enforcing_policy_denies_even_when_others_allow() -> None:
    allow = policy("a-allow", validations=[{"expression": "true"}])
    warn = policy("b-warn", enforcement="Warn", validations=[{"expression": "false", "message": "w"}])
    deny = policy("c-deny", validations=[{"expression": "false", "message": "d"}])
    decision = decide([deny, warn, allow], request(pod()))
    assert not decision.allowed
    assert 'AdmissionPolicy "c-deny" denied the request: d' in decision.message
    assert decision.warnings == ('AdmissionPolicy "b-warn": w',)
    assert [o.policy for o in decision.outcomes] == ["a-allow", "b-warn", "c-deny"]


# --- evaluation errors under both failure policies ----------------------------------------------------------

MISSING_FIELD = {"expression": "object.spec.doesNotExist == 'x'", "message": "m"}


def test_evaluation_error_with_fail_denies_naming_policy_and_expression() -> None:
    decision = decide([policy("strict", validations=[MISSING_FIELD])], request(pod()))
    assert not decision.allowed
    assert 'AdmissionPolicy "strict"' in decision.message
    assert "spec.validations[0].expression" in decision.message
    assert "doesNotExist" in decision.message


def test_evaluation_error_with_ignore_skips_the_validation_and_counts_it() -> None:
    p = policy("lenient", failurePolicy="Ignore", validations=[MISSING_FIELD, {"expression": "true"}])
    decision = decide([p], request(pod()))
    assert decision.allowed
    assert len(decision.outcomes[0].errors) == 1
    assert "spec.validations[0].expression" in decision.outcomes[0].errors[0]


def test_evaluation_error_under_warn_becomes_a_warning() -> None:
    p = policy("w", enforcement="Warn", validations=[MISSING_FIELD])
    decision = decide([p], request(pod()))
    assert decision.allowed and "doesNotExist" in decision.warnings[0]


def test_non_boolean_result_is_an_evaluation_error() -> None:
    p = policy(validations=[{"expression": "object.metadata.name"}])
    decision = decide([p], request(pod()))
    assert not decision.allowed and "must evaluate to a bool" in decision.message


def test_iteration_budget_is_an_evaluation_error_not_a_crash() -> None:
    p = policy(validations=[{"expression": "object.spec.xs.all(x, object.spec.xs.all(y, x + y >= 0))"}])
    decision = decide([p], request(pod(xs=list(range(3000)))))
    assert not decision.allowed and "budget" in decision.message.lower()


def test_condition_error_follows_failure_policy() -> None:
    cond = {"match": {"conditions": [{"name": "broken", "expression": "object.nope == 1"}]}}
    strict = policy("strict", validations=[{"expression": "true"}], **cond)
    lenient = policy("lenient", failurePolicy="Ignore", validations=[{"expression": "false"}], **cond)
    assert not decide([strict], request(pod())).allowed
    decision = decide([lenient], request(pod()))
    assert decision.allowed and decision.outcomes[0].errors


def test_mutation_error_with_fail_denies_and_with_ignore_skips() -> None:
    broken = [{"name": "broken", "jsonPatch": [
        {"op": "add", "path": "/metadata/labels/x", "valueExpression": "object.nope"}]},
        {"name": "ok", "merge": {"metadata": {"labels": {"ok": "yes"}}}}]
    denied = decide([policy("strict", mutations=broken)], request(pod()))
    assert not denied.allowed and "spec.mutations[0].jsonPatch[0].valueExpression" in denied.message
    assert denied.patch == ()
    skipped = decide([policy("lenient", failurePolicy="Ignore", mutations=broken)], request(pod()))
    assert skipped.allowed
    assert skipped.patched_object["metadata"]["labels"] == {"ok": "yes"}


def test_failed_patch_operation_leaves_the_object_as_before_that_mutation() -> None:
    mutations = [{"name": "half", "jsonPatch": [
        {"op": "add", "path": "/metadata/labels", "value": {"a": "1"}},
        {"op": "remove", "path": "/spec/absent"}]}]
    decision = decide([policy(failurePolicy="Ignore", mutations=mutations)], request(pod()))
    assert decision.allowed and decision.patch == ()
    assert "remove /spec/absent" in decision.outcomes[0].errors[0]


# --- matching ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("resources", "resource", "sub", "expected"), [
    (["pods"], "pods", "", True),
    (["pods"], "pods", "status", False),
    (["pods/status"], "pods", "status", True),
    (["pods/status"], "pods", "", False),
    (["pods/*"], "pods", "exec", True),
    (["pods/*"], "pods", "", False),
    (["*"], "pods", "", True),
    (["*"], "pods", "status", False),
    (["*/status"], "nodes", "status", True),
    (["*/*"], "pods", "exec", True),
    (["deployments"], "pods", "", False),
])
def test_resource_rules_with_wildcards_and_subresources(resources: list[str], resource: str, sub: str,
                                                        expected: bool) -> None:
    rule = {"apiGroups": [""], "apiVersions": ["*"], "resources": resources, "operations": ["*"]}
    p = policy(rules=[rule], validations=[{"expression": "false"}])
    decision = decide([p], request(pod(), resource=resource, sub_resource=sub))
    assert (not decision.allowed) is expected


@pytest.mark.parametrize(("operations", "operation", "expected"), [
    (["CREATE"], "CREATE", True), (["CREATE"], "UPDATE", False), (["*"], "DELETE", True),
    (["DELETE"], "DELETE", True), (["CONNECT"], "CONNECT", True),
])
def test_operations(operations: list[str], operation: str, expected: bool) -> None:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": operations}
    p = policy(rules=[rule], validations=[{"expression": "false"}])
    obj = None if operation in ("DELETE", "CONNECT") else pod()
    old = pod() if operation in ("UPDATE", "DELETE") else None
    assert (not decide([p], request(obj, operation=operation, old=old)).allowed) is expected


def test_group_and_version_must_match() -> None:
    rule = {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"], "operations": ["*"]}
    p = policy(rules=[rule], validations=[{"expression": "false"}])
    assert not decide([p], request({}, resource="deployments", group="apps")).allowed
    assert decide([p], request({}, resource="deployments", group="extensions")).allowed
    assert decide([p], request({}, resource="deployments", group="apps", version="v1beta1")).allowed


def test_namespace_selector_match_labels_and_expressions() -> None:
    selector = {"matchLabels": {"env": "prod"},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["sandbox"]},
                                     {"key": "team", "operator": "Exists"}]}
    p = policy(validations=[{"expression": "false"}], match={"namespaceSelector": selector})
    req = request(pod())
    assert not decide([p], req, namespace_object({"env": "prod", "team": "a"})).allowed
    assert decide([p], req, namespace_object({"env": "prod", "team": "a", "tier": "sandbox"})).allowed
    assert decide([p], req, namespace_object({"env": "prod"})).allowed
    assert decide([p], req, namespace_object({"env": "dev", "team": "a"})).allowed


def test_a_namespace_that_could_not_be_read_is_no_reason_to_skip_a_policy() -> None:
    """Its labels are unknown, not empty: a namespaceSelector policy gets its failurePolicy answer
    (it was skipped: an allow the policy might have denied); the others are judged as usual."""
    selected = policy("prod-only", validations=[{"expression": "true"}],
                      match={"namespaceSelector": {"matchLabels": {"env": "prod"}}})
    ignored = policy("prod-ignore", failurePolicy="Ignore", validations=[{"expression": "false"}],
                     match={"namespaceSelector": {"matchLabels": {"env": "prod"}}})
    everywhere = policy("everywhere", validations=[NO_OFFENSIVE])
    decision = evaluate(PolicySet([selected, ignored, everywhere]), request(pod()),
                        namespace_error="reading namespace default failed: 503 Service Unavailable")
    assert not decision.allowed
    assert decision.message == ('AdmissionPolicy "prod-only" could not evaluate the request: spec.match.'
                                "namespaceSelector cannot be judged: reading namespace default failed: 503 Service "
                                "Unavailable")
    assert sorted(o.policy for o in decision.outcomes if o.errors) == ["prod-ignore", "prod-only"]
    assert not [o for o in decision.outcomes if o.policy == "everywhere" and (o.errors or o.denied)]


def test_namespace_selector_is_ignored_for_cluster_scoped_objects() -> None:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes"], "operations": ["*"]}
    p = policy(rules=[rule], validations=[{"expression": "false"}],
               match={"namespaceSelector": {"matchLabels": {"env": "prod"}}})
    assert not decide([p], request({"metadata": {"name": "n1"}}, resource="nodes", namespace="")).allowed


def test_namespace_selector_on_a_namespace_uses_its_own_labels() -> None:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "operations": ["*"]}
    p = policy(rules=[rule], validations=[{"expression": "false"}],
               match={"namespaceSelector": {"matchLabels": {"env": "prod"}}})
    prod = {"metadata": {"name": "shop", "labels": {"env": "prod"}}}
    assert not decide([p], request(prod, resource="namespaces", namespace="")).allowed
    assert decide([p], request({"metadata": {"name": "x"}}, resource="namespaces", namespace="")).allowed


def test_object_selector_matches_old_or_new_labels() -> None:
    p = policy(validations=[{"expression": "false"}],
               match={"objectSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}})
    assert not decide([p], request(pod(labels={"app": "web"}))).allowed
    assert decide([p], request(pod(labels={"app": "db"}))).allowed
    assert decide([p], request(pod())).allowed
    # The label is being removed: the old object still matches, so the policy applies.
    relabel = request(pod(labels={}), operation="UPDATE", old=pod(labels={"app": "web"}))
    assert not decide([p], relabel).allowed


def test_exclude_namespaces() -> None:
    p = policy(validations=[{"expression": "false"}], match={"excludeNamespaces": ["default"]})
    assert decide([p], request(pod())).allowed
    assert not decide([p], request(pod(), namespace="other")).allowed


def test_cel_conditions_must_all_be_true() -> None:
    conditions = [{"name": "not-system", "expression": "!request.userInfo.username.startsWith('system:')"},
                  {"name": "labelled", "expression": "has(object.metadata.labels)"}]
    p = policy(validations=[{"expression": "false"}], match={"conditions": conditions})
    assert not decide([p], request(pod(labels={}))).allowed
    assert decide([p], request(pod())).allowed


# --- DELETE and CONNECT ---------------------------------------------------------------------------------

def test_delete_has_null_object_and_the_old_one() -> None:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["DELETE"]}
    p = policy(rules=[rule], validations=[{
        "expression": "object == null && oldObject.metadata.name == 'web' && request.operation == 'DELETE'",
        "message": "saw the delete"}])
    decision = decide([p], request(None, operation="DELETE", old=pod(),
                                   options={"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}))
    assert decision.allowed, decision.message


def test_connect_sees_options_object() -> None:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/exec"], "operations": ["CONNECT"]}
    p = policy(rules=[rule], validations=[{"expression": "object.command[0] != 'sh'", "message": "no shells"}])
    exec_options = {"kind": "PodExecOptions", "apiVersion": "v1", "command": ["sh"], "stdin": True}
    decision = decide([p], request(exec_options, operation="CONNECT", sub_resource="exec"))
    assert not decision.allowed and "no shells" in decision.message


def test_mutations_are_skipped_without_an_object() -> None:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["DELETE"]}
    p = policy(rules=[rule], mutations=[{"merge": {"metadata": {"labels": {"a": "b"}}}}])
    decision = decide([p], request(None, operation="DELETE", old=pod()))
    assert decision.allowed and decision.patch == () and decision.evaluations == 0


# --- variables ----------------------------------------------------------------------------------------------

def test_variables_are_lazy_and_computed_once() -> None:
    p = policy(
        variables=[{"name": "images", "expression": "object.spec.containers.map(c, c.image)"},
                   {"name": "count", "expression": "size(variables.images)"},
                   {"name": "broken", "expression": "object.nothing.here"}],
        validations=[{"expression": "variables.count == 1"},
                     {"expression": "variables.images.all(i, i == 'nginx')"}],
    )
    decision = decide([p], request(pod()))
    assert decision.allowed, decision.message           # "broken" is never read, so never fails
    assert decision.evaluations == 1                     # the policy's validations run as one program


def test_failures_get_their_message_expressions_from_the_same_program() -> None:
    """A denial costs about what an admission does: the messages of the validations that fail
    come out of the policy's one program (and only theirs are built)."""
    p = policy(variables=[{"name": "images", "expression": "object.spec.containers.map(c, c.image)"}],
               validations=[{"expression": "variables.images.all(i, i.contains('@'))",
                             "messageExpression": "'unpinned: ' + variables.images.join(', ')"},
                            {"expression": "size(variables.images) < 5", "messageExpression": "'never built'"},
                            {"expression": "object.metadata.name != 'web'", "message": "not web"},
                            {"expression": "false", "messageExpression": "'  '"}])   # blank: the source instead
    decision = decide([p], request(pod()))
    assert decision.message == ('AdmissionPolicy "p" denied the request: unpinned: nginx; not web; '
                                "failed expression: false")
    assert decision.evaluations == 1


def test_offenders_only_a_message_reads_are_computed_only_on_a_denial() -> None:
    """The Pod Security examples' layout: a true/false check, and a variable listing the offenders
    that only the messageExpression reads. The batch binds variables lazily (``cel.bind``), so an
    admitted request computes the checks alone: the offenders' variable here would err, and
    computing it would show as a fallback to one program per expression. A denial builds its
    message, offenders and all, in the same one program."""
    p = policy(variables=[{"name": "offenders", "expression": "object.nothing.here"},
                          {"name": "named", "expression": "object.spec.containers.map(c, c.name)"}],
               validations=[{"expression": "object.metadata.name != 'web'",
                             "messageExpression": "'offenders: ' + variables.offenders.join(', ')"},
                            {"expression": "object.spec.containers.all(c, c.image.contains('@'))",
                             "messageExpression": "'unpinned: ' + variables.named.join(', ')"}])
    admitted = decide([p], request(pod("api", images=["nginx@sha256:0"])))
    assert admitted.allowed and admitted.evaluations == 1
    denied = decide([p], request(pod("api")))
    assert not denied.allowed and denied.message.endswith("unpinned: c") and denied.evaluations == 1


def test_an_erring_validation_is_found_by_evaluating_one_at_a_time() -> None:
    p = policy(variables=[{"name": "images", "expression": "object.spec.containers.map(c, c.image)"},
                          {"name": "broken", "expression": "object.nothing.here"}],
               validations=[{"expression": "variables.images.all(i, i == 'nginx')"},
                            {"expression": "size(variables.broken) == 0", "message": "m"},
                            {"expression": "false", "message": "always fails"}])
    decision = decide([p], request(pod()))
    assert not decision.allowed
    assert "spec.variables[1].expression" in decision.message and "always fails" in decision.message
    assert decision.evaluations == 1 + 4     # the batch, then images, the check reading it, broken, false


def test_a_failing_variable_fails_the_expressions_that_read_it() -> None:
    p = policy(variables=[{"name": "x", "expression": "object.nothing"}],
               validations=[{"expression": "variables.x == 1"}])
    decision = decide([p], request(pod()))
    assert not decision.allowed and "spec.variables[0].expression" in decision.message


# --- mutations ---------------------------------------------------------------------------------------------

def applied(decision: Any, original: Any) -> Any:
    """The object the API server ends up with: the response's patch applied to the original."""
    response = build_response(decision, "u")["response"]
    if "patch" not in response:
        return original
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(original, ops)


def test_json_patch_add_creates_missing_parents() -> None:
    p = policy(mutations=[{"jsonPatch": [
        {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "k", "operator": "Exists"}},
        {"op": "add", "path": "/metadata/annotations/acme.com~1seen", "valueExpression": "'yes'"}]}])
    original = pod()
    decision = decide([p], request(original))
    result = applied(decision, original)
    assert result["spec"]["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert result["metadata"]["annotations"] == {"acme.com/seen": "yes"}
    assert result == decision.patched_object
    assert original == pod()  # the request's object is never changed in place


def test_merge_overwrite_and_if_absent() -> None:
    original = pod(labels={"team": "payments"})
    overwrite = policy("a", mutations=[{"merge": {"metadata": {"labels": {"team": "x", "tier": "web"}}}}])
    if_absent = policy("a", mutations=[{"merge": {"metadata": {"labels": {"team": "x", "tier": "web"}}},
                                        "mergeMode": "IfAbsent"}])
    assert decide([overwrite], request(original)).patched_object["metadata"]["labels"] == {
        "team": "x", "tier": "web"}
    assert decide([if_absent], request(original)).patched_object["metadata"]["labels"] == {
        "team": "payments", "tier": "web"}


def test_merge_null_removes_a_field() -> None:
    p = policy(mutations=[{"merge": {"metadata": {"labels": {"drop": None}}}}])
    decision = decide([p], request(pod(labels={"drop": "1", "keep": "2"})))
    assert decision.patched_object["metadata"]["labels"] == {"keep": "2"}


def test_mutations_compose_in_name_order_each_seeing_the_previous() -> None:
    # Idempotent, as mutations must be: each step once (a-first runs again after b-second).
    first = policy("a-first", mutations=[
        {"name": "one", "merge": {"metadata": {"labels": {"step": "1"}}}, "mergeMode": "IfAbsent"},
        {"name": "two", "condition": "!object.metadata.labels.step.contains('2')",
         "jsonPatch": [{"op": "replace", "path": "/metadata/labels/step",
                        "valueExpression": "object.metadata.labels.step + '2'"}]}])
    second = policy("b-second", mutations=[{"condition": "!object.metadata.labels.step.contains('3')", "jsonPatch": [
        {"op": "replace", "path": "/metadata/labels/step", "valueExpression": "object.metadata.labels.step + '3'"}]}])
    original = pod()
    decision = decide([second, first], request(original))
    assert decision.patched_object["metadata"]["labels"]["step"] == "123"
    assert applied(decision, original) == decision.patched_object
    assert [o.mutated for o in decision.outcomes] == [True, True]


def test_validations_see_the_mutated_object_in_phase_all() -> None:
    p = policy(mutations=[{"merge": {"metadata": {"labels": {"team": "unassigned"}}}, "mergeMode": "IfAbsent"}],
               validations=[{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels"}])
    assert decide([p], request(pod())).allowed
    # The validating webhook alone sees the object as the API server sends it.
    assert not decide([p], request(pod()), phase=Phase.VALIDATE).allowed
    mutate_only = decide([p], request(pod()), phase=Phase.MUTATE)
    assert mutate_only.allowed and mutate_only.patch


def test_later_policies_see_the_object_as_mutated_so_far() -> None:
    # "a" reads the object before mutating it, so a binding of the unmutated object exists by then.
    a = policy("a", match={"conditions": [{"name": "web", "expression": "object.metadata.name == 'web'"}]},
               mutations=[{"merge": {"metadata": {"labels": {"team": "x"}}}}])
    b = policy("b", validations=[{"expression": "object.metadata.?labels.?team.orValue('') == 'x'"}],
               mutations=[{"jsonPatch": [{"op": "add", "path": "/metadata/labels/seen",
                                          "valueExpression": "object.metadata.labels.team"}]}])
    decision = decide([b, a], request(pod("web")))
    assert decision.allowed, decision.message
    assert decision.patched_object["metadata"]["labels"] == {"team": "x", "seen": "x"}


MANAGED_FIELDS = [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:metadata": {"f:labels": {}}}}]


def managed_pod() -> dict[str, Any]:
    body = pod(labels={"app": "web"})
    body["metadata"]["managedFields"] = MANAGED_FIELDS
    return body


def test_managed_fields_are_bound_only_for_policies_that_name_them() -> None:
    # Iterating over metadata's keys would find them, if they were there.
    unaware = policy("unaware", validations=[
        {"expression": "object.metadata.all(k, k in ['name', 'namespace', 'labels'])"},
        {"expression": "oldObject.metadata.all(k, k in ['name', 'namespace', 'labels'])"}])
    aware = policy("aware", validations=[
        {"expression": "object.metadata.managedFields.all(f, f.manager == 'kubectl')"},
        {"expression": "oldObject.metadata.managedFields[0].manager == 'kubectl'"}])
    decision = decide([unaware, aware], request(managed_pod(), operation="UPDATE", old=managed_pod()))
    assert decision.allowed, decision.message


def test_mutations_keep_managed_fields() -> None:
    p = policy(mutations=[{"jsonPatch": [{"op": "replace", "path": "/metadata/labels/app",
                                          "valueExpression": "object.metadata.labels.app + '-v2'"}]}])
    original = managed_pod()
    decision = decide([p], request(original))
    assert decision.patch == ({"op": "replace", "path": "/metadata/labels/app", "value": "web-v2"},)
    assert decision.patched_object["metadata"]["managedFields"] == MANAGED_FIELDS


def test_mutation_that_changes_nothing_produces_no_patch() -> None:
    p = policy(mutations=[{"merge": {"metadata": {"labels": {"a": "b"}}}, "mergeMode": "IfAbsent"}])
    decision = decide([p], request(pod(labels={"a": "already"})))
    assert decision.patch == () and "patch" not in build_response(decision, "u")["response"]
    assert decision.outcomes[0].mutated is False


def test_a_mutation_to_true_where_1_was_is_a_change() -> None:
    # Python takes 1 == True; JSON, the API server and the patch do not.
    p = policy(mutations=[{"merge": {"spec": {"flag": True}}}])
    original = pod(containers=[{"name": "c", "image": "nginx"}], flag=1)
    decision = decide([p], request(original))
    assert decision.patch == ({"op": "replace", "path": "/spec/flag", "value": True},)
    assert decision.outcomes[0].mutated is True


def test_mutation_condition_skips() -> None:
    p = policy(mutations=[{"condition": "object.metadata.name == 'special'",
                           "merge": {"metadata": {"labels": {"special": "yes"}}}}])
    assert decide([p], request(pod("plain"))).patch == ()
    assert decide([p], request(pod("special"))).patch


def test_patch_values_are_not_shared_between_requests() -> None:
    p = policy(mutations=[{"jsonPatch": [{"op": "add", "path": "/spec/tolerations", "value": []}]},
                          {"jsonPatch": [{"op": "add", "path": "/spec/tolerations/-", "value": {"key": "k"}}]}])
    first = decide([p], request(pod())).patched_object
    second = decide([p], request(pod())).patched_object
    assert first["spec"]["tolerations"] == second["spec"]["tolerations"] == [{"key": "k"}]


# --- the response ------------------------------------------------------------------------------------------

def test_response_is_a_complete_admission_review() -> None:
    p = policy(mutations=[{"merge": {"metadata": {"labels": {"a": "b"}}}}])
    decision = decide([p], request(pod()))
    review = build_response(decision, "0000-1111")
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    assert review["response"]["uid"] == "0000-1111"
    assert review["response"]["allowed"] is True
    assert json.loads(base64.b64decode(review["response"]["patch"])) == [
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]


# --- the index ---------------------------------------------------------------------------------------------

def test_a_request_no_rule_names_evaluates_no_cel() -> None:
    p = policy(validations=[{"expression": "false"}],
               match={"conditions": [{"name": "c", "expression": "true"}]})
    decision = decide([p], request({}, resource="configmaps"))
    assert decision.allowed and decision.evaluations == 0 and decision.outcomes == ()


def test_cost_grows_with_matching_policies_not_installed_ones() -> None:
    matching = [policy(f"match-{i}", validations=[{"expression": "true"}],
                       match={"conditions": [{"name": "c", "expression": "true"}]}) for i in range(3)]
    other_rule = {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"], "operations": ["*"]}
    others = [policy(f"other-{i}", rules=[other_rule], validations=[{"expression": "true"}]) for i in range(500)]
    small = decide(matching, request(pod()))
    large = decide(matching + others, request(pod()))
    assert small.evaluations == large.evaluations == 3     # conditions and validations: one program each
    assert PolicySet(matching + others).candidates(request(pod())) == PolicySet(matching).candidates(request(pod()))


def test_policy_set_updates_are_new_sets() -> None:
    a, b = policy("a", validations=[{"expression": "true"}]), policy("b", validations=[{"expression": "true"}])
    first = PolicySet([a])
    second = first.replace(b)
    assert [p.name for p in first] == ["a"] and [p.name for p in second] == ["a", "b"]
    assert [p.name for p in second.remove("a")] == ["b"]
    with pytest.raises(ValueError, match="unique"):
        PolicySet([a, a])


def test_replacing_a_policy_drops_its_old_routes() -> None:
    deployments = {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"], "operations": ["*"]}
    before = PolicySet([policy("p", validations=[{"expression": "false"}]),
                        # (q judges no Pod templates: deployments reach p alone)
                        policy("q", validations=[{"expression": "false"}], podControllers=[])])
    after = before.replace(policy("p", rules=[deployments], validations=[{"expression": "false"}]))
    assert [p.name for p in after.candidates(request(pod()))] == ["q"]
    assert [p.name for p in after.candidates(request({}, resource="deployments", group="apps"))] == ["p"]
    assert [p.name for p in before.candidates(request(pod()))] == ["p", "q"]   # the old set is untouched
    assert after.remove("nope") is after and len(after.remove("p")) == 1


def test_every_example_policy_with_validations_runs_as_one_program() -> None:
    """The batch is an optimisation with a silent fallback: make sure it is really in use."""
    from pathlib import Path

    from admission_policy.cli.documents import load_policies

    examples = Path(__file__).parents[2] / "examples"
    # Plugins run one at a time, in order with the CEL ones: no batch for a policy using one.
    policies = [p for p in load_policies([examples]) if p.validations and not any(p.plugins())]
    assert len(policies) >= 10
    assert [p.name for p in policies if p.validation_batch is None] == []


# --- issue 18: cost, memory, deadlines, malformed input (evaluate never raises) -----------------------

@pytest.mark.parametrize(("body", "expected"), [
    (b'{"a": [1, 2.5, "x", null, true], "b": {"c": -0}}', {"a": [1, 2.5, "x", None, True], "b": {"c": 0}}),
    (b'{"n": 9223372036854775807, "m": -9223372036854775808}', {"n": 2**63 - 1, "m": -2**63}),   # int64, exact
    (b'{"n": 123456789012345678901234567890}', {"n": 1.2345678901234568e29}),   # beyond: a double, as Go reads it
    (b'{"n": 123456789012345678901234567890, "many": [' + b"[], " * MAX_JSON_DEPTH + b'[]]}',   # the slow way
     {"n": 1.2345678901234568e29, "many": [[]] * (MAX_JSON_DEPTH + 1)}),
    (b'{"s": "\\ud800"}', {"s": "\ud800"}),                                              # JSON, not Unicode
    (b'{"a": 1e-400}', {"a": 0.0}),
])
def test_a_review_body_decodes_as_the_json_it_is(body: bytes, expected: Any) -> None:
    assert decode_review(body) == expected


@pytest.mark.parametrize(("body", "error"), [
    (b'{"a": NaN}', "NaN is not a JSON number"),
    (b'{"a": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"a": 1e400}', "number 1e400 is out of range"),
    (b'{"a": "\xff"}', "the body is not UTF-8 (byte 7)"),
    (b'{"a": 1,}', "not JSON: "),
    (b"[" * (MAX_JSON_DEPTH + 50) + b"]" * (MAX_JSON_DEPTH + 50), f"JSON nested deeper than {MAX_JSON_DEPTH} levels"),
])
def test_a_review_body_that_is_not_json_is_refused_saying_why(body: bytes, error: str) -> None:
    with pytest.raises(ReviewError) as caught:
        decode_review(body)
    assert str(caught.value).startswith(error)


def test_a_review_body_nested_to_the_limit_decodes() -> None:
    deep = decode_review(b'{"a": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}")
    depth = 0
    while isinstance(deep, (dict, list)) and deep:
        deep, depth = (deep["a"] if isinstance(deep, dict) else deep[0]), depth + 1
    assert depth == MAX_JSON_DEPTH - 1

def wide_pod(containers: int) -> dict[str, Any]:
    return pod(containers=[{"name": f"c{i}", "image": "i"} for i in range(containers)])


def test_map_and_filter_results_are_unchanged_by_linear_accumulation() -> None:
    """The rewritten accumulation (syntax.linearize) gives the same items in the same order, on
    both sides of its chunk size, nested, with filters whose conditions loop over maps."""
    cases = {
        "object.spec.containers.map(c, c.name)": lambda names: names,
        "object.spec.containers.filter(c, int(c.name.substring(1)) % 3 == 0).map(c, c.name)":
            lambda names: [n for n in names if int(n[1:]) % 3 == 0],
        "object.spec.containers.map(c, int(c.name.substring(1)) % 2 == 0, [c.name, c.image])":
            lambda names: [[n, "i"] for n in names if int(n[1:]) % 2 == 0],
        "object.spec.containers.filter(c, c.exists(k, k == 'image')).map(c, c.name + '!')":
            lambda names: [n + "!" for n in names],
        "object.spec.containers.map(c, object.spec.containers.filter(d, d.name < c.name).size())":
            lambda names: [sum(other < n for other in names) for n in names],
    }
    p = policy(mutations=[{"name": f"m{i}", "jsonPatch": [{"op": "add", "path": f"/spec/r{i}", "valueExpression": e}]}
                          for i, e in enumerate(cases)])
    for count in (0, 1, 31, 32, 33, 65):
        decision = decide([p], request(wide_pod(count)))
        names = [f"c{i}" for i in range(count)]
        spec = decision.patched_object["spec"]
        assert [spec[f"r{i}"] for i in range(len(cases))] == [expected(names) for expected in cases.values()]


def test_bound_maps_read_through_their_identifiers_give_the_same_results() -> None:
    """What syntax.inline_bound_maps rewrites (a validation batch's ``variables``) keeps its
    meaning, also where a comprehension binds the map's name or its identifiers again."""
    cases = {
        "cel.bind(m, {'a': 1}, m.a)": 1,
        "cel.bind(x, 5, cel.bind(m, {'a': x}, [1, 2].map(x, m.a)))": [5, 5],       # x bound again: kept
        "cel.bind(x, 5, cel.bind(m, {'a': x}, [1, 2].map(y, m.a + y)))": [6, 7],
        "cel.bind(x, 5, cel.bind(m, {'a': x}, [1, 2].map(m, m)))": [1, 2],           # m bound again
        "cel.bind(x, 5, cel.bind(m, {'a': x}, has(m.a) && m.a == 5))": True,          # has() reads the map
        "cel.bind(x, 5, cel.bind(m, {'a': x}, size(m)))": 1,
        "cel.bind(x, 5, cel.bind(m, {'a': x}, m.a + cel.bind(m, {'a': 7}, m.a)))": 12,
    }
    p = policy(mutations=[{"name": f"m{i}", "jsonPatch": [{"op": "add", "path": f"/spec/r{i}", "valueExpression": e}]}
                          for i, e in enumerate(cases)])
    spec = decide([p], request(pod())).patched_object["spec"]
    assert [spec[f"r{i}"] for i in range(len(cases))] == list(cases.values())
    absent = {"op": "add", "path": "/spec/r", "valueExpression": "cel.bind(m, {'a': 1}, m.b)"}
    missing = decide([policy(mutations=[{"name": "m", "jsonPatch": [absent]}])], request(pod()))
    assert not missing.allowed and "Key not found in map" in missing.message


def test_a_validation_batch_reads_its_variables_without_the_map() -> None:
    source = "cel.bind(v, 1, cel.bind(variables, {'v': v}, variables.v == 1 && [2].all(x, variables.v < x)))"
    tree = syntax.Checked.decode(environment._environment(0).compile(source).serialize())
    assert syntax.inline_bound_maps(tree)
    assert "variables" not in {node.name for node in syntax.walk(tree.root) if node.kind == "ident"}


def _peak_rss_growth_mb(code: str) -> float:
    """Peak RSS growth (MB) while a fresh interpreter runs ``code`` after the imports."""
    import subprocess
    import sys
    script = (
        "import resource, sys\n"
        "from admission_policy import api\n"
        "from admission_policy.engine import PolicySet, compile_policy, evaluate, parse_review\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"{code}\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)\n")
    return float(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                text=True).stdout.strip().splitlines()[-1])


def test_a_map_over_5000_items_takes_memory_linear_in_the_items() -> None:
    """Issue 18: `object.spec.containers.map(c, c.name)` on 5,000 containers took 442 MB (each
    append copied the list, and nothing was freed before the end). Linear, it is a few MB."""
    grown = _peak_rss_growth_mb(
        "body = {'apiVersion': 'policy-operator.dev/v1alpha1', 'kind': 'AdmissionPolicy', 'metadata': {'name': 'p'},"
        " 'spec': {'match': {'resources': [{'apiGroups': [''], 'apiVersions': ['v1'], 'resources': ['pods'],"
        " 'operations': ['CREATE']}]}, 'validations': [{'expression': 'object.spec.containers.map(c, c.name)"
        ".size() >= 0'}]}}\n"
        "pod = {'metadata': {'name': 'w'}, 'spec': {'containers': [{'name': f'c{i}', 'image': 'i'}"
        " for i in range(5000)]}}\n"
        "review = {'kind': 'AdmissionReview', 'request': {'uid': '1', 'operation': 'CREATE', 'object': pod,"
        " 'resource': {'group': '', 'version': 'v1', 'resource': 'pods'}}}\n"
        "decision = evaluate(PolicySet([compile_policy(api.parse_policy(body))]), parse_review(review))\n"
        "assert decision.allowed, decision.message")
    assert grown < 60, f"peak RSS grew {grown:.0f} MB"


def test_estimated_cost_of_a_map_grows_linearly_with_the_items() -> None:
    from admission_policy import cel
    from admission_policy.api import Expression
    from admission_policy.cel import estimation
    compiled = cel.compile_expression(Expression("object.spec.containers.map(c, c.name).size() >= 0", "p"))
    small, _ = compiled.estimate(estimation.Sizes(10_000, 1_000))
    large, _ = compiled.estimate(estimation.Sizes(20_000, 2_000))
    assert 1.9 < large / small < 2.1


def test_a_deadline_gives_the_policy_at_hand_its_failure_policy_answer() -> None:
    ticks = iter(range(100))

    def clock() -> float:
        return float(next(ticks))

    fail = policy("a-fail", validations=[{"expression": "true"}, {"expression": "true"}])
    ignore = policy("b-ignore", failurePolicy="Ignore", validations=[{"expression": "true"}])
    decision = evaluate(PolicySet([fail, ignore]), request(pod()), deadline=1.5, clock=clock)
    assert not decision.allowed
    assert 'AdmissionPolicy "a-fail" could not evaluate the request: evaluation deadline exceeded' in decision.message
    assert "b-ignore" not in decision.message
    outcome = {o.policy: o for o in decision.outcomes}
    assert outcome["b-ignore"].errors and "deadline exceeded" in outcome["b-ignore"].errors[0]
    assert not outcome["b-ignore"].denied
    # Without a deadline, or before it, nothing changes.
    assert evaluate(PolicySet([fail, ignore]), request(pod())).allowed
    assert evaluate(PolicySet([fail, ignore]), request(pod()), deadline=1e9, clock=clock).allowed


def test_with_the_real_clock_a_request_gives_the_event_loop_back_at_its_deadline() -> None:
    """Issue 12: the engine runs on the webhook's event loop, so a request whose policies together
    take longer than its deadline must stop there (the rest get their failurePolicy answer), not
    run them all while every other request waits. The deadline is ten times what one policy takes
    here, measured first (the best of three, so that a pause of the collector in a long test run
    does not inflate it): the machine's speed does not matter, only that it stops part-way."""
    import time
    check = {"expression": "object.spec.containers.all(c, c.image.split(':').all(p, p != ''))"}
    slow = [policy(f"slow-{i:02d}", failurePolicy="Ignore", validations=[check]) for i in range(60)]
    big = request(wide_pod(2_000))
    times = []
    for _ in range(3):
        started = time.monotonic()
        assert evaluate(PolicySet(slow[:1]), big).evaluations == 1
        times.append(time.monotonic() - started)
    one = min(times)
    decision = evaluate(PolicySet(slow), big, deadline=time.monotonic() + 10 * one)
    assert decision.allowed   # failurePolicy Ignore: the policies left out do not deny
    stopped = [o.policy for o in decision.outcomes if any("evaluation deadline exceeded" in e for e in o.errors)]
    assert stopped and stopped[-1] == "slow-59", "the deadline stopped nothing"
    assert decision.evaluations < len(slow) and decision.evaluations + len(stopped) == len(slow)


EXAMPLES = Path(__file__).parents[2] / "examples"


def _pss(*, privileged: bool, annotations: dict[str, str], containers: int = 1) -> dict[str, Any]:
    context = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
               "seccompProfile": {"type": "RuntimeDefault"}, "privileged": privileged}
    return pod(containers=[{"name": f"c{i}", "image": "nginx:1.25", "securityContext": context,
                            "env": [{"name": f"E{j}", "value": "v" * 100} for j in range(50)]}
                           for i in range(containers)]) | {"metadata": {"name": "big", "namespace": "default",
                                                                           "annotations": annotations}}


@pytest.mark.parametrize(("annotations", "containers"), [
    ({"note": "x" * 200_000}, 1),                                     # one 200,000-character annotation
    ({f"a{i}": "y" * 1_000 for i in range(250)}, 150),               # ~1.25 MB: 250 kB of annotations
], ids=["200k-annotation", "1.25MB-object"])
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_legal_large_pod_is_judged_by_the_pod_security_examples_never_refused_for_its_size(
        annotations: dict[str, str], containers: int, operation: str) -> None:
    """Kubernetes admits such Pods; an estimate of what the policies could cost on them (tens of
    millions) once denied them. Judged for real now: compliant admitted, privileged denied."""
    policies = load_policies([EXAMPLES / "pod-security-baseline", EXAMPLES / "pod-security-restricted"])
    for privileged, allowed in ((False, True), (True, False)):
        body = _pss(privileged=privileged, annotations=annotations, containers=containers)
        old = _pss(privileged=False, annotations={}, containers=1) if operation == "UPDATE" else None
        decision = evaluate(PolicySet(policies), request(body, operation=operation, old=old),
                            deadline=time.monotonic() + OperatorConfig().evaluation_deadline)
        assert decision.allowed is allowed, decision.message
        assert all(not outcome.errors for outcome in decision.outcomes), decision.outcomes
        if not allowed:
            assert "privileged" in decision.message.lower()


def test_an_expression_still_running_at_the_deadline_is_stopped_there_and_answered_by_its_failure_policy() -> None:
    """Each of 5,000 names ("c1", "c2" …) searched for in 3 MB of "c": ~15 GB of comparing. Over
    its budget on this request, it runs in a child process, which is killed at the deadline."""
    check = {"expression": "object.spec.containers.all(c, !object.metadata.annotations.blob.contains(c.name))"}
    big = wide_pod(5_000)
    big["metadata"]["annotations"] = {"blob": "c" * 3_000_000}
    review = request(big)
    for failure_policy, allowed in (("Fail", False), ("Ignore", True)):
        policies = PolicySet([policy(failurePolicy=failure_policy, validations=[check])])
        started = time.monotonic()
        decision = evaluate(policies, review, deadline=started + 1.0)
        assert time.monotonic() - started < 2.5
        assert decision.allowed is allowed
        (outcome,) = decision.outcomes
        assert "deadline" in outcome.errors[0], outcome.errors
    small = wide_pod(3)
    small["metadata"]["annotations"] = {"blob": "x"}
    assert decide([policy(validations=[check])], request(small)).allowed


def test_an_expression_that_builds_gigabytes_is_an_evaluation_error_and_the_process_keeps_its_memory() -> None:
    """2,000 copies of a 3 MB string: 6 GB. Its child process runs out of room; this one does not."""
    check = {"expression": "object.spec.containers.map(c, object.metadata.annotations.blob + c.name)"
                           ".exists(s, s.size() == 0)"}
    big = wide_pod(2_000)
    big["metadata"]["annotations"] = {"blob": "x" * 3_000_000}
    decision = decide([policy(validations=[check])], request(big))
    assert not decision.allowed
    (outcome,) = decision.outcomes
    assert "memory" in outcome.errors[0], outcome.errors


def test_an_object_too_deep_for_cel_is_an_evaluation_error_not_a_crash() -> None:
    """The API server accepts custom resources 10,000 levels deep; CEL's C++ conversion of one
    overflowed the stack and killed the process (tested in a child process for that reason)."""
    import subprocess
    import sys
    script = (
        "from admission_policy import api\n"
        "from admission_policy.engine import PolicySet, compile_policy, evaluate, parse_review\n"
        "body = {'apiVersion': 'policy-operator.dev/v1alpha1', 'kind': 'AdmissionPolicy', 'metadata': {'name': 'p'},"
        " 'spec': {'match': {'resources': [{'apiGroups': ['*'], 'apiVersions': ['*'], 'resources': ['*'],"
        " 'operations': ['*']}]}, 'validations': [{'expression': 'has(object.spec)'}]}}\n"
        "deep = {}\n"
        "node = deep\n"
        "for _ in range(10_000):\n"
        "    node['a'] = {}\n"
        "    node = node['a']\n"
        "review = {'kind': 'AdmissionReview', 'request': {'uid': '1', 'operation': 'CREATE',"
        " 'object': {'metadata': {'name': 'w'}, 'spec': deep},"
        " 'resource': {'group': 'x.io', 'version': 'v1', 'resource': 'things'}}}\n"
        "decision = evaluate(PolicySet([compile_policy(api.parse_policy(body))]), parse_review(review))\n"
        "print(decision.allowed, decision.message)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.startswith("False") and "nests deeper than 2,000 levels" in done.stdout


def test_memory_error_from_cel_is_an_evaluation_error() -> None:
    p = policy(validations=[{"expression": "object.metadata.name.size() > 0"}])

    class Exhausted:
        def eval(self, activation: Any) -> Any:
            raise MemoryError("std::bad_alloc")

    p.validations[0].check.program = Exhausted()
    assert p.validation_batch is not None
    p.validation_batch.program = Exhausted()
    decision = decide([p], request(pod()))
    assert not decision.allowed
    assert "ran out of memory" in decision.message


@pytest.mark.parametrize("metadata", [[0], "text", 7, {"labels": [0]}, {"labels": {"team": ["a"]}}])
def test_any_shape_of_metadata_is_evaluated_without_raising(metadata: Any) -> None:
    selector = {"objectSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]},
                "namespaceSelector": {"matchLabels": {"env": "prod"}}}
    p = policy(match=selector, validations=[{"expression": "true"}],
               mutations=[{"name": "m", "merge": {"spec": {"x": 1}}}])
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {}}
    namespace_object = {"metadata": metadata}
    # As a caller may build it: parse_review refuses such metadata, evaluate() must not need it to.
    malformed = dataclasses.replace(request(pod()), object=obj, old_object=obj)
    decision = evaluate(PolicySet([p]), malformed, namespace_object)
    assert decision.allowed and decision.code == 200


def test_a_mutation_of_a_very_deep_object_produces_its_patch() -> None:
    """Issue 18: an 800-deep container field made the patch diff raise RecursionError."""
    obj = pod()
    node = obj["spec"]["containers"][0]
    for _ in range(800):
        node["x"] = {}
        node = node["x"]
    p = policy(mutations=[{"name": "label", "merge": {"metadata": {"labels": {"a": "b"}}}},
                          {"name": "deep", "jsonPatch": [{"op": "add", "path": "/spec/containers/0" + "/x" * 800 + "/y",
                                                          "value": 1}]}])
    decision = decide([p], request(obj))
    assert decision.allowed, decision.message
    assert {op["path"] for op in decision.patch} == {"/metadata/labels", "/spec/containers/0" + "/x" * 800 + "/y"}


@pytest.mark.parametrize("expression", ["double('NaN')", "{'a': [1.0 / 0.0]}", "-1.0 / 0.0"])
def test_a_mutation_value_that_is_not_a_json_number_is_an_evaluation_error(expression: str) -> None:
    for failure_policy, allowed in (("Fail", False), ("Ignore", True)):
        value = f"{{'x': string(1), 'y': {expression}}}"
        p = policy("nan", failurePolicy=failure_policy, mutations=[{"name": "m", "jsonPatch": [
            {"op": "add", "path": "/metadata/annotations", "valueExpression": value}]}])
        decision = decide([p], request(pod()))
        assert decision.allowed is allowed
        assert not decision.patch
        (outcome,) = decision.outcomes
        assert "valueExpression: evaluated to" in outcome.errors[0] and "not a JSON number" in outcome.errors[0]
        json.dumps(build_response(decision, "u"), allow_nan=False)


def test_runtime_errors_say_what_they_usually_mean() -> None:
    p = policy(failurePolicy="Fail", validations=[
        {"expression": "object.metadata.labels.team == 'a'"},
        {"expression": "object.metadata.name < 1"},
    ])
    message = decide([p], request(pod())).message
    assert "field is absent: test it with has(" in message
    assert "compare like types" in message
    deleting = policy(rules=[{**POD_RULE, "operations": ["DELETE"]}],
                      validations=[{"expression": "object.metadata.name != ''"}])
    assert "object is null on DELETE" in decide([deleting], request(None, operation="DELETE", old=pod())).message


def test_an_unexpected_failure_inside_a_policy_never_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    from admission_policy.engine import scope

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("boom")

    monkeypatch.setattr(scope, "new_activation", broken)
    for failure_policy, allowed in (("Fail", False), ("Ignore", True)):
        decision = decide([policy(failurePolicy=failure_policy, validations=[{"expression": "true"}])], request(pod()))
        assert decision.allowed is allowed
        assert "internal error: KeyError" in decision.outcomes[0].errors[0]


@pytest.mark.parametrize("apart", [False, True], ids=["in-process", "in-a-child"])
def test_a_variable_holding_an_opaque_value_keeps_its_type(apart: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``variables.q.isLessThan(…)`` as in a ValidatingAdmissionPolicy: a quantity, an IP bound
    as a variable are not their text to the expressions that read them (nor from a child process)."""
    if apart:   # every policy over its budget: evaluated in a forked child, values pickled back
        monkeypatch.setattr("admission_policy.engine.scope.POLICY_BUDGET", -1)
    p = policy(variables=[{"name": "q", "expression": "quantity('1500m')"},
                          {"name": "ip", "expression": "ip('10.0.0.1')"}],
               validations=[{"expression": "variables.q.isLessThan(quantity('1'))",
                             "messageExpression": "'family ' + string(variables.ip.family()) + ', integer: ' + "
                                                  "string(variables.q.isInteger())"}])
    decision = decide([p], request(pod()))
    assert (decision.allowed, decision.message) == (False, 'AdmissionPolicy "p" denied the request: family 4, integer: '
                                                           'false')


def test_an_earlier_policy_sees_what_a_later_one_added_as_the_api_server_reinvokes_webhooks() -> None:
    """Policies mutate in name order; the API server reinvokes a webhook once when a later one
    changed the object (reinvocationPolicy IfNeeded). So does the engine: the sidecar injected
    by "b-sidecar" gets the default resources "a-defaults" gives every container."""
    defaults = policy("a-defaults", reinvocationPolicy="IfNeeded", mutations=[{"name": "requests", "condition":
        "object.spec.containers.exists(c, !has(c.resources))", "jsonPatch": [{"op": "replace",
        "path": "/spec/containers", "valueExpression": "object.spec.containers.map(c, has(c.resources) ? c : "
        "{'name': c.name, 'image': c.image, 'resources': {'requests': {'cpu': '100m'}}})"}]}])
    sidecar = policy("b-sidecar", mutations=[{"name": "inject", "condition":
        "!object.spec.containers.exists(c, c.name == 'shipper')", "jsonPatch": [{"op": "add",
        "path": "/spec/containers/-", "value": {"name": "shipper", "image": "shipper:1"}}]}])
    decision = decide([defaults, sidecar], request(pod()), phase=Phase.MUTATE)
    containers = decision.patched_object["spec"]["containers"]
    assert [(c["name"], c.get("resources")) for c in containers] == [
        ("c", {"requests": {"cpu": "100m"}}), ("shipper", {"requests": {"cpu": "100m"}})]
    assert [o.policy for o in decision.outcomes if o.mutated] == ["a-defaults", "b-sidecar"]


def test_a_policy_is_reinvoked_only_when_it_asks_to_be() -> None:
    """reinvocationPolicy Never (the default, as Kubernetes'): a policy mutates once, and a later
    policy's change costs it nothing; IfNeeded: once more, after the last policy that changed the
    object, and no more when nothing after it changed anything."""
    counting = {"name": "requests", "condition": "object.spec.containers.exists(c, !has(c.resources))",
                "jsonPatch": [{"op": "replace", "path": "/spec/containers", "valueExpression":
                               "object.spec.containers.map(c, has(c.resources) ? c : {'name': c.name, 'image': "
                               "c.image, 'resources': {'requests': {'cpu': '100m'}}})"}]}
    sidecar = policy("b-sidecar", mutations=[{"name": "inject", "condition":
        "!object.spec.containers.exists(c, c.name == 'shipper')", "jsonPatch": [{"op": "add",
        "path": "/spec/containers/-", "value": {"name": "shipper", "image": "shipper:1"}}]}])
    once = decide([policy("a-defaults", mutations=[counting]), sidecar], request(pod()), phase=Phase.MUTATE)
    assert [(c["name"], c.get("resources")) for c in once.patched_object["spec"]["containers"]] == [
        ("c", {"requests": {"cpu": "100m"}}), ("shipper", None)]
    again = decide([policy("a-defaults", reinvocationPolicy="IfNeeded", mutations=[counting]), sidecar],
                   request(pod()), phase=Phase.MUTATE)
    assert again.evaluations > once.evaluations
    # Nothing after it changes the object: not run again, whatever it asks.
    alone = decide([policy("a-defaults", reinvocationPolicy="IfNeeded", mutations=[counting])], request(pod()),
                   phase=Phase.MUTATE)
    assert alone.evaluations == decide([policy("a-defaults", mutations=[counting])], request(pod()),
                                       phase=Phase.MUTATE).evaluations
    with pytest.raises(api.PolicyError, match=r"spec\.reinvocationPolicy"):
        policy("bad", reinvocationPolicy="Always", mutations=[counting])



def test_a_caller_that_may_not_wait_for_a_child_gets_no_decision_but_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The webhook evaluates on the event loop with may_fork=False: a policy that must run in a
    child process stops the evaluation (forks) rather than the loop, and the webhook evaluates again on a
    thread (operator/apart.py). A policy within its budget is decided as usual."""
    p = policy(validations=[{"expression": "object.metadata.name != 'bad'"}])
    cheap = evaluate(PolicySet([p]), request(pod("bad")), may_fork=False)
    assert not cheap.forks and not cheap.allowed
    monkeypatch.setattr("admission_policy.engine.scope.POLICY_BUDGET", -1)   # every policy over it
    costly = evaluate(PolicySet([p]), request(pod("bad")), may_fork=False)
    assert costly.forks and costly.outcomes == ()
    assert not evaluate(PolicySet([p]), request(pod("bad"))).forks
    with pytest.raises(Forks):
        audit_object(PolicySet([p]), request(pod("bad")), may_fork=False)
    assert audit_object(PolicySet([p]), request(pod("bad")))[0].result == FAIL
