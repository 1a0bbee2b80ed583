"""The running operator's own webhooks for tenant policies and exceptions, on the kmock emulator.

What `kubectl apply` meets: a NamespacedAdmissionPolicy over its namespace's limit is refused,
naming the setting, while one in another namespace is not; an AdmissionPolicyException gets its
creation record from the request, and an approval written by hand is refused. The same flows run
on a real API server, under users' own identities, in tests/e2e/test_e2e_tenant_policies.py and
tests/e2e/test_e2e_exceptions.py.
"""
from __future__ import annotations

import base64
import json
import pathlib
from typing import Any

import kmock
import pytest
from emulator import ADMISSION_POLICIES, NAMESPACES, Emulator
from operator_env import operator_environment, operator_running, wait_for, wait_phase, webhook_client

from admission_policy import api, policyexception
from builders import ALICE, admission_request, policy_body

TENANT_POLICIES = f"{api.API_VERSION}/{api.NAMESPACED_PLURAL}"
NEEDS_TEAM = [{"expression": "has(object.metadata.labels.team)", "message": "a team label is required"}]
POD_RULE = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> dict[str, str]:
    return operator_environment(monkeypatch, tmp_path / "certs")


def tenant_body(namespace: str, name: str) -> dict[str, Any]:
    return {**policy_body(name, metadata={"namespace": namespace}, validations=NEEDS_TEAM,
                          match={"resources": [POD_RULE]}), "kind": api.NAMESPACED_KIND}


def write(obj: dict[str, Any], resource: str, *, namespace: str, name: str, old: Any = None) -> dict[str, Any]:
    """The review of a CREATE (an UPDATE, given ``old``) of one of the operator's own kinds, by Alice."""
    return admission_request(obj, resource=resource, group=api.GROUP, version=api.VERSION, kind=obj["kind"],
                             name=name, namespace=namespace, user_info=ALICE, dryRun=False,
                             operation="CREATE" if old is None else "UPDATE", old=old)


async def test_a_tenant_policy_over_its_namespaces_limit_is_refused_at_apply(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AP_TENANT_MAX_POLICIES", "1")
    for namespace in ("team-a", "team-b"):
        await emulator.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    async with operator_running(run_operator):
        await emulator.create(TENANT_POLICIES, tenant_body("team-a", "first"), namespace="team-a")
        await wait_for(lambda: ((emulator.peek(TENANT_POLICIES, "first", namespace="team-a") or {}).get(
            "status") or {}).get("phase") == "Active", timeout=20)
        webhook = webhook_client(emulator, env)
        second = tenant_body("team-a", "second")
        refused = await webhook.review("/validate-tenant-policy", write(second, api.NAMESPACED_PLURAL,
                                                                       namespace="team-a", name="second"))
        assert refused["allowed"] is False
        assert "team-a already holds 1 NamespacedAdmissionPolicy(s)" in refused["status"]["message"]
        assert "AP_TENANT_MAX_POLICIES=1" in refused["status"]["message"]
        elsewhere = tenant_body("team-b", "first")
        assert (await webhook.review("/validate-tenant-policy", write(
            elsewhere, api.NAMESPACED_PLURAL, namespace="team-b", name="first")))["allowed"] is True
        # The limit counts other policies: a new generation of the one it holds is not one more.
        again = tenant_body("team-a", "first")
        assert (await webhook.review("/validate-tenant-policy", write(
            again, api.NAMESPACED_PLURAL, namespace="team-a", name="first")))["allowed"] is True


async def test_an_exception_gets_its_creation_record_and_a_forged_approval_is_refused(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    # The API server answers the approval question: Alice may not approve.
    emulator.kmock["post", kmock.path("/apis/authorization.k8s.io/v1/subjectaccessreviews")] << {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "status": {"allowed": False}}
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body("needs-team", validations=NEEDS_TEAM,
                                                              match={"resources": [POD_RULE]}))
        await wait_phase(emulator, "needs-team", "Active")
        webhook = webhook_client(emulator, env)
        exception = {"apiVersion": api.API_VERSION, "kind": policyexception.KIND,
                     "metadata": {"name": "legacy", "namespace": "team-a"},
                     "spec": {"policies": [{"name": "needs-team"}], "reason": "migration",
                              "expiresAt": "2099-01-01T00:00:00Z"}}
        stamped = await webhook.review("/mutate-exception", write(exception, policyexception.PLURAL,
                                                                  namespace="team-a", name="legacy"))
        assert stamped["allowed"] is True and stamped["patchType"] == "JSONPatch"
        (stamp,) = json.loads(base64.b64decode(stamped["patch"]))
        record = stamp["value"]
        assert record[policyexception.CREATED_BY] == ALICE["username"]
        # As stored after the mutating phase, with an approval Alice wrote herself: never on a create.
        forged = {**exception, "metadata": {**exception["metadata"], "generation": 1, "annotations": {
            **record, policyexception.APPROVED_BY: ALICE["username"], policyexception.APPROVED_GENERATION: "1",
            policyexception.APPROVED_AT: record[policyexception.CREATED_AT]}}}
        refused = await webhook.review("/validate-exception", write(forged, policyexception.PLURAL,
                                                                    namespace="team-a", name="legacy"))
        assert refused["allowed"] is False
        assert "an exception is created unapproved" in refused["status"]["message"]
        # Nor later: the API server says Alice may not approve.
        stored = {**exception, "metadata": {**exception["metadata"], "generation": 1, "annotations": record}}
        refused = await webhook.review("/validate-exception", write(forged, policyexception.PLURAL,
                                                                    namespace="team-a", name="legacy", old=stored))
        assert refused["allowed"] is False
        assert f"{ALICE['username']} may not approve" in refused["status"]["message"]
