"""Pod controllers: a policy written for Pods also judges the Pod templates of workloads."""
from __future__ import annotations

import copy
import datetime
from typing import Any

import jsonpatch
import pytest

from admission_policy import api
from admission_policy.api import PolicyError, parse_policy
from admission_policy.cluster.routing import routes
from admission_policy.engine import PolicySet, evaluate
from admission_policy.engine.podcontrollers import CONTROLLERS, pod_view
from admission_policy.operator import conditions
from builders import POD_RULE, container, decide, deployment, object_request, policy, policy_body

NO_PRIVILEGED = {"expression": "object.spec.containers.all(c, !c.?securityContext.?privileged.orValue(false))",
                 "message": "privileged containers are not allowed"}


def cronjob(name: str = "nightly", *, privileged: bool = False) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {
                "spec": {"restartPolicy": "Never", "containers": [container("app", privileged=privileged)]}}}}}}


# --- compile time ----------------------------------------------------------------------------------

def test_a_pod_policy_covers_every_controller_by_default() -> None:
    compiled = policy(validations=[NO_PRIVILEGED])
    assert compiled.coverage.kinds == api.POD_CONTROLLERS
    assert tuple(c.kind for c in CONTROLLERS) == api.POD_CONTROLLERS
    locations = {d.template for d in compiled.derived}
    assert locations == {("spec", "template"), ("spec", "jobTemplate", "spec", "template")}
    resources = {(g, r) for d in compiled.derived for rule in d.policy.match.resources
                 for g in rule.api_groups for r in rule.resources}
    assert resources == {("apps", "deployments"), ("apps", "replicasets"), ("apps", "statefulsets"),
                         ("apps", "daemonsets"), ("batch", "jobs"), ("batch", "cronjobs"),
                         ("", "replicationcontrollers")}


def test_operations_follow_the_pod_rules_and_delete_is_never_carried_over() -> None:
    compiled = policy(rules=[{**POD_RULE, "operations": ["CREATE", "DELETE"]}], validations=[NO_PRIVILEGED])
    assert {op for d in compiled.derived for r in d.policy.match.resources for op in r.operations} == {"CREATE"}
    delete_only = policy(rules=[{**POD_RULE, "operations": ["DELETE"]}], validations=[NO_PRIVILEGED])
    assert delete_only.derived == () and delete_only.coverage is None


def test_pod_controllers_narrows_and_opts_out() -> None:
    narrowed = policy(validations=[NO_PRIVILEGED], podControllers=["Deployment", "CronJob"])
    assert narrowed.coverage.kinds == ("Deployment", "CronJob")
    assert decide([narrowed], deployment(privileged=True)).allowed is False
    replica_set = deployment(privileged=True)
    replica_set["kind"] = "ReplicaSet"
    assert decide([narrowed], replica_set).allowed is True
    none = policy(validations=[NO_PRIVILEGED], podControllers=[])
    assert none.derived == () and none.coverage.as_status() == {
        "kinds": [], "reason": "spec.podControllers is empty"}
    assert decide([none], deployment(privileged=True)).allowed is True


@pytest.mark.parametrize(("value", "path", "fragment"), [
    (["Deployment", "Pod"], "spec.podControllers[1]", "must be one of Deployment"),
    (["Job", "Job"], "spec.podControllers[1]", "duplicate kind 'Job'"),
    ("none", "spec.podControllers", "must be a list"),
])
def test_pod_controllers_errors_name_the_field(value: Any, path: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as error:
        parse_policy(policy_body(validations=[NO_PRIVILEGED], podControllers=value))
    assert error.value.path == path and fragment in error.value.message


def test_a_policy_naming_workloads_itself_judges_them_as_written() -> None:
    everything = policy(rules=[{**POD_RULE, "apiGroups": ["*"], "resources": ["pods", "*"]}],
                        validations=[NO_PRIVILEGED])
    assert everything.derived == () and "already names" in everything.coverage.reason
    some = policy(rules=[POD_RULE, {**POD_RULE, "apiGroups": ["apps"], "resources": ["deployments"]}],
                  validations=[{"expression": "true"}])
    assert "Deployment" not in some.coverage.kinds and "ReplicaSet" in some.coverage.kinds


def test_expressions_reading_status_are_not_applied_and_status_says_why() -> None:
    compiled = policy(
        variables=[{"name": "phase", "expression": "object.?status.?phase.orValue('')"}],
        validations=[NO_PRIVILEGED,
                     {"expression": "variables.phase != 'Failed'"},
                     {"expression": "!has(object.metadata.ownerReferences)"},
                     {"expression": "'object.status' != ''"}])   # a string literal reads nothing
    status = compiled.coverage.as_status()
    assert status["notApplied"] == [
        {"path": "spec.validations[1].expression",
         "reason": "reads variables.phase, which reads object.status, which a Pod template does not have"},
        {"path": "spec.validations[2].expression",
         "reason": "reads object.metadata.ownerReferences, which only a created Pod has (a template never "
                   "carries it)"},
    ]
    (derived, _) = compiled.derived
    assert [v.spec.expression.path for v in derived.validations] == [
        "spec.validations[0].expression", "spec.validations[3].expression"]
    failed = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "default"},
              "spec": {"containers": [container("app")]}, "status": {"phase": "Failed"}}
    assert decide([compiled], failed).allowed is False   # the Pod itself still gets every validation
    assert decide([compiled], deployment()).allowed is True


def test_a_match_condition_reading_status_keeps_the_whole_policy_off_templates() -> None:
    compiled = policy(match={"conditions": [{"name": "running", "expression": "object.status.phase == 'Running'"}]},
                      validations=[NO_PRIVILEGED])
    assert compiled.derived == ()
    assert compiled.coverage.not_applied[0].path == "spec.match.conditions[0].expression"
    assert "match condition" in compiled.coverage.reason


# --- evaluation ------------------------------------------------------------------------------------

def test_a_privileged_template_is_denied_naming_the_workload() -> None:
    compiled = policy("no-privileged", validations=[NO_PRIVILEGED])
    decision = decide([compiled], deployment("web", privileged=True))
    assert decision.allowed is False and decision.code == 403
    assert decision.message == ('AdmissionPolicy "no-privileged" denied the request: the Pod template of '
                                'Deployment "web" would violate the policy: privileged containers are not allowed')
    cron = decide([compiled], cronjob("nightly", privileged=True))
    assert 'the Pod template of CronJob "nightly" would violate the policy' in cron.message
    assert decide([compiled], deployment("web")).allowed is True
    assert decide([compiled], cronjob()).allowed is True


def _at_version(workload: dict[str, Any], api_version: str) -> dict[str, Any]:
    return {**workload, "apiVersion": api_version}


@pytest.mark.parametrize(("workload", "judged"), [
    # Manifests of versions Kubernetes has since removed, as offline tests and Kyverno's cases have them.
    pytest.param(_at_version(cronjob(privileged=True), "batch/v1beta1"), True, id="CronJob batch/v1beta1"),
    pytest.param(_at_version(cronjob(privileged=True), "batch/v2alpha1"), True, id="CronJob batch/v2alpha1"),
    pytest.param(_at_version(deployment(privileged=True), "apps/v1beta1"), True, id="Deployment apps/v1beta1"),
    pytest.param(_at_version(deployment(privileged=True), "apps/v1beta2"), True, id="Deployment apps/v1beta2"),
    pytest.param({**_at_version(deployment(privileged=True), "apps/v1beta2"), "kind": "DaemonSet"}, True,
                 id="DaemonSet apps/v1beta2"),
    # A version never served for the kind, and the extensions group (its workloads gone since 1.16).
    pytest.param({**_at_version(cronjob(privileged=True), "batch/v1beta1"), "kind": "Job"}, False,
                 id="Job batch/v1beta1"),
    pytest.param(_at_version(deployment(privileged=True), "extensions/v1beta1"), False,
                 id="Deployment extensions/v1beta1"),
])
def test_workloads_of_every_served_version_are_judged(workload: dict[str, Any], judged: bool) -> None:
    decision = decide([policy(validations=[NO_PRIVILEGED])], workload)
    assert decision.allowed is not judged
    if judged:
        assert f'the Pod template of {workload["kind"]} ' in decision.message


def test_an_old_cronjob_passing_the_policy_is_judged_and_allowed() -> None:
    # Kyverno's memory-requests-equal-limits case: a batch/v1beta1 CronJob was "not matched".
    equal = {"expression": "object.spec.containers.all(c, c.?resources.?requests.?memory == "
                           "c.?resources.?limits.?memory)", "message": "memory requests must equal limits"}
    old = _at_version(cronjob(), "batch/v1beta1")
    resources = {"requests": {"memory": "1000m"}, "limits": {"memory": "1000m"}}
    old["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
    compiled = policy("memory", validations=[equal])
    review = object_request(old)
    assert [p.name for p in PolicySet([compiled]).candidates(review)] == ["memory"]
    assert decide([compiled], old).allowed is True
    resources["limits"]["memory"] = "2000m"
    assert decide([compiled], old).allowed is False


def test_warn_and_audit_name_the_workload_too() -> None:
    warn = policy("w", enforcement="Warn", validations=[NO_PRIVILEGED])
    decision = decide([warn], deployment("web", privileged=True))
    assert decision.allowed and decision.warnings == (
        'AdmissionPolicy "w": the Pod template of Deployment "web" would violate the policy: '
        'privileged containers are not allowed',)
    audit = policy("a", enforcement="Audit", validations=[NO_PRIVILEGED])
    assert "Deployment" in decide([audit], deployment("web", privileged=True)).audit_annotations["a"]


def test_object_reads_the_template_as_a_pod_with_the_workloads_name_and_namespace() -> None:
    compiled = policy(validations=[{
        "expression": "object.kind == 'Pod' && object.apiVersion == 'v1' && object.metadata.name == 'web' && "
                      "object.metadata.namespace == 'default' && object.metadata.labels == {'app': 'web'} && "
                      "!has(object.spec.template) && request.kind.kind == 'Deployment' && "
                      "namespaceObject == null"}])
    assert decide([compiled], deployment("web")).allowed is True
    view = pod_view(deployment("web"), ("spec", "template"))
    assert view["metadata"] == {"labels": {"app": "web"}, "name": "web", "namespace": "default"}
    assert pod_view(None, ("spec", "template")) is None


def test_an_update_that_keeps_the_template_is_not_judged() -> None:
    compiled = policy(validations=[NO_PRIVILEGED])
    old = deployment("web", privileged=True)
    scaled = deployment("web", privileged=True, replicas=5)
    assert decide([compiled], object_request(scaled, operation="UPDATE", old=old)).allowed is True
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "x"}
    assert decide([compiled], object_request(relabelled, operation="UPDATE", old=old)).allowed is True
    new_image = deployment("web", privileged=True, image="nginx:2")
    assert decide([compiled], object_request(new_image, operation="UPDATE", old=old)).allowed is False


def test_old_object_is_the_old_template() -> None:
    same_image = "oldObject.spec.containers[0].image == object.spec.containers[0].image"
    compiled = policy(validations=[{"expression": f"oldObject == null || {same_image}", "message": "image changed"}])
    decision = decide([compiled], object_request(deployment(image="b"), operation="UPDATE", old=deployment(image="a")))
    assert decision.allowed is False and "image changed" in decision.message


def test_the_object_selector_reads_the_template_labels() -> None:
    compiled = policy(match={"objectSelector": {"matchLabels": {"tier": "frontend"}}}, validations=[NO_PRIVILEGED])
    assert decide([compiled], deployment(privileged=True, labels={"tier": "frontend"})).allowed is False
    assert decide([compiled], deployment(privileged=True, labels={"tier": "backend"})).allowed is True


@pytest.mark.parametrize(("workload", "prefix"), [
    (deployment(), "/spec/template"),
    (cronjob(), "/spec/jobTemplate/spec/template"),
])
def test_json_patch_paths_are_rewritten_for_each_controller_kind(workload: dict[str, Any], prefix: str) -> None:
    compiled = policy(mutations=[{"name": "label", "jsonPatch": [
        {"op": "add", "path": "/metadata/labels/injected", "value": "yes"},
        {"op": "add", "path": "/spec/containers/0/env", "valueExpression": "[{'name': 'POD', 'value': "
                                                                          "object.metadata.name}]"},
    ]}])
    decision = decide([compiled], workload)
    assert {op["path"] for op in decision.patch} == {f"{prefix}/metadata/labels/injected"
                                                     if "labels" in str(workload) else f"{prefix}/metadata",
                                                     f"{prefix}/spec/containers/0/env"}
    patched = jsonpatch.apply_patch(workload, list(decision.patch))
    assert patched == decision.patched_object
    template = patched["spec"]["template"] if prefix == "/spec/template" else \
        patched["spec"]["jobTemplate"]["spec"]["template"]
    assert template["metadata"]["labels"]["injected"] == "yes"
    assert template["spec"]["containers"][0]["env"] == [{"name": "POD", "value": workload["metadata"]["name"]}]
    assert patched["metadata"] == workload["metadata"]


def test_merge_mutations_are_nested_into_the_template() -> None:
    compiled = policy(mutations=[{"name": "team", "merge": {"metadata": {"labels": {"team": "none"}}},
                                  "mergeMode": "IfAbsent"}])
    decision = decide([compiled], cronjob())
    assert decision.patched_object["spec"]["jobTemplate"]["spec"]["template"]["metadata"] == {
        "labels": {"team": "none"}}
    assert "labels" not in decision.patched_object["metadata"]


def test_mutations_with_no_place_in_a_template_are_not_applied() -> None:
    compiled = policy(mutations=[
        {"name": "rename", "jsonPatch": [{"op": "replace", "path": "/metadata/name", "value": "x"}]},
        {"name": "status", "merge": {"status": {"phase": "x"}}},
        {"name": "ok", "jsonPatch": [{"op": "add", "path": "/spec/priority", "value": 1}]},
    ])
    assert [n.path for n in compiled.coverage.not_applied] == ["spec.mutations[0]", "spec.mutations[1]"]
    decision = decide([compiled], deployment())
    assert [op["path"] for op in decision.patch] == ["/spec/template/spec/priority"]


# --- registration and status -------------------------------------------------------------------------

def test_webhooks_route_controllers_only_while_a_pod_policy_needs_them() -> None:
    pod_policy = policy(validations=[NO_PRIVILEGED])
    resources = {r for route in routes(pod_policy) for r in route.resources}
    assert {"pods", "deployments", "cronjobs", "replicationcontrollers"} <= resources
    # A cluster not serving a workload kind is nothing the policy's author has to fix (not Degraded).
    assert {r for route in routes(pod_policy, derived=False) for r in route.resources} == {"pods"}
    opted_out = policy(validations=[NO_PRIVILEGED], podControllers=[])
    assert {r for route in routes(opted_out) for r in route.resources} == {"pods"}
    mutating = {route.mutating for route in routes(policy(mutations=[
        {"name": "m", "jsonPatch": [{"op": "add", "path": "/spec/priority", "value": 1}]}]))}
    assert mutating == {True}


def test_policy_set_replace_and_remove_take_the_derived_policies_along() -> None:
    first = policy("a", validations=[NO_PRIVILEGED])
    policies = PolicySet([first])
    updated = policies.replace(policy("a", validations=[{"expression": "true"}]))
    review = object_request(deployment(privileged=True))
    assert evaluate(policies, review).allowed is False
    assert evaluate(updated, review).allowed is True
    assert evaluate(policies.remove("a"), review).allowed is True


def test_status_reports_the_kinds_and_clears_them_when_no_longer_a_pod_policy() -> None:
    compiled_ok = conditions.Condition(conditions.COMPILED, "True", "Compiled", "")
    registered = conditions.Condition(conditions.REGISTERED, "True", "Registered", "")
    now = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
    coverage = policy(validations=[NO_PRIVILEGED], podControllers=["Deployment"]).coverage.as_status()
    written = conditions.status_patch(None, conditions.Observation(
        compiled_ok, registered, coverage, reports_pod_controllers=True), 1, now)
    assert written["podControllers"] == {"kinds": ["Deployment"]}
    cleared = conditions.status_patch(written, conditions.Observation(
        compiled_ok, registered, None, reports_pod_controllers=True), 2, now)
    assert cleared["podControllers"] is None
    kept = conditions.status_patch(written, conditions.Observation(compiled_ok, registered), 2, now)
    assert "podControllers" not in kept
