"""The operator's lifecycle with Kopf really running against kmock's KubernetesEmulator."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import logging
import pathlib
import re
import socket
import ssl
from collections.abc import AsyncIterator
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
    pod_request,
    wait_phase,
    webhook_client,
)

from admission_policy.cluster import watch as cluster_watch
from admission_policy.cluster.routing import break_glass_condition
from builders import AUTHENTICATED_ALICE, admission_request, policy_body

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
    # Reconciliation's conditions; native enforcement adds its own (Native) on its next pass.
    found = {kind: c for kind, c in conditions(body).items() if kind != "Native"}
    assert set(found) == {"Compiled", "Registered", "Ready", "TypeChecked"}
    assert found["TypeChecked"]["reason"] == "Checked" and "v1, Kind=Pod" in found["TypeChecked"]["message"]
    assert body["status"]["typeChecking"] == {"expressionWarnings": []}
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
    assert ("admission_policy.operator.reconcile", logging.INFO,
            "AdmissionPolicy deny-bad: (new) → Active: the policy is enforced for every resource it matches") in lines
    # Kopf's "Handler 'reconcile' succeeded." (and one line per admission request) are DEBUG.
    assert not [line for line in lines if line[0] == "kopf.objects" and line[1] == logging.INFO]


def policy_requests(emulator: Emulator, action: Any) -> int:
    """How many requests of this kind (list, watch, …) for AdmissionPolicies the emulator got."""
    policies = kmock.resource(ADMISSION_POLICIES)
    return sum(r.action == action and r.resource == policies for r in emulator.kmock)


async def test_a_watch_that_times_out_is_resumed_without_listing_again(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_watch, "WATCH_SECONDS", 1)
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
    monkeypatch.setattr(cluster_watch, "WATCH_SECONDS", 1)

    def lists() -> int:
        return policy_requests(emulator, kmock.action.LIST)

    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("first", validations=DENY_BAD))
        await wait_phase(emulator, "first", "Active")
        # ... and native enforcement has said who enforces it: the policy is written no more.
        await wait_for(lambda: "native" in ((emulator.peek(ADMISSION_POLICIES, "first") or {}).get("status") or {}))
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
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from admission_policy.operator import reconcile
    monkeypatch.setattr(reconcile, "DISCOVERY_GRACE", 0.5)   # Degraded after asking discovery again
    rules = [{"apiGroups": ["acme.com"], "apiVersions": ["v1"], "resources": ["widgets"], "operations": ["CREATE"]}]
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("widgets", validations=DENY_BAD,
                                                              match={"resources": rules}))
        body = await wait_phase(emulator, "widgets", "Degraded")
    registered = conditions(body)["Registered"]
    assert registered["status"] == "False" and registered["reason"] == "UnservedResources"
    assert "acme.com" in registered["message"] and "widgets" in registered["message"]
    assert conditions(body)["Compiled"]["status"] == "True"


POD_CONTROLLER_RESOURCES = frozenset({"deployments", "replicasets", "statefulsets", "daemonsets", "jobs",
                                      "cronjobs", "replicationcontrollers"})


def routed_resources(emulator: Emulator) -> set[str]:
    config = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME) or {}
    fixed = ("policies.validate.policy-operator.dev", "tenant-policies.validate.policy-operator.dev",
             "exceptions.validate.policy-operator.dev", "probe.validate.policy-operator.dev")
    return {resource for webhook in config.get("webhooks", []) if webhook["name"] not in fixed
            for rule in webhook.get("rules", []) for resource in rule["resources"]}


async def test_delete_unroutes_before_the_finalizer_is_removed(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    seen: list[tuple[bool, bool]] = []   # (finalizer present, pods still routed), sampled during deletion
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("temporary", validations=DENY_BAD))
        await wait_phase(emulator, "temporary", "Active")
        # A Pod policy also routes the workloads whose Pod templates it judges (issue 17) ...
        assert routed_resources(emulator) == {"pods", *POD_CONTROLLER_RESOURCES}
        await emulator.delete(ADMISSION_POLICIES, "temporary")
        while emulator.peek(ADMISSION_POLICIES, "temporary") is not None:
            body = emulator.peek(ADMISSION_POLICIES, "temporary") or {}
            seen.append((FINALIZER in (body.get("metadata", {}).get("finalizers") or []),
                         "pods" in routed_resources(emulator)))
            await asyncio.sleep(0.01)
            assert len(seen) < 2000, "the policy was never released"
    assert routed_resources(emulator) == set()   # ... only while a policy needs them
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
    fixed, tenant, exceptions, routed, probe = validating["webhooks"]
    assert fixed["name"] == "policies.validate.policy-operator.dev"
    assert tenant["name"] == "tenant-policies.validate.policy-operator.dev"
    assert tenant["clientConfig"]["url"] == f"https://127.0.0.1:{port}/validate-tenant-policy"
    assert tenant["rules"][0]["resources"] == ["namespacedadmissionpolicies"]
    assert fixed["clientConfig"]["url"] == f"https://127.0.0.1:{port}/validate-policy"
    assert fixed["failurePolicy"] == "Fail"
    assert fixed["rules"] == [{"apiGroups": ["policy-operator.dev"], "apiVersions": ["v1alpha1"],
                               "operations": ["CREATE", "UPDATE"], "resources": ["admissionpolicies"], "scope": "*"}]
    assert exceptions["name"] == "exceptions.validate.policy-operator.dev"
    assert exceptions["clientConfig"]["url"] == f"https://127.0.0.1:{port}/validate-exception"
    assert routed["name"] == "fail.validate.policy-operator.dev"
    assert routed["clientConfig"]["url"] == f"https://127.0.0.1:{port}/validate"
    assert probe["name"] == "probe.validate.policy-operator.dev"
    assert probe["clientConfig"]["url"] == f"https://127.0.0.1:{port}/probe"
    # The Pod policy's rule, and the workloads whose Pod templates it judges (issue 17).
    assert routed["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["pods", "replicationcontrollers"], "scope": "*"},
        {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["daemonsets", "deployments", "replicasets", "statefulsets"], "scope": "*"},
        {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["cronjobs", "jobs"], "scope": "*"}]
    record, mutate = mutating["webhooks"]
    assert record["name"] == "exceptions.mutate.policy-operator.dev"
    assert record["clientConfig"]["url"] == f"https://127.0.0.1:{port}/mutate-exception"
    for exception_entry in (exceptions, record):
        assert exception_entry["failurePolicy"] == "Fail"
        assert exception_entry["rules"] == [
            {"apiGroups": ["policy-operator.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
             "resources": ["admissionpolicyexceptions"], "scope": "Namespaced"}]
        assert [c["name"] for c in exception_entry["matchConditions"]] == ["record-or-spec-written"]
        # Reviewed in every namespace, whatever the labels: no selector skips an exception.
        assert "namespaceSelector" not in exception_entry and "objectSelector" not in exception_entry
        assert exception_entry["matchPolicy"] == "Equivalent"
        assert exception_entry["sideEffects"] == "None"
        assert exception_entry["timeoutSeconds"] == 5
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
        # No objectSelector: a label is the writer's own; the break-glass also names who wrote it.
        assert "objectSelector" not in webhook
        assert webhook["matchConditions"] == [break_glass_condition((), ("system:masters",))]
    # The caBundle is the CA that signed the certificate the server actually presents.
    for webhook in (fixed, exceptions, routed, record, mutate):
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

    from admission_policy.config import OperatorConfig
    from admission_policy.operator import certificates

    settings = OperatorConfig.from_env(os.environ)
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


# --- issue 18: hardening ----------------------------------------------------------------------------------

def _kubernetes_secret_fragments(emulator: Emulator) -> list[str]:
    """Pieces of the certificate Secret's private keys, as they could appear in a log line: the
    Secret's base64 values, and the base64 body of each PEM."""
    from admission_policy.operator import certificates
    secret = emulator.peek(SECRETS, "admission-policy-operator-tls", namespace=NAMESPACE)
    assert secret is not None
    fragments = []
    for key in (certificates.CA_KEY_KEY, certificates.KEY_KEY):
        fragments.append(secret["data"][key][:48])
        pem = base64.b64decode(secret["data"][key]).decode()
        fragments.append(pem.splitlines()[1])
    return fragments


@contextlib.asynccontextmanager
async def at_debug_with_deny_bad(emulator: Emulator, run_operator: Any, monkeypatch: pytest.MonkeyPatch,
                                 caplog: pytest.LogCaptureFixture) -> AsyncIterator[None]:
    """The operator at AP_LOG_LEVEL=DEBUG (and every logger captured at DEBUG), "deny-bad" Active."""
    monkeypatch.setenv("AP_LOG_LEVEL", "DEBUG")
    with caplog.at_level(logging.DEBUG):
        async with operator_running(run_operator):
            await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
            await wait_phase(emulator, "deny-bad", "Active")
            yield


async def test_at_debug_no_log_line_carries_the_private_keys(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18 #8: the Kubernetes client logged the certificate Secret's response body at DEBUG."""
    async with at_debug_with_deny_bad(emulator, run_operator, monkeypatch, caplog):
        pass
    text = "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)
    assert "admission_policy.operator" in text   # the operator did log at DEBUG
    assert "PRIVATE KEY" not in text
    for fragment in _kubernetes_secret_fragments(emulator):
        assert fragment not in text
    assert not [r for r in caplog.records if r.name.startswith(CLIENT_LOGGER_PREFIXES) and r.levelno < logging.WARNING]


CLIENT_LOGGER_PREFIXES = ("kubernetes_asyncio", "urllib3", "aiohttp.client")


def configurations(emulator: Emulator) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    return (emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME),
            emulator.peek(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME))


def webhooks_of(config: dict[str, Any] | None) -> Any:
    return (config or {}).get("webhooks")


async def test_deleted_or_edited_configurations_are_written_back(
        emulator: Emulator, run_operator: Any, env: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18 #6: deleted by hand while the operator runs, they never came back."""
    mutating_policy = policy_body("label", mutations=[{"merge": {"metadata": {"labels": {"a": "b"}}}}])
    async with operator_running(run_operator) as op:
        await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
        await emulator.create(ADMISSION_POLICIES, mutating_policy)
        await wait_phase(emulator, "deny-bad", "Active")
        await wait_phase(emulator, "label", "Active")
        validating, mutating = configurations(emulator)
        assert validating is not None and mutating is not None

        await emulator.delete(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
        await emulator.delete(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
        await op.wait_for(lambda: all(configurations(emulator)))
        again = configurations(emulator)
        assert [webhooks_of(c) for c in again] == [webhooks_of(validating), webhooks_of(mutating)]

        edited = copy.deepcopy(webhooks_of(again[0]))
        (routed,) = [hook for hook in edited if hook["name"] == "fail.validate.policy-operator.dev"]
        routed["failurePolicy"] = "Ignore"
        routed["rules"] = []
        await emulator.patch(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME, {"webhooks": edited})
        await op.wait_for(lambda: webhooks_of(configurations(emulator)[0]) == webhooks_of(validating))
        for phase_now in (phase(emulator, "deny-bad"), phase(emulator, "label")):
            assert phase_now == "Active"
    assert any("were deleted or changed outside the operator; written back" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


async def test_policies_are_pending_while_their_configurations_are_lost_and_active_once_written_back(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18 #6: with the configurations gone, every policy still said Ready."""
    from admission_policy.operator import registration
    blocked = asyncio.Event()
    apply = registration.apply_configurations

    async def failing_while_blocked(*args: Any) -> bool:
        if blocked.is_set():
            raise RuntimeError("the API server refused the write (test)")
        return await apply(*args)

    monkeypatch.setattr(registration, "apply_configurations", failing_while_blocked)
    async with operator_running(run_operator) as op:
        await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
        await wait_phase(emulator, "deny-bad", "Active")
        blocked.set()
        await emulator.delete(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
        body = await wait_phase(emulator, "deny-bad", "Pending")
        registered, ready = conditions(body)["Registered"], conditions(body)["Ready"]
        assert registered["status"] == "False" and registered["reason"] == "RegistrationLost"
        assert f"ValidatingWebhookConfiguration {CONFIG_NAME} is missing" in registered["message"]
        assert "the API server refused the write (test)" in registered["message"]
        assert ready["status"] == "False" and ready["reason"] == "RegistrationLost"
        await op.wait_for(lambda: any(e["reason"] == "Pending" for e in emulator.events_for("deny-bad")))

        blocked.clear()
        body = await wait_phase(emulator, "deny-bad", "Active", timeout=40)
        assert conditions(body)["Ready"]["status"] == "True"
        assert configurations(emulator)[0] is not None
        await op.wait_for(lambda: any(e["reason"] == "Active" and "Pending → Active" in e["message"]
                                      for e in emulator.events_for("deny-bad")))
    (lost,) = [e for e in emulator.events_for("deny-bad") if e["reason"] == "Pending"]
    assert lost["type"] == "Warning" and "Active → Pending: the webhook configurations do not route" in lost["message"]


async def test_a_policy_for_a_crd_created_a_moment_ago_is_never_degraded(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    """Issue 18 #7: discovery cached for a minute made such a policy Degraded meanwhile."""
    from admission_policy.operator import state
    rules = [{"apiGroups": ["acme.com"], "apiVersions": ["v1"], "resources": ["widgets"], "operations": ["CREATE"]}]
    phases: list[str | None] = []
    async with operator_running(run_operator) as op:
        await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
        await wait_phase(emulator, "deny-bad", "Active")
        await state.operator().discovery.resources()   # cached now, without widgets
        emulator.declare_crd(widget_crd())
        await emulator.create(ADMISSION_POLICIES, policy_body("widgets", validations=DENY_BAD,
                                                              match={"resources": rules}))
        await op.wait_for(lambda: phases.append(phase(emulator, "widgets")) or phases[-1] in ("Active", "Degraded"),
                          timeout=20, interval=0.01)
    assert "Degraded" not in phases and phases[-1] == "Active", phases
    assert not [e for e in emulator.events_for("widgets") if e["reason"] == "Degraded"]


def widget_crd() -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.acme.com"},
            "spec": {"group": "acme.com", "scope": "Namespaced",
                     "names": {"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]}}


def request_for(resource: str, kind: str, name: str, *, group: str = "", version: str = "v1", namespace: str = "",
                operation: str = "UPDATE") -> dict[str, Any]:
    """What the API server sends the webhook for an object of any kind (``namespace``: "" if cluster-scoped)."""
    body = {"apiVersion": f"{group}/{version}".lstrip("/"), "kind": kind,
            "metadata": {"name": name, **({"namespace": namespace} if namespace else {}), "labels": {}}}
    return admission_request(body, operation=operation, old=body if operation == "UPDATE" else None,
                             resource=resource, group=group, version=version, kind=kind, name=name,
                             namespace=namespace, uid="b0c1a2d3-0000-4000-8000-0000000000aa",
                             user_info=AUTHENTICATED_ALICE, dryRun=False)


WILDCARD = {"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "operations": ["*"]}
NEEDS_TEAM = [{"expression": "object.metadata.labels.team != ''", "message": "a team label is required"}]


async def test_a_wildcard_policy_never_judges_the_operators_own_api_or_namespace(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    """Issue 18 #5: a policy matching everything judged AdmissionPolicies too, and locked itself in."""
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("needs-team", validations=NEEDS_TEAM,
                                                              match={"resources": [WILDCARD]}))
        await wait_phase(emulator, "needs-team", "Active")
        webhook = webhook_client(emulator, env)
        judged = [
            request_for("configmaps", "ConfigMap", "cm", namespace="default"),
            request_for("customresourcedefinitions", "CustomResourceDefinition", "widgets.acme.com",
                        group="apiextensions.k8s.io"),
        ]
        never_judged = [
            request_for("admissionpolicies", "AdmissionPolicy", "needs-team", group="policy-operator.dev",
                        version="v1alpha1"),
            request_for("admissionpolicies", "AdmissionPolicy", "needs-team", group="policy-operator.dev",
                        version="v1alpha1", operation="DELETE"),
            request_for("customresourcedefinitions", "CustomResourceDefinition",
                        "admissionpolicies.policy-operator.dev", group="apiextensions.k8s.io"),
            request_for("admissionpolicyexceptions", "AdmissionPolicyException", "legacy", group="policy-operator.dev",
                        version="v1alpha1", namespace="default"),
            request_for("customresourcedefinitions", "CustomResourceDefinition",
                        "admissionpolicyexceptions.policy-operator.dev", group="apiextensions.k8s.io"),
            request_for("clusterkopfpeerings", "ClusterKopfPeering", "peering", group="kopf.dev"),
            request_for("secrets", "Secret", "tls", namespace=NAMESPACE),
            request_for("configmaps", "ConfigMap", "cm", namespace="kube-system"),
            request_for("namespaces", "Namespace", NAMESPACE, namespace=NAMESPACE),
        ]
        for request in judged:
            response = await webhook.review("/validate", request)
            assert response["allowed"] is False, request["resource"]
        for request in never_judged:
            response = await webhook.review("/validate", request)
            assert response["allowed"] is True, (request["resource"], request["name"], response)
    validating = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
    assert validating is not None
    (routed,) = [w for w in validating["webhooks"] if w["name"] == "fail.validate.policy-operator.dev"]
    resources = {(group, r) for rule in routed["rules"] for group in rule["apiGroups"] for r in rule["resources"]}
    assert ("policy-operator.dev", "admissionpolicies") not in resources
    assert ("policy-operator.dev", "admissionpolicyexceptions") not in resources
    assert ("apiextensions.k8s.io", "customresourcedefinitions") in resources
    assert [c["name"] for c in routed["matchConditions"]] == ["not-break-glass", "not-the-operators-own-crds"]


async def test_denials_are_info_lines_rate_limited_per_policy_and_every_decision_a_debug_line(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18 #9: a denied Pod logged only "Webhook 'validate' succeeded"."""
    from admission_policy.operator import state
    async with at_debug_with_deny_bad(emulator, run_operator, monkeypatch, caplog):
        webhook = webhook_client(emulator, env)
        assert (await webhook.review("/validate", pod_request("good")))["allowed"] is True
        request = pod_request("bad")
        request["dryRun"] = True
        assert (await webhook.review("/validate", request))["allowed"] is False
        for _ in range(12):
            assert (await webhook.review("/validate", pod_request("bad")))["allowed"] is False
        log = state.operator().decisions
        later = log.clock() + log.window
        log.clock = lambda: later
        log.flush()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "admission_policy.operator.decisions"]
    info = [text for level, text in lines if level == logging.INFO]
    assert info[0] == "AdmissionPolicy deny-bad: denied CREATE Pod default/bad by alice (dry run): bad name"
    assert info[1:10] == ["AdmissionPolicy deny-bad: denied CREATE Pod default/bad by alice: bad name"] * 9
    # The window's length as measured: a minute, plus however long the 13 requests took.
    (suppressed,) = info[10:]
    assert re.fullmatch(r"AdmissionPolicy deny-bad: 3 more decision line\(s\) suppressed in 6\ds "
                        r"\(at most 10 per 60s per policy\)", suppressed), suppressed
    debug = [text for level, text in lines if level == logging.DEBUG]
    assert debug[0] == "Admission CREATE Pod default/good by alice via validate: allowed: deny-bad allowed"
    assert len(debug) == 14


@pytest.mark.parametrize("port", ["AP_LISTEN_PORT", "AP_HEALTH_PORT", "AP_METRICS_PORT"])
# Kopf leaves its login coroutine unawaited when start-up fails before it.
@pytest.mark.filterwarnings("ignore:coroutine 'authenticator' was never awaited:RuntimeWarning")
async def test_a_port_in_use_stops_the_operator_with_one_clear_line(
        emulator: Emulator, run_operator: Any, env: dict[str, str], port: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18: a taken port made the operator retry for ever."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(env[port])))
        taken.listen()
        with pytest.raises(Exception, match="One or more handlers failed"):
            async with operator_running(run_operator):
                pass
    (line,) = [r for r in caplog.records if "cannot listen on" in r.getMessage()]
    assert f"cannot listen on 127.0.0.1:{env[port]} ({port}" in line.getMessage()
    assert "Address already in use" in line.getMessage()


async def test_on_shutdown_the_log_says_the_webhooks_stay_and_fail_closed(
        emulator: Emulator, run_operator: Any, env: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("deny-bad", validations=DENY_BAD))
        await wait_phase(emulator, "deny-bad", "Active")
    (line,) = [r for r in caplog.records if r.getMessage().startswith("Stopping.")]
    assert line.levelno == logging.WARNING
    text = line.getMessage()
    assert f"webhook configurations {CONFIG_NAME} stay in place" in text
    assert "fail closed for 1 failurePolicy Fail policies (deny-bad)" in text
    assert f"admission-policy cleanup --name {CONFIG_NAME}" in text
