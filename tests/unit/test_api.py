"""Invalid policies are refused with the field path and what is wrong; CEL errors carry the column."""
from __future__ import annotations

from typing import Any

import pytest

from admission_policy.api import PolicyError, ResourceRule, parse_policy
from admission_policy.engine import PolicyCompileError, compile_policy
from builders import POD_RULE, policy, policy_body


@pytest.mark.parametrize(("spec", "path", "words"), [
    ({"validations": [{"expression": "true"}], "validaitons": []}, "spec.validaitons", "unknown field"),
    ({"validations": [{"expression": "true"}], "enforcement": "Deny"}, "spec.enforcement", "Enforce | Warn | Audit"),
    ({"validations": [{"expression": "true"}], "failurePolicy": "Maybe"}, "spec.failurePolicy", "Fail | Ignore"),
    ({"validations": [{"expression": "true"}], "match": {"resources": []}}, "spec.match.resources", "at least one"),
    ({"validations": [{"expression": "true"}], "match": {"resources": [{**POD_RULE, "operations": ["PATCH"]}]}},
     "spec.match.resources[0].operations[0]", "CREATE"),
    ({"validations": [{"expression": 5}]}, "spec.validations[0].expression", "must be a string"),
    ({"validations": [{"expression": "true", "reason": "Teapot"}]}, "spec.validations[0].reason", "Forbidden"),
    ({}, "spec", "at least one validation or mutation"),
    ({"mutations": [{"jsonPatch": [{"op": "add", "path": "/a"}]}]}, "spec.mutations[0].jsonPatch[0]",
     "exactly one of value or valueExpression"),
    ({"mutations": [{"jsonPatch": [{"op": "add", "path": "/a", "value": 1, "valueExpression": "1"}]}]},
     "spec.mutations[0].jsonPatch[0]", "exactly one of value or valueExpression"),
    ({"mutations": [{"jsonPatch": [{"op": "remove", "path": "a"}]}]}, "spec.mutations[0].jsonPatch[0].path",
     "JSON pointer"),
    ({"mutations": [{"merge": {}, "jsonPatch": []}]}, "spec.mutations[0]", "exactly one of jsonPatch, merge or plugin"),
    ({"validations": [{"expression": "true"}],
      "match": {"resources": [POD_RULE], "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}},
     "spec.match.namespaceSelector.matchExpressions[0].values", "must not be empty"),
    ({"validations": [{"expression": "true"}], "variables": [{"name": "a-b", "expression": "1"}]},
     "spec.variables[0].name", "CEL identifier"),
    ({"validations": [{"expression": "true"}],
      "variables": [{"name": "a", "expression": "1"}, {"name": "a", "expression": "2"}]},
     "spec.variables[1].name", "duplicate"),
])
def test_invalid_policies_name_the_field(spec: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(policy_body(**spec))
    assert caught.value.path == path
    assert words in str(caught.value)


def test_a_policy_parses_into_typed_values_with_defaults() -> None:
    policy = parse_policy(policy_body(metadata={"generation": 2}, validations=[{"expression": "true"}]))
    assert policy.name == "p" and policy.generation == 2
    assert policy.enforcement == "Enforce" and policy.failure_policy == "Fail"
    assert parse_policy(policy_body(validations=[{"expression": "true"}]),
                        default_failure_policy="Ignore").failure_policy == "Ignore"


def test_every_compile_error_is_reported_with_path_and_column() -> None:
    policy = parse_policy(policy_body(
        validations=[{"expression": "object.metadata.name.contains("},
                     {"expression": "1 + 'a' == 2"},
                     {"expression": "object.metadata.name"},
                     {"expression": "true", "messageExpression": "42"}],
        mutations=[{"jsonPatch": [{"op": "add", "path": "/a", "valueExpression": "variables.nope"}]}]))
    with pytest.raises(PolicyCompileError) as caught:
        compile_policy(policy)
    errors = {error.path: error for error in caught.value.errors}
    assert set(errors) == {"spec.validations[0].expression", "spec.validations[1].expression",
                           "spec.validations[3].messageExpression", "spec.mutations[0].jsonPatch[0].valueExpression"}
    assert errors["spec.validations[0].expression"].column == 31
    assert errors["spec.validations[1].expression"].column == 3
    assert "no matching overload" in errors["spec.validations[1].expression"].message
    assert "must evaluate to a string" in errors["spec.validations[3].messageExpression"].message
    assert "variables.nope is not declared" in errors["spec.mutations[0].jsonPatch[0].valueExpression"].message
    assert "'p'" in str(caught.value) and "(line 1, column 3)" in str(caught.value)


def test_a_variable_may_only_read_earlier_variables() -> None:
    policy = parse_policy(policy_body(validations=[{"expression": "variables.a"}],
                               variables=[{"name": "a", "expression": "variables.b"},
                                          {"name": "b", "expression": "true"}]))
    with pytest.raises(PolicyCompileError, match=r"variables\.b is declared later"):
        compile_policy(policy)


# --- issue 18: cost limits at compile time; malformed values --------------------------------------------

def doubling(times: int, start: str = "'ab'") -> str:
    """cel.bind(x0, 'ab', cel.bind(x1, x0 + x0, …)): a string 2**times as long."""
    expression = f"x{times - 1}.size() > 0"
    for i in reversed(range(times)):
        expression = f"cel.bind(x{i}, {start if i == 0 else f'x{i - 1} + x{i - 1}'}, {expression})"
    return expression


def test_an_expression_unbounded_by_construction_is_refused_at_compile_time() -> None:
    """25 nested string doublings compiled and went Active (~2 s and GBs per Pod): Kubernetes would
    stop every evaluation of it at its per-call limit, even on the smallest object."""
    with pytest.raises(PolicyCompileError) as caught:
        policy(validations=[{"expression": "true"}, {"expression": doubling(25)}])
    (error,) = caught.value.errors
    assert error.path == "spec.validations[1].expression"
    assert error.message.startswith("is unbounded by construction: its estimated cost is 6,711,013 even on an "
                                    "object of one character, over Kubernetes' limit of 1,000,000 per expression")
    policy(validations=[{"expression": doubling(20)}])   # 2 MB: Kubernetes runs it


# Kyverno's own ensure-readonly-hostpath CEL policy (its library, unchanged): three nested loops.
READONLY_HOSTPATH = {
    "variables": [
        {"name": "allContainers", "expression": "(object.spec.containers + (has(object.spec.initContainers) ? "
         "object.spec.initContainers : []) + (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers"
         " : []))"},
        {"name": "hostPathVolumes",
         "expression": "has(object.spec.volumes) ? object.spec.volumes.filter(volume, has(volume.hostPath)) : []"}],
    "validations": [{"expression": "variables.hostPathVolumes.all(hostPath, variables.allContainers.all(container, "
                     "!has(container.volumeMounts) || container.volumeMounts.all(volume, (hostPath.name != volume.name)"
                     " || has(volume.readOnly) && volume.readOnly == true)))",
                     "message": "All hostPath volumes must be mounted as readOnly."}],
}


@pytest.mark.parametrize("spec", [
    READONLY_HOSTPATH,
    # ~1.5 million each at 16 KiB and 256 items per list, by the estimate; 70 of them were refused.
    {"validations": [{"expression": "object.spec.containers.all(c, object.spec.containers.exists(d, "
                      "c.name.contains(d.name)))"}] * 70},
], ids=["kyverno-ensure-readonly-hostpath", "seventy-nested-loops"])
def test_a_policy_kubernetes_accepts_is_not_refused_for_its_estimated_cost(spec: dict[str, Any]) -> None:
    policy(**spec)


def test_variables_carry_their_estimated_size_to_the_expressions_that_read_them() -> None:
    variables = [{"name": f"v{i}", "expression": f"variables.v{i - 1} + variables.v{i - 1}" if i else "'ab'"}
                 for i in range(26)]
    with pytest.raises(PolicyCompileError) as caught:
        policy(variables=variables, validations=[{"expression": "variables.v25 != ''"}])
    assert any("unbounded by construction" in error.message for error in caught.value.errors)


def test_too_deep_nesting_is_explained_not_located_at_minus_one() -> None:
    for expression in ["(" * 40 + "1" + ")" * 40 + " == 1", "1" + " + 1" * 40 + " > 0"]:
        with pytest.raises(PolicyCompileError) as caught:
            policy(validations=[{"expression": expression}])
        text = str(caught.value)
        assert "-1" not in text and "nests too deeply" in text and "spec.variables" in text


@pytest.mark.parametrize(("mutation", "path"), [
    ({"merge": {"spec": {"x": float("nan")}}}, "spec.mutations[0].merge"),
    ({"jsonPatch": [{"op": "add", "path": "/a", "value": [float("inf")]}]}, "spec.mutations[0].jsonPatch[0].value"),
])
def test_a_patch_value_that_is_not_a_json_number_is_refused(mutation: dict[str, Any], path: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(policy_body(mutations=[mutation]))
    assert caught.value.path == path and "not a JSON number" in caught.value.message


# --- what a rule names: the one reading the engine, the exceptions and the routing share ------------------

@pytest.mark.parametrize(("resources", "request_for", "covered"), [
    (["pods"], ("pods", ""), True),
    (["pods"], ("pods", "status"), False),           # the main resource only
    (["pods/*"], ("pods", "exec"), True),
    (["pods/*"], ("pods", ""), False),               # the subresources only, as the API server reads it
    (["pods/status"], ("pods", "status"), True),
    (["pods/status"], ("pods", "exec"), False),
    (["*"], ("secrets", ""), True),
    (["*"], ("pods", "status"), False),              # every main resource, no subresource
    (["*/status"], ("deployments", "status"), True),
    (["*/status"], ("deployments", "scale"), False),
    (["*/*"], ("pods", "ephemeralcontainers"), True),
    (["*/*"], ("pods", ""), False),
    (["configmaps", "pods/exec"], ("pods", "exec"), True),
])
def test_which_requests_a_rule_covers(resources: list[str], request_for: tuple[str, str], covered: bool) -> None:
    rule = ResourceRule(("",), ("v1",), tuple(resources), ("CREATE", "UPDATE"))
    assert rule.covers("", "v1", *request_for, "UPDATE") is covered


def test_a_rule_covers_only_its_groups_versions_and_operations_unless_it_says_any() -> None:
    rule = ResourceRule(("apps",), ("v1",), ("deployments",), ("CREATE",))
    assert rule.covers("apps", "v1", "deployments", "", "CREATE")
    assert not rule.covers("", "v1", "deployments", "", "CREATE")
    assert not rule.covers("apps", "v1beta1", "deployments", "", "CREATE")
    assert not rule.covers("apps", "v1", "deployments", "", "DELETE")
    assert ResourceRule(("*",), ("*",), ("deployments",), ("*",)).covers("extensions", "v1beta1", "deployments", "",
                                                                          "DELETE")
