"""The operator's real webhook server over TLS, verified against the CA it generated, fed real
AdmissionReview JSON: what the API server would send and get back."""
from __future__ import annotations

import base64
import contextlib
import copy
import gc
import json
import logging
import pathlib
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import jsonpatch
import pytest
import yaml
from emulator import ADMISSION_POLICIES, VALIDATING_WEBHOOK_CONFIGURATIONS, Emulator
from operator_env import CONFIG_NAME, ca_context, operator_environment, operator_running, policy_body, wait_phase

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
POD_RULE = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}


def example_policy(directory: str) -> dict[str, Any]:
    (body,) = [d for d in yaml.safe_load_all((EXAMPLES / directory / "policy.yaml").read_text()) if d]
    return dict(body)


class Webhook:
    """An HTTPS client that trusts only the caBundle the operator wrote into its configuration."""

    def __init__(self, context: ssl.SSLContext, base: str) -> None:
        self.context = context
        self.base = base

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        # A session per call: pytest-asyncio runs fixture setup and teardown in different tasks.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.context)) as session, \
                session.post(f"{self.base}{path}", data=data, headers={"Content-Type": "application/json"}) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text

    async def review(self, path: str, request: dict[str, Any]) -> dict[str, Any]:
        status, body = await self.post(path, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                              "request": request})
        assert status == 200, body
        assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
        assert body["response"]["uid"] == request["uid"]
        return dict(body["response"])


@pytest.fixture
def serving(emulator: Emulator, run_operator: Any, monkeypatch: pytest.MonkeyPatch,
            tmp_path: pathlib.Path) -> Callable[[], contextlib.AbstractAsyncContextManager[Webhook]]:
    """The running operator with example policies loaded, entered in the test's own task
    (pytest-asyncio tears fixtures down in another task, which Kopf's shutdown does not survive)."""
    env = operator_environment(monkeypatch, tmp_path / "certs")
    return lambda: _serving(emulator, run_operator, env)


@contextlib.asynccontextmanager
async def _serving(emulator: Emulator, run_operator: Any, env: dict[str, str]) -> AsyncIterator[Webhook]:
    async with operator_running(run_operator):
        for body in (example_policy("deny-offensive-pod-names"), example_policy("lifespan-toleration"),
                     policy_body("team-warn", enforcement="Warn", match={"resources": [POD_RULE]},
                                 validations=[{"expression": "has(object.metadata.labels) && "
                                               "'team' in object.metadata.labels", "message": "pods need a team"}]),
                     policy_body("audit-images", enforcement="Audit", match={"resources": [POD_RULE]},
                                 validations=[{"expression": "object.spec.containers.all(c, c.image.contains(':'))",
                                               "message": "images should be pinned"}])):
            await emulator.create(ADMISSION_POLICIES, body)
            await wait_phase(emulator, body["metadata"]["name"], "Active")
        config = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
        assert config is not None
        context = ca_context(config["webhooks"][0]["clientConfig"]["caBundle"])
        # "localhost" is a SAN of the serving certificate; hostname checking stays on.
        yield Webhook(context, f"https://localhost:{env['AP_LISTEN_PORT']}")


def pod_request(name: str, labels: dict[str, str] | None = None, image: str = "nginx:1.27",
                uid: str = "b0c1a2d3-0000-4000-8000-000000000001") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "default"}
    if labels is not None:
        metadata["labels"] = labels
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
           "spec": {"containers": [{"name": name, "image": image, "resources": {}}], "restartPolicy": "Always"}}
    return {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": name, "namespace": "default", "operation": "CREATE",
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": pod, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "kubectl-run"},
    }


async def test_allows_a_compliant_pod(serving: Any) -> None:
    async with serving() as webhook:
        response = await webhook.review("/validate", pod_request("web", labels={"team": "a"}))
        assert response == {"uid": "b0c1a2d3-0000-4000-8000-000000000001", "allowed": True}


async def test_denies_with_status_code_and_message(serving: Any) -> None:
    async with serving() as webhook:
        response = await webhook.review("/validate", pod_request("offensive-pod", labels={"team": "a"}))
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert response["status"]["reason"] == "Forbidden"
        assert 'AdmissionPolicy "deny-offensive-pod-names" denied the request' in response["status"]["message"]


async def test_warns(serving: Any) -> None:
    async with serving() as webhook:
        response = await webhook.review("/validate", pod_request("web"))
        assert response["allowed"] is True
        assert response["warnings"] == ['AdmissionPolicy "team-warn": pods need a team']


async def test_audits(serving: Any) -> None:
    async with serving() as webhook:
        response = await webhook.review("/validate", pod_request("web", labels={"team": "a"}, image="nginx"))
        assert response["allowed"] is True and "warnings" not in response
        assert json.loads(response["auditAnnotations"]["audit-images"]) == ["images should be pinned"]


async def test_mutates_with_a_json_patch_that_yields_the_expected_object(serving: Any) -> None:
    async with serving() as webhook:
        request = pod_request("web", labels={"acme.com/lifespan-requested": "3"})
        response = await webhook.review("/mutate", request)
        assert response["allowed"] is True and response["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(response["patch"]))
        expected = copy.deepcopy(request["object"])
        expected["spec"]["tolerations"] = [{"key": "acme.com/lifespan-remaining", "operator": "Equal", "value": "14",
                                            "effect": "NoSchedule"}]
        assert jsonpatch.apply_patch(request["object"], patch) == expected


async def test_the_validating_path_does_not_mutate_and_the_mutating_path_does_not_validate(serving: Any) -> None:
    async with serving() as webhook:
        request = pod_request("offensive-pod", labels={"acme.com/lifespan-requested": "3"})
        mutated = await webhook.review("/mutate", request)
        assert mutated["allowed"] is True and "patch" in mutated
        validated = await webhook.review("/validate", request)
        assert validated["allowed"] is False and "patch" not in validated


@pytest.mark.parametrize(("body", "words"), [
    ("{not json", "Expecting property name"),
    ("[1, 2]", "an AdmissionReview must be a JSON object"),
    (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "x"}}),
     "request.operation is required"),
])
async def test_a_malformed_body_gets_a_400_and_the_server_keeps_serving(serving: Any, body: str,
                                                                       words: str) -> None:
    async with serving() as webhook:
        status, answer = await webhook.post("/validate", body)
        assert status == 400
        assert words in str(answer)
        response = await webhook.review("/validate", pod_request("web", labels={"team": "a"}))
        assert response["allowed"] is True


async def test_an_invalid_policy_is_rejected_naming_the_field_and_the_compiler_message(serving: Any) -> None:
    async with serving() as webhook:
        policy = policy_body("broken", validations=[{"expression": "object.metadata.name.startsWith("}])
        request = {
            "uid": "c0ffee00-0000-4000-8000-000000000002", "operation": "CREATE", "name": "broken",
            "kind": {"group": "policy-operator.dev", "version": "v1alpha1", "kind": "AdmissionPolicy"},
            "resource": {"group": "policy-operator.dev", "version": "v1alpha1", "resource": "admissionpolicies"},
            "userInfo": {"username": "admin"}, "object": policy, "oldObject": None,
        }
        response = await webhook.review("/validate-policy", request)
        assert response["allowed"] is False
        assert response["status"]["code"] == 422
        message = response["status"]["message"]
        assert "AdmissionPolicy 'broken' is invalid" in message
        assert "spec.validations[0].expression (line 1, column" in message and "Syntax error" in message
        request["object"] = policy_body("fine", validations=[{"expression": "true"}])
        request["uid"] = "c0ffee00-0000-4000-8000-000000000003"
        assert (await webhook.review("/validate-policy", request))["allowed"] is True


async def test_a_policy_update_that_leaves_the_spec_alone_is_never_refused(serving: Any) -> None:
    """Removing a finalizer or labelling a policy that slipped in broken must stay possible, also on
    API servers without ``matchConditions`` (they send every UPDATE); a spec edit is still judged."""
    async with serving() as webhook:
        broken = policy_body("slipped-in", validations=[{"expression": "object.metadata.name.startsWith("}])
        relabelled = copy.deepcopy(broken)
        relabelled["metadata"].update(labels={"team": "a"}, finalizers=[])
        request = {
            "uid": "c0ffee00-0000-4000-8000-000000000004", "operation": "UPDATE", "name": "slipped-in",
            "kind": {"group": "policy-operator.dev", "version": "v1alpha1", "kind": "AdmissionPolicy"},
            "resource": {"group": "policy-operator.dev", "version": "v1alpha1", "resource": "admissionpolicies"},
            "userInfo": {"username": "admin"}, "object": relabelled, "oldObject": broken,
        }
        assert (await webhook.review("/validate-policy", request))["allowed"] is True

        deleting = copy.deepcopy(broken)
        deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        deleting["spec"]["description"] = "changed while being deleted"
        request.update(uid="c0ffee00-0000-4000-8000-000000000005", object=deleting)
        assert (await webhook.review("/validate-policy", request))["allowed"] is True

        edited = copy.deepcopy(broken)
        edited["spec"]["description"] = "a spec edit is judged"
        request.update(uid="c0ffee00-0000-4000-8000-000000000006", object=edited)
        response = await webhook.review("/validate-policy", request)
        assert response["allowed"] is False and response["status"]["code"] == 422


async def test_no_per_request_log_lines_at_info(serving: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with serving() as webhook:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            for name in ("web", "offensive-pod"):
                await webhook.review("/validate", pod_request(name, labels={"team": "a"}))
        noisy = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "Webhook" in r.getMessage()]
        assert noisy == []


async def test_updates_of_many_objects_leave_nothing_behind(serving: Any) -> None:
    # Kopf keeps a memory per object uid for every UPDATE it admits and forgets it only when a
    # watch it runs sees the object deleted: for pods that would grow without bound.
    from kopf._core.reactor.inventory import ResourceMemory

    def memories() -> int:
        return sum(isinstance(o, ResourceMemory) for o in gc.get_objects())

    async with serving() as webhook:
        before = memories()
        for index in range(60):
            request = pod_request(f"web-{index}", labels={"team": "a"})
            request.update(operation="UPDATE", oldObject=copy.deepcopy(request["object"]),
                           options={"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"})
            for body in (request["object"], request["oldObject"]):
                body["metadata"]["uid"] = f"7e570000-0000-4000-8000-{index:012d}"
            assert (await webhook.review("/validate", request))["allowed"] is True
        assert memories() - before <= 1


DENIED = 'admission_policy_requests_total{decision="denied",operation="CREATE",policy="deny-offensive-pod-names"}'


def metric(text: str, name: str) -> float:
    """A sample's value (0 when absent): the registry is per process, so tests compare deltas."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_probes_and_metrics(serving: Any) -> None:
    import os
    async with serving() as webhook, aiohttp.ClientSession() as session:
        metrics_url = f"http://127.0.0.1:{os.environ['AP_METRICS_PORT']}/metrics"
        health = f"http://127.0.0.1:{os.environ['AP_HEALTH_PORT']}"
        async with session.get(metrics_url) as response:
            before = await response.text()
        await webhook.review("/validate", pod_request("offensive-pod", labels={"team": "a"}))
        async with session.get(f"{health}/healthz") as response:
            assert response.status == 200
        async with session.get(f"{health}/readyz") as response:
            assert response.status == 200
        async with session.get(metrics_url) as response:
            after = await response.text()
    assert metric(after, DENIED) == metric(before, DENIED) + 1
    count, infinity = ('admission_policy_evaluation_seconds_count{webhook="validate"}',
                       'admission_policy_evaluation_seconds_bucket{le="+Inf",webhook="validate"}')
    assert metric(after, count) == metric(before, count) + 1 == metric(after, infinity)
    assert metric(after, "admission_policy_policies_loaded") >= 4
