"""The operator: ``kopf run -m admission_policy.operator.handlers --all-namespaces``.

Two paths share one process. Reconciliation (paused by Kopf peering on all but one replica)
drives each AdmissionPolicy's finalizer, conditions, phase and events. Serving (never paused)
runs in every replica: its own watcher loads policies into the PolicyStore, a loop writes the
webhook configurations, and Kopf's admission handlers answer every routed request from the
engine.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import gc
import hashlib
import logging
import os
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import kopf
from kubernetes_asyncio import client

from .. import api
from ..engine import Decision, Phase, PolicyCompileError, evaluate
from . import certificates, conditions, events, metrics, registration, watcher
from .kube import Discovery, new_api_client
from .settings import OperatorSettings
from .store import FINALIZER, PolicyStore, error_text, load_policy
from .webhook import PolicyWebhookServer, current_exchange
from .webhookconfig import unserved_resources

logger = logging.getLogger(__name__)

REGISTRATION_TIMEOUT = 20.0      # how long reconciliation waits for the configurations to be written
CERT_CHECK_INTERVAL = 3600.0
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
    tasks: list[asyncio.Task[Any]] = dataclasses.field(default_factory=list)
    runners: list[Any] = dataclasses.field(default_factory=list)

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
    logging.getLogger("admission_policy").setLevel(config.log_level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Kopf logs every admission request at INFO on "kopf.objects" ("Webhook 'validate' succeeded").
    # The operator logs (and posts as Events) what matters about a policy itself, so Kopf's
    # per-object lines start at WARNING unless debugging: a handler that fails still shows.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if config.log_level == "DEBUG" else logging.WARNING)
    logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False   # cheaper records

    settings.admission.managed = None          # we write the configurations ourselves (DESIGN §5)
    settings.persistence.finalizer = FINALIZER
    # A thousand policies at startup would otherwise each get a worker at once; the peak memory of
    # that burst stays with the process (Python rarely returns it), so reconcile a few at a time.
    settings.queueing.worker_limit = RECONCILE_WORKERS
    settings.queueing.idle_timeout = 0.5   # a settled object's worker gives its slot back quickly
    if settings.peering.name == "default":
        settings.peering.name = config.peering_name
    if settings.peering.priority == 0:
        settings.peering.priority = peering_priority(config.pod_name)

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
        certfile=paths.certfile, pkeyfile=paths.pkeyfile, cafile=paths.cafile, file_check_interval=10.0)

    _operator = op = Operator(config, store, api_client, Discovery(api_client), bundle,
                              events.PolicyEvents("admission-policy-operator"))
    op.runners.append(await metrics.serve_probes(config.listen_host, config.health_port, lambda: store.ready))
    if config.metrics_port:
        op.runners.append(await metrics.serve_metrics(config.listen_host, config.metrics_port))
    op.spawn("policy watcher", watcher.watch_policies(api_client, store))
    op.spawn("namespace watcher", watcher.watch_namespaces(api_client, store))
    op.spawn("webhook configurations",
             registration.keep_configurations(api_client, config, store, op.discovery, lambda: op.bundle.ca_bundle))
    op.spawn("denial events", op.events.run(api_client, store.uids.get))
    op.spawn("certificate renewal", _renew_certificates(op))
    op.spawn("heap freeze", _freeze_after_load(store))
    metrics.POLICIES.set_function(lambda: len(store.policies))   # read at scrape time
    metrics.REJECTED.set_function(lambda: len(store.rejected))
    store.changed.set()  # write the configurations once even with no policies (the fixed entry)
    logger.info("Operator started: webhook on %s:%d, %s client config", config.listen_host, config.listen_port,
                f"url {config.advertised_url}" if config.advertised_url else "service")


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    global _operator
    if _operator is None:
        return
    op, _operator = _operator, None
    for task in op.tasks:
        task.cancel()
    await asyncio.gather(*op.tasks, return_exceptions=True)
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
    observation = await observe(op, body, name, generation)
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


async def observe(op: Operator, body: Mapping[str, Any], name: str, generation: int) -> conditions.Observation:
    """Compile this generation, check what it names against discovery, wait until it is routed."""
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
            conditions.Condition(conditions.REGISTERED, "Unknown", "NotCompiled", "this generation did not compile"))
    compiled_ok = conditions.Condition(conditions.COMPILED, "True", "Compiled",
                                   f"{len(compiled.policy.expressions())} CEL expression(s) compiled and type-checked")
    if not await op.store.wait_registered(name, generation, REGISTRATION_TIMEOUT):
        return conditions.Observation(compiled_ok, conditions.Condition(
            conditions.REGISTERED, "Unknown", "Registering", "waiting for the webhook configurations to be written"))
    unserved = unserved_resources(registration.routes(compiled), await op.discovery.resources())
    if unserved:
        return conditions.Observation(compiled_ok, conditions.Condition(
            conditions.REGISTERED, "False", "UnservedResources",
            f"not served by this cluster, so never checked: {'; '.join(unserved)}; install the API or "
            "fix spec.match.resources (the rest of the policy is enforced)"))
    return conditions.Observation(compiled_ok, conditions.Condition(
        conditions.REGISTERED, "True", "Registered",
        f"routed by {op.settings.webhook_config_name} webhook configurations"))


@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL)
async def delete(body: kopf.Body, name: str, status: kopf.Status, **_: Any) -> None:
    """Stop enforcing and unroute before Kopf removes the finalizer."""
    op = operator()
    await _write_status(op, name, conditions.terminating_patch(status, _now()))
    await op.events.post(op.api_client, name, body.metadata.uid, type_="Normal", reason="Terminating",
                         message="removing the policy from the webhook configurations")
    op.store.forget(name)
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
    warning = observation.phase in ("Failed", "Degraded")
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
    exchange = current_exchange()
    request = exchange.request
    namespace = None
    if request.namespace:
        namespace = op.store.namespaces.get(request.namespace) or await _fetch_namespace(op, request.namespace)
    started = time.perf_counter()
    decision = evaluate(op.store.policies, request, namespace, phase)
    metrics.observe(decision, request.operation, webhook, time.perf_counter() - started)
    exchange.decision = decision
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
        return
    exchange.decision = Decision(allowed=True)


def _spec_written(new: Any, old: Any) -> bool:
    """An UPDATE that changes the spec of a policy not being deleted."""
    meta = new.get("metadata") if isinstance(new, Mapping) else None
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return False
    return not (isinstance(new, Mapping) and isinstance(old, Mapping) and new.get("spec") == old.get("spec"))


async def _fetch_namespace(op: Operator, name: str) -> Mapping[str, Any] | None:
    """A namespace the watcher has not delivered yet (created a moment ago)."""
    try:
        response: Any = await client.CoreV1Api(op.api_client).read_namespace(name, _preload_content=False)
        body: Mapping[str, Any] = await response.json()
    except client.ApiException:
        return None
    op.store.namespaces.setdefault(name, body)
    return body


# --- background ----------------------------------------------------------------------------------------------

async def _renew_certificates(op: Operator) -> None:
    """Adopt a renewed bundle: trust the new CA in the configurations first, then serve it."""
    while True:
        await asyncio.sleep(CERT_CHECK_INTERVAL)
        try:
            bundle = await certificates.ensure_certificates(client.CoreV1Api(op.api_client), op.settings, _now())
        except Exception as exc:
            logger.warning("Checking the serving certificate failed: %s", exc)
            continue
        if bundle == op.bundle:
            continue
        op.bundle = bundle
        written = op.store.registration_count
        op.store.changed.set()
        await op.store.wait_registration_after(written, timeout=REGISTRATION_TIMEOUT)
        certificates.write_files(bundle, op.settings.cert_dir)
        logger.info("Serving certificate renewed; valid until %s", bundle.not_after.isoformat())


async def _freeze_after_load(store: PolicyStore) -> None:
    """Once the policies are loaded and routed, move everything alive to the permanent GC
    generation: a full collection over the imports and the loaded policies costs tens of
    milliseconds, which would otherwise land on whatever request triggers it (p99)."""
    await store.policies_loaded.wait()
    await store.wait_registration_after(0, timeout=REGISTRATION_TIMEOUT)
    gc.collect()
    gc.freeze()


def _report_crash(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("%s stopped: %r", task.get_name(), task.exception())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)

