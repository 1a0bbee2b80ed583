"""``vap/native.py``: the ValidatingAdmissionPolicies and bindings an AdmissionPolicy becomes when
Kubernetes enforces it, field by field, and what keeps a policy on the webhook."""
from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from celcases import evaluate

from admission_policy import api
from admission_policy.cel import CelEvaluationError
from admission_policy.cluster.discovery import DiscoveredResource
from admission_policy.cluster.routing import NOT_OWN_CRD, ServedIndex, break_glass_condition
from admission_policy.engine import load_policy
from admission_policy.vap import native
from admission_policy.vap.objects import POLICY
from builders import POD_RULE, decide, policy_body, rule

ROOT = Path(__file__).parents[2]
NAME_LABEL = "kubernetes.io/metadata.name"
TRUE = [{"expression": "true"}]
NEWEST = native.Target("v1", (1, 32), ServedIndex(()))


def example(path: str) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples" / path).read_text())
    assert isinstance(body, dict)
    return body


def plan(body: Mapping[str, Any], target: native.Target = NEWEST, handed_back: Collection[str] = ()) -> native.Plan:
    return native.plan(load_policy(body, "Fail"), body, target, handed_back)


def generated(body: Mapping[str, Any], target: native.Target = NEWEST,
              handed_back: Collection[str] = ()) -> dict[tuple[str, str], dict[str, Any]]:
    """The objects of a policy that ports, by (kind, name)."""
    result = plan(body, target, handed_back)
    assert result.blockers == ()
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in result.objects}


def only_policy(body: Mapping[str, Any], target: native.Target = NEWEST,
                handed_back: Collection[str] = ()) -> dict[str, Any]:
    """The spec of the one ValidatingAdmissionPolicy of a policy that judges no Pods."""
    found = [obj for obj in generated(body, target, handed_back).values() if obj["kind"] == "ValidatingAdmissionPolicy"]
    assert len(found) == 1
    spec: dict[str, Any] = found[0]["spec"]
    return spec


def only_binding(body: Mapping[str, Any]) -> dict[str, Any]:
    found = [obj for obj in generated(body).values() if obj["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert len(found) == 1
    spec: dict[str, Any] = found[0]["spec"]
    return spec


def configmap_policy(name: str = "p", **spec: Any) -> dict[str, Any]:
    """A policy on ConfigMaps: one place, one pair of objects."""
    spec.setdefault("validations", TRUE)
    return policy_body(name, rules=[rule("configmaps")], **spec)


def messages(result: native.Plan) -> list[tuple[str, str]]:
    return [(finding.path, finding.message) for finding in result.blockers]


# --- names and owners ----------------------------------------------------------------------------

def test_a_pod_policy_becomes_a_pair_per_place_named_after_it() -> None:
    objects = generated(example("deny-offensive-pod-names/policy.yaml"))
    names = [f"ap.{place}.deny-offensive-pod-names" for place in ("policy", "podtemplate", "jobtemplate")]
    assert list(objects) == [(kind, name) for name in names
                             for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    for name in names:
        assert objects["ValidatingAdmissionPolicyBinding", name]["spec"]["policyName"] == name
    rules = {name: objects["ValidatingAdmissionPolicy", name]["spec"]["matchConstraints"]["resourceRules"]
             for name in names}
    assert [(r["apiGroups"], r["resources"]) for r in rules["ap.policy.deny-offensive-pod-names"]] == [([""], ["pods"])]
    assert [(r["apiGroups"], r["resources"]) for r in rules["ap.podtemplate.deny-offensive-pod-names"]] == [
        ([""], ["replicationcontrollers"]), (["apps"], ["daemonsets", "deployments", "replicasets", "statefulsets"]),
        (["batch"], ["jobs"])]
    assert [(r["apiGroups"], r["resources"]) for r in rules["ap.jobtemplate.deny-offensive-pod-names"]] == [
        (["batch"], ["cronjobs"])]


def test_a_tenant_policy_is_named_with_its_namespace_and_its_own_name() -> None:
    objects = generated(example("tenant-policy/policy.yaml"))
    assert sorted({name for _, name in objects}) == ["nap.team-a.podtemplate.require-team-label",
                                                     "nap.team-a.policy.require-team-label"]
    for obj in objects.values():
        assert obj["metadata"]["labels"] == {**native.MANAGED_BY, native.POLICY_KIND_LABEL: api.NAMESPACED_KIND,
                                             native.POLICY_NAME_LABEL: "require-team-label",
                                             native.POLICY_NAMESPACE_LABEL: "team-a"}


def test_a_name_too_long_is_cut_with_a_digest_of_the_whole() -> None:
    first, second = (load_policy(configmap_policy("a" * 240 + suffix), "Fail").policy for suffix in ("-one", "-two"))
    names = [native.object_name(policy) for policy in (first, second)]
    assert [len(name) for name in names] == [253, 253]
    assert names[0] != names[1]   # the same first 236 characters
    whole = f"ap.policy.{'a' * 240}-one"
    assert names[0] == f"{whole[:236]}.{hashlib.sha256(whole.encode()).hexdigest()[:16]}"
    assert native.object_name(load_policy(configmap_policy("a" * 243), "Fail").policy) == f"ap.policy.{'a' * 243}"


def test_owner_labels_hash_a_name_longer_than_a_label_value() -> None:
    fits, long = (load_policy(configmap_policy(name), "Fail").policy for name in ("b" * 63, "b" * 64))
    assert native.owner_labels(fits) == {**native.MANAGED_BY, native.POLICY_KIND_LABEL: api.KIND,
                                         native.POLICY_NAME_LABEL: "b" * 63}
    assert native.owner_labels(long)[native.POLICY_NAME_LABEL] == hashlib.sha256(b"b" * 64).hexdigest()[:63]
    # ... where the objects' names (253 characters) keep it whole.
    assert native.object_name(long).endswith("b" * 64)


def test_policy_and_binding_carry_the_same_owner_finalizer_and_generation() -> None:
    body = configmap_policy(metadata={"generation": 7})
    objects = list(generated(body).values())
    assert [obj["apiVersion"] for obj in objects] == ["admissionregistration.k8s.io/v1"] * 2
    for obj in objects:
        assert obj["metadata"]["labels"] == native.owner_labels(load_policy(body, "Fail").policy)
        assert obj["metadata"]["annotations"] == {native.GENERATION_ANNOTATION: "7",
                                                  native.POLICY_ANNOTATION: body["metadata"]["name"]}
        assert obj["metadata"]["finalizers"] == [native.FINALIZER]


def test_the_api_version_is_the_targets() -> None:
    target = native.Target("v1beta1", (1, 29), ServedIndex(()))
    assert {obj["apiVersion"] for obj in generated(configmap_policy(), target).values()} == {
        "admissionregistration.k8s.io/v1beta1"}


# --- what the policy says ------------------------------------------------------------------------

@pytest.mark.parametrize(("enforcement", "action"), [("Enforce", "Deny"), ("Warn", "Warn"), ("Audit", "Audit")])
def test_enforcement_is_the_bindings_validation_action(enforcement: str, action: str) -> None:
    assert only_binding(configmap_policy(enforcement=enforcement))["validationActions"] == [action]


@pytest.mark.parametrize("failure_policy", ["Fail", "Ignore"])
def test_failure_policy_is_carried_over(failure_policy: str) -> None:
    assert only_policy(configmap_policy(failurePolicy=failure_policy))["failurePolicy"] == failure_policy


def test_validations_keep_message_message_expression_and_reason() -> None:
    spec = only_policy(configmap_policy(validations=[
        {"expression": "object.data.size() < 10", "message": "too many keys", "reason": "Invalid"},
        {"expression": "has(object.data)", "messageExpression": "'no data in ' + object.metadata.name"},
    ]))
    assert spec["validations"] == [
        {"expression": "object.data.size() < 10", "reason": "Invalid", "message": "too many keys"},
        {"expression": "has(object.data)", "reason": "Forbidden",
         "messageExpression": "'no data in ' + object.metadata.name"},
    ]


def test_variables_and_match_conditions_are_carried_over_after_the_break_glass() -> None:
    break_glass = break_glass_condition((), ("system:masters",))
    assert break_glass is not None
    target = native.Target("v1", (1, 32), ServedIndex(()), break_glass=break_glass)
    spec = only_policy(configmap_policy(
        match={"conditions": [{"name": "labelled", "expression": "has(object.metadata.labels)"}]},
        variables=[{"name": "keys", "expression": "object.data.size()"}],
        validations=[{"expression": "variables.keys < 10"}]), target)
    assert spec["variables"] == [{"name": "keys", "expression": "object.data.size()"}]
    labelled = {"name": "labelled", "expression": "has(object.metadata.labels)"}
    assert spec["matchConditions"] == [break_glass, labelled, {"name": "any-validation-fails", "expression": (
        "!([object.data.size()].all(_keys, ((_keys) < 10)))")}]


def test_nothing_unasked_for_is_written() -> None:
    spec = only_policy(configmap_policy())
    assert set(spec) == {"failurePolicy", "matchConstraints", "matchConditions", "validations"}
    assert spec["matchConditions"] == [{"name": "any-validation-fails", "expression": "!((true))"}]
    assert spec["matchConstraints"] == {
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                           "resources": ["configmaps"], "scope": "*"}],
        "namespaceSelector": {}, "objectSelector": {}, "matchPolicy": "Equivalent"}
    assert set(only_binding(configmap_policy())) == {"policyName", "validationActions"}


def test_a_rule_on_crds_leaves_the_operators_own_alone() -> None:
    body = policy_body(rules=[rule("customresourcedefinitions", group="apiextensions.k8s.io")], validations=TRUE)
    assert only_policy(body)["matchConditions"][:-1] == [NOT_OWN_CRD]


# --- any-validation-fails: a request every validation admits is skipped -------------------------------

SKIPPED_POLICY: dict[str, Any] = {
    "variables": [{"name": "keys", "expression": "object.data.size()"},
                  {"name": "crowded", "expression": "variables.keys > 3"},
                  {"name": "team", "expression": "object.metadata.labels.team"}],
    "validations": [
        {"expression": "!has(object.data) || !variables.crowded",
         "messageExpression": "'keys: ' + string(variables.keys)"},
        {"expression": "object.metadata.name != 'forbidden'", "message": "a forbidden name"},
        {"expression": "variables.team != ''", "message": "a team label, not empty"},
    ]}


def skip_condition(spec: Mapping[str, Any]) -> str | None:
    found = [c["expression"] for c in spec.get("matchConditions", ()) if c["name"] == "any-validation-fails"]
    return found[0] if found else None


def test_a_request_every_validation_admits_is_skipped_by_a_last_match_condition() -> None:
    """Kubernetes runs every messageExpression of a policy it applies; this condition keeps it from
    applying one whose checks all pass. Match conditions have no variables: one a check reads
    behind a guard is written out where it is read (keys errs without data), one a check cannot
    pass without (team) is evaluated once, up front."""
    spec = only_policy(configmap_policy(**SKIPPED_POLICY))
    assert spec["matchConditions"][-1] == {"name": "any-validation-fails", "expression": (
        "!([object.metadata.labels.team].all(_team, (!has(object.data) || !((object.data.size()) > 3)) && "
        "(object.metadata.name != 'forbidden') && ((_team) != '')))")}
    assert [v["expression"] for v in spec["validations"]] == [v["expression"] for v in SKIPPED_POLICY["validations"]]


CONFIGMAPS: list[dict[str, Any]] = [
    {"metadata": {"name": "fine", "labels": {"team": "a"}}, "data": {"a": "1"}},
    {"metadata": {"name": "fine", "labels": {"team": "a"}}},
    {"metadata": {"name": "crowded", "labels": {"team": "a"}}, "data": dict.fromkeys("abcd", "1")},
    {"metadata": {"name": "forbidden", "labels": {"team": "a"}}},
    {"metadata": {"name": "unlabelled"}},                                # the third check errors
    {"metadata": {"name": "forbidden"}},                                 # an error and a failure
    {"metadata": {"name": "empty-team", "labels": {"team": ""}}, "data": {}},
]


@pytest.mark.parametrize("configmap", CONFIGMAPS, ids=[str(i) for i in range(len(CONFIGMAPS))])
def test_the_skip_condition_is_false_exactly_where_the_policy_admits(configmap: dict[str, Any]) -> None:
    """Under failurePolicy Fail: false only where every check passes (the engine admits), true
    where one fails, an error (the failurePolicy's: a refusal) only where the engine refuses."""
    body = configmap_policy(**SKIPPED_POLICY)
    condition = skip_condition(only_policy(body))
    assert condition is not None
    obj = {"apiVersion": "v1", "kind": "ConfigMap", **configmap}
    obj["metadata"] = {**obj["metadata"], "namespace": "default"}
    admitted = decide(load_policy(body, "Fail"), obj).allowed
    try:
        skipped = evaluate(condition, object=obj, oldObject=None) is False
    except CelEvaluationError:
        skipped = False
    assert skipped == admitted


@pytest.mark.parametrize(("change", "why"), [
    ({"failurePolicy": "Ignore"}, "a request whose checks exceed one expression's cost limit would go unjudged"),
    ({"validations": [{"expression": "namespaceObject.metadata.name != 'x'"}]}, "namespaceObject is null there"),
    ({"validations": [{"expression": "request.resource.resource == 'configmaps'"}]}, "the request's own resource"),
    ({"validations": [{"expression": "object.data.all(object, object != '')"}]}, "a loop variable named object"),
    ({"variables": [{"name": "k", "expression": "object.data"}],
      "validations": [{"expression": "variables['k'].size() < 3"}]}, "variables read otherwise than by name"),
    ({"variables": [{"name": "k", "expression": "object.data"}],
      "validations": [{"expression": "variables.k.all(_k, _k != '')"}]}, "a loop variable named as a binding"),
    ({"match": {"conditions": [{"name": "any-validation-fails", "expression": "true"}]}}, "the name taken"),
])
def test_no_skip_condition_where_it_could_decide_otherwise(change: dict[str, Any], why: str) -> None:
    spec = only_policy(configmap_policy(**change))
    assert [c["name"] for c in spec.get("matchConditions", ())].count("any-validation-fails") <= 1, why
    if "match" not in change:
        assert skip_condition(spec) is None, why


def test_the_skip_condition_reads_the_pod_template_and_the_1_28_spelling() -> None:
    body = example("pod-security-restricted/policy.yaml")
    objects = generated(body, native.Target("v1beta1", (1, 28), ServedIndex(())))
    for (kind, name), obj in objects.items():
        if kind != "ValidatingAdmissionPolicy":
            continue
        condition = skip_condition(obj["spec"])
        assert condition is not None and ".?" not in condition and "variables." not in condition, name
        assert ("object.spec.template.spec" in condition) == (name == "ap.podtemplate.pod-security-restricted"), name


def test_namespace_and_object_selectors_are_carried_over() -> None:
    spec = only_policy(configmap_policy(match={
        "namespaceSelector": {"matchLabels": {"env": "prod"},
                              "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}]},
        "objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}}))
    assert spec["matchConstraints"]["namespaceSelector"] == {
        "matchLabels": {"env": "prod"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["api", "web"]}]}
    assert spec["matchConstraints"]["objectSelector"] == {
        "matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}


def test_excluded_exempt_and_handed_back_namespaces_are_one_not_in() -> None:
    target = native.Target("v1", (1, 32), ServedIndex(()), exempt_namespaces=("kube-system", "ops"))
    spec = only_policy(configmap_policy(match={"excludeNamespaces": ["dev"],
                                               "namespaceSelector": {"matchLabels": {"env": "prod"}}}),
                       target, handed_back=("team-b", "dev"))
    assert spec["matchConstraints"]["namespaceSelector"] == {
        "matchLabels": {"env": "prod"},
        "matchExpressions": [{"key": NAME_LABEL, "operator": "NotIn",
                              "values": ["dev", "kube-system", "ops", "team-b"]}]}


def test_a_tenant_policy_is_confined_to_its_namespace() -> None:
    target = native.Target("v1", (1, 32), ServedIndex(()), exempt_namespaces=("kube-system",))
    objects = generated(example("tenant-policy/policy.yaml"), target)
    for (kind, _), obj in objects.items():
        if kind != "ValidatingAdmissionPolicy":
            continue
        constraints = obj["spec"]["matchConstraints"]
        assert constraints["namespaceSelector"] == {"matchExpressions": [
            {"key": NAME_LABEL, "operator": "In", "values": ["team-a"]},
            {"key": NAME_LABEL, "operator": "NotIn", "values": ["kube-system"]}]}
        assert {r["scope"] for r in constraints["resourceRules"]} == {"Namespaced"}


def test_params_become_param_kind_and_the_bindings_param_ref() -> None:
    body = configmap_policy(paramKind={"apiVersion": "v1", "kind": "ConfigMap"},
                            paramRef={"selector": {"matchLabels": {"app": "limits"}}, "namespace": "config",
                                      "parameterNotFoundAction": "Allow"},
                            validations=[{"expression": "params.data.size() > 0"}])
    assert only_policy(body)["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert only_binding(body)["paramRef"] == {"parameterNotFoundAction": "Allow", "namespace": "config",
                                              "selector": {"matchLabels": {"app": "limits"}}}
    named = configmap_policy(paramKind={"apiVersion": "v1", "kind": "ConfigMap"}, paramRef={"name": "limits"},
                             validations=[{"expression": "params.data.size() > 0"}])
    # An unset action is written as the policy's default, Deny, as Kubernetes' is.
    assert only_binding(named)["paramRef"] == {"parameterNotFoundAction": "Deny", "name": "limits"}


# --- Pod templates -------------------------------------------------------------------------------

def test_pod_template_expressions_read_the_template_but_the_workloads_name() -> None:
    expression = ("object.metadata.labels['team'] != '' && object.spec.containers.all(c, c.image != '') && "
                  "object.metadata.name != '' && oldObject == null")
    objects = generated(policy_body(rules=[POD_RULE], validations=[{"expression": expression}]))
    read = {name: obj["spec"]["validations"][0]["expression"] for (kind, name), obj in objects.items()
            if kind == "ValidatingAdmissionPolicy"}
    assert read == {
        "ap.policy.p": expression,
        "ap.podtemplate.p": "object.spec.template.metadata.labels['team'] != '' && "
                            "object.spec.template.spec.containers.all(c, c.image != '') && "
                            "object.metadata.name != '' && oldObject == null",
        "ap.jobtemplate.p": "object.spec.jobTemplate.spec.template.metadata.labels['team'] != '' && "
                            "object.spec.jobTemplate.spec.template.spec.containers.all(c, c.image != '') && "
                            "object.metadata.name != '' && oldObject == null",
    }


def test_variables_and_messages_are_rewritten_for_templates_too() -> None:
    body = example("tenant-policy/policy.yaml")
    spec = generated(body)["ValidatingAdmissionPolicy", "nap.team-a.podtemplate.require-team-label"]["spec"]
    assert spec["variables"][0]["expression"].startswith(
        "(object.spec.template.spec.containers + object.spec.template.spec.?initContainers.orValue([]))")
    assert spec["validations"][0]["expression"] == "object.spec.template.metadata.?labels.?team.orValue('') != ''"
    # ... and say whose Pod template it judged, as the webhook does.
    assert spec["validations"][0]["messageExpression"] == (
        "'the Pod template of ' + request.kind.kind + (request.name != '' ? ' \"' + request.name + '\"' : "
        "has(object.metadata.generateName) ? ' \"' + object.metadata.generateName + '\"' : '') + "
        "' would violate the policy: ' + ('a team label is required in team-a: ' + object.metadata.name)")


def test_a_pod_only_policy_judges_pods_alone() -> None:
    names = {name for _, name in generated(policy_body(podControllers=[], validations=TRUE))}
    assert names == {"ap.policy.p"}


def test_reading_the_pod_as_a_whole_keeps_a_pod_policy_on_the_webhook() -> None:
    result = plan(policy_body(validations=[{"expression": "object.kind == 'Pod'"}]))
    assert result.objects == ()
    assert messages(result) == [("spec.validations[0].expression", "reads object.kind, which a Pod template does "
                                 "not stand for natively (spec.podControllers: [] judges Pods alone)")]


# --- rules and discovery -------------------------------------------------------------------------

def test_a_wildcard_expands_from_discovery_never_to_what_the_webhooks_never_see() -> None:
    served = ServedIndex([DiscoveredResource("", "v1", "pods", ("status",)), DiscoveredResource("", "v1", "events"),
                          DiscoveredResource("apps", "v1", "deployments")])
    body = policy_body(rules=[{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"],
                               "operations": ["CREATE"]}], validations=TRUE)
    spec = only_policy(body, native.Target("v1", (1, 32), served))
    assert [(r["apiGroups"], r["apiVersions"], r["resources"]) for r in spec["matchConstraints"]["resourceRules"]] == [
        ([""], ["v1"], ["pods"]), (["apps"], ["v1"], ["deployments"])]


def test_a_resource_named_is_at_its_groups_preferred_version_when_discovered() -> None:
    served = ServedIndex([DiscoveredResource("apps", "v1", "deployments")])
    body = policy_body(rules=[rule("deployments", group="apps", version="*")], validations=TRUE)
    rules = only_policy(body, native.Target("v1", (1, 32), served))["matchConstraints"]["resourceRules"]
    assert [r["apiVersions"] for r in rules] == [["v1"]]
    undiscovered = only_policy(body)["matchConstraints"]["resourceRules"]
    assert [r["apiVersions"] for r in undiscovered] == [["*"]]


# --- what keeps a policy on the webhook ----------------------------------------------------------

def test_optional_syntax_is_written_without_optionals_before_kubernetes_1_29() -> None:
    body = example("require-team-label-enforce/policy.yaml")
    old = generated(body, native.Target("v1beta1", (1, 28), ServedIndex(())))
    new = generated(body, native.Target("v1beta1", (1, 29), ServedIndex(())))
    expression = {key: obj["spec"]["validations"][0]["expression"] for key, obj in old.items() if key[0] == POLICY}
    assert expression and all(".?" not in text and "[?" not in text and "has(" in text for text in expression.values())
    assert any(".?" in obj["spec"]["validations"][0]["expression"] for key, obj in new.items() if key[0] == POLICY)


def test_optional_syntax_that_plain_cel_cannot_say_needs_kubernetes_1_29() -> None:
    body = configmap_policy(validations=[{"expression": "object.data.?key.optMap(v, size(v)).orValue(0) < 10"}])
    old = plan(body, native.Target("v1beta1", (1, 28), ServedIndex(())))
    assert old.objects == () and not old.native
    ((path, message),) = messages(old)
    assert path == "spec.validations[0].expression"
    assert message.startswith("uses CEL's optional syntax (.?field, ?key, optional.*), which Kubernetes has from 1.29 "
                              "(this cluster is 1.28), in a way plain CEL cannot say: ") and "optMap" in message
    assert plan(body, native.Target("v1beta1", (1, 29), ServedIndex(()))).native


def test_a_library_newer_than_the_cluster_is_a_blocker() -> None:
    body = configmap_policy(validations=[{"expression": "semver('1.2.3').major() == 1"}])
    assert messages(plan(body)) == [("spec.validations[0].expression",
                                     "needs Kubernetes 1.33 or later (library semver); this cluster is 1.32")]
    assert plan(body, native.Target("v1", (1, 33), ServedIndex(()))).native


def test_cel_kubernetes_lacks_is_one_blocker_not_one_per_library() -> None:
    body = configmap_policy(validations=[{"expression": "formatQuantity(quantity('1')) == '1'"}])
    for kubernetes in ((1, 28), (1, 32)):
        found = messages(plan(body, native.Target("v1", kubernetes, ServedIndex(()))))
        assert [path for path, _ in found] == ["spec.validations[0].expression"]
        assert "undeclared reference to 'formatQuantity'" in found[0][1]


@pytest.mark.parametrize(("spec", "path", "words"), [
    ({"reportAdmission": True}, "spec.reportAdmission", "reports each admission decision"),
    ({"context": [{"name": "all", "version": "v1", "resource": "configmaps"}]}, "spec.context", "no lists"),
    ({"mutations": [{"jsonPatch": [{"op": "add", "path": "/metadata/labels/x", "value": "y"}]}]},
     "spec.mutations", "serves no MutatingAdmissionPolicy"),
])
def test_what_kubernetes_cannot_do_is_a_blocker_at_its_field(spec: dict[str, Any], path: str, words: str) -> None:
    result = plan(configmap_policy(**spec))
    assert result.objects == ()
    assert [(found_path, words in message) for found_path, message in messages(result)] == [(path, True)]


def test_params_of_a_policy_judging_crds_are_a_blocker() -> None:
    body = policy_body(rules=[rule("customresourcedefinitions", group="apiextensions.k8s.io")], validations=TRUE,
                       paramKind={"apiVersion": "v1", "kind": "ConfigMap"}, paramRef={"name": "limits"})
    assert [path for path, _ in messages(plan(body))] == ["spec.paramKind"]


def test_a_policy_naming_only_what_the_webhooks_never_see_has_nothing_to_generate() -> None:
    result = plan(policy_body(rules=[rule("events")], validations=TRUE))
    assert messages(result) == [("spec.match.resources", "names nothing this cluster serves")]
