"""Native enforcement on a real API server: a policy Kubernetes can run becomes a generated
ValidatingAdmissionPolicy and binding, keeps enforcing with the operator stopped, and goes back
to the webhooks.

The policy here uses no optional syntax, so that it ports to Kubernetes 1.28 (v1beta1, whose CEL
has no optionals) as well as to 1.32 (v1). The session's operator judges every other test's
policies itself (``AP_NATIVE_DEFAULT=Never``); this one says ``spec.native: Auto``.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pykube
import pytest
from e2e_kube import AdmissionPolicy, Answer, Cluster, OperatorProcess, Policies, eventually, policy_body, unique

GROUP = "admissionregistration.k8s.io"


def _vap_version(cluster: Cluster) -> str:
    for version in ("v1", "v1beta1"):
        answer = cluster.raw("GET", f"/apis/{GROUP}/{version}")
        if answer.ok and any(r.get("name") == "validatingadmissionpolicies" for r in answer.obj.get("resources", [])):
            return version
    pytest.fail("the control plane serves no ValidatingAdmissionPolicy API")


def _policy(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return policy_body(name, **{
        "native": "Auto",
        "failurePolicy": "Fail",
        "match": {"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                                 "operations": ["CREATE", "UPDATE"]}],
                  "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        "validations": [{"expression": "!(has(object.metadata.labels) && 'forbidden' in object.metadata.labels)",
                         "message": "the label 'forbidden' is not allowed", "reason": "Forbidden"}],
        **spec,
    })


def _configmap(namespace: str, bad: bool) -> dict[str, Any]:
    labels = {"forbidden": "yes"} if bad else {"fine": "yes"}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": unique("cm", 40), "namespace": namespace, "labels": labels}}


def _native_status(cluster: Cluster, name: str) -> dict[str, Any]:
    answer = cluster.get(AdmissionPolicy, name)
    assert answer.ok, answer
    native: dict[str, Any] = (answer.obj.get("status") or {}).get("native") or {}
    return native


def _wait_enforced_by(cluster: Cluster, name: str, who: str, reason: str = "", timeout: float = 90) -> dict[str, Any]:
    return eventually(lambda: _native_status(cluster, name), lambda native: native.get("enforcedBy") == who
                      and native.get("reason") == (reason or native.get("reason")),
                      f"AdmissionPolicy {name} to be enforced by {who}", timeout)


def _generated(cluster: Cluster, version: str, name: str) -> list[str]:
    found = []
    for plural in ("validatingadmissionpolicies", "validatingadmissionpolicybindings"):
        answer = cluster.raw("GET", f"/apis/{GROUP}/{version}/{plural}",
                             params={"labelSelector": f"policy-operator.dev/policy-name={name}"})
        assert answer.ok, answer
        found += [f"{plural}/{item['metadata']['name']}" for item in answer.obj.get("items", [])]
    return sorted(found)


def _answer(cluster: Cluster, namespace: str, bad: bool) -> Answer:
    return cluster.create(pykube.ConfigMap, _configmap(namespace, bad), dry_run=True)


def _right(answer: Answer, bad: bool) -> bool:
    """Refused with the policy's message (the API server's own or the webhook's), or admitted."""
    message = answer.body.get("message", "") if isinstance(answer.body, dict) else ""
    return (not answer.ok and answer.status in (403, 422) and "the label 'forbidden' is not allowed" in message) \
        if bad else answer.ok


def _judged_right(cluster: Cluster, namespace: str, bad: bool) -> bool:
    return _right(_answer(cluster, namespace, bad), bad)


@pytest.fixture
def native_namespace(namespace: Any) -> Iterator[str]:
    yield namespace()


def test_a_portable_policy_is_enforced_natively_and_handed_back_without_a_wrong_answer(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, native_namespace: str) -> None:
    version = _vap_version(cluster)
    name = unique("native-labels", 50)
    policies.apply(_policy(name, native_namespace))
    native = _wait_enforced_by(cluster, name, "Native")
    assert native["reason"] == "Generated"
    assert _generated(cluster, version, name) == sorted(
        [f"validatingadmissionpolicies/ap.policy.{name}", f"validatingadmissionpolicybindings/ap.policy.{name}"])
    assert {o["kind"] for o in native["objects"]} == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    listing = cluster.kubectl("get", "admissionpolicy", name).stdout
    assert "ENFORCED-BY" in listing and "Native" in listing
    for bad in (True, False):
        answer = _answer(cluster, native_namespace, bad)
        assert _right(answer, bad), answer

    # Every replica down: Kubernetes still refuses what the policy refuses.
    operator.stop()
    try:
        for bad in (True, False, True):
            assert _judged_right(cluster, native_namespace, bad), f"with the operator stopped, bad={bad}"
    finally:
        operator.start()

    # Switched to Never: back to the webhooks, the generated objects removed.
    assert cluster.merge_patch(AdmissionPolicy, name, {"spec": {"native": "Never"}}).ok
    native = _wait_enforced_by(cluster, name, "Webhook", "Disabled")
    eventually(lambda: _generated(cluster, version, name), lambda found: not found,
               "the generated objects to be deleted", 60)
    eventually(lambda: _judged_right(cluster, native_namespace, bad=True), bool,
               "the webhooks to refuse what the policy refuses", 30)

    # Back to Kubernetes; deleting the policy deletes what was generated.
    assert cluster.merge_patch(AdmissionPolicy, name, {"spec": {"native": "Auto"}}).ok
    _wait_enforced_by(cluster, name, "Native")
    assert len(_generated(cluster, version, name)) == 2
    policies.delete(name)
    assert _generated(cluster, version, name) == []


def test_what_does_not_port_stays_on_the_webhook_and_says_why(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, native_namespace: str) -> None:
    name = unique("native-reported", 50)
    policies.apply(_policy(name, native_namespace, enforcement="Warn", reportAdmission=True))
    native = _wait_enforced_by(cluster, name, "Webhook")
    assert native["reason"] == "NotPortable" and "spec.reportAdmission" in native["message"], native
    assert native["objects"] == []
    condition = next(c for c in cluster.get(AdmissionPolicy, name).obj["status"]["conditions"] if c["type"] == "Native")
    assert (condition["status"], condition["reason"]) == ("False", "NotPortable")
