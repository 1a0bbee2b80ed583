"""Reconciliation: each AdmissionPolicy's finalizer, conditions, phase and events.

Only the replica Kopf's peering lets reconcile runs these. The conditions are observations
(``conditions.py``): did this generation compile, do the webhook configurations route it, are its
params and context listed. Two followers (``follow_registration``, ``follow_inputs``) keep them
true when the configurations or the caches change later, without a Kopf daemon per policy.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from .. import api
from ..cluster.routing import NOT_SERVED, routes, unserved_resources
from ..engine import CompiledPolicy, PolicyCompileError, load_policy
from . import conditions, native, typechecking
from .policyio import list_policies, write_status
from .sources import InputProblems
from .state import REGISTRATION_TIMEOUT, Operator, now, operator
from .store import error_text, object_key

logger = logging.getLogger(__name__)

DISCOVERY_GRACE = 10.0           # how long a new generation waits for a resource it names to be served
DISCOVERY_POLL = 1.0
FOLLOW_INTERVAL = 30.0           # while the configurations are lost, re-list the policies this often
INPUTS_GRACE = 10.0              # how long a new generation waits for its params and context to be listed
TYPE_CHECK_TIMEOUT = 10.0        # for reading the CRDs of the custom kinds a policy names


# Both kinds: AdmissionPolicy and the tenants' NamespacedAdmissionPolicy, named "namespace/name"
# here as everywhere (``store.object_key``).
@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, field="spec")
@kopf.on.resume(api.GROUP, api.VERSION, api.NAMESPACED_PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.NAMESPACED_PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.NAMESPACED_PLURAL, field="spec")
async def reconcile(body: kopf.Body, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
    """Bring a new generation (or, on resume, the last one) to its phase: Pending at once, so
    `kubectl get ap -w` shows the step, then what ``observe`` finds. Still Pending, Kopf retries."""
    op = operator()
    name = object_key(body)
    generation = int(meta.get("generation") or 0)
    if status.get("observedGeneration") != generation:
        pending = conditions.status_patch(status, conditions.pending(), generation, now())
        await write_status(op.api_client, name, pending)
    # Already found Degraded for this generation (a restart): no grace for discovery, no flapping.
    settle = not (status.get("phase") == "Degraded" and status.get("observedGeneration") == generation)
    observation = await observe(op, body, name, generation, settle=settle)
    await _publish(op, body, observation, patch)
    if observation.phase == "Pending":
        raise kopf.TemporaryError("waiting for the webhook configurations to route this policy", delay=5)


@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=60.0, idle=60.0,
            when=lambda status, **_: status.get("phase") == "Degraded")
@kopf.timer(api.GROUP, api.VERSION, api.NAMESPACED_PLURAL, interval=60.0, idle=60.0,
            when=lambda status, **_: status.get("phase") == "Degraded")
async def recheck_degraded(body: kopf.Body, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch,
                           **_: Any) -> None:
    """A Degraded policy recovers by itself once the cluster serves what it names."""
    op = operator()
    name = object_key(body)
    op.discovery.invalidate()
    generation = int(meta.get("generation") or 0)
    observation = await observe(op, body, name, generation)
    if observation.phase != "Degraded":
        await _publish(op, body, observation, patch)


async def observe(op: Operator, body: Mapping[str, Any], name: str, generation: int,
                  *, settle: bool = False) -> conditions.Observation:
    """See ``_observe``; a compiled generation also reports what it does to Pod controllers."""
    observation, compiled = await _observe(op, body, name, generation, settle=settle)
    if compiled is None:
        return observation
    coverage = compiled.coverage.as_status() if compiled.coverage else None
    spec = compiled.policy
    declared = spec.param_kind is not None or bool(spec.context)
    if declared and observation.registered.status == "True":
        problems = await _wait_inputs(op, spec, INPUTS_GRACE if settle else 0.0)
        observation = dataclasses.replace(observation, inputs=conditions.inputs_condition(
            problems.unsynced, problems.over_cap))
    observation = dataclasses.replace(
        observation, pod_controllers=coverage, reports_pod_controllers=True, reports_inputs=True, reports_plugins=True,
        plugins=conditions.plugins_condition(compiled.gated_off, sum(1 for _ in compiled.plugins())))
    if _type_checked(body, generation):   # once per generation: a restart does not check every policy again
        return observation
    checked = await typechecking.check(op, spec, TYPE_CHECK_TIMEOUT)
    return dataclasses.replace(observation, type_checked=typechecking.condition(checked),
                               type_warnings=tuple(w.as_status() for w in checked.warnings) if checked else ())


def _type_checked(body: Mapping[str, Any], generation: int) -> bool:
    """Whether the status already holds this generation's type check (``TypeChecked`` known)."""
    return any(isinstance(c, Mapping) and c.get("type") == conditions.TYPE_CHECKED and c.get("status") != "Unknown"
               and c.get("observedGeneration") == generation
               for c in (body.get("status") or {}).get("conditions") or ())


async def _observe(op: Operator, body: Mapping[str, Any], name: str, generation: int,
                   *, settle: bool) -> tuple[conditions.Observation, CompiledPolicy | None]:
    """Compile this generation, check what it names against discovery, wait until it is routed.

    ``settle``: a resource discovery does not know yet gets ``DISCOVERY_GRACE`` to appear — a CRD
    applied together with its policy is served a moment later, and cached discovery is older.
    """
    # The watcher has usually compiled this generation already: share it.
    compiled = op.store.policies.get(name) if op.store.generations.get(name) == generation else None
    try:
        compiled = compiled or load_policy(body, op.config.default_failure_policy, op.config.tenant_plugins)
    except (api.PolicyError, PolicyCompileError) as error:
        kept = op.store.generations.get(name)
        note = f" (generation {kept} stays enforced)" if kept is not None else " (not enforced)"
        reason = "CompileError" if isinstance(error, PolicyCompileError) else "InvalidSpec"
        return conditions.Observation(
            conditions.Condition(conditions.COMPILED, "False", reason, error_text(error) + note),
            conditions.Condition(conditions.REGISTERED, "Unknown", "NotCompiled",
                                 "this generation did not compile")), None
    compiled_ok = conditions.Condition(conditions.COMPILED, "True", "Compiled",
                                   f"{len(compiled.policy.expressions())} CEL expression(s) compiled and type-checked")
    if op.store.registration.lost:
        return conditions.Observation(compiled_ok, _registration_lost(op)), compiled
    if not await op.store.registration.wait_routed(name, generation, REGISTRATION_TIMEOUT):
        if op.store.registration.lost:
            return conditions.Observation(compiled_ok, _registration_lost(op)), compiled
        return conditions.Observation(compiled_ok, conditions.Condition(
            conditions.REGISTERED, "Unknown", "Registering", "waiting for the webhook configurations to be written")), \
            compiled
    unserved = await _unserved(op, compiled, settle)
    if unserved:
        return conditions.Observation(compiled_ok, conditions.Condition(
            conditions.REGISTERED, "False", "UnservedResources",
            f"not served by this cluster, so never checked: {'; '.join(unserved)}; install the API or "
            "fix spec.match.resources (the rest of the policy is enforced)")), compiled
    return conditions.Observation(compiled_ok, conditions.Condition(
        conditions.REGISTERED, "True", "Registered",
        f"routed by {op.config.webhook_config_name} webhook configurations")), compiled


async def _wait_inputs(op: Operator, policy: api.AdmissionPolicy, grace: float) -> InputProblems:
    """The policy's params and context caches' problems, after up to ``grace`` seconds for a cache
    just started to list (a new policy's own sources start as it loads)."""
    deadline = time.monotonic() + grace
    while True:
        changed = op.sources.sync_changed()
        problems = op.sources.problems(policy)
        if not problems.unsynced or time.monotonic() >= deadline:
            return problems
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                await changed.wait()


async def follow_inputs(op: Operator) -> None:
    """InputsSynced follows the caches: a cache that falls out of sync (its watch fails or stalls),
    or a context that goes over its maxObjects, turns the policies reading it Degraded at once, and
    back once it has listed again (is back under). Wakes only when one of those changes."""
    while True:
        changed = op.sources.sync_changed()
        await changed.wait()
        await asyncio.sleep(0.2)   # caches starting together: one pass
        try:
            if await op.reconciles():
                await _update_inputs(op)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("Updating the policies' InputsSynced condition failed: %s", exc)


async def _update_inputs(op: Operator) -> None:
    reading = {compiled.name: compiled.policy for compiled in op.store.policies
               if compiled.policy.param_kind is not None or compiled.policy.context}
    if not reading:
        return
    for body in await list_policies(op):   # listed, not read one by one: the chart grants list, not get
        name = object_key(body)
        spec = reading.get(name)
        if spec is None:
            continue
        status, generation = body.status, int(body.metadata.get("generation") or 0)
        if status.get("observedGeneration") != generation or body.metadata.get("deletionTimestamp"):
            continue   # reconciliation has this generation in hand
        written = conditions.from_status(status, conditions.INPUTS_SYNCED)
        problems = op.sources.problems(spec)
        current = conditions.inputs_condition(problems.unsynced, problems.over_cap)
        if written is not None and (written.status, written.message) == (current.status, current.message):
            continue
        await _publish(op, body, await observe(op, body, name, generation))


async def _unserved(op: Operator, compiled: Any, settle: bool) -> list[str]:
    """What the policy names that the cluster does not serve, asking discovery again on a miss
    (rate-limited in ``Discovery``) before saying so."""
    # Only what the policy names: a workload kind it judges through Pod templates that this
    # cluster does not serve (a minimal API server without batch/v1, say) is nothing to fix.
    wanted = routes(compiled, derived=False)
    unserved = unserved_resources(wanted, await op.discovery.resources())
    deadline = time.monotonic() + (DISCOVERY_GRACE if settle else 0.0)
    while any(item.endswith(NOT_SERVED) for item in unserved):
        unserved = unserved_resources(wanted, await op.discovery.fresh_resources())
        if not unserved or time.monotonic() >= deadline:
            break
        await asyncio.sleep(DISCOVERY_POLL)
    return unserved


def _registration_lost(op: Operator) -> conditions.Condition:
    return conditions.Condition(conditions.REGISTERED, "False", conditions.REGISTRATION_LOST,
                                f"the webhook configurations do not route this policy: {op.store.registration.lost}")


async def follow_registration(op: Operator) -> None:
    """Registered/Ready follow what the API server holds, not what was once written: when the
    webhook configurations are lost (deleted or edited by hand, and not written back) the Active
    policies go Pending, and once they are written back those go Active again.

    Every replica sees the loss (each keeps the configurations), but only the one that reconciles
    writes statuses. One task, waking only when the loss begins or ends (and every
    ``FOLLOW_INTERVAL`` while it lasts, for a change of the reconciling replica): a Kopf daemon
    or timer per policy would cost every policy a task and a kept copy of its body."""
    lost = False
    while True:
        changed = op.store.registration.changed()
        if bool(op.store.registration.lost) != lost or op.store.registration.lost:
            try:
                if await op.reconciles():
                    await _update_registered(op)
                    lost = bool(op.store.registration.lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("Updating the policies' Registered condition failed: %s", exc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FOLLOW_INTERVAL if op.store.registration.lost else None):
                await changed.wait()


async def _update_registered(op: Operator) -> None:
    for body in await list_policies(op):
        await _follow(op, body)


async def _follow(op: Operator, body: kopf.Body) -> None:
    name, meta, status = object_key(body), body.metadata, body.status
    generation = int(meta.get("generation") or 0)
    if status.get("observedGeneration") != generation or meta.get("deletionTimestamp"):
        return   # reconciliation has this generation in hand
    registered = conditions.from_status(status, conditions.REGISTERED)
    was_lost = registered is not None and registered.reason == conditions.REGISTRATION_LOST
    compiled = conditions.from_status(status, conditions.COMPILED)
    if op.store.registration.lost and status.get("phase") == "Active" and compiled is not None:
        observation = conditions.Observation(compiled, _registration_lost(op))
    elif not op.store.registration.lost and was_lost:
        observation = await observe(op, body, name, generation)
    else:
        return
    await _publish(op, body, observation)


@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.delete(api.GROUP, api.VERSION, api.NAMESPACED_PLURAL)
async def delete(body: kopf.Body, status: kopf.Status, **_: Any) -> None:
    """Stop enforcing and unroute before Kopf removes the finalizer."""
    op = operator()
    name = object_key(body)
    await write_status(op.api_client, name, conditions.terminating_patch(status, now()))
    await op.events.post_policy(op.api_client, name, body.metadata.uid, type_="Normal", reason="Terminating",
                                message="removing the policy from the webhook configurations")
    op.store.forget(name, "its deletion began")
    if not await op.store.registration.wait_unrouted(name, REGISTRATION_TIMEOUT):
        raise kopf.TemporaryError("the webhook configurations still route this policy", delay=5)
    await native.remove(op, name)   # Kubernetes' own objects go with it
    logger.info("%s %s: unrouted; releasing the finalizer", api.PolicyKey.parse(name).kind, name)


async def _publish(op: Operator, body: kopf.Body, observation: conditions.Observation,
                   patch: kopf.Patch | None = None) -> None:
    """The one way what a writer observed of a policy reaches it: its status (conditions, phase,
    observedGeneration: ``conditions.status_patch``), written now or, in a handler, with Kopf's
    own ``patch`` as the handler ends; then one event and one log line if the phase changed."""
    name, status = object_key(body), body.status
    written = conditions.status_patch(status, observation, int(body.metadata.get("generation") or 0), now())
    if patch is not None:
        patch.status.update(written)
    else:
        await write_status(op.api_client, name, written)
    old_phase = status.get("phase")
    if old_phase == observation.phase:
        return
    message = f"{old_phase or '(new)'} → {observation.phase}: {observation.ready.message}"
    warning = observation.phase in ("Failed", "Degraded") or observation.ready.reason == conditions.REGISTRATION_LOST
    logger.log(logging.WARNING if warning else logging.INFO, "%s %s: %s", api.PolicyKey.parse(name).kind, name, message)
    await op.events.post_policy(op.api_client, name, body.metadata.uid, type_="Warning" if warning else "Normal",
                                reason=observation.phase, message=message)
