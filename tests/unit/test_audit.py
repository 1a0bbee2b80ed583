"""The background audit's evaluation (engine/background.py) and the reports built from it (reports.py)."""
from __future__ import annotations

import functools
from typing import Any

import pytest

import builders
from admission_policy import api, reports
from admission_policy.engine import PolicySet
from admission_policy.engine.background import (
    ERROR,
    FAIL,
    MUTATION_RULE,
    PASS,
    WARN,
    Resource,
    audit_object,
    audits,
    background_request,
    user_info_reads,
)
from builders import pod, rule

PODS = Resource("", "v1", "pods", "Pod")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)


TEAM = [{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
         "message": "a team label is required"},
        {"expression": "object.metadata.name.size() < 8",
         "messageExpression": "'name ' + object.metadata.name + ' is long'"}]

policy = functools.partial(builders.policy, name="team")   # the policy judged below, unless named otherwise


def stored_pod(name: str = "web", namespace: str = "apps", labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod as the audit lists it from the cluster: stored, so with a uid."""
    return pod(name, namespace=namespace, labels=labels, metadata={"uid": f"uid-{name}"})


def audit(policies: list[Any], body: dict[str, Any], resource: Resource = PODS,
          namespace: dict[str, Any] | None = None) -> Any:
    return audit_object(PolicySet(policies), background_request(body, resource), namespace)


def test_the_background_request_is_a_create_with_no_old_object_and_no_user() -> None:
    request = background_request(stored_pod(), PODS)
    assert (request.operation, request.old_object, request.dry_run) == ("CREATE", None, True)
    assert request.raw["userInfo"] == {"username": "", "uid": "", "groups": []}
    assert request.raw["uid"] == "background-uid-web" and request.namespace == "apps"
    assert request.raw["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert background_request({"metadata": {"name": "n", "namespace": "x"}}, NAMESPACES).namespace == ""


def test_each_failed_validation_is_a_finding_naming_its_rule() -> None:
    (result,) = audit([policy(validations=TEAM)], stored_pod("webserver-1"))
    assert result.result == FAIL and result.violates
    assert [(f.rule, f.message, f.error) for f in result.findings] == [
        ("spec.validations[0]", "a team label is required", False),
        ("spec.validations[1]", "name webserver-1 is long", False)]
    assert result.message == "a team label is required; name webserver-1 is long"


def test_a_passing_object_passes_and_a_warn_policy_warns() -> None:
    assert audit([policy(validations=TEAM)], stored_pod(labels={"team": "a"}))[0].result == PASS
    (warned,) = audit([policy(enforcement="Warn", validations=TEAM)], stored_pod())
    assert warned.result == WARN and warned.violates


def test_an_evaluation_error_is_an_error_result_not_a_pass() -> None:
    broken = [{"expression": "object.spec.missing.size() > 0"}]
    for failure_policy in ("Fail", "Ignore"):
        (result,) = audit([policy(validations=broken, failurePolicy=failure_policy)], stored_pod())
        assert result.result == ERROR and not result.violates, failure_policy
        assert all(f.error for f in result.findings) and "missing" in result.findings[0].message


def test_selectors_excluded_namespaces_and_conditions_decide_what_has_a_result() -> None:
    selected = policy(validations=TEAM, match={"objectSelector": {"matchLabels": {"audit": "yes"}},
                                               "excludeNamespaces": ["skip"]})
    assert audit([selected], stored_pod(labels={"audit": "yes"}))[0].result == FAIL
    assert audit([selected], stored_pod(labels={"audit": "no"})) == ()
    assert audit([selected], stored_pod(namespace="skip", labels={"audit": "yes"})) == ()
    by_namespace = policy(validations=TEAM, match={"namespaceSelector": {"matchLabels": {"env": "prod"}}})
    prod = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps", "labels": {"env": "prod"}}}
    assert audit([by_namespace], stored_pod(), namespace=prod)[0].result == FAIL
    assert audit([by_namespace], stored_pod(), namespace={**prod, "metadata": {"name": "apps"}}) == ()


def test_user_info_is_empty_so_exempting_conditions_hold_and_selecting_ones_do_not() -> None:
    exempting = policy(validations=TEAM, match={"conditions": [
        {"name": "not-system", "expression": "!request.userInfo.username.startsWith('system:')"}]})
    selecting = policy(name="alice-only", validations=TEAM, match={"conditions": [
        {"name": "alice", "expression": "request.userInfo.username == 'alice'"}]})
    results = audit([exempting, selecting], stored_pod())
    assert [(r.policy, r.result) for r in results] == [("team", FAIL)]
    assert user_info_reads(exempting) == ("spec.match.conditions[0].expression",)
    assert user_info_reads(policy(validations=TEAM)) == ()


def test_mutations_are_not_applied_but_reported() -> None:
    labelling = policy(validations=TEAM[:1], mutations=[{"name": "team", "merge": {"metadata": {"labels": {
        "team": "unassigned"}}}, "mergeMode": "IfAbsent"}])
    body = stored_pod()
    (result,) = audit([labelling], body)
    # Validations judged the object as stored: the mutation would have added the label.
    assert result.result == FAIL and result.would_mutate
    assert result.findings[-1].rule == MUTATION_RULE and "labels" not in body["metadata"]
    (only_mutates,) = audit([policy(mutations=[{"name": "m", "merge": {"metadata": {"labels": {"x": "y"}}}}])],
                            stored_pod())
    assert only_mutates.result == PASS and only_mutates.would_mutate and "would be mutated" in only_mutates.message
    (unchanged,) = audit([policy(mutations=[{"name": "m", "merge": {"metadata": {"labels": {"x": "y"}}}}])],
                         stored_pod(labels={"x": "y"}))
    assert unchanged.result == PASS and not unchanged.would_mutate


def test_only_policies_judging_create_audit() -> None:
    assert audits(policy(validations=TEAM))
    assert audits(policy(validations=TEAM, rules=[rule("pods", operations=("*",))]))
    update_only = policy(validations=TEAM, rules=[rule("pods", operations=("UPDATE",))])
    assert not audits(update_only) and audit([update_only], stored_pod()) == ()


def test_a_pod_policy_judges_a_workloads_pod_template() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "apps"},
                  "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}}}
    (result,) = audit([policy(validations=TEAM[:1])], deployment, DEPLOYMENTS)
    assert result.result == FAIL and result.template_of == 'Deployment "web"'
    assert result.message == 'the Pod template of Deployment "web": a team label is required'


# --- reports ---------------------------------------------------------------------------------------------


def entries_for(body: dict[str, Any], policies: list[Any], seen: int = 100) -> list[reports.Entry]:
    ref = reports.ObjectRef.of(body, "v1", "Pod")
    return [entry for result in audit(policies, body) for entry in reports.entries(result, ref, seen)]


def test_entries_are_one_per_failed_rule_or_one_pass() -> None:
    failing = entries_for(stored_pod("webserver-1"), [policy(validations=TEAM)])
    assert [(e.result, e.rule) for e in failing] == [(FAIL, "spec.validations[0]"), (FAIL, "spec.validations[1]")]
    (passing,) = entries_for(stored_pod(labels={"team": "a"}), [policy(validations=TEAM)])
    assert (passing.result, passing.rule, passing.message) == (PASS, "", "")
    as_dict = failing[0].as_dict()
    assert as_dict["resources"] == [{"apiVersion": "v1", "kind": "Pod", "name": "webserver-1", "namespace": "apps",
                                     "uid": "uid-webserver-1"}]
    assert as_dict["timestamp"] == {"seconds": 100, "nanos": 0} and as_dict["properties"]["enforcement"] == "Enforce"


def test_a_report_lists_failures_first_and_sums_every_result() -> None:
    results = reports.Results()
    for body in (stored_pod("a", labels={"team": "x"}), stored_pod("b"), stored_pod("c", namespace="other")):
        for entry in entries_for(body, [policy(validations=TEAM[:1])]):
            results.add(entry)
    namespaced, other = reports.build_reports(results)
    assert (namespaced["kind"], namespaced["metadata"]["namespace"]) == ("Report", "apps")
    assert [r["result"] for r in namespaced["results"]] == ["fail", "pass"]
    assert namespaced["summary"] == {"pass": 1, "fail": 1, "warn": 0, "error": 0, "skip": 0}
    assert other["metadata"]["namespace"] == "other" and other["summary"]["fail"] == 1
    cluster = reports.build_report("", [], {"fail": 2})
    assert cluster["kind"] == "ClusterReport" and "namespace" not in cluster["metadata"]


def test_results_keep_failures_over_passes_beyond_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reports, "MAX_RESULTS", 2)
    results = reports.Results()
    ref = reports.ObjectRef("v1", "Pod", "p", "ns")
    for index, result in enumerate(["pass", "pass", "fail", "pass", "fail", "fail"]):
        results.add(reports.Entry("p", str(index), result, "", ref, "Enforce", 0))
    assert sorted(e.result for e in results.entries["ns"]) == ["fail", "fail"]
    assert results.counts["ns"] == {"pass": 3, "fail": 3}


def test_report_content_ignores_server_fields_and_stays_equal_when_nothing_changed() -> None:
    first = entries_for(stored_pod("b"), [policy(validations=TEAM[:1])], seen=100)
    body = reports.build_report("apps", first, {"fail": 1})
    served = {**body, "metadata": {**body["metadata"], "resourceVersion": "7", "uid": "u"}}
    assert reports.content(served) == reports.content(reports.build_report("apps", first, {"fail": 1}))
    assert first[0].key == entries_for(stored_pod("b"), [policy(validations=TEAM[:1])], seen=999)[0].key


def test_an_admission_result_replaces_the_scans_result_for_its_object() -> None:
    scanned = reports.Results()
    ref = reports.ObjectRef("v1", "Pod", "web", "apps", "uid-1")
    other = reports.ObjectRef("v1", "Pod", "db", "apps", "uid-2")
    scanned.add(reports.Entry("team", "", "pass", "", ref, "Warn", 1))
    scanned.add(reports.Entry("team", "spec.validations[0]", "warn", "x", other, "Warn", 1))
    admitted = reports.Entry("team", "spec.validations[0]", "warn", "needs a team", reports.ObjectRef(
        "v1", "Pod", "web", "apps"), "Warn", 2, reports.ORIGIN_ADMISSION)
    elsewhere = reports.Entry("team", "spec.validations[0]", "warn", "needs a team", reports.ObjectRef(
        "v1", "Pod", "new", "other"), "Warn", 2, reports.ORIGIN_ADMISSION)
    merged = scanned.with_objects([(admitted.ref, [admitted]), (elsewhere.ref, [elsewhere])])
    assert merged.counts["apps"] == {"pass": 0, "warn": 2}
    assert [(e.ref.name, e.origin) for e in merged.entries["apps"]] == [("db", "background"), ("web", "admission")]
    assert merged.counts["other"] == {"warn": 1} and merged.entries["other"] == [elsewhere]
    assert scanned.counts["apps"] == {"pass": 1, "warn": 1}   # the scan's own results are left as they were
    assert scanned.namespaces == {"apps"}


def test_a_warning_is_not_scored_and_a_failure_is() -> None:
    ref = reports.ObjectRef("v1", "Pod", "web", "apps", "uid-1")
    assert reports.Entry("team", "r", "warn", "m", ref, "Warn", 1).as_dict()["scored"] is False
    assert reports.Entry("team", "r", "fail", "m", ref, "Audit", 1).as_dict()["scored"] is True


def test_a_report_read_back_gives_each_result_its_first_seen_time() -> None:
    """A restarted operator's first scan keeps the timestamps the cluster's reports hold."""
    found = entries_for(stored_pod("b"), [policy(validations=TEAM)], seen=100) + \
        entries_for(stored_pod("c", labels={"team": "a"}), [policy(validations=TEAM)], seen=200) + \
        entries_for(stored_pod("d"), [policy(name="other", validations=TEAM[:1])], seen=300)
    cluster_scoped = reports.Entry("team", "", "pass", "", reports.ObjectRef("v1", "Namespace", "apps"), "Enforce", 400)
    content = reports.content(reports.build_report("apps", [*found, cluster_scoped], {}))
    seen = reports.first_seen(content)["team"]
    assert seen == {entry.key: entry.seen for entry in [*found, cluster_scoped] if entry.policy == "team"}
    assert len(seen) == 3


def test_report_admission_is_a_boolean_naming_its_field() -> None:
    assert policy(validations=TEAM, reportAdmission=True).policy.report_admission
    assert not policy(validations=TEAM).policy.report_admission
    with pytest.raises(api.PolicyError, match=r"spec.reportAdmission: must be true or false"):
        policy(validations=TEAM, reportAdmission="yes")
