"""Prometheus metrics and the liveness/readiness probes, each on its own port."""
from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterator

import aiohttp.web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from .. import features, plugins
from ..engine import Decision

REGISTRY = CollectorRegistry(auto_describe=True)

POLICIES = Gauge("admission_policy_policies_loaded", "AdmissionPolicies loaded and enforced by this replica.",
                 registry=REGISTRY)
REJECTED = Gauge("admission_policy_policies_rejected", "AdmissionPolicy generations that failed to compile.",
                 registry=REGISTRY)
# Native enforcement (operator/native.py): policies the API server enforces itself, and switches.
NATIVE_POLICIES = Gauge("admission_policy_native_policies", "Policies enforced by the API server through "
                        "generated ValidatingAdmissionPolicies (as this replica's status view has it).",
                        registry=REGISTRY)
NATIVE_SWITCHES = Counter("admission_policy_native_switches", "Policies handed to the API server (to=Native) "
                          "or back to the webhooks (to=Webhook) by this replica.", ["to"], registry=REGISTRY)

# The background audit's last scan of each policy (operator/audit.py); only the reconciling
# replica scans, so only its series are non-empty.
AUDIT_VIOLATIONS = Gauge("admission_policy_audit_violations", "Objects the last background scan found "
                         "violating the policy.", ["policy"], registry=REGISTRY)
AUDIT_OBJECTS = Gauge("admission_policy_audit_objects_scanned", "Objects the last background scan of the policy "
                      "listed and judged.", ["policy"], registry=REGISTRY)
AUDIT_SECONDS = Gauge("admission_policy_audit_scan_seconds", "How long the last background scan of the policy "
                      "took.", ["policy"], registry=REGISTRY)
_AUDIT_GAUGES = (AUDIT_VIOLATIONS, AUDIT_OBJECTS, AUDIT_SECONDS)


def audit_scanned(policy: str, objects: int, violations: int, seconds: float) -> None:
    AUDIT_OBJECTS.labels(policy).set(objects)
    AUDIT_VIOLATIONS.labels(policy).set(violations)
    AUDIT_SECONDS.labels(policy).set(seconds)


def audit_forget(policy: str) -> None:
    """A deleted policy's series go with it (a stale gauge would still alert)."""
    for gauge in _AUDIT_GAUGES:
        with contextlib.suppress(KeyError):
            gauge.remove(policy)


NO_POLICY = "(none)"


class SourceStats:
    """The params and context caches (operator/sources.py), read at scrape time: objects held,
    approximate bytes per object (marshalled size, managedFields left out), and whether in sync."""

    def __init__(self) -> None:
        self.read: Callable[[], Iterator[tuple[str, int, float, bool]]] | None = None

    def collect(self) -> Iterator[Metric]:
        objects = GaugeMetricFamily("admission_policy_context_objects",
                                    "Objects held by each params/context cache.", labels=["source"])
        size = GaugeMetricFamily("admission_policy_context_object_bytes",
                                 "Approximate memory per cached object (its marshalled size), per cache.",
                                 labels=["source"])
        synced = GaugeMetricFamily("admission_policy_context_synced",
                                   "1 while a params/context cache is listed and watched, 0 while it is not "
                                   "(requests reading it get the failurePolicy answer).", labels=["source"])
        for source, count, per_object, in_sync in (self.read() if self.read is not None else ()):
            objects.add_metric([source], count)
            size.add_metric([source], per_object)
            synced.add_metric([source], 1 if in_sync else 0)
        yield from (objects, size, synced)


SOURCES = SourceStats()
REGISTRY.register(SOURCES)


class TaskStats:
    """The background tasks (operator/supervision.py), read at scrape time: a task that dies is
    restarted, so only its restarts say it happened; one left dead is also named in /readyz."""

    def __init__(self) -> None:
        self.read: Callable[[], Iterator[tuple[str, int, bool]]] | None = None

    def collect(self) -> Iterator[Metric]:
        restarts = CounterMetricFamily("admission_policy_task_restarts", "Restarts of a background task "
                                       "after it died, by task.", labels=["task"])
        stopped = GaugeMetricFamily("admission_policy_task_stopped", "1 once a background task died too often to "
                                    "be restarted again (the probes name it), by task.", labels=["task"])
        for task, count, given_up in (self.read() if self.read is not None else ()):
            restarts.add_metric([task], count)
            stopped.add_metric([task], 1 if given_up else 0)
        yield from (restarts, stopped)


TASKS = TaskStats()
REGISTRY.register(TASKS)
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class AdmissionStats:
    """What every admission request adds to the metrics, as plain numbers turned into samples when
    scraped. The event loop is the only writer, so the lock prometheus_client's own metrics take on
    every ``inc()`` and ``observe()`` buys nothing here, and cost a measurable share of a request."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str, str], int] = defaultdict(int)   # policy, operation, decision
        self.errors: defaultdict[str, int] = defaultdict(int)                      # policy
        self.latency: dict[str, list[int]] = {}                                    # webhook: count per bucket
        self.latency_sum: defaultdict[str, float] = defaultdict(float)
        # Per plugin: calls by result (passed, failed, error, mutated, unchanged), latency buckets.
        self.plugin_calls: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.plugin_latency: dict[str, list[int]] = {}
        self.plugin_latency_sum: defaultdict[str, float] = defaultdict(float)
        self.exempted: defaultdict[tuple[str, str], int] = defaultdict(int)             # exception, policy
        # The exceptions' states, read at scrape time (``exceptionstatus.states``).
        self.exception_states: Callable[[], Iterator[str]] = lambda: iter(())

    def observe(self, decision: Decision, operation: str, webhook: str, seconds: float) -> None:
        counts = self.latency.get(webhook)
        if counts is None:
            counts = self.latency[webhook] = [0] * (len(BUCKETS) + 1)
        counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.latency_sum[webhook] += seconds
        if not decision.outcomes:
            self.requests[NO_POLICY, operation, "allowed"] += 1
        for call in decision.plugin_calls:
            self.plugin_calls[call.plugin, call.result] += 1
            buckets = self.plugin_latency.get(call.plugin)
            if buckets is None:
                buckets = self.plugin_latency[call.plugin] = [0] * (len(BUCKETS) + 1)
            buckets[bisect.bisect_left(BUCKETS, call.seconds)] += 1
            self.plugin_latency_sum[call.plugin] += call.seconds
        for outcome in decision.outcomes:
            self.requests[outcome.policy, operation, outcome.result] += 1
            if outcome.errors:
                self.errors[outcome.policy] += len(outcome.errors)
        if decision.exempted and decision.allowed and webhook == "validate":
            for exception, policy in {(e.exception, e.policy) for e in decision.exempted}:
                self.exempted[exception, policy] += 1

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("admission_policy_requests", "Admission requests by policy, operation "
                                       "and decision.", labels=["policy", "operation", "decision"])
        for labels, count in self.requests.items():
            requests.add_metric(list(labels), count)
        latency = HistogramMetricFamily("admission_policy_evaluation_seconds", "Time the engine takes to decide "
                                        "a request.", labels=["webhook"])
        for webhook, counts in self.latency.items():
            latency.add_metric([webhook], _cumulative(BUCKETS, counts), self.latency_sum[webhook])
        errors = CounterMetricFamily("admission_policy_evaluation_errors", "CEL evaluation errors by policy.",
                                     labels=["policy"])
        for policy, count in self.errors.items():
            errors.add_metric([policy], count)
        calls = CounterMetricFamily("admission_policy_plugin_calls", "Plugin calls by plugin and result (passed, "
                                    "failed, error, mutated, unchanged).", labels=["plugin", "result"])
        for call_labels, count in self.plugin_calls.items():
            calls.add_metric(list(call_labels), count)
        plugin_latency = HistogramMetricFamily("admission_policy_plugin_seconds", "Time one plugin call takes.",
                                               labels=["plugin"])
        for plugin, counts in self.plugin_latency.items():
            plugin_latency.add_metric([plugin], _cumulative(BUCKETS, counts), self.plugin_latency_sum[plugin])
        gates = GaugeMetricFamily("admission_policy_feature_gate", "1 when a feature gate is on, by gate and stage.",
                                  labels=["name", "stage"])
        for gate, enabled in features.current().items():
            gates.add_metric([gate.name, gate.stage], 1 if enabled else 0)
        installed = GaugeMetricFamily("admission_policy_plugin_info", "Installed plugins, by name, version and "
                                      "source.", labels=["plugin", "version", "source"])
        found = plugins.registry()
        for name, installed_plugin in found.plugins.items():
            installed.add_metric([name, installed_plugin.version, found.sources[name]], 1)
        exempted = CounterMetricFamily("admission_policy_exempted_requests", "Requests admitted while an "
                                       "AdmissionPolicyException waived a policy's failures, by exception and "
                                       "policy.", labels=["exception", "policy"])
        for exempted_labels, count in self.exempted.items():
            exempted.add_metric(list(exempted_labels), count)
        states = GaugeMetricFamily("admission_policy_exceptions", "AdmissionPolicyExceptions by state (Active, "
                                   "PendingApproval, Invalid, Expired).", labels=["state"])
        tally = collections.Counter(self.exception_states())
        for state in ("Active", "PendingApproval", "Invalid", "Expired"):
            states.add_metric([state], tally[state])
        return iter((requests, latency, errors, calls, plugin_latency, gates, installed, exempted, states))


def _cumulative(buckets: tuple[float, ...], counts: list[int]) -> list[tuple[str, int]]:
    """A histogram's samples as Prometheus wants them: per upper bound, the count at or below it."""
    return list(zip([*map(str, buckets), "+Inf"], itertools.accumulate(counts), strict=True))


STATS = AdmissionStats()
REGISTRY.register(STATS)
observe = STATS.observe

# How late the event loop runs a timer: every request waiting for the loop waits that long on top
# of its own work, so a stall (a long synchronous step, a full GC) shows here before it shows as a
# webhook timeout. Sampled every LAG_INTERVAL.
LAG_INTERVAL = 0.1
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LoopLag:
    """``admission_policy_event_loop_lag_seconds``: a histogram of the lag of each sample."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LAG_BUCKETS) + 1)
        self.total = 0.0
        self.worst = 0.0   # since the process started, for the logs and the bench

    def observe(self, lag: float) -> None:
        self.counts[bisect.bisect_left(LAG_BUCKETS, lag)] += 1
        self.total += lag
        self.worst = max(self.worst, lag)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily("admission_policy_event_loop_lag_seconds", "How late the event loop runs "
                                       f"a timer, sampled every {LAG_INTERVAL:g} s: what every request waits on top "
                                       "of its own work.")
        family.add_metric([], _cumulative(LAG_BUCKETS, self.counts), self.total)
        yield family


LOOP_LAG = LoopLag()
REGISTRY.register(LOOP_LAG)


async def watch_loop_lag(lag: LoopLag = LOOP_LAG) -> None:
    """Sample the event loop's lag into ``lag``, for ever."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(LAG_INTERVAL)
        lag.observe(max(0.0, loop.time() - start - LAG_INTERVAL))


async def serve_metrics(host: str, port: int) -> aiohttp.web.AppRunner:
    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get("/metrics", metrics)])
    return await _start(app, host, port)


async def serve_probes(host: str, port: int, ready: Callable[[], bool], detail: Callable[[], str] = str,
                       broken: Callable[[], str] = str) -> aiohttp.web.AppRunner:
    """/healthz answers while the event loop runs; /readyz once policies are loaded and served, with
    ``detail()`` (e.g. a watch that is down) after "ready" when there is one. While ``broken()``
    says what the replica cannot do without a restart (an essential background task left dead),
    both fail with it: out of the Service, then restarted by the kubelet."""
    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        problem = broken()
        if problem:
            return aiohttp.web.Response(status=503, text=f"not alive: {problem}")
        return aiohttp.web.Response(text="ok")

    async def readyz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        problem = broken()
        if problem:
            return aiohttp.web.Response(status=503, text=f"not ready: {problem}")
        if ready():
            problem = detail()
            return aiohttp.web.Response(text=f"ready; {problem}" if problem else "ready")
        return aiohttp.web.Response(status=503, text="not ready: policies not loaded or webhook server not listening")

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get("/healthz", healthz), aiohttp.web.get("/readyz", readyz)])
    return await _start(app, host, port)


async def _start(app: aiohttp.web.Application, host: str, port: int) -> aiohttp.web.AppRunner:
    runner = aiohttp.web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner
