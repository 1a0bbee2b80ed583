"""The operator's own API calls (operator/kube.py) against an API server that does not answer:
a bounded wait and a message, never a task waiting for ever (the audit, the reports, discovery)."""
from __future__ import annotations

import asyncio

import kmock
import pytest
from emulator import CONFIGMAPS, Emulator
from kubernetes_asyncio import client

from admission_policy.operator import kube


async def never() -> None:
    """A reaction that never answers (kmock awaits what a payload callable returns)."""
    await asyncio.Event().wait()


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "CALL_TIMEOUT", 0.5)


async def test_a_call_without_an_answer_is_a_504_naming_the_wait(emulator: Emulator, short_timeout: None) -> None:
    emulator.kmock["list", kmock.resource(CONFIGMAPS)] << never
    async with client.ApiClient(client.Configuration(host=emulator.url)) as api:
        status, answer = await kube.call_json(api, "GET", kube.resource_path("", "v1", "configmaps"))
        assert (status, answer) == (504, {"message": "no answer from the API server within 0.5 s"})
        status, _ = await kube.call_json(api, "GET", kube.resource_path("", "v1", "secrets"))
        assert status == 200   # the next call is served as usual


async def test_an_api_server_that_cannot_be_reached_is_a_503(short_timeout: None) -> None:
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as api:
        status, answer = await kube.call_json(api, "GET", "/api/v1/namespaces")
    assert status == 503 and answer["message"].startswith("cannot reach the API server: "), answer


async def test_discovery_without_an_answer_raises_naming_the_path(emulator: Emulator, short_timeout: None) -> None:
    emulator.kmock["get", "/apis"] << never
    async with client.ApiClient(client.Configuration(host=emulator.url)) as api:
        with pytest.raises(client.ApiException) as raised:
            await kube.Discovery(api).resources()
    assert raised.value.status == 504 and "discovery of /apis: no answer from the API server" in str(raised.value)
