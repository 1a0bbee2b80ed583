"""Running the real operator module against the emulator, with its settings on free local ports."""
from __future__ import annotations

import base64
import contextlib
import json
import pathlib
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import yaml
from emulator import ADMISSION_POLICIES, VALIDATING_WEBHOOK_CONFIGURATIONS, Emulator, RunningOperator, wait_for

from admission_policy import api
from builders import AUTHENTICATED_ALICE, CREATE_POD_RULE, admission_request, container, pod, policy_body
from ports import free_ports

MODULE = "admission_policy.operator.handlers"
CONFIG_NAME = "admission-policy-operator"
NAMESPACE = "admission-policy-system"


def operator_environment(monkeypatch: pytest.MonkeyPatch, cert_dir: pathlib.Path) -> dict[str, str]:
    # One call for the three: ports picked apart could be the same one ("address already in use").
    listen, health, metrics = free_ports(3)
    env = {
        "AP_NAMESPACE": NAMESPACE, "AP_LISTEN_HOST": "127.0.0.1", "AP_LISTEN_PORT": str(listen),
        "AP_ADVERTISE_HOST": "127.0.0.1", "AP_HEALTH_PORT": str(health), "AP_METRICS_PORT": str(metrics),
        "AP_CERT_DIR": str(cert_dir), "AP_WEBHOOK_CONFIG_NAME": CONFIG_NAME, "AP_LOG_LEVEL": "INFO",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@contextlib.asynccontextmanager
async def operator_running(
    run_operator: Callable[..., contextlib.AbstractAsyncContextManager[RunningOperator]],
) -> AsyncIterator[RunningOperator]:
    async with run_operator(module=MODULE, startup_timeout=20) as op:
        yield op


def phase(emulator: Emulator, name: str) -> str | None:
    return ((emulator.peek(ADMISSION_POLICIES, name) or {}).get("status") or {}).get("phase")


async def wait_phase(emulator: Emulator, name: str, expected: str, timeout: float = 20) -> dict[str, Any]:
    await wait_for(lambda: phase(emulator, name) == expected, timeout=timeout)
    body = emulator.peek(ADMISSION_POLICIES, name)
    assert body is not None
    return body


def conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in body["status"]["conditions"]}


def ca_context(ca_bundle_b64: str) -> ssl.SSLContext:
    """A client context that trusts only the operator's CA, as the API server does."""
    context = ssl.create_default_context(cadata=base64.b64decode(ca_bundle_b64).decode())
    context.check_hostname = True
    return context


# --- the webhook server with the example policies loaded (the ``serving`` fixture, conftest.py) --------------

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


def example_policy(directory: str) -> dict[str, Any]:
    (body,) = [d for d in yaml.safe_load_all((EXAMPLES / directory / "policy.yaml").read_text()) if d]
    return dict(body)


class Webhook:
    """An HTTPS client that trusts only the caBundle the operator wrote into its configuration."""

    def __init__(self, context: ssl.SSLContext, base: str) -> None:
        self.context = context
        self.base = base
        self.port = int(base.rsplit(":", 1)[1])

    async def post(self, path: str, body: Any, content_type: str = "application/json") -> tuple[int, Any]:
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        # A session per call: pytest-asyncio runs fixture setup and teardown in different tasks.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.context)) as session, \
                session.post(f"{self.base}{path}", data=data, headers={"Content-Type": content_type}) as response:
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


@contextlib.asynccontextmanager
async def serving_webhook(emulator: Emulator, run_operator: Any, env: dict[str, str]) -> AsyncIterator[Webhook]:
    """The operator running with two example policies, a Warn and an Audit one, all Active."""
    async with operator_running(run_operator):
        for body in (example_policy("deny-offensive-pod-names"), example_policy("lifespan-toleration"),
                     policy_body("team-warn", enforcement="Warn", match={"resources": [CREATE_POD_RULE]},
                                 validations=[{"expression": "has(object.metadata.labels) && "
                                               "'team' in object.metadata.labels", "message": "pods need a team"}]),
                     policy_body("audit-images", enforcement="Audit", match={"resources": [CREATE_POD_RULE]},
                                 validations=[{"expression": "object.spec.containers.all(c, c.image.contains(':'))",
                                               "message": "images should be pinned"}])):
            await emulator.create(ADMISSION_POLICIES, body)
            await wait_phase(emulator, body["metadata"]["name"], "Active")
        yield webhook_client(emulator, env)


def webhook_client(emulator: Emulator, env: dict[str, str]) -> Webhook:
    """The running operator's webhook, trusting the CA it wrote into its configuration."""
    config = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME)
    assert config is not None
    # "localhost" is a SAN of the serving certificate; hostname checking stays on.
    return Webhook(ca_context(config["webhooks"][0]["clientConfig"]["caBundle"]),
                   f"https://localhost:{env['AP_LISTEN_PORT']}")


def pod_request(name: str, labels: dict[str, str] | None = None, image: str = "nginx:1.27",
                uid: str = "b0c1a2d3-0000-4000-8000-000000000001") -> dict[str, Any]:
    """What the API server sends the webhook for `kubectl run <name> --image <image>`."""
    created = pod(name, labels=labels, containers=[container(name, image, resources={})], restartPolicy="Always")
    return admission_request(created, kind="Pod", name=name, uid=uid, user_info=AUTHENTICATED_ALICE,
                             requestKind={"group": "", "version": "v1", "kind": "Pod"},
                             requestResource={"group": "", "version": "v1", "resource": "pods"}, dryRun=False,
                             options={"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions",
                                      "fieldManager": "kubectl-run"})


def policy_request(policy: dict[str, Any], *, operation: str = "CREATE", old: dict[str, Any] | None = None,
                   uid: str = "c0ffee00-0000-4000-8000-00000000f022") -> dict[str, Any]:
    """What the API server sends the policy webhook for `kubectl apply` of ``policy``."""
    return admission_request(policy, operation=operation, old=old, resource="admissionpolicies", group=api.GROUP,
                             version=api.VERSION, kind=api.KIND, name=policy["metadata"]["name"], namespace=None,
                             uid=uid, user_info={"username": "admin"})
