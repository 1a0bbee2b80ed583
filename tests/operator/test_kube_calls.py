"""The operator's own API calls against an API server that fails or does not answer: a bounded
wait and a message, never a task waiting for ever (the audit, the reports, discovery), and never
a policy skipped because what it selects by could not be read."""
from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import kmock
import pytest
from emulator import ADMISSION_POLICIES, CONFIGMAPS, SECRETS, Emulator, wait_for
from kubernetes_asyncio import client
from operator_env import (
    operator_environment,
    operator_running,
    pod_request,
    wait_phase,
    webhook_client,
)

from admission_policy.cluster import client as kube
from admission_policy.cluster.discovery import Discovery
from admission_policy.cluster.watch import list_and_watch
from builders import CREATE_POD_RULE, policy_body


async def never() -> None:
    """A reaction that never answers (kmock awaits what a payload callable returns)."""
    await asyncio.Event().wait()


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "CALL_TIMEOUT", 0.5)


async def test_a_call_without_an_answer_is_a_504_naming_the_wait(emulator: Emulator, short_timeout: None) -> None:
    emulator.kmock["list", kmock.resource(CONFIGMAPS)] << never
    async with kube.BoundedApiClient(client.Configuration(host=emulator.url)) as api:
        status, answer = await kube.call_json(api, "GET", kube.resource_path("", "v1", "configmaps"))
        assert (status, answer) == (504, {"message": "no answer from the API server within 0.5 s"})
        status, _ = await kube.call_json(api, "GET", kube.resource_path("", "v1", "secrets"))
        assert status == 200   # the next call is served as usual


async def test_an_api_server_that_cannot_be_reached_is_a_503(short_timeout: None) -> None:
    async with kube.BoundedApiClient(client.Configuration(host="http://127.0.0.1:9")) as api:
        status, answer = await kube.call_json(api, "GET", "/api/v1/namespaces")
    assert status == 503 and answer["message"].startswith("cannot reach the API server: "), answer


async def test_a_typed_call_without_an_answer_is_a_504_naming_the_wait(emulator: Emulator,
                                                                      short_timeout: None) -> None:
    """What the certificate renewal, the configuration writer and the events call: one connection
    left half-open must not stall them for ever."""
    emulator.kmock["get", kmock.resource(SECRETS)] << never
    api = await kube.new_api_client()   # the emulator's kubeconfig
    async with api:
        with pytest.raises(client.ApiException) as raised:
            async with asyncio.timeout(30):   # a guard: without a bound, the call never ends
                await client.CoreV1Api(api).read_namespaced_secret("certificates", "default")
        assert (raised.value.status, raised.value.reason) == (504, "no answer from the API server within 0.5 s")
        listing = await client.CoreV1Api(api).list_namespace()
        assert listing.items is not None   # the next call is served as usual


async def test_a_watch_outlives_the_calls_time_limit(emulator: Emulator, short_timeout: None) -> None:
    """A watch waits for events for minutes: it keeps its own read timeout, not the calls' limit."""
    seen: list[str] = []
    failures: list[str] = []
    api = await kube.new_api_client()
    async with api:
        core = client.CoreV1Api(api)
        watching = asyncio.create_task(list_and_watch(
            "config maps", core.list_config_map_for_all_namespaces,
            lambda kind, body: seen.append(f"{kind} {body['metadata']['name']}"), lambda names: None,
            asyncio.Event(), on_error=failures.append))
        try:
            await wait_for(lambda: emulator.is_watched(CONFIGMAPS))
            await asyncio.sleep(3 * kube.CALL_TIMEOUT)   # silent for longer than a call may take
            await emulator.create(CONFIGMAPS, {"metadata": {"name": "late", "namespace": "default"}})
            await wait_for(lambda: "ADDED late" in seen)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
    assert failures == []


async def test_discovery_without_an_answer_raises_naming_the_path(emulator: Emulator, short_timeout: None) -> None:
    emulator.kmock["get", "/apis"] << never
    async with kube.BoundedApiClient(client.Configuration(host=emulator.url)) as api:
        with pytest.raises(client.ApiException) as raised:
            await Discovery(api).resources()
    assert raised.value.status == 504 and "discovery of /apis: no answer from the API server" in str(raised.value)


async def test_a_namespace_that_cannot_be_read_gets_a_namespace_selector_policy_its_failure_policy(
        emulator: Emulator, run_operator: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """A request in a namespace the operator has not seen and cannot read: a policy selecting
    namespaces by label answers by its failurePolicy, naming why (the namespace was taken as
    unlabelled, and the policy skipped: an allow it might have denied)."""
    env = operator_environment(monkeypatch, tmp_path / "certs")
    emulator.kmock["get", "/api/v1/namespaces/ghost"] << 503 << {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503, "reason": "ServiceUnavailable",
        "message": "etcd is busy"}
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body(
            "prod-only", match={"resources": [CREATE_POD_RULE], "namespaceSelector": {"matchLabels": {"env": "prod"}}},
            validations=[{"expression": "true"}]))
        await wait_phase(emulator, "prod-only", "Active")
        webhook = webhook_client(emulator, env)
        ghost = pod_request("web")
        ghost["namespace"] = ghost["object"]["metadata"]["namespace"] = "ghost"
        response = await webhook.review("/validate", ghost)
        assert not response["allowed"], response
        assert "spec.match.namespaceSelector cannot be judged: reading namespace ghost failed: 503" in \
            response["status"]["message"], response
        assert (await webhook.review("/validate", pod_request("web")))["allowed"]   # "default" reads fine
        await emulator.delete(ADMISSION_POLICIES, "prod-only")
        await wait_for(lambda: emulator.peek(ADMISSION_POLICIES, "prod-only") is None, timeout=20)
