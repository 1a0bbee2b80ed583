"""Native enforcement on a real API server, on both control planes (1.28: ValidatingAdmissionPolicy
v1beta1; 1.32: v1): a policy Kubernetes can run becomes a generated ValidatingAdmissionPolicy and
binding, keeps enforcing with the operator stopped, and changes hands without a request judged
wrongly — a steady stream of requests runs through every switch.

The policy here uses no optional syntax, so that it ports to Kubernetes 1.28 (whose CEL has no
optionals) as well as to 1.32. The session's operators judge every other test's policies
themselves (``AP_NATIVE_DEFAULT=Never``); this one says ``spec.native: Auto``.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pykube
import pytest
from e2e_kube import (
    AdmissionPolicy,
    Answer,
    Cluster,
    Policies,
    Target,
    ValidatingWebhookConfiguration,
    eventually,
    policy_body,
    unique,
    vap_version,
)
from envtest import ControlPlane
from traffic import Sent, Traffic

GROUP = "admissionregistration.k8s.io"


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
    return sorted(f"{plural}/{item['metadata']['name']}" for plural, item in _generated_objects(cluster, version, name))


def _generated_objects(cluster: Cluster, version: str, name: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for plural in ("validatingadmissionpolicies", "validatingadmissionpolicybindings"):
        answer = cluster.raw("GET", f"/apis/{GROUP}/{version}/{plural}",
                             params={"labelSelector": f"policy-operator.dev/policy-name={name}"})
        assert answer.ok, answer
        found += [(plural, item) for item in answer.obj.get("items", [])]
    return found


def _answer(cluster: Cluster, namespace: str, bad: bool) -> Answer:
    return cluster.create(pykube.ConfigMap, _configmap(namespace, bad), dry_run=True)


def _right(answer: Answer, bad: bool) -> bool:
    """Refused with the policy's message (the API server's own or the webhook's), or admitted."""
    message = answer.body.get("message", "") if isinstance(answer.body, dict) else ""
    return (not answer.ok and answer.status in (403, 422) and "the label 'forbidden' is not allowed" in message) \
        if bad else answer.ok


def _judged_right(cluster: Cluster, namespace: str, bad: bool) -> bool:
    return _right(_answer(cluster, namespace, bad), bad)


def _routed(cluster: Cluster, resource: str) -> bool:
    answer = cluster.get(ValidatingWebhookConfiguration, cluster.settings.webhook_config_name)
    return not answer.ok or any(resource in (rule.get("resources") or []) for webhook in answer.obj["webhooks"]
                                for rule in webhook.get("rules") or [])


def _stream_body(namespace: str, name: str) -> dict[str, Any]:
    """Even clients send what the policy refuses, odd ones what it admits (``Sent`` keeps the client)."""
    body = _configmap(namespace, bad=int(name.split("-")[1]) % 2 == 0)
    body["metadata"]["name"] = name
    return body


def _wrong(answers: list[Sent]) -> list[Sent]:
    """Every answer but the policy's: a refusal with its message of what it refuses, an admission of
    the rest. An error (no answer, a webhook that failed) counts as wrong as well."""
    return [a for a in answers if not ((a.status in (403, 422) and "the label 'forbidden' is not allowed" in a.message)
                                       if a.client % 2 == 0 else a.allowed)]


class _Switches:
    """A stream of requests through a sequence of switches, each waited for, then a few more
    seconds of requests: the answers of each step, to count the wrong ones per switch."""

    def __init__(self, traffic: Traffic) -> None:
        self.traffic = traffic
        self.steps: list[tuple[str, int, int]] = []

    def step(self, what: str, switch: Callable[[], object], settle: float = 3.0) -> None:
        first = len(self.traffic.answers)
        switch()
        time.sleep(settle)
        self.traffic.wait(20, 60)   # flowing still
        self.steps.append((what, first, len(self.traffic.answers)))

    def report(self) -> dict[str, tuple[int, list[str]]]:
        answers = list(self.traffic.answers)
        return {what: (end - first, [str(a) for a in _wrong(answers[first:end])[:5]])
                for what, first, end in self.steps}


def test_a_portable_policy_changes_hands_without_a_wrong_answer(
        native_target: Target, target_namespace: Callable[..., str], target_policies: Policies) -> None:
    """Webhook → Native, a generated policy deleted by hand and written back, Native → Webhook
    (``Never``) and back: a request stream never sees the policy missing or judged twice wrongly."""
    cluster = native_target.cluster
    version = vap_version(cluster)
    namespace = target_namespace()
    name = unique("native-labels", 50)
    target_policies.apply(_policy(name, namespace))   # Active: the webhooks judge it meanwhile
    vap = f"/apis/{GROUP}/{version}/validatingadmissionpolicies/ap.policy.{name}"

    def uid() -> str:
        answer = cluster.raw("GET", vap)
        return str(answer.obj["metadata"]["uid"]) if answer.ok else ""

    def rewritten(before: str) -> None:
        eventually(lambda: (uid(), _native_status(cluster, name)), lambda found: found[0] not in ("", before)
                   and found[1].get("enforcedBy") == "Native" and found[1].get("reason") == "Generated",
                   f"ValidatingAdmissionPolicy ap.policy.{name} written back and enforced", 90)

    with Traffic(cluster, namespace, clients=4, body=_stream_body) as traffic:
        switches = _Switches(traffic)
        traffic.wait(20, 60)
        switches.step("webhook to native", lambda: _wait_enforced_by(cluster, name, "Native", "Generated"))
        native = _native_status(cluster, name)
        assert _generated(cluster, version, name) == sorted(
            [f"validatingadmissionpolicies/ap.policy.{name}", f"validatingadmissionpolicybindings/ap.policy.{name}"])
        assert {o["kind"] for o in native["objects"]} == {"ValidatingAdmissionPolicy",
                                                          "ValidatingAdmissionPolicyBinding"}
        before = uid()
        switches.step("generated policy deleted by hand",
                      lambda: (cluster.raw("DELETE", vap), rewritten(before)))
        switches.step("switched to Never", lambda: (
            cluster.merge_patch(AdmissionPolicy, name, {"spec": {"native": "Never"}}),
            _wait_enforced_by(cluster, name, "Webhook", "Disabled"),
            eventually(lambda: _generated(cluster, version, name), lambda found: not found,
                       "the generated objects to be deleted", 60)))
        switches.step("back to Auto", lambda: (
            cluster.merge_patch(AdmissionPolicy, name, {"spec": {"native": "Auto"}}),
            _wait_enforced_by(cluster, name, "Native", "Generated")))
    report = switches.report()
    print(f"requests per switch on {native_target.version}:", {what: count for what, (count, _) in report.items()})
    assert all(count >= 20 for count, _ in report.values()), report
    assert all(not wrong for _, wrong in report.values()), report

    # Edited by hand (a cluster admin's doing, in effect at once): written back as generated.
    answer = cluster.raw("GET", vap)
    edited = {**answer.obj, "spec": {**answer.obj["spec"], "validations": [{"expression": "true"}]}}
    assert cluster.raw("PUT", vap, body=edited).ok
    eventually(lambda: cluster.raw("GET", vap).obj["spec"]["validations"][0]["expression"],
               lambda expression: expression != "true", "the edited policy to be written back", 60)

    listing = cluster.kubectl("get", "admissionpolicy", name).stdout
    assert "ENFORCED-BY" in listing and "Native" in listing
    target_policies.delete(name)
    assert _generated(cluster, version, name) == []


def test_natively_enforced_policies_keep_refusing_with_every_replica_down(
        native_target: Target, target_namespace: Callable[..., str], target_policies: Policies) -> None:
    cluster, operator = native_target.cluster, native_target.operator
    namespace = target_namespace()
    name = unique("native-down", 50)
    target_policies.apply(_policy(name, namespace))
    _wait_enforced_by(cluster, name, "Native", "Generated")
    # The status says Native first; the webhook configurations stop routing the policy right after.
    # Stopped before that, its route would fail closed (failurePolicy Fail), as any routed policy's.
    eventually(lambda: _routed(cluster, "configmaps"), lambda routed: not routed,
               "the webhook configurations to stop routing the policy", 60)
    operator.stop()
    try:
        for bad in (True, False, True):
            assert _judged_right(cluster, namespace, bad), f"with the operator stopped, bad={bad}"
    finally:
        operator.start()


def test_a_request_the_checks_admit_skips_the_policy_and_a_refusal_still_says_why(
        native_target: Target, target_namespace: Callable[..., str], target_policies: Policies) -> None:
    """The generated policy's last match condition, any-validation-fails, lets the API server skip
    what every check admits (no messageExpression runs for it); what one check refuses still gets
    that validation's own message, and a check that errs refuses (failurePolicy: Fail), as the
    validation's error would."""
    cluster = native_target.cluster
    namespace = target_namespace()
    name = unique("native-skip", 50)
    body = _policy(name, namespace, variables=[{"name": "team", "expression": "object.metadata.labels.team"}])
    body["spec"]["validations"].append({"expression": "variables.team != ''", "reason": "Forbidden",
                                        "messageExpression": "'an empty team label on ' + object.metadata.name"})
    target_policies.apply(body)
    _wait_enforced_by(cluster, name, "Native", "Generated")
    eventually(lambda: _routed(cluster, "configmaps"), lambda routed: not routed,
               "the webhook configurations to stop routing the policy", 60)
    [generated] = [item for plural, item in _generated_objects(cluster, vap_version(cluster), name)
                   if plural == "validatingadmissionpolicies"]
    assert generated["spec"]["matchConditions"][-1]["name"] == "any-validation-fails", generated["spec"]

    def create(labels: dict[str, str] | None) -> Answer:
        metadata: dict[str, Any] = {"name": unique("cm", 40), "namespace": namespace}
        if labels is not None:
            metadata["labels"] = labels
        return cluster.create(pykube.ConfigMap, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata},
                              dry_run=True)

    def refused_by_it(answer: Answer, words: str) -> bool:
        message = answer.body.get("message", "") if isinstance(answer.body, dict) else ""
        return answer.status in (403, 422) and f"ap.policy.{name}" in message and words in message

    assert create({"team": "a"}).ok
    empty = create({"team": ""})
    assert refused_by_it(empty, "an empty team label on cm-"), empty
    forbidden = create({"team": "a", "forbidden": "yes"})
    assert refused_by_it(forbidden, "the label 'forbidden' is not allowed"), forbidden
    unlabelled = create(None)   # variables.team errs: no labels
    assert refused_by_it(unlabelled, ""), unlabelled


def test_what_does_not_port_stays_on_the_webhook_and_says_why(
        native_target: Target, target_namespace: Callable[..., str], target_policies: Policies) -> None:
    cluster = native_target.cluster
    name = unique("native-reported", 50)
    target_policies.apply(_policy(name, target_namespace(), enforcement="Warn", reportAdmission=True))
    native = _wait_enforced_by(cluster, name, "Webhook")
    assert native["reason"] == "NotPortable" and "spec.reportAdmission" in native["message"], native
    assert native["objects"] == []
    condition = next(c for c in cluster.get(AdmissionPolicy, name).obj["status"]["conditions"] if c["type"] == "Native")
    assert (condition["status"], condition["reason"]) == ("False", "NotPortable")


def test_the_api_servers_type_checking_warnings_reach_the_policys_status(
        native_target: Target, target_namespace: Callable[..., str], target_policies: Policies) -> None:
    """kube-controller-manager type-checks a generated policy against ConfigMap's schema; its
    warning (a misspelt field) is shown at the policy's own field."""
    cluster = native_target.cluster
    name = unique("native-typed", 50)
    body = _policy(name, target_namespace())
    body["spec"]["validations"].append({"expression": "!has(object.metadata.nmae)", "message": "never"})
    target_policies.apply(body)
    native = eventually(lambda: _native_status(cluster, name), lambda found: bool(found.get("typeChecking")),
                        f"AdmissionPolicy {name} to show the type checking of its generated policy", 90)
    assert [(w["object"], w["fieldRef"]) for w in native["typeChecking"]] == [
        (f"ap.policy.{name}", "spec.validations[1].expression")], native
    assert "nmae" in native["typeChecking"][0]["warning"], native


def test_an_api_no_longer_served_hands_the_policies_back_to_the_webhooks(
        control_plane: ControlPlane | None, cluster: Cluster, policies: Policies,
        namespace: Callable[..., str]) -> None:
    """The API server restarted without the ValidatingAdmissionPolicy API (a downgrade, its gate
    turned off) enforces the generated policies no more, from its first request: the webhooks must
    take them back at once. Nothing can be made before that break (the operator learns of it from
    the API server it restarted), so the test measures the window, and asserts that it closes
    within seconds and that nothing is judged wrongly after."""
    if control_plane is None or not (1, 26) <= control_plane.version < (1, 30):
        pytest.skip("needs the session's envtest plane with ValidatingAdmissionPolicy behind its gate (1.26-1.29), "
                    "to restart it without")
    ns = namespace()
    name = unique("native-downgraded", 50)
    policies.apply(_policy(name, ns))
    _wait_enforced_by(cluster, name, "Native", "Generated")
    try:
        with Traffic(cluster, ns, clients=4, body=_stream_body, pace=0.02) as traffic:
            traffic.wait(20, 60)
            down = time.monotonic()
            control_plane.restart_apiserver(3.0, admission_policies=False)
            up = time.monotonic()   # ready: answering as it will from now on
            _wait_enforced_by(cluster, name, "Webhook", "APIUnavailable", timeout=60)
            handed = time.monotonic()
            time.sleep(3)
            traffic.wait(100, 60)
        # The API server's own errors while it stops and starts (503, no answer) are no judgement.
        answered = [a for a in traffic.answers if a.sent >= down and 0 < a.status < 500]
        wrong = _wrong(answered)
        window = [a.sent - up for a in wrong] or [0.0]
        print(f"API no longer served: ready {up - down:.1f}s after the restart began, handed back {handed - up:.1f}s "
              f"later; {len(wrong)} of {len(answered)} answers wrong, sent {min(window):.1f}s to {max(window):.1f}s "
              f"from ready: {sorted({(a.client % 2 == 0, a.status) for a in wrong})}")
        assert handed - up < 20, f"handed back {handed - up:.1f}s after the API server was ready"
        # The status says Webhook first; the webhook configuration follows, written and loaded
        # within seconds.
        late = [str(a) for a in wrong if a.sent > handed + 5]
        assert not late, late[:5]
        assert not [a for a in wrong if a.client % 2], "a request the policy admits was refused"
    finally:
        control_plane.restart_apiserver(3.0, admission_policies=True)
    # Served again: back to the API server, whose objects were kept.
    _wait_enforced_by(cluster, name, "Native", "Generated")
    for bad in (True, False):
        assert _judged_right(cluster, ns, bad)


def test_what_the_api_server_refuses_to_create_stays_on_the_webhook_and_says_why(
        native_target: Target, target_namespace: Callable[..., str], target_policies: Policies) -> None:
    """Kubernetes validates a ValidatingAdmissionPolicy further than this operator validates a
    policy (a message on two lines is refused there): its refusal, quoted, keeps the policy on the
    webhook, which judges it as before."""
    cluster = native_target.cluster
    namespace = target_namespace()
    name = unique("native-refused", 50)
    body = _policy(name, namespace)
    body["spec"]["validations"][0]["message"] = "the label 'forbidden' is not allowed\nsee the team's wiki"
    target_policies.apply(body)
    native = _wait_enforced_by(cluster, name, "Webhook", "NotPortable")
    assert "the API server refused" in native["message"] and "line breaks" in native["message"], native
    assert native["objects"] == [] and _generated(cluster, vap_version(cluster), name) == []
    assert _judged_right(cluster, namespace, bad=True) and _judged_right(cluster, namespace, bad=False)
