"""The operator: ``kopf run -m admission_policy.operator.handlers --all-namespaces``.

Two paths share one process. Reconciliation (paused by Kopf peering on all but one replica)
drives each AdmissionPolicy's finalizer, conditions, phase and events. Serving (never paused)
runs in every replica: its own watcher loads policies into the PolicyStore, a loop writes the
webhook configurations, and Kopf's admission handlers answer every routed request from the
engine.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import gc
import hashlib
import logging
import os
import socket
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import kopf
from kubernetes_asyncio import client

from .. import api, features, plugins
from ..engine import CompiledPolicy, Decision, Phase, PolicyCompileError, evaluate
from . import audit, authorizer, certificates, conditions, events, metrics, registration, watcher
from .decisions import DecisionLog
from .kube import Discovery, call_json, leads_peering, message_of, new_api_client, resource_path
from .settings import OperatorSettings
from .sources import InputProblems, Sources
from .store import FINALIZER, PolicyStore, error_text, load_policy
from .webhook import PolicyWebhookServer, current_exchange
from .webhookconfig import EXEMPT_LABEL, NOT_SERVED, never_judged, unserved_resources

logger = logging.getLogger(__name__)

REGISTRATION_TIMEOUT = 20.0      # how long reconciliation waits for the configurations to be written
DISCOVERY_GRACE = 10.0           # how long a new generation waits for a resource it names to be served
DISCOVERY_POLL = 1.0
FOLLOW_INTERVAL = 30.0           # while the configurations are lost, re-list the policies this often
INPUTS_GRACE = 10.0              # how long a new generation waits for its params and context to be listed
# Loggers of the HTTP clients: at DEBUG they print whole response bodies, the certificate Secret's
# private keys included. They stay at WARNING whatever the operator's level (issue 18).
CLIENT_LOGGERS = ("kubernetes_asyncio", "client", "urllib3", "aiohttp.client", "aiohttp.internal")
RECONCILE_WORKERS = 20


@dataclasses.dataclass
class Operator:
    """Everything the handlers share, built once at startup."""
    settings: OperatorSettings
    store: PolicyStore
    api_client: client.ApiClient
    discovery: Discovery
    bundle: certificates.CertificateBundle
    events: events.PolicyEvents
    sources: Sources
    decisions: DecisionLog = dataclasses.field(default_factory=DecisionLog)
    kopf_settings: kopf.OperatorSettings | None = None
    auditor: audit.Auditor | None = None
    tasks: list[asyncio.Task[Any]] = dataclasses.field(default_factory=list)
    runners: list[Any] = dataclasses.field(default_factory=list)

    async def reconciles(self) -> bool:
        """Whether Kopf lets this replica reconcile now (standalone, or first in the peering)."""
        peering = self.kopf_settings.peering if self.kopf_settings is not None else None
        if peering is None or peering.standalone:
            return True
        return await leads_peering(self.api_client, peering.name, peering.priority)

    def spawn(self, name: str, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coroutine, name=f"admission-policy: {name}")
        task.add_done_callback(_report_crash)
        self.tasks.append(task)


_operator: Operator | None = None


def operator() -> Operator:
    if _operator is None:
        raise kopf.PermanentError("the operator has not started")
    return _operator


def peering_priority(pod_name: str) -> int:
    """A stable priority per pod: Kopf pauses peers of equal priority, so replicas must differ."""
    return 1 + int.from_bytes(hashlib.sha256(pod_name.encode()).digest()[:4], "big") % (2**31 - 2)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _operator
    config = OperatorSettings.from_env(os.environ)
    _configure_logging(config.log_level)
    features.configure(features.parse(config.feature_gates))   # before any policy is compiled
    _report_broken_plugins(plugins.registry())

    settings.admission.managed = None          # we write the configurations ourselves (docs/design.md)
    # Kopf would post its own events about policies (a handler failed) into the operator's
    # namespace, where `kubectl describe ap` never looks; the operator posts its own (events.py).
    settings.posting.enabled = False
    settings.persistence.finalizer = FINALIZER
    # A thousand policies at startup would otherwise each get a worker at once; the peak memory of
    # that burst stays with the process (Python rarely returns it), so reconcile a few at a time.
    settings.queueing.worker_limit = RECONCILE_WORKERS
    settings.queueing.idle_timeout = 0.5   # a settled object's worker gives its slot back quickly
    if settings.peering.name == "default":
        settings.peering.name = config.peering_name
    if settings.peering.priority == 0:
        settings.peering.priority = peering_priority(config.pod_name)

    _check_ports_free(config)
    api_client = await new_api_client()
    store = PolicyStore(config.default_failure_policy)
    try:
        bundle = await certificates.ensure_certificates(client.CoreV1Api(api_client), config, _now())
    except client.ApiException as exc:
        await api_client.close()
        hint = (f"does namespace {config.namespace!r} exist? create it or set AP_NAMESPACE"
                if exc.status == 404 else "check the operator's RBAC for Secrets")
        secret = f"{config.namespace}/{config.cert_secret}"
        raise kopf.PermanentError(f"cannot keep the serving certificate in Secret {secret}: "
                                  f"{exc.status} {exc.reason}; {hint}") from None
    paths = certificates.write_files(bundle, config.cert_dir)
    settings.admission.server = PolicyWebhookServer(
        listening=store.listening, addr=config.listen_host, port=config.listen_port,
        certfile=paths.certfile, pkeyfile=paths.pkeyfile, cafile=paths.cafile, file_check_interval=10.0,
        max_connections=config.max_connections, body_timeout=config.webhook_timeout)

    discovery = Discovery(api_client)
    sources = Sources(api_client, discovery)
    store.on_change = sources.want
    _operator = op = Operator(config, store, api_client, discovery, bundle,
                              events.PolicyEvents("admission-policy-operator"), sources, kopf_settings=settings)
    op.runners.append(await _listening(metrics.serve_probes(config.listen_host, config.health_port,
                                                            lambda: store.ready, store.out_of_sync),
                                       config.listen_host, config.health_port, "AP_HEALTH_PORT, the probes"))
    if config.metrics_port:
        op.runners.append(await _listening(metrics.serve_metrics(config.listen_host, config.metrics_port),
                                           config.listen_host, config.metrics_port, "AP_METRICS_PORT, the metrics"))
    op.spawn("policy watcher", watcher.watch_policies(api_client, store))
    op.spawn("namespace watcher", watcher.watch_namespaces(api_client, store))
    op.spawn("webhook configurations",
             registration.keep_configurations(api_client, config, store, op.discovery, lambda: op.bundle.ca_bundle))
    op.spawn("denial events", op.events.run(api_client, store.uids.get))
    op.spawn("decision log", op.decisions.run())
    op.spawn("registration status", _follow_registration(op))
    op.spawn("certificate renewal", _renew_certificates(op))
    op.auditor = audit.Auditor(api_client, config, store, op.discovery, op.reconciles, inputs=sources)
    op.spawn("background audit", op.auditor.run())
    op.spawn("heap freeze", _freeze_after_load(store))
    op.spawn("params and context caches", sources.run())
    op.spawn("inputs status", _follow_inputs(op))
    metrics.SOURCES.read = sources.stats
    metrics.POLICIES.set_function(lambda: len(store.policies))   # read at scrape time
    metrics.REJECTED.set_function(lambda: len(store.rejected))
    store.changed.set()  # write the configurations once even with no policies (the fixed entry)
    logger.info("Operator started: webhook on %s:%d, %s client config", config.listen_host, config.listen_port,
                f"url {config.advertised_url}" if config.advertised_url else "service")


def _report_broken_plugins(found: plugins.Registry) -> None:
    """Log, once, each plugin entry point that failed to load: its policies are refused, and this
    says why at startup rather than at the first `kubectl apply`."""
    for broken in found.broken:
        logger.warning("Plugin %r (from %s) failed to load and is unavailable: %s", broken.name, broken.source,
                       broken.error)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    global _operator
    if _operator is None:
        return
    op, _operator = _operator, None
    _log_what_stays(op)
    for task in op.tasks:
        task.cancel()
    await asyncio.gather(*op.tasks, return_exceptions=True)
    await op.sources.close()
    for runner in op.runners:
        await runner.cleanup()
    await op.api_client.close()


# --- reconciliation ------------------------------------------------------------------------------------------

@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, field="spec")
async def reconcile(body: kopf.Body, name: str, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch,
                    **_: Any) -> None:
    op = operator()
    generation = int(meta.get("generation") or 0)
    if status.get("observedGeneration") != generation:
        await _write_status(op, name, conditions.status_patch(status, conditions.pending(), generation, _now()))
    # Already found Degraded for this generation (a restart): no grace for discovery, no flapping.
    settle = not (status.get("phase") == "Degraded" and status.get("observedGeneration") == generation)
    observation = await observe(op, body, name, generation, settle=settle)
    patch.status.update(conditions.status_patch(status, observation, generation, _now()))
    await _announce(op, body, status.get("phase"), observation)
    if observation.phase == "Pending":
        raise kopf.TemporaryError("waiting for the webhook configurations to route this policy", delay=5)


@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=60.0, idle=60.0,
            when=lambda status, **_: status.get("phase") == "Degraded")
async def recheck_degraded(body: kopf.Body, name: str, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch,
                           **_: Any) -> None:
    """A Degraded policy recovers by itself once the cluster serves what it names."""
    op = operator()
    op.discovery.invalidate()
    generation = int(meta.get("generation") or 0)
    observation = await observe(op, body, name, generation)
    if observation.phase != "Degraded":
        patch.status.update(conditions.status_patch(status, observation, generation, _now()))
        await _announce(op, body, status.get("phase"), observation)


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
    return dataclasses.replace(observation, pod_controllers=coverage, reports_pod_controllers=True, reports_inputs=True,
                               reports_plugins=True, plugins=conditions.plugins_condition(
                                   compiled.gated_off, sum(1 for _ in compiled.plugins())))


async def _observe(op: Operator, body: Mapping[str, Any], name: str, generation: int,
                   *, settle: bool) -> tuple[conditions.Observation, CompiledPolicy | None]:
    """Compile this generation, check what it names against discovery, wait until it is routed.

    ``settle``: a resource discovery does not know yet gets ``DISCOVERY_GRACE`` to appear — a CRD
    applied together with its policy is served a moment later, and cached discovery is older.
    """
    # The watcher has usually compiled this generation already: share it.
    compiled = op.store.policies.get(name) if op.store.generations.get(name) == generation else None
    try:
        compiled = compiled or load_policy(body, op.settings.default_failure_policy)
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
    if op.store.registration_lost:
        return conditions.Observation(compiled_ok, _registration_lost(op)), compiled
    if not await op.store.wait_registered(name, generation, REGISTRATION_TIMEOUT):
        if op.store.registration_lost:
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
        f"routed by {op.settings.webhook_config_name} webhook configurations")), compiled


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


async def _follow_inputs(op: Operator) -> None:
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
    objects = client.CustomObjectsApi(op.api_client)
    for compiled in op.store.policies:
        spec = compiled.policy
        if spec.param_kind is None and not spec.context:
            continue
        try:
            raw: Any = await objects.get_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL, spec.name)
        except client.ApiException:
            continue
        body = kopf.Body(raw)
        status, generation = body.status, int(body.metadata.get("generation") or 0)
        if status.get("observedGeneration") != generation or body.metadata.get("deletionTimestamp"):
            continue   # reconciliation has this generation in hand
        written = conditions.from_status(status, conditions.INPUTS_SYNCED)
        problems = op.sources.problems(spec)
        now = conditions.inputs_condition(problems.unsynced, problems.over_cap)
        if written is not None and (written.status, written.message) == (now.status, now.message):
            continue
        observation = await observe(op, body, spec.name, generation)
        await _write_status(op, spec.name, conditions.status_patch(status, observation, generation, _now()))
        await _announce(op, body, status.get("phase"), observation)


async def _unserved(op: Operator, compiled: Any, settle: bool) -> list[str]:
    """What the policy names that the cluster does not serve, asking discovery again on a miss
    (rate-limited in ``Discovery``) before saying so."""
    # Only what the policy names: a workload kind it judges through Pod templates that this
    # cluster does not serve (a minimal API server without batch/v1, say) is nothing to fix.
    routes = registration.routes(compiled, derived=False)
    unserved = unserved_resources(routes, await op.discovery.resources())
    deadline = time.monotonic() + (DISCOVERY_GRACE if settle else 0.0)
    while any(item.endswith(NOT_SERVED) for item in unserved):
        unserved = unserved_resources(routes, await op.discovery.fresh_resources())
        if not unserved or time.monotonic() >= deadline:
            break
        await asyncio.sleep(DISCOVERY_POLL)
    return unserved


def _registration_lost(op: Operator) -> conditions.Condition:
    return conditions.Condition(conditions.REGISTERED, "False", conditions.REGISTRATION_LOST,
                                f"the webhook configurations do not route this policy: {op.store.registration_lost}")


async def _follow_registration(op: Operator) -> None:
    """Registered/Ready follow what the API server holds, not what was once written: when the
    webhook configurations are lost (deleted or edited by hand, and not written back) the Active
    policies go Pending, and once they are written back those go Active again.

    Every replica sees the loss (each keeps the configurations), but only the one that reconciles
    writes statuses. One task, waking only when the loss begins or ends (and every
    ``FOLLOW_INTERVAL`` while it lasts, for a change of the reconciling replica): a Kopf daemon
    or timer per policy would cost every policy a task and a kept copy of its body."""
    lost = False
    while True:
        changed = op.store.registration_changed()
        if bool(op.store.registration_lost) != lost or op.store.registration_lost:
            try:
                if await op.reconciles():
                    await _update_registered(op)
                    lost = bool(op.store.registration_lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("Updating the policies' Registered condition failed: %s", exc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FOLLOW_INTERVAL if op.store.registration_lost else None):
                await changed.wait()


async def _update_registered(op: Operator) -> None:
    objects = client.CustomObjectsApi(op.api_client)
    listing: Any = await objects.list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL,
                                                            _preload_content=False)
    if not 200 <= listing.status <= 299:   # unread, the client raises on no status
        raise client.ApiException(status=listing.status, reason=(await listing.text())[:500])
    for raw in (await listing.json()).get("items", []):
        await _follow(op, kopf.Body(raw))


async def _follow(op: Operator, body: kopf.Body) -> None:
    name, meta, status = body.metadata.name or "", body.metadata, body.status
    generation = int(meta.get("generation") or 0)
    if status.get("observedGeneration") != generation or meta.get("deletionTimestamp"):
        return   # reconciliation has this generation in hand
    old_phase = status.get("phase")
    registered = conditions.from_status(status, conditions.REGISTERED)
    was_lost = registered is not None and registered.reason == conditions.REGISTRATION_LOST
    compiled = conditions.from_status(status, conditions.COMPILED)
    if op.store.registration_lost and old_phase == "Active" and compiled is not None:
        observation = conditions.Observation(compiled, _registration_lost(op))
    elif not op.store.registration_lost and was_lost:
        observation = await observe(op, body, name, generation)
    else:
        return
    await _write_status(op, name, conditions.status_patch(status, observation, generation, _now()))
    await _announce(op, body, old_phase, observation)


@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL)
async def delete(body: kopf.Body, name: str, status: kopf.Status, **_: Any) -> None:
    """Stop enforcing and unroute before Kopf removes the finalizer."""
    op = operator()
    await _write_status(op, name, conditions.terminating_patch(status, _now()))
    await op.events.post(op.api_client, name, body.metadata.uid, type_="Normal", reason="Terminating",
                         message="removing the policy from the webhook configurations")
    op.store.forget(name, "its deletion began")
    if not await op.store.wait_unregistered(name, REGISTRATION_TIMEOUT):
        raise kopf.TemporaryError("the webhook configurations still route this policy", delay=5)
    logger.info("AdmissionPolicy %s: unrouted; releasing the finalizer", name)


async def _announce(op: Operator, body: kopf.Body, old_phase: str | None,
                    observation: conditions.Observation) -> None:
    """One event and one log line per phase transition."""
    if old_phase == observation.phase:
        return
    name = body.metadata.name or ""
    message = f"{old_phase or '(new)'} → {observation.phase}: {observation.ready.message}"
    warning = observation.phase in ("Failed", "Degraded") or observation.ready.reason == conditions.REGISTRATION_LOST
    logger.log(logging.WARNING if warning else logging.INFO, "AdmissionPolicy %s: %s", name, message)
    await op.events.post(op.api_client, name, body.metadata.uid, type_="Warning" if warning else "Normal",
                         reason=observation.phase, message=message)


async def _write_status(op: Operator, name: str, new_status: Mapping[str, Any]) -> None:
    """A status write now (not at the handler's end), so `kubectl get ap -w` shows the step."""
    objects = client.CustomObjectsApi(op.api_client)
    await objects.patch_cluster_custom_object_status(
        api.GROUP, api.VERSION, api.PLURAL, name, {"status": dict(new_status)},
        _content_type="application/merge-patch+json")  # type: ignore[call-arg]  # a dict is not a JSON Patch


# --- admission --------------------------------------------------------------------------------------------

@kopf.on.validate(kopf.EVERYTHING, id="validate", subresource="*")
async def validate(**_: Any) -> None:
    await _decide(Phase.VALIDATE, "validate")


@kopf.on.mutate(kopf.EVERYTHING, id="mutate", subresource="*")
async def mutate(**_: Any) -> None:
    await _decide(Phase.MUTATE, "mutate")


async def _decide(phase: Phase, webhook: str) -> None:
    """The engine's decision, stored for the response (see ``webhook``)."""
    op = operator()
    arrived = time.monotonic()
    exchange = current_exchange()
    request = exchange.request
    if never_judged(op.settings, request.group, request.resource, request.namespace, request.name):
        exchange.decision = Decision(allowed=True)   # the operator's own API and namespace (issue 18)
        return
    deadline = arrived + op.settings.evaluation_deadline
    namespace, namespace_error = None, ""
    if request.namespace:
        namespace = op.store.namespaces.get(request.namespace)
        if namespace is None:
            namespace, namespace_error = await _fetch_namespace(op, request.namespace, deadline)
    started = time.perf_counter()
    policies = op.store.policies
    decision = await authorizer.decide(   # the policies' authorizer checks, by SubjectAccessReviews
        lambda answers: evaluate(policies, request, namespace, phase, deadline=deadline, inputs=op.sources,
                                 namespace_error=namespace_error, authorization=answers),
        authorizer.reviewer(op.api_client, deadline))
    metrics.observe(decision, request.operation, webhook, time.perf_counter() - started)
    exchange.decision = decision
    op.decisions.record(request, decision, webhook)
    if phase is Phase.VALIDATE and decision.outcomes and op.auditor is not None:
        op.auditor.admitted(request, decision)   # spec.reportAdmission: Audit/Warn failures into the reports
    if not decision.allowed and not request.dry_run:
        for outcome in decision.outcomes:
            if outcome.denied:
                op.events.record_denial(outcome.policy, decision.message)


@kopf.on.validate(api.GROUP, api.VERSION, api.PLURAL, id="validate-policy", operations=["CREATE", "UPDATE"])
async def validate_policy(**_: Any) -> None:
    """Refuse an AdmissionPolicy whose spec or CEL is invalid, at `kubectl apply` time."""
    op = operator()
    exchange = current_exchange()
    request = exchange.request
    if request.operation == "UPDATE" and not _spec_written(request.object, request.old_object):
        # What the configuration's matchConditions already exclude, for API servers without them.
        exchange.decision = Decision(allowed=True)
        return
    try:
        load_policy(request.object, op.settings.default_failure_policy)
    except (api.PolicyError, PolicyCompileError) as error:
        message = f"AdmissionPolicy {exchange.request.name!r} is invalid: {error_text(error)}"
        exchange.decision = Decision(allowed=False, code=422, reason="Invalid", message=message)
        op.decisions.refused_policy(request, message)
        return
    exchange.decision = Decision(allowed=True)


def _spec_written(new: Any, old: Any) -> bool:
    """An UPDATE that changes the spec of a policy not being deleted."""
    meta = new.get("metadata") if isinstance(new, Mapping) else None
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return False
    return not (isinstance(new, Mapping) and isinstance(old, Mapping) and new.get("spec") == old.get("spec"))


async def _fetch_namespace(op: Operator, name: str, deadline: float) -> tuple[Mapping[str, Any] | None, str]:
    """A namespace the watcher has not delivered yet (created a moment ago), and why it could not
    be read ("" when read, or when it does not exist). Half of what is left before the request's
    deadline is given to it: the rest is the policies'."""
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic()) / 2):
            status, body = await call_json(op.api_client, "GET", resource_path("", "v1", "namespaces", name=name))
    except TimeoutError:
        return None, f"namespace {name} could not be read in time"
    if status == 404:
        return None, ""
    if status != 200 or not isinstance(body, Mapping):
        return None, f"reading namespace {name} failed: {status} {message_of(body)}".strip()
    op.store.namespaces.setdefault(name, body)
    return body, ""


# --- background ----------------------------------------------------------------------------------------------

async def _renew_certificates(op: Operator) -> None:
    """Adopt a renewed bundle: trust the new CA in the configurations first, then serve it.

    The shared Secret is checked every ``cert_check_interval`` (renewing it when due) and at
    once when it changes: another replica renewed it, or it was deleted by hand (recreated as a
    renewal of the bundle served here, whose CA stays trusted).
    """
    core = client.CoreV1Api(op.api_client)
    secret_changed = asyncio.Event()
    op.spawn("certificate Secret watcher", _watch_certificate_secret(op, secret_changed))
    served = op.bundle
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(op.settings.cert_check_interval):
                await secret_changed.wait()
        secret_changed.clear()
        try:
            bundle = await certificates.ensure_certificates(core, op.settings, _now(), held=op.bundle)
        except Exception as exc:
            logger.warning("Checking the serving certificate failed: %s", exc)
            continue
        if bundle == served:
            continue
        op.bundle = bundle
        written = op.store.registration_count
        op.store.changed.set()
        await op.store.wait_registration_after(written, timeout=REGISTRATION_TIMEOUT)
        # The API server calls with the caBundle its informer holds, a moment behind the write.
        await asyncio.sleep(op.settings.cert_switch_grace)
        certificates.write_files(bundle, op.settings.cert_dir)
        served = bundle
        server = op.kopf_settings.admission.server if op.kopf_settings is not None else None
        if isinstance(server, PolicyWebhookServer):
            server.files_written()
        logger.info("Serving certificate renewed; valid until %s", bundle.not_after.isoformat())


async def _watch_certificate_secret(op: Operator, secret_changed: asyncio.Event) -> None:
    """Trust a CA another replica wrote into the Secret at once: otherwise this replica's writer,
    seeing the configurations changed, would write its older caBundle back over the new one."""
    name, namespace = op.settings.cert_secret, op.settings.namespace
    core = client.CoreV1Api(op.api_client)

    def on_event(kind: str, body: Mapping[str, Any]) -> None:
        if body.get("metadata", {}).get("name") != name:
            return
        if kind != "DELETED":
            try:
                bundle = certificates.bundle_from_secret_data(body.get("data") or {})
            except certificates.CertificateError:
                bundle = None
            if bundle is not None and bundle != op.bundle and not bundle.needs_renewal(
                    _now(), certificates.serving_hosts(op.settings)):
                op.bundle = bundle
                op.store.changed.set()
        secret_changed.set()

    def on_listed(names: set[str]) -> None:
        if name not in names:
            secret_changed.set()

    await watcher.watch_objects(
        f"Secret {namespace}/{name}",
        lambda **kw: core.list_namespaced_secret(namespace, field_selector=f"metadata.name={name}", **kw),
        on_event, on_listed)


async def _freeze_after_load(store: PolicyStore) -> None:
    """Once the policies are loaded and routed, move everything alive to the permanent GC
    generation: a full collection over the imports and the loaded policies costs tens of
    milliseconds, which would otherwise land on whatever request triggers it (p99)."""
    await store.policies_loaded.wait()
    await store.wait_registration_after(0, timeout=REGISTRATION_TIMEOUT)
    gc.collect()
    gc.freeze()


# --- logging and start-up checks --------------------------------------------------------------------------

def _configure_logging(level: str) -> None:
    logging.getLogger("admission_policy").setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # Kopf logs every admission request at INFO on "kopf.objects" ("Webhook 'validate' succeeded").
    # The operator logs (and posts as Events) what matters about a policy itself, so Kopf's
    # per-object lines start at WARNING unless debugging: a handler that fails still shows.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False   # cheaper records
    _widen_logger_names()


# `kopf run` formats records as "%(name)-20.20s": "admission_policy.operator.registration" would
# read "admission_policy.ope" (kopf/_core/actions/loggers.py, LogFormat.FULL).
_CUT_NAME = "%(name)-20.20s"


def _widen_logger_names() -> None:
    """Let Kopf's text format print logger names whole."""
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        fmt = getattr(formatter, "_fmt", None)
        if formatter is not None and isinstance(fmt, str) and _CUT_NAME in fmt:
            handler.setFormatter(type(formatter)(fmt.replace(_CUT_NAME, "%(name)s"), formatter.datefmt))


def _check_ports_free(config: OperatorSettings) -> None:
    for port, what in ((config.listen_port, "AP_LISTEN_PORT, the webhook server"),
                       (config.health_port, "AP_HEALTH_PORT, the probes"),
                       (config.metrics_port, "AP_METRICS_PORT, the metrics")):
        if port:
            _check_port_free(config.listen_host, port, what)


def _check_port_free(host: str, port: int, what: str) -> None:
    """Kopf starts the webhook server later and, should its port be taken, retries for ever: say
    so once, at start-up, and stop."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise kopf.PermanentError(f"cannot listen on {host}:{port} ({what}): {exc}") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as aiohttp does
            try:
                probe.bind(address)
            except OSError as exc:
                raise _port_error(host, port, what, exc) from None


async def _listening(starting: Coroutine[Any, Any, Any], host: str, port: int, what: str) -> Any:
    try:
        return await starting
    except OSError as exc:
        raise _port_error(host, port, what, exc) from None


def _port_error(host: str, port: int, what: str, error: OSError) -> kopf.PermanentError:
    reason = os.strerror(error.errno) if error.errno else str(error)
    return kopf.PermanentError(f"cannot listen on {host}:{port} ({what}): {reason}; "
                               "is another process using it? choose a free port")


def _log_what_stays(op: Operator) -> None:
    """On the way out, say what the cluster is left with: the configurations are shared by every
    replica, so they stay, and while no replica runs they fail closed."""
    name = op.settings.webhook_config_name
    failing = sorted(p.name for p in op.store.policies if p.policy.failure_policy == "Fail")
    exempt = ", ".join(op.settings.all_exempt_namespaces)
    logger.log(logging.WARNING if failing else logging.INFO,
               "Stopping. The webhook configurations %s stay in place for the other replicas; while none runs, "
               "the requests they route fail closed for %d failurePolicy Fail policies%s and AdmissionPolicy "
               "writes are refused (never in namespaces %s, nor for objects labelled %s=true). "
               "If the operator is not coming back: admission-policy cleanup-webhooks --name %s",
               name, len(failing), f" ({', '.join(failing[:5])}{', …' if len(failing) > 5 else ''})" if failing
               else "", exempt, EXEMPT_LABEL, name)


def _report_crash(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("%s stopped: %r", task.get_name(), task.exception())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)

