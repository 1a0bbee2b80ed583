"""Issue 12, scenario 8 (security): what each of the operator's ports gives away.

TLS versions and ciphers, and 404 for a path that is not ours, are in test_webhook_tls.py; the
chart's pod security and RBAC in tests/chart/test_chart.py. Here: the webhook port answers
admission reviews and nothing else, with any method, on any path, and never in cleartext; the
metrics and probe ports name policies but never show what a policy says — its expressions and
messages may name internal registries, teams or users, and a metrics endpoint is scraped (and
often exposed) far more widely than the policies themselves are readable.
"""
from __future__ import annotations

import asyncio
import os
import secrets
from typing import Any

import aiohttp
import pytest
from emulator import ADMISSION_POLICIES, Emulator
from operator_env import pod_request, wait_phase

from admission_policy.operator.webhookconfig import MUTATE_PATH, VALIDATE_PATH, VALIDATE_POLICY_PATH
from builders import CREATE_POD_RULE, policy_body

ADMISSION_PATHS = (VALIDATE_PATH, MUTATE_PATH, VALIDATE_POLICY_PATH)
OTHER_PATHS = ("/", "/metrics", "/healthz", "/readyz", "/livez", "/debug/pprof/", "/validate/../metrics",
               "/kopf/validate", "/.well-known/security.txt")
METHODS = ("GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


async def test_the_webhook_port_serves_admission_reviews_and_nothing_else(serving: Any) -> None:
    async with serving() as webhook, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=webhook.context)) as session:
        answers: dict[tuple[str, str], int] = {}
        for path in (*ADMISSION_PATHS, *OTHER_PATHS):
            for method in (*METHODS, *(("POST",) if path in OTHER_PATHS else ())):
                async with session.request(method, f"{webhook.base}{path}", data=b"{}") as response:
                    await response.read()
                    answers[method, path] = response.status
        served = {request: status for request, status in answers.items() if status < 400}
        assert not served, f"answered on the webhook port: {served}"
        assert set(answers.values()) <= {404, 405}, answers
        # ... while a review posted to an admission path is answered.
        review = await webhook.review(VALIDATE_PATH, pod_request("offensive-pod", labels={"team": "a"}))
        assert review["allowed"] is False


async def test_the_webhook_port_never_answers_in_cleartext(serving: Any) -> None:
    """An HTTP request sent without TLS gets no HTTP answer: the bytes are a failed handshake."""
    async with serving() as webhook:
        reader, writer = await asyncio.open_connection("127.0.0.1", webhook.port)
        try:
            writer.write(b"GET /validate HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            await writer.drain()
            data = await asyncio.wait_for(reader.read(65536), timeout=10)
        except (ConnectionError, TimeoutError):
            data = b""
        finally:
            writer.close()
    assert not data.startswith(b"HTTP/"), data[:200]


async def test_the_metrics_and_probes_name_policies_but_never_show_their_content(
        serving: Any, emulator: Emulator) -> None:
    marker = f"zq{secrets.token_hex(6)}"   # in the policy's every text field, and nowhere else
    name = "metrics-leak-probe"
    body = policy_body(
        name, description=f"{marker} description", failurePolicy="Ignore",
        match={"resources": [CREATE_POD_RULE]},
        variables=[{"name": "secret", "expression": f"'{marker}-variable'"}],
        validations=[
            {"expression": f"object.metadata.name != '{marker}-name'", "message": f"{marker} message"},
            {"expression": "false", "messageExpression": f"'{marker} ' + variables.secret", "reason": "Invalid"},
            # An evaluation error (no such label), counted in the metrics by policy.
            {"expression": f"object.metadata.labels['{marker}'] == 'x'", "message": f"{marker} error"},
        ])
    metrics_url = f"http://127.0.0.1:{os.environ['AP_METRICS_PORT']}"
    health_url = f"http://127.0.0.1:{os.environ['AP_HEALTH_PORT']}"
    async with serving() as webhook:
        await emulator.create(ADMISSION_POLICIES, body)
        await wait_phase(emulator, name, "Active")
        response = await webhook.review(VALIDATE_PATH, pod_request("a-pod", labels={"team": "a"}))
        assert marker in response["status"]["message"], "the policy did not judge the request: nothing to leak"
        texts = {}
        async with aiohttp.ClientSession() as session:
            for url in (f"{metrics_url}/metrics", f"{health_url}/healthz", f"{health_url}/readyz"):
                async with session.get(url) as answer:
                    texts[url] = await answer.text()
    metrics = texts[f"{metrics_url}/metrics"]
    assert f'admission_policy_requests_total{{decision="denied",operation="CREATE",policy="{name}"}}' in metrics
    assert f'admission_policy_evaluation_errors_total{{policy="{name}"}}' in metrics
    for url, text in texts.items():
        assert marker not in text, (url, [line for line in text.splitlines() if marker in line][:5])


@pytest.mark.parametrize("path", ["/", "/validate", "/healthz", "/debug"])
async def test_the_metrics_port_serves_only_metrics(serving: Any, path: str) -> None:
    async with serving(), aiohttp.ClientSession() as session, \
            session.get(f"http://127.0.0.1:{os.environ['AP_METRICS_PORT']}{path}") as response:
        assert response.status == 404, await response.text()
