"""ensure_certificates and apply_configurations through kubernetes_asyncio against the emulator."""

import base64
import datetime
from collections.abc import AsyncIterator
from typing import Any

import pytest
from emulator import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    SECRETS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    Emulator,
)
from kubernetes_asyncio import client

from admission_policy.cluster.discovery import DiscoveredResource
from admission_policy.cluster.routing import RouteRule
from admission_policy.config import OperatorConfig
from admission_policy.operator.certificates import (
    SERVING_LIFETIME,
    bundle_from_secret_data,
    ensure_certificates,
)
from admission_policy.operator.webhookconfig import (
    apply_configurations,
    build_mutating_configuration,
    build_validating_configuration,
)

SETTINGS = OperatorConfig(namespace="ap-system")
NOW = datetime.datetime.now(datetime.UTC)
DISCOVERED = [DiscoveredResource("", "v1", "pods", ("status", "exec"))]


@pytest.fixture
async def api_client(emulator: Emulator) -> AsyncIterator[client.ApiClient]:
    async with client.ApiClient(client.Configuration(host=emulator.url)) as api:
        yield api


async def test_secret_is_created_once_and_shared(emulator: Emulator, api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    first = await ensure_certificates(core, SETTINGS, NOW)
    stored = emulator.peek(SECRETS, SETTINGS.cert_secret, namespace="ap-system")
    assert stored is not None
    assert stored["type"] == "kubernetes.io/tls"
    assert bundle_from_secret_data(stored["data"]) == first

    rv = stored["metadata"]["resourceVersion"]
    assert await ensure_certificates(core, SETTINGS, NOW) == first  # another replica: same bundle
    after = emulator.peek(SECRETS, SETTINGS.cert_secret, namespace="ap-system")
    assert after is not None and after["metadata"]["resourceVersion"] == rv  # nothing written


async def test_secret_is_renewed_keeping_the_old_ca(emulator: Emulator, api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    first = await ensure_certificates(core, SETTINGS, NOW)
    later = NOW + SERVING_LIFETIME * 0.9
    renewed = await ensure_certificates(core, SETTINGS, later)
    assert renewed.ca_cert_pem != first.ca_cert_pem
    assert renewed.previous_ca_pems == (first.ca_cert_pem,)
    stored = emulator.peek(SECRETS, SETTINGS.cert_secret, namespace="ap-system")
    assert stored is not None and bundle_from_secret_data(stored["data"]) == renewed


async def test_empty_or_broken_secret_is_filled(emulator: Emulator, api_client: client.ApiClient) -> None:
    await emulator.create(
        SECRETS,
        {"metadata": {"name": SETTINGS.cert_secret}, "type": "Opaque", "data": {"tls.crt": "Zm9v"}},
        namespace="ap-system",
    )
    bundle = await ensure_certificates(client.CoreV1Api(api_client), SETTINGS, NOW)
    stored = emulator.peek(SECRETS, SETTINGS.cert_secret, namespace="ap-system")
    assert stored is not None and stored["type"] == "Opaque"  # a Secret's type is immutable
    assert bundle_from_secret_data(stored["data"]) == bundle


def _configs(routes: list[RouteRule], ca: str = "CA\n") -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        build_validating_configuration(SETTINGS, ca, routes, DISCOVERED),
        build_mutating_configuration(SETTINGS, ca, routes, DISCOVERED),
    )


async def test_configurations_are_created_then_left_alone_then_replaced(
    emulator: Emulator, api_client: client.ApiClient
) -> None:
    api = client.AdmissionregistrationV1Api(api_client)
    pods = RouteRule(("",), ("v1",), ("pods",), ("CREATE",), "Fail", mutating=False)
    validating, mutating = _configs([pods])
    assert await apply_configurations(api, validating, mutating) is True
    stored = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, SETTINGS.webhook_config_name)
    assert stored is not None and stored["webhooks"] == validating["webhooks"]
    assert emulator.peek(MUTATING_WEBHOOK_CONFIGURATIONS, SETTINGS.webhook_config_name) is not None

    rv = stored["metadata"]["resourceVersion"]
    assert await apply_configurations(api, validating, mutating) is False  # idempotent
    again = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, SETTINGS.webhook_config_name)
    assert again is not None and again["metadata"]["resourceVersion"] == rv

    exec_ = RouteRule(("",), ("v1",), ("pods/exec",), ("CONNECT",), "Ignore", mutating=True)
    validating, mutating = _configs([pods, exec_], ca="NEW CA\n")
    assert await apply_configurations(api, validating, mutating) is True
    stored = emulator.peek(MUTATING_WEBHOOK_CONFIGURATIONS, SETTINGS.webhook_config_name)
    assert stored is not None
    assert [w["name"] for w in stored["webhooks"]] == ["exceptions.mutate.policy-operator.dev",
                                                       "ignore.connect.mutate.policy-operator.dev"]
    stored = emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, SETTINGS.webhook_config_name)
    assert stored is not None
    assert base64.b64decode(stored["webhooks"][0]["clientConfig"]["caBundle"]) == b"NEW CA\n"


async def test_a_secret_deleted_by_hand_is_recreated_trusting_the_ca_in_use(
        emulator: Emulator, api_client: client.ApiClient) -> None:
    """The replica that notices passes the bundle it serves: the new CA comes with the old one
    still trusted, so no replica's certificate stops being accepted while they switch."""
    core = client.CoreV1Api(api_client)
    held = await ensure_certificates(core, SETTINGS, NOW)
    await core.delete_namespaced_secret(SETTINGS.cert_secret, "ap-system")
    recreated = await ensure_certificates(core, SETTINGS, NOW, held=held)
    assert recreated.ca_cert_pem != held.ca_cert_pem
    assert recreated.previous_ca_pems == (held.ca_cert_pem,)
    stored = emulator.peek(SECRETS, SETTINGS.cert_secret, namespace="ap-system")
    assert stored is not None and bundle_from_secret_data(stored["data"]) == recreated
    # Another replica, holding the same old bundle, adopts that one rather than issuing its own.
    assert await ensure_certificates(core, SETTINGS, NOW, held=held) == recreated
