"""AdmissionPolicyExceptions and tenant policies under native enforcement, on both control planes
(1.28: ValidatingAdmissionPolicy v1beta1; 1.32: v1): they must behave as in webhook mode.

- An exception for a natively enforced policy hands its namespace back to the webhooks (a
  ``NotIn`` in the generated policy's namespaceSelector, ``status.native.handedBack``), which apply
  it: what it covers is admitted there, what it does not is refused, and every other namespace
  stays with the API server. At its expiry the webhooks refuse again, to the second, and the
  namespace returns to the generated objects. A request stream runs through both switches.
- With every replica down, the handed-back namespace fails closed (``failurePolicy: Fail``); the
  others are still judged by the API server.
- A tenant policy is enforced natively in its namespace alone; an exception for it hands the whole
  policy back to the webhooks (``reason: Exception``) until the exception is gone.

The policies' exceptions need no approval (``spec.exceptions.approval: None``): approval is
test_e2e_exceptions.py's subject, and it would only delay the exception taking effect here.
"""
from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable
from typing import Any

import pykube
import pytest
from e2e_kube import (
    AdmissionPolicy,
    AdmissionPolicyException,
    Answer,
    Cluster,
    NamespacedAdmissionPolicy,
    Policies,
    Target,
    eventually,
    policy_body,
    unique,
    vap_version,
)
from pykube.objects import APIObject
from traffic import Sent, Traffic

from admission_policy import api

pytestmark = pytest.mark.e2e

GROUP = "admissionregistration.k8s.io"
MESSAGE = "the label 'forbidden' is not allowed"
NAME_LABEL = "kubernetes.io/metadata.name"
LIFETIME = 30   # seconds from an exception's creation to its expiry: the hand-back takes a few (1-6 measured)
SLACK = 0.1     # seconds either side of the expiry instant, for converting wall time to monotonic
CONFIGMAPS = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "operations": ["CREATE", "UPDATE"]}
VALIDATION = {"expression": "!(has(object.metadata.labels) && 'forbidden' in object.metadata.labels)",
              "message": MESSAGE, "reason": "Forbidden"}
NO_APPROVAL = {"approval": "None", "maxDuration": "1h"}


# --- policies, exceptions, requests ---------------------------------------------------------------------------

def _policy(name: str, namespaces: list[str]) -> dict[str, Any]:
    """Portable to 1.28 (no optional syntax), as test_e2e_native.py's; judges ConfigMaps in ``namespaces``."""
    return policy_body(name, native="Auto", failurePolicy="Fail", exceptions=NO_APPROVAL,
                       match={"resources": [CONFIGMAPS], "namespaceSelector": {"matchExpressions": [
                           {"key": NAME_LABEL, "operator": "In", "values": namespaces}]}},
                       validations=[VALIDATION])


def _tenant_policy(namespace: str, name: str) -> dict[str, Any]:
    body = policy_body(name, native="Auto", failurePolicy="Fail", exceptions=NO_APPROVAL,
                       match={"resources": [CONFIGMAPS]}, validations=[VALIDATION])
    body.update(kind=api.NAMESPACED_KIND)
    body["metadata"]["namespace"] = namespace
    return body


def _exception(namespace: str, name: str, policy: str, expires: float) -> dict[str, Any]:
    """Narrower than its namespace: ConfigMaps named legacy-* only."""
    at = datetime.datetime.fromtimestamp(expires, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicyException",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"policies": [{"name": policy}], "match": {"names": ["legacy-*"]},
                     "reason": "e2e: the legacy ConfigMaps keep their label until TICKET-1234",
                     "expiresAt": at}}


def _create_exception(cluster: Cluster, namespace: str, policy: str, lifetime: float) -> tuple[str, float]:
    """An exception created now, expiring ``lifetime`` seconds on (a whole second): its name and expiry."""
    name = unique("legacy", 40)
    expires = float(math.ceil(time.time() + lifetime))
    created = cluster.create(AdmissionPolicyException, _exception(namespace, name, policy, expires))
    assert created.ok, str(created)
    return name, expires


def _configmap(namespace: str, bad: bool, covered: bool = False) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": unique("legacy-cm" if covered else "cm", 40), "namespace": namespace,
                         "labels": {"forbidden": "yes"} if bad else {"fine": "yes"}}}


def _ask(cluster: Cluster, namespace: str, bad: bool, covered: bool = False) -> Answer:
    return cluster.create(pykube.ConfigMap, _configmap(namespace, bad, covered), dry_run=True)


def _refused_by_vap(answer: Answer, vap: str) -> bool:
    return answer.status in (403, 422) and f"ValidatingAdmissionPolicy '{vap}' with binding" in answer.message \
        and f"denied request: {MESSAGE}" in answer.message


def _refused_by_webhook(answer: Answer, policy: str, kind: str = api.KIND) -> bool:
    return answer.status == 403 and "admission webhook" in answer.message \
        and f'{kind} "{policy}" denied the request: ' in answer.message and MESSAGE in answer.message


def _exempted(answer: Answer, namespace: str, exception: str) -> bool:
    """Admitted by the webhook under the exception: its warning names it."""
    return answer.ok and any(w.startswith(f"admitted under exception {namespace}/{exception}, expires ")
                             for w in answer.warnings)


# --- status and generated objects -------------------------------------------------------------------------------

def _native(cluster: Cluster, name: str, cls: type[APIObject] = AdmissionPolicy,
            namespace: str | None = None) -> dict[str, Any]:
    answer = cluster.get(cls, name, namespace)
    assert answer.ok, str(answer)
    native: dict[str, Any] = (answer.obj.get("status") or {}).get("native") or {}
    return native


def _vap(cluster: Cluster, version: str, name: str) -> dict[str, Any] | None:
    answer = cluster.raw("GET", f"/apis/{GROUP}/{version}/validatingadmissionpolicies/{name}")
    if answer.status == 404:
        return None
    assert answer.ok, str(answer)
    return answer.obj


def _left_out(vap: dict[str, Any] | None) -> list[str]:
    """The namespaces the generated policy leaves alone (its NotIn on the namespace's name)."""
    selector = ((vap or {}).get("spec", {}).get("matchConstraints") or {}).get("namespaceSelector") or {}
    return [value for e in selector.get("matchExpressions") or []
            if e["key"] == NAME_LABEL and e["operator"] == "NotIn" for value in e["values"]]


def _wait_native(cluster: Cluster, name: str, handed_back: list[str], cls: type[APIObject] = AdmissionPolicy,
                 namespace: str | None = None, timeout: float = 90) -> dict[str, Any]:
    return eventually(lambda: _native(cluster, name, cls, namespace),
                      lambda n: n.get("enforcedBy") == "Native" and n.get("reason") == "Generated"
                      and n.get("handedBack") == handed_back,
                      f"{cls.kind} {name} to be enforced natively, handed back in {handed_back}", timeout)


# --- the request stream --------------------------------------------------------------------------------------

# What each client sends (by client number): in A, a bad ConfigMap the exception covers, one it does
# not (bad, not named legacy-*), a good one; in B, a bad one and a good one.
ROLES = ("covered-a", "uncovered-a", "good-a", "bad-b", "good-b")


def _stream(a: str, b: str) -> Callable[[str, str], dict[str, Any]]:
    def body(_: str, name: str) -> dict[str, Any]:
        role = ROLES[int(name.split("-")[1]) % len(ROLES)]
        made = _configmap(b if role.endswith("-b") else a, bad=not role.startswith("good"))
        made["metadata"]["name"] = f"legacy-{name}" if role == "covered-a" else name
        return made
    return body


def _judge(answers: list[Sent], exception: str, a: str, created: float, expiry: float) -> tuple[list[str], float]:
    """The wrong answers, and when the covered request was first admitted (monotonic; inf: never).

    The covered request in A: refused until the hand-back is in effect (the API server's policy
    judges A until it has loaded the objects leaving A out; in webhook mode, until the replica has
    loaded the exception), then admitted under the exception until the expiry, never refused again
    in between; refused from the expiry on, to the second as in webhook mode: a request in flight
    across the instant (± SLACK) may get either answer. Every other request: as the policy says.
    """
    def refused(s: Sent) -> bool:
        return s.status in (403, 422) and MESSAGE in s.message

    wrong = []
    covered = sorted((s for s in answers if ROLES[s.client % len(ROLES)] == "covered-a"), key=lambda s: s.sent)
    admitted = [s for s in covered if s.allowed]
    first = min((s.answered for s in admitted), default=math.inf)
    for s in covered:
        if s.sent >= expiry + SLACK or s.answered <= created:
            right = refused(s)
        elif s.answered < expiry - SLACK and s.sent > first:
            right = s.allowed and any(w.startswith(f"admitted under exception {a}/{exception}") for w in s.warnings)
        else:   # the hand-back under way, or in flight across the expiry
            right = refused(s) or s.allowed
        if not right:
            wrong.append(str(s))
    for s in answers:
        role = ROLES[s.client % len(ROLES)]
        if role != "covered-a" and not (refused(s) if role in ("uncovered-a", "bad-b") else s.allowed):
            wrong.append(f"{role}: {s}")
    return wrong, first


# --- the tests -------------------------------------------------------------------------------------------------

def test_an_exception_hands_its_namespace_back_until_it_expires(
        native_target: Target, target_namespace: Callable[..., str], target_policies: Policies) -> None:
    cluster = native_target.cluster
    version = vap_version(cluster)
    a, b = target_namespace(), target_namespace()
    name = unique("native-exc", 50)
    vap_name = f"ap.policy.{name}"
    target_policies.apply(_policy(name, [a, b]))
    _wait_native(cluster, name, [])
    assert a not in _left_out(_vap(cluster, version, vap_name))

    with Traffic(cluster, a, clients=len(ROLES), body=_stream(a, b), pace=0.02) as traffic:
        traffic.wait(20, 60)
        offset = time.time() - time.monotonic()
        created = time.monotonic()
        exception, expires = _create_exception(cluster, a, name, LIFETIME)
        expiry = expires - offset   # monotonic

        # Handed back: the status first, then the generated policy leaving A out.
        eventually(lambda: (_native(cluster, name), _left_out(_vap(cluster, version, vap_name))),
                   lambda seen: seen[0].get("enforcedBy") == "Native" and seen[0].get("handedBack") == [a]
                   and a in seen[1], f"{a} to be handed back to the webhooks", LIFETIME)
        eventually(lambda: _ask(cluster, a, bad=True, covered=True), lambda ans: ans.ok,
                   "the covered request to be admitted in A", max(expiry - time.monotonic(), 1))
        handed_back = time.monotonic() - created
        assert expiry - time.monotonic() > 5, f"the hand-back took {handed_back:.1f}s of the {LIFETIME}s lifetime"

        assert _exempted(_ask(cluster, a, bad=True, covered=True), a, exception)
        assert _refused_by_webhook(uncovered := _ask(cluster, a, bad=True), name), str(uncovered)
        assert _ask(cluster, a, bad=False).ok
        assert _refused_by_vap(in_b := _ask(cluster, b, bad=True, covered=True), vap_name), str(in_b)
        assert _ask(cluster, b, bad=False).ok
        native = _native(cluster, name)
        assert (native["enforcedBy"], native["handedBack"]) == ("Native", [a]), native
        assert a in native["message"], native

        # The expiry: refused at once (the webhooks apply it to the second), then A returns to the API server.
        time.sleep(max(0.0, expiry - time.monotonic() + SLACK))
        again = _ask(cluster, a, bad=True, covered=True)
        refused_after = time.monotonic() - expiry
        assert not again.ok and MESSAGE in again.message, f"{refused_after:.2f}s after the expiry: {again}"
        eventually(lambda: (_native(cluster, name), _left_out(_vap(cluster, version, vap_name))),
                   lambda seen: seen[0].get("enforcedBy") == "Native" and seen[0].get("handedBack") == []
                   and a not in seen[1], f"{a} to return to the generated objects", 30)
        returned = time.monotonic() - expiry
        time.sleep(3)
        traffic.wait(20, 60)

    wrong, first = _judge(list(traffic.answers), exception, a, created, expiry)
    print(f"on {native_target.version}: {len(traffic.answers)} requests, {len(wrong)} wrong; covered request "
          f"admitted {first - created:.1f}s after the exception's creation (hand-back seen {handed_back:.1f}s), "
          f"refused {refused_after:.2f}s after its expiry, A back to the API server {returned:.1f}s after it")
    assert not wrong, wrong[:5]
    assert returned < 20, f"A was handed back to the generated objects {returned:.1f}s after the expiry"
    assert _refused_by_vap(natively := _ask(cluster, a, bad=True, covered=True), vap_name), str(natively)
    covered_answers = [s for s in traffic.answers if s.client % len(ROLES) == 0]
    assert any(s.allowed for s in covered_answers) and any(s.sent > expiry + SLACK for s in covered_answers)


def test_a_handed_back_namespace_fails_closed_with_every_replica_down(
        native_target: Target, target_namespace: Callable[..., str], target_policies: Policies) -> None:
    cluster, operator = native_target.cluster, native_target.operator
    a, b = target_namespace(), target_namespace()
    name = unique("native-exc-down", 50)
    vap_name = f"ap.policy.{name}"
    target_policies.apply(_policy(name, [a, b]))
    _wait_native(cluster, name, [])
    exception, _ = _create_exception(cluster, a, name, 600)
    _wait_native(cluster, name, [a])
    eventually(lambda: _ask(cluster, a, bad=True, covered=True), lambda ans: _exempted(ans, a, exception),
               "the covered request to be admitted in A", 30)
    operator.stop()
    try:
        # A: the webhooks judge it, and do not answer: refused, whatever the request (failurePolicy Fail).
        for bad, covered in ((True, True), (True, False), (False, False)):
            answer = _ask(cluster, a, bad, covered)
            assert not answer.ok and "failed calling webhook" in answer.message, (bad, covered, str(answer))
        # B: the API server's own policy, as before.
        assert _refused_by_vap(in_b := _ask(cluster, b, bad=True, covered=True), vap_name), str(in_b)
        assert _ask(cluster, b, bad=False).ok
    finally:
        operator.start()


def test_an_exception_for_a_tenant_policy_hands_the_policy_back_until_it_is_gone(
        native_target: Target, target_namespace: Callable[..., str]) -> None:
    cluster = native_target.cluster
    version = vap_version(cluster)
    tenant, other = target_namespace(), target_namespace()
    name = unique("native-tenant", 40)
    key, vap_name = f"{tenant}/{name}", f"nap.{tenant}.policy.{name}"
    created = cluster.create(NamespacedAdmissionPolicy, _tenant_policy(tenant, name))
    assert created.ok, str(created)
    try:
        _wait_native(cluster, name, [], NamespacedAdmissionPolicy, tenant)
        vap = _vap(cluster, version, vap_name)
        assert vap is not None, vap_name
        selector = vap["spec"]["matchConstraints"]["namespaceSelector"]
        assert {"key": NAME_LABEL, "operator": "In", "values": [tenant]} in selector["matchExpressions"], selector
        assert _refused_by_vap(answer := _ask(cluster, tenant, bad=True), vap_name), str(answer)
        assert _ask(cluster, tenant, bad=False).ok
        assert _ask(cluster, other, bad=True).ok   # its namespace only

        exception, _ = _create_exception(cluster, tenant, key, 600)
        native = eventually(lambda: _native(cluster, name, NamespacedAdmissionPolicy, tenant),
                            lambda n: n.get("enforcedBy") == "Webhook", f"{key} to go back to the webhooks", 60)
        assert native["reason"] == "Exception" and native["objects"] == [], native
        eventually(lambda: _vap(cluster, version, vap_name), lambda vap: vap is None,
                   f"{vap_name} to be deleted", 30)
        # The API server drops a deleted policy from its own watch, a moment after the object is gone:
        # until then both judge, and the exception is not in effect yet (the safe side).
        gone = time.monotonic()
        eventually(lambda: _ask(cluster, tenant, bad=True, covered=True), lambda ans: _exempted(ans, tenant, exception),
                   "the covered request to be admitted under the exception", 15)
        print(f"on {native_target.version}: the exception applied {time.monotonic() - gone:.1f}s after {vap_name} "
              "was gone")
        assert _refused_by_webhook(answer := _ask(cluster, tenant, bad=True), key, api.NAMESPACED_KIND), str(answer)
        assert _ask(cluster, other, bad=True).ok

        assert cluster.delete(AdmissionPolicyException, exception, tenant).ok
        _wait_native(cluster, name, [], NamespacedAdmissionPolicy, tenant)
        assert _refused_by_vap(answer := _ask(cluster, tenant, bad=True, covered=True), vap_name), str(answer)
        assert _ask(cluster, other, bad=True).ok
    finally:
        cluster.delete(NamespacedAdmissionPolicy, name, tenant)
        cluster.wait_gone(NamespacedAdmissionPolicy, name, tenant)
    eventually(lambda: _vap(cluster, version, vap_name), lambda vap: vap is None,
               f"{vap_name} to be deleted with its policy", 30)
