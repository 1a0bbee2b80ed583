"""Running the real operator module against the emulator, with its settings on free local ports."""
from __future__ import annotations

import base64
import contextlib
import pathlib
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from emulator import ADMISSION_POLICIES, Emulator, RunningOperator, wait_for

MODULE = "admission_policy.operator.handlers"
CONFIG_NAME = "admission-policy-operator"
NAMESPACE = "admission-policy-system"
POD_RULE = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE", "UPDATE"]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def operator_environment(monkeypatch: pytest.MonkeyPatch, cert_dir: pathlib.Path) -> dict[str, str]:
    env = {
        "AP_NAMESPACE": NAMESPACE, "AP_LISTEN_HOST": "127.0.0.1", "AP_LISTEN_PORT": str(free_port()),
        "AP_ADVERTISE_HOST": "127.0.0.1", "AP_HEALTH_PORT": str(free_port()), "AP_METRICS_PORT": str(free_port()),
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


def policy_body(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("match", {"resources": [POD_RULE]})
    return {"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicy",
            "metadata": {"name": name}, "spec": spec}


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
