"""Keep the Validating/MutatingWebhookConfigurations in step with the loaded policies.

Every replica runs this loop; the builder is deterministic and the writer only writes on a
difference, so replicas with the same policies converge on one identical object.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from kubernetes_asyncio import client

from ..engine import CompiledPolicy, PolicySet
from .kube import Discovery
from .settings import OperatorSettings
from .store import PolicyStore
from .webhookconfig import (
    RouteRule,
    apply_configurations,
    build_mutating_configuration,
    build_validating_configuration,
)

logger = logging.getLogger(__name__)

DEBOUNCE = 0.1  # coalesce a burst of watch events (the initial list) into one write


def routes(policy: CompiledPolicy) -> list[RouteRule]:
    """What the webhooks must send for one policy: its rules, on the webhooks it uses."""
    kinds = [flag for flag, wanted in ((False, policy.validations), (True, policy.mutations)) if wanted]
    return [
        RouteRule(rule.api_groups, rule.api_versions, rule.resources, rule.operations,
                  policy.policy.failure_policy, mutating)
        for rule in policy.policy.match.resources
        for mutating in kinds
    ]


def all_routes(policies: Iterable[CompiledPolicy]) -> list[RouteRule]:
    return [route for policy in policies for route in routes(policy)]


async def keep_configurations(
    api_client: client.ApiClient,
    settings: OperatorSettings,
    store: PolicyStore,
    discovery: Discovery,
    ca_bundle: Callable[[], str],
) -> None:
    registrations = client.AdmissionregistrationV1Api(api_client)
    # Writing before the first full list would unroute every policy for a moment on each restart.
    await store.policies_loaded.wait()
    backoff = 1.0
    while True:
        await store.changed.wait()
        await asyncio.sleep(DEBOUNCE)
        store.changed.clear()
        snapshot: PolicySet = store.policies
        generations = {name: store.generations[name] for name in (p.name for p in snapshot)
                       if name in store.generations}
        try:
            discovered = await discovery.resources()
            routed = all_routes(snapshot)
            validating = build_validating_configuration(settings, ca_bundle(), routed, discovered)
            mutating = build_mutating_configuration(settings, ca_bundle(), routed, discovered)
            if await apply_configurations(registrations, validating, mutating):
                logger.info("Webhook configurations %s written for %d policies",
                            settings.webhook_config_name, len(snapshot))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("Writing the webhook configurations failed, retrying in %.0fs: %s", backoff, exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)
            store.changed.set()
            continue
        backoff = 1.0
        await store.mark_registered(generations)


async def remove_configurations(api_client: client.ApiClient, name: str) -> list[str]:
    """Delete both configurations (uninstall); absent ones are fine. Returns what was deleted."""
    registrations = client.AdmissionregistrationV1Api(api_client)
    deleted = []
    for kind, delete in (("ValidatingWebhookConfiguration", registrations.delete_validating_webhook_configuration),
                         ("MutatingWebhookConfiguration", registrations.delete_mutating_webhook_configuration)):
        try:
            await delete(name)
            deleted.append(kind)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    return deleted
