"""``vap/mutating.py``: an AdmissionPolicy's mutations as MutatingAdmissionPolicies, and what keeps
them on the webhook.

Beyond the translation table, each generated expression is evaluated here (this project's CEL, its
JSONPatch values read as maps) and the JSON patch it returns applied as RFC 6902 applies it, with no
parent created (as Kubernetes' JSON patch): the result must be the engine's, object by object.
tests/e2e/test_e2e_native_mutations.py proves the same against a real API server.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import jsonpatch
import pytest
import yaml

from admission_policy import api, plugins
from admission_policy.cel import CelEvaluationError, compile_expression, new_activation
from admission_policy.cluster.routing import NOT_OWN_CRD, ServedIndex
from admission_policy.engine import Phase, compile_policy, load_policy
from admission_policy.vap import mutating, native
from builders import decide, object_request, policy_body, rule

ROOT = Path(__file__).parents[2]
TARGET = native.Target("v1", (1, 32), ServedIndex(()), mutating_version="v1alpha1")
MUTATING_KINDS = (mutating.MUTATING_POLICY, mutating.MUTATING_BINDING)
CONFIGMAPS = [rule("configmaps")]


def mutation(**fields: Any) -> api.Mutation:
    body = policy_body(rules=CONFIGMAPS, mutations=[fields])
    return api.parse_policy(body).mutations[0]


def expression(*operations: Mapping[str, Any], condition: str | None = None) -> str:
    fields: dict[str, Any] = {"jsonPatch": list(operations)}
    if condition is not None:
        fields["condition"] = condition
    return mutating.mutation_expression(mutation(**fields))


def plan(body: Mapping[str, Any], target: native.Target = TARGET) -> native.Plan:
    """The policy's plan, its MutatingAdmissionPolicies and bindings alone."""
    found = native.plan(load_policy(body, "Fail"), body, target)
    return native.Plan(tuple(o for o in found.objects if o["kind"] in MUTATING_KINDS), found.blockers)


def blockers(*mutations: Mapping[str, Any], failure_policy: str = "Fail") -> list[tuple[str, str]]:
    body = policy_body(rules=CONFIGMAPS, failurePolicy=failure_policy, mutations=list(mutations))
    return [(f.path, f.message) for f in plan(body).blockers]


# --- evaluating a generated expression, and applying its patch as Kubernetes does --------------------

def _as_maps(source: str) -> str:
    """JSONPatch{op: ..., path: ..., value: ...} as map literals, for a CEL environment without the type."""
    source = source.replace("JSONPatch{op: ", '{"op": ')
    return re.sub(r'", (path|from|value): ', r'", "\1": ', source)


def kubernetes_result(source: str, obj: Mapping[str, Any]) -> Any:
    """The object after the generated expression's patch, applied without creating parents; or the
    word "error" (a CEL or patch error: failurePolicy decides, as for the engine's)."""
    compiled = compile_expression(api.Expression(_as_maps(source), "t"))
    try:
        operations = compiled.evaluate(new_activation({"object": obj, "oldObject": None}))
        return jsonpatch.apply_patch(copy.deepcopy(obj), operations)
    except (CelEvaluationError, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
        return "error"


def engine_result(body: Mapping[str, Any], obj: Mapping[str, Any]) -> Any:
    decision = decide(compile_policy(api.parse_policy(body)), object_request(obj), phase=Phase.MUTATE)
    return decision.patched_object if decision.allowed else "error"


def same_as_engine(mutations: Sequence[Mapping[str, Any]], objects: Sequence[Mapping[str, Any]]) -> None:
    body = policy_body(rules=CONFIGMAPS, failurePolicy="Fail", mutations=list(mutations))
    assert plan(body).blockers == ()
    policy = api.parse_policy(body)
    for obj in objects:
        result: Any = copy.deepcopy(obj)
        for item in policy.mutations:
            if result == "error":
                break
            result = kubernetes_result(mutating.mutation_expression(item), result)
        assert result == engine_result(body, obj), obj


def configmap(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "default"}, **fields}


# --- literals -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "literal"), [
    (None, "null"),
    (True, "true"),
    (False, "false"),
    (3, "3"),
    (-3, "-3"),
    (2.5, "2.5"),
    (1e300, "1e+300"),
    (2.0, "2.0"),
    ("plain", '"plain"'),
    ('q"\\\n\t\x01', '"q\\"\\\\\\n\\t\\u0001"'),
    ("ünïcode", '"ünïcode"'),
    ([], "[]"),
    ({}, "{}"),
    ([1, 2], "[1, 2]"),
    ({"a": "x", "b": "y"}, '{"a": "x", "b": "y"}'),
    # Kubernetes' CEL refuses a literal whose items differ in type: each is wrapped in dyn().
    ([1, "two", None], '[dyn(1), dyn("two"), dyn(null)]'),
    ({"a": "x", "n": 1}, '{"a": dyn("x"), "n": dyn(1)}'),
    ({"m": {"a": 1}, "l": {"b": "s"}}, '{"m": dyn({"a": 1}), "l": dyn({"b": "s"})}'),
    ({"m": {"a": 1}, "l": {"b": 2}}, '{"m": {"a": 1}, "l": {"b": 2}}'),
    ([[1], [2, 3]], "[[1], [2, 3]]"),
    ({1: "key"}, '{"1": "key"}'),   # as JSON carries a YAML key
])
def test_json_becomes_the_cel_literal_of_the_same_json(value: Any, literal: str) -> None:
    assert mutating.cel_literal(value) == literal


@pytest.mark.parametrize("value", [
    {"nested": {"list": [1, "two", True, None, 2.5, {"x": []}], "flag": False, "n": -3}, "empty": {}},
    [None, [None], {"a": None}], "a\\b\"c\n",
])
def test_a_literal_evaluates_to_the_value_it_was_made_from(value: Any) -> None:
    compiled = compile_expression(api.Expression(mutating.cel_literal(value), "t"))
    assert compiled.evaluate(new_activation({})) == value


# --- JSON patch operations ------------------------------------------------------------------------

def test_each_operation_is_one_jsonpatch_value_in_order() -> None:
    assert expression({"op": "replace", "path": "/data/k", "value": "v"}, {"op": "remove", "path": "/data/g"},
                      {"op": "copy", "from": "/data/k", "path": "/data/c"},
                      {"op": "move", "from": "/data/m", "path": "/data/n"}) == (
        '[JSONPatch{op: "replace", path: "/data/k", value: "v"}, JSONPatch{op: "remove", path: "/data/g"}, '
        'JSONPatch{op: "copy", path: "/data/c", from: "/data/k"}, JSONPatch{op: "move", path: "/data/n", '
        'from: "/data/m"}]')


def test_an_add_at_the_root_needs_no_parent() -> None:
    assert expression({"op": "add", "path": "/data", "value": {"k": "v"}}) == \
        '[JSONPatch{op: "add", path: "/data", value: {"k": "v"}}]'


def test_an_add_creates_its_missing_parents_where_the_path_first_goes_missing() -> None:
    source = expression({"op": "add", "path": "/spec/tolerations/-", "value": {"key": "k"}})
    assert source == (
        '(!("spec" in object) || object["spec"] == null ? '
        '[JSONPatch{op: "add", path: "/spec", value: {"tolerations": [{"key": "k"}]}}] : '
        '(!("tolerations" in object["spec"]) || object["spec"]["tolerations"] == null ? '
        '[JSONPatch{op: "add", path: "/spec/tolerations", value: [{"key": "k"}]}] : '
        '[JSONPatch{op: "add", path: "/spec/tolerations/-", value: {"key": "k"}}]))')


def test_a_numeric_token_is_an_index_in_a_list_and_a_key_in_a_map() -> None:
    source = expression({"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "E"}})
    assert 'type(object["spec"]["containers"]) == list ? (0 < size(object["spec"]["containers"])' in source
    assert '!("0" in object["spec"]["containers"])' in source
    pod = {"spec": {"containers": [{"name": "c"}]}}
    assert kubernetes_result(source, pod) == {"spec": {"containers": [{"name": "c", "env": [{"name": "E"}]}]}}
    assert kubernetes_result(source, {"spec": {"containers": []}}) == "error"   # no container 0: as the engine
    assert kubernetes_result(source, {"spec": {"containers": {"0": {}}}}) == {
        "spec": {"containers": {"0": {"env": [{"name": "E"}]}}}}


def test_keys_with_slashes_and_tildes_keep_their_escapes_in_paths_and_lose_them_in_values() -> None:
    source = expression({"op": "add", "path": "/metadata/annotations/example.com~1a~0b", "value": "v"})
    assert 'path: "/metadata/annotations/example.com~1a~0b"' in source
    assert 'path: "/metadata/annotations", value: {"example.com/a~b": "v"}' in source
    assert '"example.com/a~b" in object["metadata"]["annotations"]' not in source   # the leaf is not tested
    assert kubernetes_result(source, configmap()) == configmap(metadata={
        "name": "cm", "namespace": "default", "annotations": {"example.com/a~b": "v"}})


def test_a_condition_guards_the_patch_on_lines_of_its_own() -> None:
    source = expression({"op": "add", "path": "/data", "value": {}}, condition="true // always")
    assert source == '(\ntrue // always\n) ? [JSONPatch{op: "add", path: "/data", value: {}}] : []'


def test_a_value_expression_is_used_as_written() -> None:
    source = expression({"op": "add", "path": "/data", "valueExpression": "{'k': object.metadata.name}"})
    assert source == '[JSONPatch{op: "add", path: "/data", value: (\n{\'k\': object.metadata.name}\n)}]'


@pytest.mark.parametrize("objects", [[
    configmap(),
    configmap(data={"k": "v", "gone": "x", "m": "1"}),
    configmap(data={"k": "v", "m": "1"}, metadata={"name": "cm", "namespace": "default", "labels": {"a": "b"},
                                                   "finalizers": ["f"]}),
    configmap(data=None, metadata={"name": "cm", "namespace": "default", "labels": None}),
    configmap(metadata={"name": "cm", "namespace": "default", "finalizers": "not-a-list"}),
]])
def test_json_patches_change_each_object_as_the_engine_does(objects: list[dict[str, Any]]) -> None:
    same_as_engine([
        {"jsonPatch": [{"op": "add", "path": "/metadata/labels/added", "value": "yes"},
                       {"op": "add", "path": "/metadata/labels/second", "value": "too"}]},
        {"jsonPatch": [{"op": "add", "path": "/metadata/finalizers/-", "value": "last"},
                       {"op": "add", "path": "/metadata/finalizers/0", "value": "first"}]},
        {"jsonPatch": [{"op": "add", "path": "/spec/deep/er/list/-", "value": {"a": [1, None]}},
                       {"op": "add", "path": "/spec/deep/other", "value": True},
                       {"op": "add", "path": "/spec/new/0", "value": "first"}]},
        {"condition": "has(object.data) && 'k' in object.data",
         "jsonPatch": [{"op": "copy", "from": "/data/k", "path": "/data/c"},
                       {"op": "replace", "path": "/data/k", "valueExpression": "object.data.k + '!'"}]},
    ], objects)


def test_a_failing_operation_fails_both_ways() -> None:
    same_as_engine([{"jsonPatch": [{"op": "remove", "path": "/data/gone"}]}], [configmap(data={})])
    same_as_engine([{"jsonPatch": [{"op": "add", "path": "/spec/list/3", "value": 1}]}], [configmap()])
    same_as_engine([{"jsonPatch": [{"op": "add", "path": "/spec/list/0/x", "value": 1}]}], [configmap()])


# --- merge patches --------------------------------------------------------------------------------

def test_a_merge_patch_is_the_json_patch_of_what_it_changes() -> None:
    source = mutating.mutation_expression(mutation(merge={"data": {"a": "1", "gone": None}}))
    assert source == (
        '("data" in object && type(object["data"]) == map ? '
        '[JSONPatch{op: "add", path: "/data/a", value: "1"}] + '
        '("gone" in object["data"] ? [JSONPatch{op: "remove", path: "/data/gone"}] : []) : '
        '[JSONPatch{op: "add", path: "/data", value: {"a": "1"}}])')


@pytest.mark.parametrize("mode", ["Overwrite", "IfAbsent"])
def test_merge_patches_change_each_object_as_the_engine_does(mode: str) -> None:
    patch = {"metadata": {"labels": {"m": "1", "drop": None}, "annotations": {"n/x~": "x"}},
             "data": {"new": "v", "old": None, "k": "over", "obj": {"a": None, "b": [None, 1]}}, "other": [1]}
    same_as_engine([{"merge": patch, "mergeMode": mode}], [
        configmap(),
        configmap(data={"k": "v", "old": "o", "obj": "scalar"}, metadata={
            "name": "cm", "namespace": "default", "labels": {"drop": "me", "m": "0"}, "annotations": None}),
        configmap(data={"obj": {"a": 1, "c": 2}, "k": None}, other={"was": "map"}),
        configmap(data=None, metadata=None),
    ])


# --- Pod templates --------------------------------------------------------------------------------

def test_a_pod_policy_mutates_templates_with_paths_and_expressions_rewritten() -> None:
    body = yaml.safe_load((ROOT / "examples" / "lifespan-toleration" / "policy.yaml").read_text())
    objects = {(o["kind"], o["metadata"]["name"]): o for o in plan(body).objects}
    names = [f"ap.{place}.lifespan-toleration" for place in ("policy", "podtemplate", "jobtemplate")]
    assert list(objects) == [(kind, name) for name in names for kind in (mutating.MUTATING_POLICY,
                                                                          mutating.MUTATING_BINDING)]
    job = objects[mutating.MUTATING_POLICY, "ap.jobtemplate.lifespan-toleration"]["spec"]
    source = job["mutations"][0]["jsonPatch"]["expression"]
    assert "object.spec.jobTemplate.spec.template.spec.?tolerations" in source
    assert 'path: "/spec/jobTemplate/spec/template/spec/tolerations/-"' in source
    labels = "object.spec.jobTemplate.spec.template.metadata.labels"
    # Its variable inlined where it is read: Kubernetes 1.32 validates a MutatingAdmissionPolicy's
    # mutations without its variables (expressions.inline_variables).
    assert "variables" not in job and "variables." not in source
    assert f"({labels}['acme.com/lifespan-requested']).matches(" in source
    assert "matchConditions" not in job   # CREATE only: no template to compare with
    assert job["reinvocationPolicy"] == "Never"
    binding = objects[mutating.MUTATING_BINDING, "ap.jobtemplate.lifespan-toleration"]
    assert binding["spec"] == {"policyName": "ap.jobtemplate.lifespan-toleration"}
    assert binding["apiVersion"] == "admissionregistration.k8s.io/v1alpha1"


def test_a_template_update_that_changes_nothing_is_left_alone_as_the_webhook_does() -> None:
    body = policy_body(rules=[rule("pods")], mutations=[{"merge": {"metadata": {"labels": {"a": "b"}}}}])
    objects = {obj["metadata"]["name"]: obj["spec"] for obj in plan(body).objects
               if obj["kind"] == mutating.MUTATING_POLICY}
    assert objects["ap.podtemplate.p"]["matchConditions"] == [{
        "name": "pod-template-changed",
        "expression": "request.operation != 'UPDATE' || oldObject == null || "
                      "(has(object.spec) && has(object.spec.template) ? object.spec.template : null) != "
                      "(has(oldObject.spec) && has(oldObject.spec.template) ? oldObject.spec.template : null)"}]
    assert "matchConditions" not in objects["ap.policy.p"]


# --- the objects ---------------------------------------------------------------------------------

def test_the_policy_object_matches_as_the_validating_one_does_and_never_deletes() -> None:
    body = policy_body(rules=[rule("configmaps", operations=["CREATE", "UPDATE", "DELETE"]),
                              rule("customresourcedefinitions", group="apiextensions.k8s.io")],
                       failurePolicy="Ignore", reinvocationPolicy="IfNeeded",
                       match={"excludeNamespaces": ["skip"], "objectSelector": {"matchLabels": {"x": "y"}},
                              "conditions": [{"name": "c", "expression": "true"}]},
                       variables=[{"name": "v", "expression": "1"}],
                       mutations=[{"jsonPatch": [{"op": "add", "path": "/metadata/labels", "value": {}}]}])
    target = native.Target("v1", (1, 32), ServedIndex(()), exempt_namespaces=("kube-system",),
                           break_glass={"name": "not-break-glass", "expression": "true"}, mutating_version="v1alpha1")
    policy, binding = plan(body, target).objects
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Ignore"
    assert spec["reinvocationPolicy"] == "IfNeeded"
    assert {op for r in spec["matchConstraints"]["resourceRules"] for op in r["operations"]} == {"CREATE", "UPDATE"}
    assert spec["matchConstraints"]["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "skip"]}]}
    assert spec["matchConstraints"]["objectSelector"] == {"matchLabels": {"x": "y"}}
    assert [c["name"] for c in spec["matchConditions"]] == ["not-break-glass", NOT_OWN_CRD["name"], "c"]
    assert "variables" not in spec   # inlined
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == binding["spec"]["policyName"] == "ap.policy.p"
    assert policy["metadata"]["labels"] == native.owner_labels(api.parse_policy(body))
    assert "validationActions" not in binding["spec"]


def test_a_policy_that_mutates_only_deletes_has_no_object() -> None:
    body = policy_body(rules=[rule("configmaps", operations=["DELETE"])],
                       mutations=[{"jsonPatch": [{"op": "add", "path": "/data", "value": {}}]}])
    assert plan(body).objects == ()
    assert [f.path for f in plan(body).blockers] == ["spec.match.resources"]


def test_a_policy_that_validates_and_mutates_has_both_of_one_name_and_owner() -> None:
    body = policy_body(rules=CONFIGMAPS, validations=[{"expression": "true"}],
                       mutations=[{"jsonPatch": [{"op": "add", "path": "/data", "value": {}}]}])
    objects = native.plan(load_policy(body, "Fail"), body, TARGET).objects
    assert [(o["kind"], o["apiVersion"]) for o in objects] == [
        ("ValidatingAdmissionPolicy", "admissionregistration.k8s.io/v1"),
        ("ValidatingAdmissionPolicyBinding", "admissionregistration.k8s.io/v1"),
        (mutating.MUTATING_POLICY, "admissionregistration.k8s.io/v1alpha1"),
        (mutating.MUTATING_BINDING, "admissionregistration.k8s.io/v1alpha1")]
    assert len({(o["metadata"]["name"], str(o["metadata"]["labels"]), str(o["metadata"]["annotations"]))
                for o in objects}) == 1
    assert objects[3]["spec"] == {"policyName": "ap.policy.p"}


def test_without_a_mutating_api_mutations_stay_on_the_webhook() -> None:
    body = policy_body(rules=CONFIGMAPS, mutations=[{"jsonPatch": [{"op": "add", "path": "/data", "value": {}}]}])
    found = plan(body, native.Target("v1", (1, 32), ServedIndex(()))).blockers
    assert [(f.path, f.message.split(" (")[0]) for f in found] == [
        ("spec.mutations", "the API server serves no MutatingAdmissionPolicy")]


# --- blockers --------------------------------------------------------------------------------------

def test_examples_that_do_not_port_say_why() -> None:
    for example, fragment in (("default-resources", "a map literal mixes"),
                              ("node-cpu-overcommit", "undeclared reference to 'formatQuantity'")):
        body = yaml.safe_load((ROOT / "examples" / example / "policy.yaml").read_text())
        found = plan(body).blockers
        assert found and all(fragment in f.message for f in found), found


def test_examples_that_port() -> None:
    for example in ("sidecar-injection", "lifespan-toleration"):
        body = yaml.safe_load((ROOT / "examples" / example / "policy.yaml").read_text())
        assert plan(body).blockers == ()


@pytest.mark.parametrize(("operations", "fragment"), [
    ([{"op": "test", "path": "/data/k", "value": "v"}], "skips the rest of a JSON patch whose test fails"),
    ([{"op": "remove", "path": "/metadata/finalizers/-1"}], "which Kubernetes reads as a number"),
    ([{"op": "replace", "path": "/metadata/finalizers/01", "value": "x"}], "which Kubernetes reads as a number"),
    ([{"op": "add", "path": "/metadata/a~2b", "value": "x"}], "a '~' that is not ~0 or ~1"),
    ([{"op": "add", "path": "/spec/-/x", "value": "x"}], "'-' before its last token"),
    ([{"op": "add", "path": "/data/n", "value": {"big": 2 ** 60}}], "past 2**53"),
    ([{"op": "add", "path": "/spec", "value": {}}, {"op": "add", "path": "/spec/a/b", "value": 1}],
     "an earlier operation of this mutation (add /spec) writes above"),
    ([{"op": "add", "path": "/spec/l/0", "value": {}}, {"op": "add", "path": "/spec/l/1/a/b", "value": 1}],
     "changes a list this add's path goes through"),
    ([{"op": "add", "path": "/spec/0/1/2/3/x", "value": 1}], "more than 3 numeric tokens"),
])
def test_operations_kubernetes_applies_otherwise_keep_the_policy_on_the_webhook(
        operations: list[dict[str, Any]], fragment: str) -> None:
    found = blockers({"jsonPatch": operations})
    assert found and all(path.startswith("spec.mutations[0].jsonPatch[") for path, _ in found), found
    assert any(fragment in message for _, message in found), found


def test_an_earlier_add_under_the_same_parent_is_known_to_have_made_it() -> None:
    source = mutating.mutation_expression(mutation(jsonPatch=[
        {"op": "add", "path": "/metadata/labels/a", "value": "1"},
        {"op": "add", "path": "/metadata/labels/b", "value": "2"}]))
    second = source.split(" + ")[1]
    assert second == '[JSONPatch{op: "add", path: "/metadata/labels/b", value: "2"}]'


def test_plugins_conditions_kubernetes_lacks_and_old_clusters_are_blockers() -> None:
    ours = "formatQuantity(quantity('1'))"
    found = blockers({"condition": f"{ours} == '1'",
                      "jsonPatch": [{"op": "add", "path": "/data/k", "valueExpression": ours}]})
    assert [path for path, _ in found] == ["spec.mutations[0].condition",
                                           "spec.mutations[0].jsonPatch[0].valueExpression"]
    body = policy_body(rules=CONFIGMAPS, mutations=[{"merge": {"data": {}}}])
    old = native.Target("v1", (1, 31), ServedIndex(()), mutating_version="v1alpha1")
    assert [(f.path, f.message) for f in plan(body, old).blockers] == [
        ("spec.mutations", "Kubernetes has MutatingAdmissionPolicy from 1.32 (this cluster is 1.31)")]


def test_a_validating_blocker_other_than_mutations_stays_one() -> None:
    body = policy_body(rules=CONFIGMAPS, reportAdmission=True,
                       mutations=[{"merge": {"data": {}}}])
    assert [f.path for f in plan(body).blockers] == ["spec.reportAdmission"]


class _Mutator(plugins.MutatorPlugin):
    name: ClassVar[str] = "stamp"
    stage: ClassVar[plugins.Stage] = "Beta"

    def mutate(self, config: Any, request: plugins.PluginRequest) -> Any:
        return None


def test_a_mutator_plugin_stays_on_the_webhook() -> None:
    registry = plugins.Registry({"stamp": _Mutator()}, {"stamp": "test"})
    body = policy_body(rules=CONFIGMAPS, mutations=[{"plugin": {"name": "stamp"}}])
    compiled = compile_policy(api.parse_policy(body), registry=registry)
    assert [(f.path, f.message) for f in mutating.mutation_blockers(compiled, (1, 32))] == [
        ("spec.mutations[0].plugin", "the Python plugin 'stamp' runs only in this operator")]


def test_variables_are_inlined_in_order_and_read_otherwise_stay_on_the_webhook() -> None:
    body = policy_body(rules=CONFIGMAPS, variables=[{"name": "a", "expression": "object.data.x"},
                                                    {"name": "b", "expression": "variables.a + 'y'"}],
                       mutations=[{"condition": "has(object.data.x)",
                                   "jsonPatch": [{"op": "add", "path": "/data/z", "valueExpression": "variables.b"}]}])
    (policy,) = [o for o in plan(body).objects if o["kind"] == mutating.MUTATING_POLICY]
    assert "variables" not in policy["spec"]
    assert "((object.data.x) + 'y')" in policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
    body["spec"]["mutations"][0]["jsonPatch"][0]["valueExpression"] = "variables['b']"
    assert [(f.path, f.message.split(",")[0]) for f in plan(body).blockers] == [
        ("spec.mutations[0].jsonPatch[0].valueExpression", "reads its variables otherwise than as variables.<name>")]
