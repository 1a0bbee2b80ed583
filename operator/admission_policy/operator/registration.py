"""Keep the Validating/MutatingWebhookConfigurations in step with the loaded policies.

Every replica runs this loop; the builder is deterministic and the writer only writes on a
difference, so replicas with the same policies converge on one identical object. Whatever the
API server holds is checked against what was written — a configuration deleted or edited by hand
is written back — and when it cannot be, the store says so, and the policies' Registered/Ready
conditions with it.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from ..cluster.discovery import Discovery
from ..cluster.routing import all_routes
from ..cluster.watch import watch_objects
from ..config import OperatorConfig
from ..engine import PolicySet
from .store import PolicyStore
from .webhookconfig import (
    apply_configurations,
    build_mutating_configuration,
    build_validating_configuration,
    held_problem,
    holds,
    probe_name,
)

logger = logging.getLogger(__name__)

DEBOUNCE = 0.1  # coalesce a burst of watch events (the initial list) into one write
RECHECK_INTERVAL = 60.0  # read both configurations back at least this often, whatever the watches say


async def keep_configurations(
    api_client: client.ApiClient,
    settings: OperatorConfig,
    store: PolicyStore,
    discovery: Discovery,
    ca_bundle: Callable[[], str],
) -> None:
    """Write the configurations whenever the policies change, and write them back whenever the
    API server stops holding them (deleted or edited by hand): a watch on each notices at once,
    a re-check every ``RECHECK_INTERVAL`` catches whatever a watch missed."""
    keeper = _Keeper(client.AdmissionregistrationV1Api(api_client), settings, store, discovery, ca_bundle)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(keeper.watch("ValidatingWebhookConfiguration",
                                       keeper.api.list_validating_webhook_configuration))
        tasks.create_task(keeper.watch("MutatingWebhookConfiguration",
                                       keeper.api.list_mutating_webhook_configuration))
        tasks.create_task(keeper.run())


class _Keeper:
    """The writer's state: what the API server held after the last successful write."""

    def __init__(self, api: client.AdmissionregistrationV1Api, settings: OperatorConfig, store: PolicyStore,
                 discovery: Discovery, ca_bundle: Callable[[], str]) -> None:
        self.api = api
        self.settings = settings
        self.store = store
        self.discovery = discovery
        self.ca_bundle = ca_bundle
        self.written: dict[str, Mapping[str, Any]] = {}   # kind → the body the API server last held

    async def run(self) -> None:
        # Writing before the first full list would unroute every policy for a moment on each restart.
        await self.store.readiness.policies_loaded.wait()
        backoff = 1.0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECHECK_INTERVAL):
                    await self.store.changed.wait()
            await asyncio.sleep(DEBOUNCE)
            self.store.changed.clear()
            try:
                await self.write()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("Writing the webhook configurations failed, retrying in %.0fs: %s", backoff, exc)
                await self.report_loss(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                self.store.changed.set()
                continue
            backoff = 1.0

    async def write(self) -> None:
        snapshot: PolicySet = self.store.serving
        generations = {name: self.store.generations[name] for name in (p.name for p in snapshot)
                       if name in self.store.generations}
        discovered = await self.discovery.resources()
        routed = all_routes(snapshot)
        validating = build_validating_configuration(self.settings, self.ca_bundle(), routed, discovered)
        mutating = build_mutating_configuration(self.settings, self.ca_bundle(), routed, discovered)
        name = self.settings.webhook_config_name
        if await apply_configurations(self.api, validating, mutating):
            if self.written == {validating["kind"]: validating, mutating["kind"]: mutating}:
                logger.warning("Webhook configurations %s were deleted or changed outside the operator; "
                               "written back", name)
            else:
                logger.info("Webhook configurations %s written for %d policies", name, len(snapshot))
        self.written = {validating["kind"]: validating, mutating["kind"]: mutating}
        await self.store.registration.mark_written(generations, probe_name(validating))

    async def report_loss(self, error: Exception) -> None:
        """After a failed write: if the API server no longer holds what was last written, no
        policy is routed as its status says — tell the store, so that Registered/Ready follow."""
        if len(self.written) < 2:
            return   # nothing written yet: nothing counts as routed anyway
        try:
            problem = await held_problem(self.api, *self.written.values())
        except Exception as exc:   # the API server is unreachable: what it holds is unknown, likely unchanged
            logger.debug("Cannot read the webhook configurations back: %s", exc)
            return
        if problem:
            await self.store.registration.mark_lost(
                f"{problem}, and writing it back failed ({_brief(error)}); retrying")

    async def watch(self, kind: str, lister: Callable[..., Any]) -> None:
        """Wake the writer when the configuration is deleted, or changed into something other
        than what was written (the writer's own writes, seen again here, change nothing)."""
        name = self.settings.webhook_config_name

        def on_event(event: str, body: Mapping[str, Any]) -> None:
            if body.get("metadata", {}).get("name") != name or kind not in self.written:
                return
            if event == "DELETED" or not holds(body, self.written[kind]):
                logger.debug("%s %s was %s; checking it", kind, name, "deleted" if event == "DELETED" else "changed")
                self.store.changed.set()

        def on_listed(names: set[str]) -> None:
            if name not in names and kind in self.written:
                self.store.changed.set()

        await watch_objects(f"{kind}s", lambda **kw: lister(field_selector=f"metadata.name={name}", **kw),
                            on_event, on_listed)


def _brief(error: Exception) -> str:
    if isinstance(error, client.ApiException):
        return f"{error.status} {error.reason}"
    return str(error) or type(error).__name__
