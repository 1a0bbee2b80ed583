"""Start and stop: Kopf's startup and cleanup handlers, and what they check and set up.

Startup builds the one ``Operator`` (``state.py``) before Kopf starts watching, so every handler
finds it whole, and starts the background tasks under a ``Supervisor``. Two settings objects meet
here: ``settings`` is Kopf's (``kopf.OperatorSettings``, passed by that keyword), ``config`` ours
(``OperatorConfig``, from the ``AP_*`` variables).
"""
from __future__ import annotations

import gc
import hashlib
import logging
import os
import socket
from collections.abc import Coroutine
from typing import Any

import aiohttp.web
import kopf
from kubernetes_asyncio import client

from .. import features, plugins
from ..cluster.client import new_api_client
from ..cluster.discovery import Discovery
from ..cluster.routing import BREAK_GLASS_LABEL
from ..config import OperatorConfig
from . import audit, certificates, exceptionstatus, metrics, native, reconcile, registration, state, watcher
from .events import PolicyEvents
from .rotation import CertificateRotation
from .sources import Sources
from .state import REGISTRATION_TIMEOUT, Operator
from .store import FINALIZER, ExceptionStore, PolicyStore
from .webhook import PolicyWebhookServer

logger = logging.getLogger(__name__)

# Loggers of the HTTP clients: at DEBUG they print whole response bodies, the certificate Secret's
# private keys included. They stay at WARNING whatever the operator's level (issue 18).
CLIENT_LOGGERS = ("kubernetes_asyncio", "client", "urllib3", "aiohttp.client", "aiohttp.internal")
RECONCILE_WORKERS = 20


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Everything before the first policy is handled: fail here, once and with a clear message
    (a port in use, no namespace for the certificate Secret), rather than retry for ever later."""
    config = OperatorConfig.from_env(os.environ)
    _configure_logging(config.log_level)
    features.configure(features.parse(config.feature_gates))   # before any policy is compiled
    _report_broken_plugins(plugins.registry())
    _configure_kopf(settings, config)
    _check_ports_free(config)

    api_client = await new_api_client()
    store = PolicyStore(config.default_failure_policy, config.tenant_plugins)
    bundle = await _ensure_certificates(api_client, config)
    paths = certificates.write_files(bundle, config.cert_dir)
    settings.admission.server = PolicyWebhookServer(
        listening=store.readiness.listening, addr=config.listen_host, port=config.listen_port,
        certfile=paths.certfile, pkeyfile=paths.pkeyfile, cafile=paths.cafile, file_check_interval=10.0,
        max_connections=config.max_connections, body_timeout=config.webhook_timeout)

    discovery = Discovery(api_client)
    sources = Sources(api_client, discovery)
    store.on_change = sources.want
    op = Operator(config, store, api_client, discovery, bundle, PolicyEvents("admission-policy-operator"), sources,
                  ExceptionStore(config.namespace), kopf_settings=settings)
    state.install(op)
    op.runners.append(await _listening(
        metrics.serve_probes(config.listen_host, config.health_port, lambda: store.readiness.ready,
                             lambda: _trouble(op),
                             lambda: op.tasks.given_up(essential=True)),
        config.listen_host, config.health_port, "AP_HEALTH_PORT, the probes"))
    if config.metrics_port:
        op.runners.append(await _listening(metrics.serve_metrics(config.listen_host, config.metrics_port),
                                           config.listen_host, config.metrics_port, "AP_METRICS_PORT, the metrics"))
    _spawn_background_tasks(op)
    metrics.SOURCES.read = sources.stats
    metrics.TASKS.read = op.tasks.stats
    metrics.STATS.exception_states = lambda: exceptionstatus.states(op)
    metrics.POLICIES.set_function(lambda: len(store.policies))   # read at scrape time
    metrics.REJECTED.set_function(lambda: len(store.rejected))
    store.changed.set()  # write the configurations once even with no policies (the fixed entry)
    logger.info("Operator started: webhook on %s:%d, %s client config", config.listen_host, config.listen_port,
                f"url {config.advertised_url}" if config.advertised_url else "service")


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    """Stop what startup started, in reverse; the webhook configurations stay (``_log_what_stays``)."""
    op = state.uninstall()
    if op is None:
        return
    _log_what_stays(op)
    await op.tasks.stop()
    await op.sources.close()
    for runner in op.runners:
        await runner.cleanup()
    await op.api_client.close()


def peering_priority(pod_name: str) -> int:
    """A stable priority per pod: Kopf pauses peers of equal priority, so replicas must differ."""
    return 1 + int.from_bytes(hashlib.sha256(pod_name.encode()).digest()[:4], "big") % (2**31 - 2)


def _configure_kopf(kopf_settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    kopf_settings.admission.managed = None          # we write the configurations ourselves (docs/design.md)
    # Kopf would post its own events about policies (a handler failed) into the operator's
    # namespace, where `kubectl describe ap` never looks; the operator posts its own (events.py).
    kopf_settings.posting.enabled = False
    kopf_settings.persistence.finalizer = FINALIZER
    # A thousand policies at startup would otherwise each get a worker at once; the peak memory of
    # that burst stays with the process (Python rarely returns it), so reconcile a few at a time.
    kopf_settings.queueing.worker_limit = RECONCILE_WORKERS
    kopf_settings.queueing.idle_timeout = 0.5   # a settled object's worker gives its slot back quickly
    if kopf_settings.peering.name == "default":
        kopf_settings.peering.name = config.peering_name
    if kopf_settings.peering.priority == 0:
        kopf_settings.peering.priority = peering_priority(config.pod_name)


async def _ensure_certificates(api_client: client.ApiClient, config: OperatorConfig) -> certificates.CertificateBundle:
    try:
        return await certificates.ensure_certificates(client.CoreV1Api(api_client), config, state.now())
    except client.ApiException as exc:
        await api_client.close()
        hint = {404: f"does namespace {config.namespace!r} exist? create it or set AP_NAMESPACE",
                504: "is the API server reachable from the operator?"}.get(exc.status,
                                                                          "check the operator's RBAC for Secrets")
        secret = f"{config.namespace}/{config.cert_secret}"
        raise kopf.PermanentError(f"cannot keep the serving certificate in Secret {secret}: "
                                  f"{exc.status} {exc.reason}; {hint}") from None


def _spawn_background_tasks(op: Operator) -> None:
    """Essential tasks are those admission answers depend on (docs/design.md, "Background tasks")."""
    api_client, config, store, tasks = op.api_client, op.config, op.store, op.tasks
    rotation = CertificateRotation(op)
    tasks.spawn("policy watcher", lambda: watcher.watch_policies(api_client, store))
    tasks.spawn("tenant policy watcher", lambda: watcher.watch_tenant_policies(api_client, store))
    tasks.spawn("namespace watcher", lambda: watcher.watch_namespaces(api_client, store))
    tasks.spawn("exception watcher",
                lambda: watcher.watch_exceptions(api_client, op.exceptions, store.readiness.unsynced))
    tasks.spawn("exception status", lambda: exceptionstatus.follow_exceptions(op), essential=False)
    tasks.spawn("webhook configurations", lambda: registration.keep_configurations(
        api_client, config, store, op.discovery, lambda: op.bundle.ca_bundle))
    tasks.spawn("denial events", lambda: op.events.run(api_client, store.uids.get), essential=False)
    tasks.spawn("decision log", op.decisions.run, essential=False)
    tasks.spawn("registration status", lambda: reconcile.follow_registration(op), essential=False)
    tasks.spawn("certificate renewal", rotation.renew)
    tasks.spawn("certificate Secret watcher", rotation.watch_secret)
    auditor = op.auditor = audit.Auditor(api_client, config, store, op.discovery, op.reconciles, inputs=op.sources,
                                         exceptions=lambda: op.exceptions.current)
    tasks.spawn("background audit", auditor.run, essential=False)
    tasks.spawn("heap freeze", lambda: _freeze_after_load(store), essential=False)
    tasks.spawn("params and context caches", op.sources.run)
    tasks.spawn("inputs status", lambda: reconcile.follow_inputs(op), essential=False)
    tasks.spawn("event loop lag", metrics.watch_loop_lag, essential=False)
    tasks.spawn("native enforcement", lambda: native.keep_native(op), essential=False)

def _trouble(op: Operator) -> str:
    """What /readyz adds after "ready": a watch that is down, a side task left dead."""
    return "; ".join(filter(None, (op.store.readiness.out_of_sync(), op.tasks.given_up(essential=False))))


def _report_broken_plugins(found: plugins.Registry) -> None:
    """Log, once, each plugin entry point that failed to load: its policies are refused, and this
    says why at startup rather than at the first `kubectl apply`."""
    for broken in found.broken:
        logger.warning("Plugin %r (from %s) failed to load and is unavailable: %s", broken.name, broken.source,
                       broken.error)


async def _freeze_after_load(store: PolicyStore) -> None:
    """Once the policies are loaded and routed, move everything alive to the permanent GC
    generation: a full collection over the imports and the loaded policies costs tens of
    milliseconds, which would otherwise land on whatever request triggers it (p99)."""
    await store.readiness.policies_loaded.wait()
    await store.registration.wait_write_after(0, timeout=REGISTRATION_TIMEOUT)
    gc.collect()
    gc.freeze()


# --- logging ---------------------------------------------------------------------------------------------------

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


def _log_what_stays(op: Operator) -> None:
    """On the way out, say what the cluster is left with: the configurations are shared by every
    replica, so they stay, and while no replica runs they fail closed."""
    name = op.config.webhook_config_name
    failing = sorted(p.name for p in op.store.policies if p.policy.failure_policy == "Fail")
    exempt = ", ".join(op.config.all_exempt_namespaces)
    logger.log(logging.WARNING if failing else logging.INFO,
               "Stopping. The webhook configurations %s stay in place for the other replicas; while none runs, "
               "the requests they route fail closed for %d failurePolicy Fail policies%s and AdmissionPolicy "
               "writes are refused (never in namespaces %s; break-glass: %s). "
               "If the operator is not coming back: admission-policy cleanup --name %s",
               name, len(failing), f" ({', '.join(failing[:5])}{', …' if len(failing) > 5 else ''})" if failing
               else "", exempt, _break_glass(op.config), name)


def _break_glass(config: OperatorConfig) -> str:
    named = [*(f"group {g}" for g in config.break_glass_groups), *config.break_glass_users]
    if not named:
        return "none, AP_BREAK_GLASS_GROUPS and AP_BREAK_GLASS_USERS name nobody"
    return f"objects labelled {BREAK_GLASS_LABEL}=true written by {', '.join(named)}"


# --- start-up checks -------------------------------------------------------------------------------------------

def _check_ports_free(config: OperatorConfig) -> None:
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


async def _listening(starting: Coroutine[Any, Any, aiohttp.web.AppRunner], host: str, port: int,
                     what: str) -> aiohttp.web.AppRunner:
    try:
        return await starting
    except OSError as exc:
        raise _port_error(host, port, what, exc) from None


def _port_error(host: str, port: int, what: str, error: OSError) -> kopf.PermanentError:
    reason = os.strerror(error.errno) if error.errno else str(error)
    return kopf.PermanentError(f"cannot listen on {host}:{port} ({what}): {reason}; "
                               "is another process using it? choose a free port")
