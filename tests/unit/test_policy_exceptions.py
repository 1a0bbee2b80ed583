"""AdmissionPolicyExceptions: parsed strictly, checked as `kubectl apply` will check them, and
applied by the engine, the background audit, the reports and the CLI (docs/exceptions.md).

Time is injected (``now``): an exception ends at ``expiresAt`` to the second.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from admission_policy import api, policyexception, reports
from admission_policy.cli import main
from admission_policy.engine import ExceptionCompileError, ExceptionSet, PolicySet, compile_exception
from admission_policy.engine.background import ERROR, FAIL, SKIP, Resource, audit_object, background_request
from admission_policy.policyexception import check_exception, parse_exception, parse_time
from builders import POD_RULE, container, decide, deployment, pod, policy, policy_body, request, rule

ROOT = Path(__file__).resolve().parents[2]
EXPIRES = "2026-12-31T00:00:00Z"
END = parse_time(EXPIRES, "")
BEFORE = END - 86_400
NOT_PRIVILEGED = "object.spec.containers.all(c, !c.?securityContext.?privileged.orValue(false))"
HAS_LIMITS = "object.spec.containers.all(c, has(c.resources))"


def no_privileged(**spec: Any) -> Any:
    """A Pod policy with two named validations: ``privileged`` and ``limits``."""
    return policy("no-privileged", validations=[
        {"name": "privileged", "expression": NOT_PRIVILEGED, "message": "no privileged containers"},
        {"name": "limits", "expression": HAS_LIMITS, "message": "resources are required"}], **spec)


def exception_body(name: str = "legacy", *, namespace: str = "default", policies: Any = None,
                   annotations: dict[str, str] | None = None, generation: int = 1, **spec: Any) -> dict[str, Any]:
    """An exception; by default created by alice and approved by someone else (policies require it)."""
    record = {policyexception.CREATED_BY: "alice", **approved()} if annotations is None else annotations
    return {"apiVersion": api.API_VERSION, "kind": policyexception.KIND,
            "metadata": {"name": name, "namespace": namespace, "generation": generation,
                         "annotations": dict(record)},
            "spec": {"policies": policies if policies is not None else [{"name": "no-privileged"}],
                     "reason": "migration pending", "expiresAt": EXPIRES, **spec}}


def approved(generation: int = 1) -> dict[str, str]:
    return {policyexception.APPROVED_BY: "lead", policyexception.APPROVED_GENERATION: str(generation)}


def exceptions(*bodies: dict[str, Any], cluster_namespace: str = "admission-policy-system") -> ExceptionSet:
    return ExceptionSet([compile_exception(parse_exception(body)) for body in bodies],
                        cluster_namespace=cluster_namespace)


def privileged_pod(name: str = "web", **fields: Any) -> dict[str, Any]:
    return pod(name, containers=[container("app", privileged=True, resources={})], **fields)


# --- parsing ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "path"), [
    (lambda b: b["spec"].pop("reason"), "spec.reason"),
    (lambda b: b["spec"].update(reason="  "), "spec.reason"),
    (lambda b: b["spec"].pop("expiresAt"), "spec.expiresAt"),
    (lambda b: b["spec"].update(expiresAt="next week"), "spec.expiresAt"),
    (lambda b: b["spec"].update(expiresAt="2026-12-31T00:00:00"), "spec.expiresAt"),   # no offset
    (lambda b: b["spec"].update(policies=[]), "spec.policies"),
    (lambda b: b["spec"].update(policies=[{"name": "a"}, {"name": "a"}]), "spec.policies[1].name"),
    (lambda b: b["spec"].update(policies=[{"name": "a", "rulez": []}]), "spec.policies[0].rulez"),
    (lambda b: b["spec"].update(match={"names": [""]}), "spec.match.names[0]"),
    (lambda b: b["spec"].update(match={"resources": [{"apiGroups": [""]}]}), "spec.match.resources[0].apiVersions"),
    (lambda b: b["spec"].update(match={"objectSelector": {"matchLabels": {"a": 1}}}),
     "spec.match.objectSelector.matchLabels.a"),
    (lambda b: b["spec"].update(conditions=[{"name": "c"}]), "spec.conditions[0].expression"),
    (lambda b: b["metadata"].pop("namespace"), "metadata.namespace"),
    (lambda b: b["metadata"]["annotations"].update({policyexception.APPROVED_GENERATION: "one"}),
     f"metadata.annotations[{policyexception.APPROVED_GENERATION!r}]"),
])
def test_parsing_errors_name_the_field(change: Any, path: str) -> None:
    body = exception_body()
    change(body)
    with pytest.raises(api.PolicyError) as caught:
        parse_exception(body)
    assert caught.value.path == path


def test_a_condition_that_does_not_compile_is_refused_with_its_path() -> None:
    body = exception_body(conditions=[{"name": "c", "expression": "object.spec +"}])
    with pytest.raises(ExceptionCompileError) as caught:
        compile_exception(parse_exception(body))
    assert caught.value.path == "spec.conditions[0].expression"


def test_the_policy_side_spec_exceptions_is_parsed_and_in_the_crd() -> None:
    parsed = api.parse_policy({"metadata": {"name": "p"}, "spec": {
        "match": {"resources": [POD_RULE]}, "validations": [{"expression": "true"}],
        "exceptions": {"allowed": False, "maxDuration": "1h30m", "approval": "Required"}}})
    assert parsed.exceptions == api.ExceptionRules(False, 5_400, "Required")
    assert parsed.rule_names() == ("validation-0",)
    for bad, path in (({"maxDuration": "30 days"}, "spec.exceptions.maxDuration"),
                      ({"approval": "Maybe"}, "spec.exceptions.approval")):
        with pytest.raises(api.PolicyError) as caught:
            api.parse_policy({"metadata": {"name": "p"}, "spec": {
                "match": {"resources": [POD_RULE]}, "validations": [{"expression": "true"}], "exceptions": bad}})
        assert caught.value.path == path
    crd = yaml.safe_load((ROOT / "crds" / "admissionpolicy.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert tuple(spec["exceptions"]["properties"]["approval"]["enum"]) == api.APPROVALS


# --- check_exception: what `kubectl apply` will refuse ----------------------------------------------------

def test_check_exception_names_each_problem_with_its_field() -> None:
    specs = [no_privileged(exceptions={"maxDuration": "30d"}).policy,
             policy("closed", validations=[{"expression": "true"}], exceptions={"allowed": False}).policy]
    body = exception_body(policies=[{"name": "no-privileged", "rules": ["privileged", "nope"]},
                                    {"name": "closed"}, {"name": "missing"}])
    problems = check_exception(parse_exception(body), specs, now=END - 31 * 86_400)
    assert [problem.split(":")[0] for problem in problems] == [
        "spec.policies[0].rules[1]", "spec.policies[1].name", "spec.policies[2].name", "spec.expiresAt"]
    assert "has no validation or mutation named 'nope' (it has: privileged, limits)" in problems[0]
    assert "more than 30d after the exception's creation" in problems[3]
    expired = check_exception(parse_exception(body), specs, now=END)[-1]
    assert expired.startswith("spec.expiresAt: 2026-12-31T00:00:00Z is not in the future")
    fine = exception_body(policies=[{"name": "no-privileged", "rules": ["privileged"]}])
    assert check_exception(parse_exception(fine), specs, now=END - 29 * 86_400) == []


# --- the engine ------------------------------------------------------------------------------------------

def test_without_exceptions_nothing_changes() -> None:
    decision = decide(no_privileged(), privileged_pod())
    assert not decision.allowed and decision.exempted == ()


def test_an_exception_in_force_admits_with_a_warning_naming_it_and_its_expiry() -> None:
    decision = decide(no_privileged(), privileged_pod(), exceptions=exceptions(exception_body()), now=BEFORE)
    assert decision.allowed
    assert decision.warnings == (f"admitted under exception default/legacy, expires {EXPIRES}",)
    assert [(e.policy, e.rule, e.exception) for e in decision.exempted] == [("no-privileged", "privileged",
                                                                             "default/legacy")]


def test_it_ends_at_expires_at_to_the_second() -> None:
    given = exceptions(exception_body())
    assert decide(no_privileged(), privileged_pod(), exceptions=given, now=END - 1).allowed
    assert not decide(no_privileged(), privileged_pod(), exceptions=given, now=END).allowed


def test_no_warning_when_the_exception_changed_nothing() -> None:
    decision = decide(no_privileged(), pod(containers=[container(resources={})]),
                      exceptions=exceptions(exception_body()), now=BEFORE)
    assert decision.allowed and decision.warnings == () and decision.exempted == ()


@pytest.mark.parametrize(("subject", "match", "covered"), [
    (privileged_pod(namespace="other"), {}, False),                          # its own namespace only
    (privileged_pod("legacy-1"), {"names": ["legacy-*"]}, True),
    (privileged_pod("web"), {"names": ["legacy-*"]}, False),
    (privileged_pod(labels={"app": "legacy"}), {"objectSelector": {"matchLabels": {"app": "legacy"}}}, True),
    (privileged_pod(labels={"app": "web"}), {"objectSelector": {"matchLabels": {"app": "legacy"}}}, False),
    (privileged_pod(), {"resources": [rule("pods", operations=["CREATE"])]}, True),
    (privileged_pod(), {"resources": [rule("pods", operations=["UPDATE"])]}, False),
    (privileged_pod(), {"resources": [rule("pods/status")]}, False),
])
def test_matching(subject: dict[str, Any], match: dict[str, Any], covered: bool) -> None:
    decision = decide(no_privileged(), subject, exceptions=exceptions(exception_body(match=match)), now=BEFORE)
    assert decision.allowed is covered


@pytest.mark.parametrize(("expression", "covered"), [
    ("request.userInfo.username == 'alice'", True),
    ("object.metadata.name == 'db'", False),
    ("object.spec.nope == 1", False),     # an error: the exception does not apply
])
def test_conditions_must_all_hold(expression: str, covered: bool) -> None:
    given = exceptions(exception_body(conditions=[{"name": "c", "expression": expression}]))
    assert decide(no_privileged(), request(privileged_pod()), exceptions=given, now=BEFORE).allowed is covered


def test_a_cluster_scoped_object_is_covered_from_the_operator_namespace_only() -> None:
    node_policy = policy("no-privileged", rules=[rule("namespaces")],
                         validations=[{"name": "privileged", "expression": "false"}])
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}
    there = exceptions(exception_body(namespace="ops"), cluster_namespace="ops")
    elsewhere = exceptions(exception_body(namespace="default"), cluster_namespace="ops")
    assert decide(node_policy, namespace, exceptions=there, now=BEFORE).allowed
    assert not decide(node_policy, namespace, exceptions=elsewhere, now=BEFORE).allowed


def test_approval_counts_for_the_generation_it_approved() -> None:
    strict = no_privileged(exceptions={"approval": "Required"})
    for record, generation, covered in (({}, 1, False), (approved(1), 1, True), (approved(1), 2, False)):
        given = exceptions(exception_body(annotations=record, generation=generation))
        assert decide(strict, privileged_pod(), exceptions=given, now=BEFORE).allowed is covered


def test_approval_is_required_unless_the_policy_says_none() -> None:
    """The default: an exception-editor cannot grant an exception that applies at once."""
    assert api.ExceptionRules().approval == "Required"
    given = exceptions(exception_body(annotations={policyexception.CREATED_BY: "alice"}))
    assert not decide(no_privileged(), privileged_pod(), exceptions=given, now=BEFORE).allowed
    assert decide(no_privileged(exceptions={"approval": "None"}), privileged_pod(), exceptions=given,
                  now=BEFORE).allowed


@pytest.mark.parametrize(("record", "covered"), [
    ({policyexception.CREATED_BY: "alice"}, True),
    ({policyexception.CREATED_BY: "lead"}, False),                                     # approved their own
    ({policyexception.CREATED_BY: "alice", policyexception.SPEC_CHANGED_BY: "lead"}, False),   # their own edit
    ({policyexception.CREATED_BY: "alice", policyexception.SPEC_CHANGED_BY: "bob"}, True),
])
def test_an_approval_counts_only_from_someone_other_than_the_specs_authors(
        record: dict[str, str], covered: bool) -> None:
    given = exceptions(exception_body(annotations={**record, **approved()}))
    assert decide(no_privileged(), privileged_pod(), exceptions=given, now=BEFORE).allowed is covered


def test_a_policy_that_allows_none_or_caps_the_duration_is_not_waived() -> None:
    created = {policyexception.CREATED_AT: "2026-12-01T00:00:00Z", **approved()}
    given = exceptions(exception_body(annotations=created))
    assert not decide(no_privileged(exceptions={"allowed": False}), privileged_pod(), exceptions=given,
                      now=BEFORE).allowed
    assert not decide(no_privileged(exceptions={"maxDuration": "29d"}), privileged_pod(), exceptions=given,
                      now=BEFORE).allowed
    assert decide(no_privileged(exceptions={"maxDuration": "30d"}), privileged_pod(), exceptions=given,
                  now=BEFORE).allowed


def test_a_rule_level_exception_waives_that_rule_only() -> None:
    given = exceptions(exception_body(policies=[{"name": "no-privileged", "rules": ["privileged"]}]))
    bare = pod(containers=[container("app", privileged=True)])    # no resources: `limits` fails too
    decision = decide(no_privileged(), bare, exceptions=given, now=BEFORE)
    assert not decision.allowed and "resources are required" in decision.message
    assert "no privileged containers" not in decision.message
    assert [e.rule for e in decision.exempted] == ["privileged"]


def test_a_covered_mutation_is_skipped() -> None:
    labelling = policy("no-privileged", mutations=[
        {"name": "label", "merge": {"metadata": {"labels": {"checked": "yes"}}}}])
    given = exceptions(exception_body(policies=[{"name": "no-privileged", "rules": ["label"]}]))
    decision = decide(labelling, pod(), exceptions=given, now=BEFORE)
    assert decision.allowed and decision.patch == () and [e.rule for e in decision.exempted] == ["label"]


def test_an_exception_for_pods_covers_a_deployments_pod_template() -> None:
    given = exceptions(exception_body(match={"resources": [rule("pods")], "names": ["legacy"],
                                             "objectSelector": {"matchLabels": {"app": "legacy"}}}))
    workload = deployment("legacy", privileged=True, resources={"limits": {"cpu": "1"}})
    decision = decide(no_privileged(), workload, exceptions=given, now=BEFORE)
    assert decision.allowed and decision.warnings == (f"admitted under exception default/legacy, expires {EXPIRES}",)
    other_labels = deployment("legacy", privileged=True, labels={"app": "other"}, resources={"limits": {"cpu": "1"}})
    assert not decide(no_privileged(), other_labels, exceptions=given, now=BEFORE).allowed


# --- the background audit and the reports ----------------------------------------------------------------

def test_a_waived_rule_that_errs_on_a_variable_is_skipped_by_the_audit_too() -> None:
    """A waived validation that errs because a variable it reads fails (an unlabelled Pod): the
    error names the variable's field, not the rule's, yet it is the rule's verdict, and the
    exception covers it. Admission allowed it; the audit said ``error`` and counted it."""
    team = policy("team", variables=[{"name": "team", "expression": "object.metadata.labels['team']"}],
                  validations=[{"name": "team", "expression": "variables.team != ''", "message": "no team"}])
    given = exceptions(exception_body(policies=[{"name": "team", "rules": ["team"]}]))
    unlabelled = pod("legacy")
    decision = decide(team, unlabelled, exceptions=given, now=BEFORE)
    assert decision.allowed and [e.rule for e in decision.exempted] == ["team"]
    req = background_request(unlabelled, Resource("", "v1", "pods", "Pod"))
    (result,) = audit_object(PolicySet([team]), req, exceptions=given, now=BEFORE)
    assert result.result == SKIP
    (expired,) = audit_object(PolicySet([team]), req, exceptions=given, now=END)
    assert expired.result == ERROR and "spec.variables[0]" in expired.findings[0].message


def test_the_audit_says_skip_naming_the_exception_then_fail_once_it_expired() -> None:
    policies = PolicySet([no_privileged()])
    given = exceptions(exception_body(policies=[{"name": "no-privileged", "rules": ["privileged"]}]))
    req = background_request(privileged_pod(), Resource("", "v1", "pods", "Pod"))
    (result,) = audit_object(policies, req, exceptions=given, now=BEFORE)
    assert result.result == SKIP
    ref = reports.ObjectRef.of(privileged_pod(), "v1", "Pod")
    (entry,) = [e.as_dict() for e in reports.entries(result, ref, 0)]
    assert entry["result"] == "skip" and entry["rule"] == "privileged"
    assert entry["message"] == f"waived by AdmissionPolicyException default/legacy until {EXPIRES}"
    assert entry["properties"]["exception"] == "default/legacy"
    (expired,) = audit_object(policies, req, exceptions=given, now=END)
    assert expired.result == FAIL


# --- the CLI ---------------------------------------------------------------------------------------------

def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def write(path: Path, *bodies: Any) -> Path:
    path.write_text(yaml.safe_dump_all(bodies))
    return path


def test_the_example_suite_passes() -> None:
    code, out = run("test", str(ROOT / "examples" / "policy-exception"))
    assert code == 0, out
    assert "0 failed" in out


def test_test_and_audit_take_exceptions_with_the_policies_and_now(tmp_path: Path) -> None:
    policy_file = write(tmp_path / "policy.yaml", _policy_body(), exception_body())
    subject = write(tmp_path / "pod.yaml", privileged_pod())
    code, out = run("test", "-p", str(policy_file), "--now", "2026-12-30T23:59:59Z", str(subject))
    assert code == 0 and "admitted under exception default/legacy" in out
    code, out = run("test", "-p", str(policy_file), "--now", EXPIRES, "-o", "json", str(subject))
    assert json.loads(out)["inputs"][0]["allowed"] is False
    code, out = run("audit", "-p", str(policy_file), "--now", "2026-12-30T00:00:00Z", "-o", "json", str(subject))
    assert code == 0
    (report,) = json.loads(out)["items"]
    assert report["summary"]["skip"] == 2 and report["summary"]["fail"] == 0   # the whole policy is waived
    code, _ = run("audit", "-p", str(policy_file), "--now", EXPIRES, str(subject))
    assert code == 1


def _policy_body() -> dict[str, Any]:
    return policy_body("no-privileged", validations=[
        {"name": "privileged", "expression": NOT_PRIVILEGED, "message": "no privileged containers"},
        {"name": "limits", "expression": "object.spec.containers.all(c, c.image != 'nginx')",
         "message": "no nginx"}])


def test_lint_checks_exceptions_against_the_policies(tmp_path: Path) -> None:
    bad = exception_body(policies=[{"name": "no-privileged", "rules": ["nope"]}])
    files = write(tmp_path / "all.yaml", _policy_body(), bad)
    code, out = run("lint", "--now", "2026-12-01T00:00:00Z", str(files))
    assert code == 2
    assert "AdmissionPolicyException 'default/legacy': spec.policies[0].rules[0]" in out
    good = copy.deepcopy(bad)
    good["spec"]["policies"] = [{"name": "no-privileged"}]
    write(tmp_path / "all.yaml", _policy_body(), good)
    code, out = run("lint", "--now", "2026-12-01T00:00:00Z", str(files))
    assert code == 0 and "ok     " in out and "AdmissionPolicyException 'default/legacy'" in out
    code, out = run("lint", "--now", EXPIRES, str(files))   # stale, not invalid: time alone fails no CI check
    assert code == 0 and "warn   " in out and "spec.expiresAt: expired at 2026-12-31T00:00:00Z" in out


def test_a_suite_refuses_an_exception_naming_an_unknown_rule(tmp_path: Path) -> None:
    write(tmp_path / "policy.yaml", _policy_body(), exception_body(policies=[{"name": "no-privileged",
                                                                                "rules": ["nope"]}]))
    write(tmp_path / "test.yaml", {"apiVersion": api.API_VERSION, "kind": "AdmissionPolicyTest",
                                   "cases": [{"object": privileged_pod(), "expect": {"allowed": False}}]})
    code, out = run("test", str(tmp_path))
    assert code == 2 and "has no validation or mutation named 'nope'" in out
