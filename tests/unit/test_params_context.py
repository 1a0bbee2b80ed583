"""Params (spec.paramKind/paramRef) and context (spec.context): parsing, compiling, evaluating."""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

import builders
from admission_policy import plugins
from admission_policy.api import PolicyError, parse_policy
from admission_policy.engine import Listing, PolicyCompileError, StaticInputs
from admission_policy.plugins import PluginRequest, ValidatorPlugin
from builders import decide, request, rule

DEPLOYMENTS = rule("deployments", group="apps")
PARAMS = {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
          "paramRef": {"name": "limits", "parameterNotFoundAction": "Deny"}}
CONTEXT = [{"name": "deployments", "group": "apps", "version": "v1", "resource": "deployments",
            "scope": "RequestNamespace", "maxObjects": 3}]

# Every policy here is on Deployments, validating ``true`` unless told otherwise, and every
# object a Deployment in TEAM, the namespace its params and context are read from.
TEAM = "team-a"
policy_body = functools.partial(builders.policy_body, rules=[DEPLOYMENTS], validations=[{"expression": "true"}])
policy = functools.partial(builders.policy, rules=[DEPLOYMENTS], validations=[{"expression": "true"}])
deployment = functools.partial(builders.deployment, namespace=TEAM)
configmap = functools.partial(builders.configmap, namespace=TEAM)


# --- parsing ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "path", "fragment"), [
    ({"paramRef": {"name": "x"}}, "spec.paramKind", "is required with spec.paramRef"),
    ({"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}}, "spec.paramRef", "is required with spec.paramKind"),
    ({**PARAMS, "paramRef": {"name": "x", "selector": {}}}, "spec.paramRef", "exactly one of name or selector"),
    ({**PARAMS, "paramRef": {"name": "x", "parameterNotFoundAction": "Maybe"}},
     "spec.paramRef.parameterNotFoundAction", "Allow | Deny"),
    ({**PARAMS, "paramKind": {"apiVersion": "a/b/c", "kind": "X"}}, "spec.paramKind.apiVersion", "not an apiVersion"),
    ({"context": [{**CONTEXT[0], "name": "my-list"}]}, "spec.context[0].name", "CEL identifier"),
    ({"context": [{**CONTEXT[0], "maxObjects": 20_000}]}, "spec.context[0].maxObjects", "from 1 to 10,000"),
    ({"context": [{**CONTEXT[0], "resource": "deployments/scale"}]}, "spec.context[0].resource", "not a resource"),
    ({"context": [{**CONTEXT[0], "scope": "Here"}]}, "spec.context[0].scope", "All | RequestNamespace"),
    ({"context": [CONTEXT[0], CONTEXT[0]]}, "spec.context[1].name", "duplicate context name"),
    ({"context": [{**CONTEXT[0], "labelSelector": {"matchLabel": {}}}]}, "spec.context[0].labelSelector.matchLabel",
     "unknown field"),
])
def test_bad_params_and_context_are_refused_naming_the_field(spec: dict[str, Any], path: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as error:
        parse_policy(policy_body(**spec))
    assert error.value.path == path
    assert fragment in error.value.message


def test_context_and_params_parse_into_typed_values() -> None:
    labelled = [{**CONTEXT[0], "labelSelector": {"matchLabels": {"a": "b"}}}]
    parsed = parse_policy(policy_body(**PARAMS, context=labelled))
    assert parsed.param_kind is not None and parsed.param_kind.kind == "ConfigMap" and parsed.param_kind.group == ""
    assert parsed.param_ref is not None and parsed.param_ref.name == "limits"
    entry = parsed.context[0]
    assert (entry.name, entry.scope, entry.max_objects) == ("deployments", "RequestNamespace", 3)
    assert str(entry.source) == "deployments.apps/v1 (a=b)"


# --- compiling ----------------------------------------------------------------------------------------------

def test_reading_an_undeclared_context_or_params_is_a_compile_error() -> None:
    with pytest.raises(PolicyCompileError) as error:
        policy(context=CONTEXT, validations=[{"expression": "context.pods.size() < 3"}])
    assert "context.pods is not declared in spec.context (declared: deployments)" in str(error.value)
    with pytest.raises(PolicyCompileError) as error:
        policy(validations=[{"expression": "params.data.x == 'y'"}])
    assert "reads params, but the policy sets no spec.paramKind" in str(error.value)


def test_a_loop_variable_named_context_is_not_taken_for_the_context() -> None:
    compiled = policy(validations=[{"expression": "[{'a': 1}].all(context, context.a == 1)",
                                    "message": "no params here"}])
    assert decide(compiled, deployment()).allowed


def test_the_cost_estimate_counts_the_declared_max_objects() -> None:
    loop = [{"expression": "context.deployments.all(d, d.metadata.name.startsWith('x'))"}]
    small = policy(context=[{**CONTEXT[0], "maxObjects": 10}], validations=loop)
    large = policy(context=[{**CONTEXT[0], "maxObjects": 10_000}], validations=loop)
    assert large.validations[0].check.cost > 100 * small.validations[0].check.cost


# --- evaluating ---------------------------------------------------------------------------------------------

LIMIT = [{"expression": "object.spec.replicas <= int(params.data.max)",
          "messageExpression": "'at most ' + params.data.max + ' replicas (' + params.metadata.name + ')'"}]


def test_each_matching_param_is_one_evaluation() -> None:
    quota = {"quota": "yes"}
    compiled = policy(paramKind=PARAMS["paramKind"], paramRef={"selector": {"matchLabels": quota}}, validations=LIMIT)
    inputs = StaticInputs([configmap("a", labels=quota, data={"max": "3"}),
                           configmap("b", labels=quota, data={"max": "2"}),
                           configmap("c", data={"max": "1"}), configmap("d", namespace="other", data={"max": "0"})])
    assert decide(compiled, deployment(replicas=2), inputs=inputs).allowed
    denied = decide(compiled, deployment(replicas=4), inputs=inputs)
    assert not denied.allowed
    assert "at most 3 replicas (a); at most 2 replicas (b)" in denied.message


def test_the_param_is_read_in_the_request_namespace_or_a_fixed_one() -> None:
    inputs = StaticInputs([configmap("limits", data={"max": "5"}),
                           configmap("limits", namespace="shared", data={"max": "1"})])
    own = policy(**PARAMS, validations=LIMIT)
    assert decide(own, deployment(replicas=4), inputs=inputs).allowed
    fixed = policy(paramKind=PARAMS["paramKind"], paramRef={"name": "limits", "namespace": "shared"},
                   validations=LIMIT)
    assert "at most 1 replicas" in decide(fixed, deployment(replicas=4), inputs=inputs).message


def test_a_cluster_scoped_object_gets_no_namespaced_param_without_paramref_namespace() -> None:
    """As ValidatingAdmissionPolicy: the param of a cluster-scoped request cannot be the request's
    namespace's; it was read from every namespace, so any team's limits judged a Namespace."""
    compiled = policy(rules=[rule("namespaces", operations=["CREATE"])], **PARAMS,
                      validations=[{"expression": "params.data.max == '1'"}])
    namespace = request({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "new"}},
                        resource="namespaces", name="new", namespace=None)
    decision = decide(compiled, namespace, inputs=StaticInputs([configmap("limits", data={"max": "1"})]))
    assert not decision.allowed
    assert ("param ConfigMap limits cannot be chosen for a cluster-scoped object: ConfigMap is namespaced and "
            "spec.paramRef.namespace is unset") in decision.message


def test_a_param_is_found_at_any_version_of_its_group_as_the_operator_finds_it() -> None:
    """The operator watches paramKind's group and kind, served converted to its version: a file
    holding the object at another version of the group is the same param offline."""
    compiled = policy(paramKind={"apiVersion": "quota.example.com/v1", "kind": "Limits"},
                      paramRef={"name": "limits"}, validations=LIMIT)
    stored = {**configmap("limits", data={"max": "1"}), "apiVersion": "quota.example.com/v1beta1", "kind": "Limits"}
    denied = decide(compiled, deployment(replicas=2), inputs=StaticInputs([stored]))
    assert "at most 1 replicas (limits)" in denied.message
    other_group = {**stored, "apiVersion": "quota.other.com/v1"}
    missing = decide(compiled, deployment(), inputs=StaticInputs([other_group]))
    assert "param Limits team-a/limits not found" in missing.message


def test_a_missing_param_follows_parameter_not_found_action_and_failure_policy() -> None:
    deny = policy(**PARAMS, validations=LIMIT)
    refused = decide(deny, deployment(), inputs=StaticInputs())
    assert not refused.allowed
    assert "param ConfigMap team-a/limits not found (spec.paramRef.parameterNotFoundAction is Deny)" in refused.message
    ignore = policy(**PARAMS, failurePolicy="Ignore", validations=LIMIT)
    assert decide(ignore, deployment(), inputs=StaticInputs()).allowed
    allow = policy(paramKind=PARAMS["paramKind"], paramRef={"name": "limits", "parameterNotFoundAction": "Allow"},
                   validations=LIMIT)
    skipped = decide(allow, deployment(), inputs=StaticInputs())
    assert skipped.allowed and not skipped.outcomes


def test_a_malformed_param_is_an_evaluation_error_naming_it() -> None:
    decision = decide(policy(**PARAMS, validations=LIMIT), deployment(),
                      inputs=StaticInputs([configmap("limits", data={"max": "x"})]))
    assert not decision.allowed
    assert "(with param ConfigMap team-a/limits)" in decision.message


def test_context_lists_the_request_namespace_within_the_cap() -> None:
    compiled = policy(context=CONTEXT, validations=[{
        "expression": "context.deployments.map(d, d.spec.replicas).sum() + object.spec.replicas <= 4",
        "message": "too many replicas in the namespace"}])
    inputs = StaticInputs(context_objects={"deployments": [deployment("a", replicas=2),
                                                           deployment("b", namespace="other", replicas=9)]})
    assert decide(compiled, deployment(replicas=2), inputs=inputs).allowed
    assert not decide(compiled, deployment(replicas=3), inputs=inputs).allowed
    crowded = StaticInputs(context_objects={"deployments": [deployment(str(i), replicas=0) for i in range(4)]})
    over = decide(compiled, deployment(), inputs=crowded)
    assert not over.allowed
    assert "holds 4 objects in namespace team-a, over its maxObjects of 3 (spec.context[0].maxObjects)" in over.message


class Unsynced:
    def params(self, kind: Any, namespace: str | None) -> Listing:
        return Listing(problem="never listed")

    def context(self, entry: Any, namespace: str | None) -> Listing:
        return Listing(problem="the watch has failed for 12s")


def test_inputs_not_in_sync_get_the_failure_policy_answer_never_a_verdict() -> None:
    compiled = policy(context=CONTEXT, validations=[{"expression": "context.deployments.size() == 0"}])
    refused = decide(compiled, deployment(), inputs=Unsynced())
    assert not refused.allowed
    assert "context 'deployments' (deployments.apps/v1) is not in sync: the watch has failed for 12s" in refused.message
    lenient = policy(context=CONTEXT, failurePolicy="Ignore", validations=[{"expression": "false"}])
    decision = decide(lenient, deployment(), inputs=Unsynced())
    assert decision.allowed and decision.outcomes[0].errors


def test_no_inputs_supplied_is_an_error_for_policies_that_read_them_only() -> None:
    plain = policy(validations=[{"expression": "object.spec.replicas < 10"}])
    assert decide(plain, deployment()).allowed
    assert not decide(policy(context=CONTEXT), deployment()).allowed


class SeesInputs(ValidatorPlugin):
    name: ClassVar[str] = "sees-inputs"
    stage: ClassVar[plugins.Stage] = "Beta"

    def validate(self, config: Any, request: PluginRequest) -> Sequence[str]:
        assert request.params is not None
        names = [d["metadata"]["name"] for d in request.context["deployments"]]
        return [f"param {request.params['metadata']['name']}, context {names}"]


def test_plugins_see_params_and_context() -> None:
    found = plugins.discover(group="admission_policy.plugins.none")
    registry = plugins.Registry({**found.plugins, "sees-inputs": SeesInputs()}, {**found.sources,
                                                                                 "sees-inputs": "test"})
    compiled = policy(registry=registry, **PARAMS, context=CONTEXT, validations=[{"plugin": {"name": "sees-inputs"}}])
    inputs = StaticInputs([configmap("limits")], {"deployments": [deployment("a")]})
    decision = decide(compiled, deployment(), inputs=inputs)
    assert "param limits, context ['a']" in decision.message


def test_a_quota_policy_on_deployments_gets_no_pod_template_policies() -> None:
    """The Pod-controller rewrite applies to Pod policies only: a Deployment policy reading the
    Deployment's own template (and the scale subresource) is judged as written."""
    compiled = policy(context=CONTEXT, match={"resources": [{**DEPLOYMENTS, "resources": ["deployments",
                                                                                          "deployments/scale"]}]})
    assert compiled.derived == () and compiled.coverage is None
