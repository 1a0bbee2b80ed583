"""Type checking on a real API server: a misspelt field is a warning at `kubectl apply`, in
`kubectl describe ap` (condition TypeChecked, status.typeChecking) — never a refusal unless the
policy says ``typeChecking: Deny`` — and the operator's warnings are the ones kube-controller-manager
writes on a ValidatingAdmissionPolicy with the same expressions, on both control planes.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pykube
import yaml
from e2e_kube import AdmissionPolicy, Cluster, Policies, Target, eventually, policy_body, unique, vap_version

GROUP = "admissionregistration.k8s.io"
DEPLOYMENTS = {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"],
               "operations": ["CREATE", "UPDATE"]}
PODS = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE", "UPDATE"]}

# (expression, messageExpression): both checkers see the same mistakes here. No variables: 1.28's
# checker does not know them.
SAME = [
    ("object.spec.replicas > 1", None),
    ("object.spec.replica > 1", None),                                      # undefined field 'replica'
    ("object.spec.replicas == 'three'", None),                              # int == string
    ("object.spec.template.spec.containers.all(c, c.image != '')", "'replicas: ' + object.spec.replicas"),
    ("object.spec.template.spec.containers.all(c, c.imagePullPolicy.startsWith('If'))", None),
    ("object.spec.template.spec.containers.all(c, c.imgae != '')", None),   # undefined field 'imgae'
    ("has(object.metadata.labels) && object.metadata.labels.team == 'a'", None),
]


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    answer = cluster.get(AdmissionPolicy, name)
    assert answer.ok, answer
    status: dict[str, Any] = answer.obj.get("status") or {}
    return status


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or () if c["type"] == type_), {})


def _validations() -> list[dict[str, Any]]:
    return [{"expression": expression, "message": "m", **({"messageExpression": message} if message else {})}
            for expression, message in SAME]


def test_the_operators_warnings_are_those_of_kube_controller_manager(
        native_target: Target, target_policies: Policies) -> None:
    cluster = native_target.cluster
    name = unique("e2e-typed", 50)
    vap = {"apiVersion": f"{GROUP}/{vap_version(cluster)}", "kind": "ValidatingAdmissionPolicy",
           "metadata": {"name": name},
           "spec": {"failurePolicy": "Ignore", "matchConstraints": {"resourceRules": [DEPLOYMENTS]},
                    "validations": _validations()}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(vap))
    try:
        def vap_status() -> dict[str, Any]:
            got = cluster.kubectl("get", f"validatingadmissionpolicies.{GROUP}", name, "-o", "json").stdout
            found: dict[str, Any] = json.loads(got).get("status") or {}
            return found
        checked = eventually(vap_status, lambda s: s.get("observedGeneration") == 1 and "typeChecking" in s,
                             f"ValidatingAdmissionPolicy {name} to be type-checked", cluster.settings.timeout)
        theirs = {w["fieldRef"]: w["warning"] for w in checked["typeChecking"].get("expressionWarnings") or ()}

        target_policies.apply(policy_body(name, native="Never", failurePolicy="Ignore",
                                          match={"resources": [DEPLOYMENTS]}, validations=_validations()))
        status = eventually(lambda: _status(cluster, name), lambda s: bool(_condition(s, "TypeChecked")),
                            f"AdmissionPolicy {name} to be type-checked", cluster.settings.timeout)
        ours = {w["fieldRef"]: w["warning"] for w in status["typeChecking"]["expressionWarnings"]}
    finally:
        cluster.kubectl("delete", f"validatingadmissionpolicies.{GROUP}", name, "--ignore-not-found")

    assert sorted(ours) == sorted(theirs) == [
        "spec.validations[1].expression", "spec.validations[2].expression",
        "spec.validations[3].messageExpression", "spec.validations[5].expression"], (ours, theirs)
    for field, mistake in [("spec.validations[1].expression", "undefined field 'replica'"),
                           ("spec.validations[5].expression", "undefined field 'imgae'"),
                           ("spec.validations[2].expression", "found no matching overload for '_==_'"),
                           ("spec.validations[3].messageExpression", "found no matching overload for '_+_'")]:
        assert mistake in ours[field] and mistake in theirs[field], (field, ours[field], theirs[field])
        assert ours[field].startswith("apps/v1, Kind=Deployment: ") and "apps/v1, Kind=Deployment" in theirs[field]
    condition = _condition(status, "TypeChecked")
    assert (condition["status"], condition["reason"]) == ("False", "Warnings"), condition


def test_a_misspelt_field_is_a_warning_at_apply_in_describe_and_never_a_refusal(
        cluster: Cluster, policies: Policies, namespace: Callable[..., str]) -> None:
    name = unique("e2e-typo", 50)
    ns = namespace()
    body = policy_body(name, failurePolicy="Fail",
                       match={"resources": [PODS], "namespaceSelector": {
                           "matchLabels": {"kubernetes.io/metadata.name": ns}}},
                       validations=[{"expression": "!has(object.spec.hostNetwrok)", "message": "no host network"}])
    policies.names.append(name)
    applied = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
    assert (f"Warning: AdmissionPolicy '{name}': spec.validations[0].expression: v1, Kind=Pod: undefined field "
            "'hostNetwrok' not found in struct 'PodSpec' (line 1, column 5)") in applied.stderr, applied
    policies.wait_active(name)   # a warning, not a refusal: the policy is enforced

    status = eventually(lambda: _status(cluster, name), lambda s: bool(_condition(s, "TypeChecked")),
                        f"AdmissionPolicy {name} to be type-checked", cluster.settings.timeout)
    assert status["typeChecking"]["expressionWarnings"] == [
        {"fieldRef": "spec.validations[0].expression",
         "warning": "v1, Kind=Pod: undefined field 'hostNetwrok' not found in struct 'PodSpec' (line 1, column 5)"}]
    described = cluster.kubectl("describe", "ap", name).stdout
    assert "TypeChecked" in described and "Warnings" in described and "hostNetwrok" in described, described

    # Fixed: no warning at apply, and the condition says so.
    body["spec"]["validations"][0]["expression"] = "!has(object.spec.hostNetwork)"
    fixed = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
    assert "Warning" not in fixed.stderr, fixed
    checked = eventually(lambda: _condition(_status(cluster, name), "TypeChecked"),
                         lambda c: c.get("observedGeneration") == 2, "the fix to be type-checked",
                         cluster.settings.timeout)
    assert (checked["status"], checked["reason"]) == ("True", "Checked"), checked
    assert _status(cluster, name)["typeChecking"]["expressionWarnings"] == []


def test_a_policy_that_opts_in_is_refused_while_it_does_not_type_check(cluster: Cluster, policies: Policies) -> None:
    name = unique("e2e-typo-deny", 50)
    body = policy_body(name, typeChecking="Deny", match={"resources": [PODS]},
                       validations=[{"expression": "object.spec.containers.all(c, c.imgae != '')"}])
    refused = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert refused.returncode != 0, refused
    assert (f"AdmissionPolicy '{name}' is invalid: spec.validations[0].expression: v1, Kind=Pod: undefined field "
            "'imgae'") in refused.stderr, refused
    assert cluster.get(AdmissionPolicy, name).status == 404


def test_a_custom_kind_is_checked_against_its_crd(cluster: Cluster, policies: Policies) -> None:
    group = "typed.e2e.policy-operator.dev"
    crd_name = f"gadgets.{group}"
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": crd_name},
           "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "gadgets", "kind": "Gadget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {"type": "object", "properties": {
                            "size": {"type": "integer"}, "color": {"type": "string"}}}}}}}]}}
    assert cluster.create(pykube.CustomResourceDefinition, crd).ok
    try:
        name = unique("e2e-typed-crd", 50)
        body = policy_body(name, match={"resources": [{"apiGroups": [group], "apiVersions": ["v1"],
                                                       "resources": ["gadgets"], "operations": ["CREATE"]}]},
                           validations=[{"expression": "object.spec.size < 10 && object.spec.colour != 'red'"}])
        policies.names.append(name)
        applied = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
        assert (f"spec.validations[0].expression: {group}/v1, Kind=Gadget: undefined field 'colour' not found in "
                "struct 'Gadget.spec'") in applied.stderr, applied
    finally:
        cluster.delete(pykube.CustomResourceDefinition, crd_name)
