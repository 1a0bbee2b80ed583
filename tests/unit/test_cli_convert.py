"""``admission-policy convert``: each ValidatingAdmissionPolicy feature, the AdmissionPolicy it
becomes, and the same decisions (Kubernetes' matching, apiserver admission/plugin/policy/matching),
judged by the engine; what cannot be converted is one line on standard error and exit code 2."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

import builders
from admission_policy.cli import main
from admission_policy.engine import PolicySet, evaluate, load_policy, parse_review
from admission_policy.engine.inputs import StaticInputs

ROOT = Path(__file__).parents[2]
CONFIGMAPS = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}
ABSENT = object()   # an expected field that must not be in the output


def vap(name: str = "check", version: str = "v1", **spec: Any) -> dict[str, Any]:
    spec.setdefault("matchConstraints", {"resourceRules": [CONFIGMAPS]})
    spec.setdefault("validations", [{"expression": "false"}])
    return {"apiVersion": f"admissionregistration.k8s.io/{version}", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name}, "spec": spec}


def binding(name: str = "check-binding", policy: str = "check", version: str = "v1", **spec: Any) -> dict[str, Any]:
    spec.setdefault("validationActions", ["Deny"])
    return {"apiVersion": f"admissionregistration.k8s.io/{version}", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name}, "spec": {"policyName": policy, **spec}}


def convert(tmp_path: Path, *objects: dict[str, Any]) -> tuple[int, list[dict[str, Any]], list[str]]:
    """Exit code, the AdmissionPolicies written, the lines on standard error."""
    source = tmp_path / "input.yaml"
    source.write_text(yaml.safe_dump_all(objects))
    result = CliRunner().invoke(main, ["convert", str(source)])
    assert "Traceback" not in result.output + result.stderr
    written = [body for body in yaml.safe_load_all(result.stdout) if body]
    return result.exit_code, written, result.stderr.splitlines()


def converted(tmp_path: Path, *objects: dict[str, Any]) -> dict[str, Any]:
    """The one AdmissionPolicy a faithful conversion writes."""
    code, written, errors = convert(tmp_path, *objects)
    assert (code, errors, len(written)) == (0, [], 1)
    return written[0]


# --- each feature, the AdmissionPolicy it becomes ------------------------------------------------------

def test_a_minimal_policy_and_binding(tmp_path: Path) -> None:
    policy = converted(tmp_path, vap(), binding())
    assert policy == {
        "apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicy",
        "metadata": {"name": "check-binding"},
        "spec": {
            "description": "Converted from ValidatingAdmissionPolicy 'check' with binding 'check-binding'.",
            "enforcement": "Enforce", "failurePolicy": "Fail",
            "match": {"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                                     "operations": ["CREATE", "UPDATE"]}]},
            # Kubernetes' default reason is Invalid (422); an AdmissionPolicy's is Forbidden.
            "validations": [{"expression": "false", "reason": "Invalid"}],
        },
    }


@pytest.mark.parametrize("version", ["v1beta1", "v1alpha1"])
def test_older_api_versions_convert_as_v1(tmp_path: Path, version: str) -> None:
    expected = converted(tmp_path, vap(), binding())
    assert converted(tmp_path, vap(version=version), binding(version=version)) == expected


@pytest.mark.parametrize(("policy_spec", "binding_spec", "field", "expected"), [
    pytest.param({"failurePolicy": "Ignore"}, {}, "failurePolicy", "Ignore", id="failurePolicy"),
    pytest.param({}, {"validationActions": ["Warn"]}, "enforcement", "Warn", id="Warn"),
    pytest.param({}, {"validationActions": ["Audit"]}, "enforcement", "Audit", id="Audit"),
    pytest.param({"validations": [{"expression": "object.data.x == 'y'", "message": "  no x  ",
                                   "messageExpression": "'x is ' + object.data.x", "reason": "Forbidden"}]}, {},
                 "validations", [{"expression": "object.data.x == 'y'", "message": "no x",
                                  "messageExpression": "'x is ' + object.data.x", "reason": "Forbidden"}],
                 id="validation"),
    pytest.param({"variables": [{"name": "x", "expression": "object.data.x"}],
                  "validations": [{"expression": "variables.x == 'y'"}]}, {},
                 "variables", [{"name": "x", "expression": "object.data.x"}], id="variables"),
    pytest.param({"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                  "validations": [{"expression": "object.data == params.data"}]},
                 {"paramRef": {"name": "limits", "namespace": "team", "parameterNotFoundAction": "Allow"}},
                 "paramRef", {"name": "limits", "namespace": "team", "parameterNotFoundAction": "Allow"},
                 id="paramRef name"),
    pytest.param({"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}},
                 {"paramRef": {"selector": {"matchLabels": {"use": "limits"}}, "parameterNotFoundAction": "Deny"}},
                 "paramRef", {"selector": {"matchLabels": {"use": "limits"}}, "parameterNotFoundAction": "Deny"},
                 id="paramRef selector"),
    pytest.param({"paramKind": {"apiVersion": "example.com/v1", "kind": "Limits"}},
                 {"paramRef": {"name": "l", "parameterNotFoundAction": "Deny"}},
                 "paramKind", {"apiVersion": "example.com/v1", "kind": "Limits"}, id="paramKind"),
    # Without the binding's paramRef, Kubernetes runs the policy with params null: no params to read.
    pytest.param({"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}}, {}, "paramKind", ABSENT,
                 id="paramKind without paramRef"),
    pytest.param({}, {"paramRef": {"name": "l", "parameterNotFoundAction": "Deny"}}, "paramRef", ABSENT,
                 id="paramRef without paramKind"),
])
def test_fields_convert_to_their_counterparts(tmp_path: Path, policy_spec: dict[str, Any],
                                              binding_spec: dict[str, Any], field: str, expected: Any) -> None:
    spec = converted(tmp_path, vap(**policy_spec), binding(**binding_spec))["spec"]
    assert spec.get(field, ABSENT) == expected


@pytest.mark.parametrize(("constraints", "match_resources", "field", "expected"), [
    pytest.param({"namespaceSelector": {"matchLabels": {"env": "prod"}}},
                 {"namespaceSelector": {"matchLabels": {"env": "staging", "team": "a"},
                                        "matchExpressions": [{"key": "tier", "operator": "Exists"}]}},
                 "namespaceSelector",
                 # Both must match: a key fixed to two values matches nothing, as with both selectors.
                 {"matchLabels": {"env": "prod", "team": "a"},
                  "matchExpressions": [{"key": "env", "operator": "In", "values": ["staging"]},
                                       {"key": "tier", "operator": "Exists"}]},
                 id="namespace selectors, both"),
    pytest.param({}, {"objectSelector": {"matchLabels": {"app": "web"}}},
                 "objectSelector", {"matchLabels": {"app": "web"}}, id="binding objectSelector"),
    pytest.param({"objectSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]}},
                 {}, "objectSelector", {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]},
                 id="policy objectSelector"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "resourceNames": ["a", "b"]}]}, {},
                 "conditions", [{"name": "policy-resource-rules", "expression": "request.?name.orValue('') in ['a', 'b']"}],  # noqa: E501
                 id="resourceNames"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "scope": "Namespaced"}]}, {},
                 "conditions", [{"name": "policy-resource-rules", "expression":
                                 "request.?namespace.orValue('') != '' && !(request.resource.group == '' && "
                                 "request.resource.version == 'v1' && request.resource.resource == 'namespaces')"}],
                 id="scope"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "resources": ["pods/*", "*/*"]}]}, {},
                 "resources", [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "pods/*", "*", "*/*"],
                                "operations": ["CREATE", "UPDATE"]}],
                 id="a/* matches a too"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "resources": ["configmaps", "secrets"]}]},
                 {"resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["secrets"],
                                     "operations": ["CREATE", "DELETE"]}]},
                 "resources", [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["secrets"],
                                "operations": ["CREATE"]}],
                 id="rules intersected"),
    pytest.param({"matchPolicy": "Exact"}, {},
                 "resources", [{"apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                                "operations": ["CREATE", "UPDATE"]}],
                 id="Exact routes any version"),
])
def test_matching_converts_to_match(tmp_path: Path, constraints: dict[str, Any], match_resources: dict[str, Any],
                                    field: str, expected: Any) -> None:
    spec = converted(tmp_path, vap(matchConstraints={"resourceRules": [CONFIGMAPS], **constraints}),
                     binding(matchResources=match_resources))["spec"]
    assert spec["match"].get(field, ABSENT) == expected


def test_generated_conditions_go_before_the_policys_own(tmp_path: Path) -> None:
    """The engine stops at the first condition that does not hold: Kubernetes never evaluates a
    matchCondition on a request its rules do not select."""
    conditions = converted(tmp_path, vap(
        matchConstraints={"resourceRules": [CONFIGMAPS], "excludeResourceRules": [{**CONFIGMAPS, "resourceNames": ["x"]}],  # noqa: E501
                          "objectSelector": {"matchLabels": {"a": "b"}}},
        matchConditions=[{"name": "policy-resource-rules", "expression": "true"}]),
        binding(matchResources={"objectSelector": {"matchLabels": {"c": "d"}}}))["spec"]["match"]["conditions"]
    assert [c["name"] for c in conditions] == ["policy-resource-rules-2", "binding-object-selector",
                                               "policy-resource-rules"]


def test_a_pod_policy_judges_pods_only(tmp_path: Path) -> None:
    """A ValidatingAdmissionPolicy on Pods does not judge the Pod templates of workloads."""
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    spec = converted(tmp_path, vap(matchConstraints={"resourceRules": [rule]}), binding())["spec"]
    assert spec["podControllers"] == []


def test_one_policy_per_binding(tmp_path: Path) -> None:
    code, written, errors = convert(tmp_path, vap(), binding("warn-dev", validationActions=["Warn"]),
                                    binding("deny-prod"))
    assert (code, errors) == (0, [])
    assert [(p["metadata"]["name"], p["spec"]["enforcement"]) for p in written] == [("warn-dev", "Warn"),
                                                                                   ("deny-prod", "Enforce")]


# --- the same decisions ---------------------------------------------------------------------------------

def review(*, resource: str = "configmaps", group: str = "", version: str = "v1", sub: str = "", name: str = "web",
           namespace: str = "default", operation: str = "CREATE", labels: dict[str, str] | None = None,
           old_labels: dict[str, str] | None = None, sent: tuple[str, str] | None = None) -> dict[str, Any]:
    """An AdmissionReview of a ConfigMap (or of ``resource``) as the API server sends it; ``sent``: the
    (group, version) the client used, when the API server converted the request."""
    def body(with_labels: dict[str, str] | None) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, **({"labels": with_labels} if with_labels is not None else {})}}
    sent_group, sent_version = sent or (group, version)
    return builders.review(body(labels) if operation != "DELETE" else None, operation=operation,
                           old=body(old_labels) if operation in ("UPDATE", "DELETE") else None,
                           resource=resource, group=group, version=version, sub_resource=sub, name=name or None,
                           namespace=namespace or None, uid="1", user_info={"username": "u"},
                           requestResource={"group": sent_group, "version": sent_version, "resource": resource})


def allowed(policy: dict[str, Any], request: dict[str, Any], namespace_labels: dict[str, str] | None = None) -> bool:
    parsed = parse_review(request)
    namespace = {"metadata": {"name": parsed.namespace, "labels": namespace_labels or {}}} if parsed.namespace else None
    return evaluate(PolicySet([load_policy(policy, "Fail")]), parsed, namespace).allowed


POD_STATUS_EXCLUDED = {"resourceRules": [{**CONFIGMAPS, "resources": ["pods/*"], "operations": ["*"]}],
                       "excludeResourceRules": [{**CONFIGMAPS, "resources": ["pods/status"], "operations": ["*"]}]}


@pytest.mark.parametrize(("constraints", "match_resources", "request_", "namespace_labels", "judged"), [
    pytest.param({"resourceRules": [{**CONFIGMAPS, "resourceNames": ["web"]}]}, {}, review(name="web"), None, True,
                 id="resourceNames: named"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "resourceNames": ["web"]}]}, {}, review(name="api"), None, False,
                 id="resourceNames: another name"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "resourceNames": ["web"]}]}, {}, review(name=""), None, False,
                 id="resourceNames: a generated name is none"),
    pytest.param(POD_STATUS_EXCLUDED, {}, review(resource="pods"), None, True, id="pods/* selects pods"),
    pytest.param(POD_STATUS_EXCLUDED, {}, review(resource="pods", sub="ephemeralcontainers"), None, True,
                 id="pods/* selects a subresource"),
    pytest.param(POD_STATUS_EXCLUDED, {}, review(resource="pods", sub="status"), None, False,
                 id="excluded subresource"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "resources": ["*"], "scope": "Namespaced"}]}, {},
                 review(resource="namespaces", name="team", namespace="team"), None, False,
                 id="Namespaced: a Namespace is not"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "resources": ["*"], "scope": "Cluster"}]}, {},
                 review(resource="namespaces", name="team", namespace="team"), None, True,
                 id="Cluster: a Namespace is"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "resources": ["*"], "scope": "Cluster"}]}, {},
                 review(), None, False, id="Cluster: a ConfigMap is not"),
    pytest.param({}, {"resourceRules": [{**CONFIGMAPS, "operations": ["CREATE"]}]}, review(operation="UPDATE"), None,
                 False, id="binding rules: not this operation"),
    pytest.param({"namespaceSelector": {"matchLabels": {"env": "prod"}}},
                 {"namespaceSelector": {"matchLabels": {"team": "a"}}}, review(), {"env": "prod", "team": "a"}, True,
                 id="both namespace selectors match"),
    pytest.param({"namespaceSelector": {"matchLabels": {"env": "prod"}}},
                 {"namespaceSelector": {"matchLabels": {"team": "a"}}}, review(), {"env": "prod"}, False,
                 id="one namespace selector matches"),
    # Each object selector holds if the new or the old object matches: here one each.
    pytest.param({"objectSelector": {"matchLabels": {"tier": "web"}}},
                 {"objectSelector": {"matchLabels": {"app": "shop"}}},
                 review(operation="UPDATE", labels={"tier": "web"}, old_labels={"app": "shop"}), None, True,
                 id="object selectors: new and old"),
    pytest.param({"objectSelector": {"matchLabels": {"tier": "web"}}},
                 {"objectSelector": {"matchLabels": {"app": "shop"}}},
                 review(operation="UPDATE", labels={"tier": "web"}, old_labels={}), None, False,
                 id="object selectors: one"),
    pytest.param({"objectSelector": {"matchLabels": {"tier": "web"}},
                  "resourceRules": [{**CONFIGMAPS, "operations": ["DELETE"]}]},
                 {"objectSelector": {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}},
                 review(operation="DELETE", old_labels={"tier": "web"}), None, True,
                 id="object selectors: DELETE reads the old object"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "apiGroups": ["apps"], "resources": ["deployments"]}],
                  "matchPolicy": "Exact"}, {},
                 review(group="apps", resource="deployments", sent=("apps", "v1beta1")), None, False,
                 id="Exact: sent at another version"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "apiGroups": ["apps"], "resources": ["deployments"]}],
                  "matchPolicy": "Exact"}, {},
                 review(group="apps", resource="deployments"), None, True, id="Exact: sent at this version"),
    pytest.param({"resourceRules": [{**CONFIGMAPS, "apiGroups": ["apps"], "resources": ["deployments"]}]}, {},
                 review(group="apps", resource="deployments", sent=("apps", "v1beta1")), None, True,
                 id="Equivalent: sent at another version"),
])
def test_the_converted_policy_judges_what_kubernetes_would(
        tmp_path: Path, constraints: dict[str, Any], match_resources: dict[str, Any], request_: dict[str, Any],
        namespace_labels: dict[str, str] | None, judged: bool) -> None:
    """The policy's one validation fails: a request it judges is denied, one it does not, allowed."""
    policy = converted(tmp_path, vap(matchConstraints={"resourceRules": [CONFIGMAPS], **constraints}),
                       binding(matchResources=match_resources))
    assert allowed(policy, request_, namespace_labels) is not judged


def test_params_are_read_as_the_binding_says(tmp_path: Path) -> None:
    policy = converted(tmp_path, vap(paramKind={"apiVersion": "v1", "kind": "ConfigMap"},
                                     validations=[{"expression": "object.metadata.name != params.data.banned"}]),
                       binding(paramRef={"name": "rules", "parameterNotFoundAction": "Allow"}))
    compiled = load_policy(policy, "Fail")
    rules = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rules"}, "data": {"banned": "web"}}
    other = {**rules, "metadata": {"name": "other"}}

    def allows(name: str, *params: dict[str, Any]) -> bool:
        return evaluate(PolicySet([compiled]), parse_review(review(name=name)), {"metadata": {"name": "default"}},
                        inputs=StaticInputs(params)).allowed

    assert (allows("web", rules), allows("api", rules)) == (False, True)
    assert allows("web", other) is True   # none found: parameterNotFoundAction Allow skips the policy


# --- what cannot be converted ---------------------------------------------------------------------------

@pytest.mark.parametrize(("objects", "line", "written"), [
    pytest.param([vap(auditAnnotations=[{"key": "k", "valueExpression": "'v'"}]), binding()],
                 "ValidatingAdmissionPolicy 'check': spec.auditAnnotations: not converted", True,
                 id="auditAnnotations: left out"),
    pytest.param([vap(validations=[], auditAnnotations=[{"key": "k", "valueExpression": "'v'"}]), binding()],
                 "it has no validations, so nothing is written for it", False, id="auditAnnotations only"),
    pytest.param([vap(), binding(validationActions=["Deny", "Audit"])],
                 "ValidatingAdmissionPolicyBinding 'check-binding': spec.validationActions: Deny+Audit is converted as "
                 "enforcement: Enforce", True, id="Deny+Audit"),
    pytest.param([vap(), binding(validationActions=["Warn", "Audit"])],
                 "spec.validationActions: Warn+Audit is converted as enforcement: Warn", True, id="Warn+Audit"),
    pytest.param([vap(), binding(validationActions=["Deny", "Warn"])],
                 "spec.validationActions: must not contain both Deny and Warn", False, id="Deny+Warn"),
    pytest.param([vap(), binding(validationActions=["Reject"])],
                 "spec.validationActions[0]: must be one of Deny, Warn, Audit, got 'Reject'", False,
                 id="unknown action"),
    pytest.param([vap(), binding(validationActions=[])], "spec.validationActions: is required", False,
                 id="no action"),
    pytest.param([vap(matchConstraints={"resourceRules": [{**CONFIGMAPS, "resourceNamez": ["x"]}]}), binding()],
                 "ValidatingAdmissionPolicy 'check': spec.matchConstraints.resourceRules[0].resourceNamez: unknown field",  # noqa: E501
                 False, id="unknown field"),
    pytest.param([vap(validations=[{"expression": "true", "reason": "Teapot"}]), binding()],
                 "spec.validations[0].reason: must be one of", False, id="unknown reason"),
    pytest.param([vap(matchConstraints={"namespaceSelector": {}}), binding()],
                 "spec.matchConstraints.resourceRules: is required", False, id="no resource rules"),
    pytest.param([vap(paramKind={"apiVersion": "v1", "kind": "ConfigMap"}),
                  binding(paramRef={"name": "limits"})],
                 "spec.paramRef.parameterNotFoundAction: must be one of Allow, Deny, got nothing", False,
                 id="parameterNotFoundAction required in v1"),
    pytest.param([vap(), binding(policy="missing")],
                 "ValidatingAdmissionPolicyBinding 'check-binding': spec.policyName: no ValidatingAdmissionPolicy named "  # noqa: E501
                 "'missing' among the inputs", False, id="no such policy"),
    pytest.param([vap(validations=[{"expression": "object.metadata.name.shout() == 'X'"}]), binding()],
                 "ValidatingAdmissionPolicy 'check': spec.validations[0].expression (line 1, column 27): not converted "
                 "(no AdmissionPolicy is written for binding 'check-binding'): ",
                 False, id="CEL that does not compile here"),
    pytest.param([vap(matchConstraints={"resourceRules": [{**CONFIGMAPS, "resourceNames": ["x"]}]},
                      matchConditions=[{"name": "c", "expression": "nope()"}]), binding()],
                 "spec.matchConditions[0].expression (line 1, column", False,
                 id="matchConditions path after the generated ones"),
    pytest.param([vap(), vap(), binding()], "metadata.name: is also the name of the ValidatingAdmissionPolicy in",
                 True, id="two policies of one name"),
    pytest.param([vap(version="v2"), binding()], "apiVersion: admissionregistration.k8s.io/v2 is not one of", False,
                 id="unknown version"),
    pytest.param([{**vap(), "kind": "MutatingAdmissionPolicy"}, vap(), binding()],
                 "MutatingAdmissionPolicy 'check': not converted: only ValidatingAdmissionPolicy and "
                 "ValidatingAdmissionPolicyBinding objects are", True, id="another kind"),
])
def test_what_cannot_be_converted_is_a_line_and_exit_2(tmp_path: Path, objects: list[dict[str, Any]], line: str,
                                                       written: bool) -> None:
    code, policies, errors = convert(tmp_path, *objects)
    assert code == 2
    assert [error for error in errors if line in error], errors
    assert all(error.startswith(f"error: {tmp_path / 'input.yaml'}#") for error in errors if line in error)
    assert len(policies) == (1 if written else 0)


def test_a_policy_without_a_binding_is_said_not_to_be_enforced(tmp_path: Path) -> None:
    code, policies, errors = convert(tmp_path, vap(), vap("lonely"), binding())
    assert code == 0 and len(policies) == 1
    assert errors == [f"warning: {tmp_path / 'input.yaml'}#2: ValidatingAdmissionPolicy 'lonely': no binding names "
                      "it, so Kubernetes does not enforce it; nothing is written for it"]
    code, policies, errors = convert(tmp_path, vap("lonely"))
    assert code == 2 and policies == []
    assert errors[-1].startswith("error: nothing converted: no ValidatingAdmissionPolicyBinding")


def test_rules_with_nothing_in_common_write_nothing(tmp_path: Path) -> None:
    code, policies, errors = convert(tmp_path, vap(), binding(matchResources={"resourceRules": [
        {**CONFIGMAPS, "resources": ["secrets"]}]}))
    assert code == 2 and policies == []
    assert "have no request in common; nothing is written for it" in errors[0]


# --- the command line -----------------------------------------------------------------------------------

def test_output_file_stdin_and_lists(tmp_path: Path) -> None:
    objects = {"apiVersion": "v1", "kind": "List", "items": [vap(), binding(),
                                                              {"apiVersion": "v1", "kind": "ConfigMap",
                                                               "metadata": {"name": "params"}}]}
    output = tmp_path / "out.yaml"
    result = CliRunner().invoke(main, ["convert", "-o", str(output), "-"], input=json.dumps(objects))
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")
    (policy,) = yaml.safe_load_all(output.read_text())
    assert policy["metadata"]["name"] == "check-binding"
    assert output.read_text().startswith("---\napiVersion: policy-operator.dev/v1alpha1\n")


@pytest.mark.parametrize(("args", "error"), [
    (["missing.yaml"], "error: missing.yaml: no such file or directory\n"),
    (["-o", "/nonexistent/dir/out.yaml", "INPUT"], "error: -o /nonexistent/dir/out.yaml: cannot write: "),
])
def test_unusable_input_or_output_is_one_line(tmp_path: Path, args: list[str], error: str) -> None:
    source = tmp_path / "input.yaml"
    source.write_text(yaml.safe_dump_all([vap(), binding()]))
    result = CliRunner().invoke(main, ["convert", *(str(source) if a == "INPUT" else a for a in args)])
    assert result.exit_code == 2
    assert result.stderr.startswith(error) and len(result.stderr.splitlines()) == 1


def test_the_output_is_what_lint_accepts(tmp_path: Path) -> None:
    output = tmp_path / "out.yaml"
    source = tmp_path / "input.yaml"
    source.write_text(yaml.safe_dump_all([
        vap(matchConstraints={"resourceRules": [{**CONFIGMAPS, "resourceNames": ["a"]}],
                              "objectSelector": {"matchLabels": {"a": "b"}}, "matchPolicy": "Exact"},
            validations=[{"expression": "object.data.x == 'y'\n  || true", "messageExpression": "'it\\'s'"}]),
        binding(matchResources={"objectSelector": {"matchLabels": {"c": "d"}},
                                "excludeResourceRules": [{**CONFIGMAPS, "scope": "Cluster"}]})]))
    assert CliRunner().invoke(main, ["convert", "-o", str(output), str(source)]).exit_code == 0
    assert "- expression: |-\n" in output.read_text()   # several lines stay several lines
    result = CliRunner().invoke(main, ["lint", str(output)])
    assert result.exit_code == 0, result.stdout
    assert f"portable      {output}: AdmissionPolicy 'check-binding'" in result.stdout


def test_the_example_is_what_convert_writes() -> None:
    example = ROOT / "examples" / "from-vap"
    result = CliRunner().invoke(main, ["convert", str(example / "vap.yaml")])
    assert (result.exit_code, result.stderr) == (0, "")
    expected = [body for body in yaml.safe_load_all((example / "policy.yaml").read_text()) if body]
    assert list(yaml.safe_load_all(result.stdout)) == expected
