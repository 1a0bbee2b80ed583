"""The operator's lifecycle with Kopf really running against kmock's KubernetesEmulator."""
from __future__ import annotations

import asyncio
import base64
import logging
import pathlib
import ssl
from typing import Any

import kmock
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from emulator import (
    ADMISSION_POLICIES,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    SECRETS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    Emulator,
    wait_for,
)
from operator_env import (
    CONFIG_NAME,
    NAMESPACE,
    conditions,
    operator_environment,
    operator_running,
    phase,
    policy_body,
    wait_phase,
)

from admission_policy.operator import watcher

FINALIZER = "policy-operator.dev/finalizer"
DENY_BAD = [{"expression": "object.metadata.name != 'bad'", "message": "bad name"}]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> dict[str, str]:
    return operator_environment(monkeypatch, tmp_path / "certs")


async def test_create_adds_finalizer_and_reaches_active_with_conditions(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
        body = await wait_phase(emulator, "deny-bad", "Active")
        await wait_for(lambda: any(e["reason"] == "Active" for e in emulator.events_for("deny-bad")))
    assert FINALIZER in body["metadata"]["finalizers"]
    (event,) = [e for e in emulator.events_for("deny-bad") if e["reason"] == "Active"]
    assert event["type"] == "Normal" and "→ Active" in event["message"]
    assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
    found = conditions(body)
    assert set(found) == {"Compiled", "Registered", "Ready"}
    for condition in found.values():
        assert condition["status"] == "True"
        assert condition["observedGeneration"] == body["metadata"]["generation"]
        assert condition["reason"] and condition["message"] and condition["lastTransitionTime"]


async def test_the_log_names_the_policy_in_each_transition_and_kopf_lines_stay_below_info(
        emulator: Emulator, run_operator: Any, env: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        async with operator_running(run_operator):
            await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
            await wait_phase(emulator, "deny-bad", "Active")
    lines = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert ("admission_policy.operator.handlers", logging.INFO,
            "AdmissionPolicy deny-bad: (new) → Active: the policy is enforced for every resource it matches") in lines
    # Kopf's "Handler 'reconcile' succeeded." (and one line per admission request) are DEBUG.
    assert not [line for line in lines if line[0] == "kopf.objects" and line[1] == logging.INFO]


def policy_requests(emulator: Emulator, action: Any) -> int:
    """How many requests of this kind (list, watch, …) for AdmissionPolicies the emulator got."""
    policies = kmock.resource(ADMISSION_POLICIES)
    return sum(r.action == action and r.resource == policies for r in emulator.kmock)


async def test_a_watch_that_times_out_is_resumed_without_listing_again(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watcher, "WATCH_SECONDS", 1)
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
        await wait_phase(emulator, "deny-bad", "Active")
        lists = policy_requests(emulator, kmock.action.LIST)   # Kopf's and the operator's own
        await wait_for(lambda: policy_requests(emulator, kmock.action.WATCH) >= 4, timeout=10)
        await emulator.patch(ADMISSION_POLICIES, "deny-bad", {"spec": {"validations": [
            {"expression": "object.metadata.name != 'worse'"}]}})
        # Active at generation 2 once this replica's own watcher has loaded it (and routed it).
        await wait_for(lambda: (emulator.peek(ADMISSION_POLICIES, "deny-bad") or {}).get("status", {}).get(
            "observedGeneration") == 2 and phase(emulator, "deny-bad") == "Active")
        assert policy_requests(emulator, kmock.action.LIST) == lists


async def test_a_watch_too_old_to_resume_lists_again_at_once(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(watcher, "WATCH_SECONDS", 1)

    def lists() -> int:
        return policy_requests(emulator, kmock.action.LIST)

    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("first", validations=DENY_BAD))
        await wait_phase(emulator, "first", "Active")
        before = lists()
        # Something else is written, then history is compacted: resuming from the policies' last
        # resourceVersion is now 410 Gone.
        await emulator.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bump"}},
                              namespace=NAMESPACE)
        emulator.compact(ADMISSION_POLICIES)
        await wait_for(lambda: lists() == before + 1, timeout=10)
        await emulator.create(ADMISSION_POLICIES, policy_body("second", validations=DENY_BAD))
        await wait_phase(emulator, "second", "Active")
        assert lists() == before + 1
    assert not [r for r in caplog.records if "Watching AdmissionPolicies failed" in r.getMessage()]


async def test_invalid_cel_goes_failed_with_the_compiler_message(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    broken = [{"expression": "object.metadata.name.startsWith(", "message": "m"}]
    async with operator_running(run_operator):
        # Created directly in storage, as if the validating webhook had been down.
        await emulator.create(ADMISSION_POLICIES, policy_body("broken", validations=broken))
        body = await wait_phase(emulator, "broken", "Failed")
        await wait_for(lambda: any(e["reason"] == "Failed" for e in emulator.events_for("broken")))
    assert [e["type"] for e in emulator.events_for("broken") if e["reason"] == "Failed"] == ["Warning"]
    compiled = conditions(body)["Compiled"]
    assert compiled["status"] == "False" and compiled["reason"] == "CompileError"
    assert "spec.validations[0].expression (line 1, column" in compiled["message"]
    assert "not enforced" in compiled["message"]
    assert conditions(body)["Ready"]["status"] == "False"


async def test_a_new_generation_is_observed_and_a_broken_one_keeps_the_old_enforced(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("evolving", validations=DENY_BAD))
        await wait_phase(emulator, "evolving", "Active")
        await emulator.patch(ADMISSION_POLICIES, "evolving",
                             {"spec": {"validations": [{"expression": "true", "message": "any"}]}})
        await wait_for(lambda: (emulator.peek(ADMISSION_POLICIES, "evolving") or {}).get("status", {})
                       .get("observedGeneration") == 2 and phase(emulator, "evolving") == "Active", timeout=20)
        await emulator.patch(ADMISSION_POLICIES, "evolving",
                             {"spec": {"validations": [{"expression": "1 + 'x'", "message": "any"}]}})
        body = await wait_phase(emulator, "evolving", "Failed")
    assert body["status"]["observedGeneration"] == 3
    assert "generation 2 stays enforced" in conditions(body)["Compiled"]["message"]


async def test_a_resource_the_cluster_does_not_serve_is_degraded(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    rules = [{"apiGroups": ["acme.com"], "apiVersions": ["v1"], "resources": ["widgets"], "operations": ["CREATE"]}]
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("widgets", validations=DENY_BAD,
                                                              match={"resources": rules}))
        body = await wait_phase(emulator, "widgets", "Degraded")
    registered = conditions(body)["Registered"]
    assert registered["status"] == "False" and registered["reason"] == "UnservedResources"
    assert "acme.com" in registered["message"] and "widgets" in registered["message"]
    assert conditions(body)["Compiled"]["status"] == "True"


def routed_resources(emulator: Emulator) -> set[str]:
    config = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME) or {}
    fixed = "policies.validate.policy-operator.dev"
    return {resource for webhook in config.get("webhooks", []) if webhook["name"] != fixed
            for rule in webhook.get("rules", []) for resource in rule["resources"]}


async def test_delete_unroutes_before_the_finalizer_is_removed(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    seen: list[tuple[bool, bool]] = []   # (finalizer present, pods still routed), sampled during deletion
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("temporary", validations=DENY_BAD))
        await wait_phase(emulator, "temporary", "Active")
        assert routed_resources(emulator) == {"pods"}
        await emulator.delete(ADMISSION_POLICIES, "temporary")
        while emulator.peek(ADMISSION_POLICIES, "temporary") is not None:
            body = emulator.peek(ADMISSION_POLICIES, "temporary") or {}
            seen.append((FINALIZER in (body.get("metadata", {}).get("finalizers") or []),
                         "pods" in routed_resources(emulator)))
            await asyncio.sleep(0.01)
            assert len(seen) < 2000, "the policy was never released"
    assert routed_resources(emulator) == set()
    # Whenever the policy was still routed, our finalizer was still holding the object.
    assert all(finalizer for finalizer, routed in seen if routed)


async def test_written_configurations_field_by_field(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    mutating_policy = policy_body("label", failurePolicy="Ignore",
                                  mutations=[{"merge": {"metadata": {"labels": {"a": "b"}}}}])
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
        await emulator.create(ADMISSION_POLICIES, mutating_policy)
        await wait_phase(emulator, "deny-bad", "Active")
        await wait_phase(emulator, "label", "Active")
        served = await served_certificate(int(env["AP_LISTEN_PORT"]))
    validating = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
    mutating = emulator.peek(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
    assert validating is not None and mutating is not None
    port = env["AP_LISTEN_PORT"]
    fixed, routed = validating["webhooks"]
    assert fixed["name"] == "policies.validate.policy-operator.dev"
    assert fixed["clientConfig"]["url"] == f"https://127.0.0.1:{port}/validate-policy"
    assert fixed["failurePolicy"] == "Fail"
    assert fixed["rules"] == [{"apiGroups": ["policy-operator.dev"], "apiVersions": ["v1alpha1"],
                               "operations": ["CREATE", "UPDATE"], "resources": ["admissionpolicies"], "scope": "*"}]
    assert routed["name"] == "fail.validate.policy-operator.dev"
    assert routed["clientConfig"]["url"] == f"https://127.0.0.1:{port}/validate"
    assert routed["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                                "resources": ["pods"], "scope": "*"}]
    (mutate,) = mutating["webhooks"]
    assert mutate["name"] == "ignore.mutate.policy-operator.dev"
    assert mutate["failurePolicy"] == "Ignore"
    assert mutate["reinvocationPolicy"] == "IfNeeded"
    assert mutate["clientConfig"]["url"] == f"https://127.0.0.1:{port}/mutate"
    for webhook in (routed, mutate):
        assert webhook["matchPolicy"] == "Equivalent"
        assert webhook["sideEffects"] == "None"
        assert webhook["timeoutSeconds"] == 5
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["namespaceSelector"] == {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE, "kube-system"]}]}
        assert webhook["objectSelector"] == {"matchExpressions": [
            {"key": "policy-operator.dev/exempt", "operator": "NotIn", "values": ["true"]}]}
    # The caBundle is the CA that signed the certificate the server actually presents.
    for webhook in (fixed, routed, mutate):
        cas = x509.load_pem_x509_certificates(base64.b64decode(webhook["clientConfig"]["caBundle"]))
        assert any(served.verify_directly_issued_by(ca) is None for ca in cas if _issued_by(served, ca))
    secret = emulator.peek(SECRETS, "admission-policy-operator-tls", namespace=NAMESPACE)
    assert secret is not None and base64.b64decode(secret["data"]["tls.crt"]).startswith(b"-----BEGIN CERTIFICATE")


async def test_a_second_operator_instance_writes_an_identical_configuration(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
        await wait_phase(emulator, "deny-bad", "Active")
    first = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
    async with operator_running(run_operator) as op:
        await op.wait_for(lambda: phase(emulator, "deny-bad") == "Active")
        await asyncio.sleep(1.0)  # time for a (wrong) rewrite to happen
    second = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
    assert second == first  # same webhooks, same caBundle, and not even rewritten (same resourceVersion)


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    return cert.issuer == ca.subject


async def served_certificate(port: int) -> x509.Certificate:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return x509.load_der_x509_certificate(der)


async def test_a_certificate_near_expiry_is_renewed_with_both_cas_trusted(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    import datetime
    import os

    from admission_policy.operator import certificates
    from admission_policy.operator.settings import OperatorSettings

    settings = OperatorSettings.from_env(os.environ)
    hosts = certificates.serving_hosts(settings)
    # Issued ~300 days ago: less than a third of its year remains, so it is due for renewal.
    old = certificates.generate_bundle(hosts, datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=300))
    await emulator.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                                    "metadata": {"name": settings.cert_secret, "namespace": NAMESPACE},
                                    "data": certificates.bundle_to_secret_data(old)}, namespace=NAMESPACE)
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
        await wait_phase(emulator, "deny-bad", "Active")
        served = await served_certificate(int(env["AP_LISTEN_PORT"]))
    validating = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
    assert validating is not None
    trusted = x509.load_pem_x509_certificates(base64.b64decode(validating["webhooks"][0]["clientConfig"]["caBundle"]))
    old_ca = x509.load_pem_x509_certificate(old.ca_cert_pem.encode())
    assert old_ca in trusted and len(trusted) == 2        # API servers holding the old CA keep working
    new_ca = next(ca for ca in trusted if ca != old_ca)
    served.verify_directly_issued_by(new_ca)              # the server already presents the new certificate
    secret = emulator.peek(SECRETS, settings.cert_secret, namespace=NAMESPACE)
    assert secret is not None
    assert certificates.bundle_from_secret_data(secret["data"]).ca_cert_pem == new_ca.public_bytes(
        serialization.Encoding.PEM).decode()
