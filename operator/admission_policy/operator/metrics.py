"""Prometheus metrics and the liveness/readiness probes, each on its own port."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp.web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..engine import Decision

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter("admission_policy_requests", "Admission requests by policy, operation and decision.",
                   ["policy", "operation", "decision"], registry=REGISTRY)
LATENCY = Histogram("admission_policy_evaluation_seconds", "Time the engine takes to decide a request.",
                    ["webhook"], registry=REGISTRY,
                    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
ERRORS = Counter("admission_policy_evaluation_errors", "CEL evaluation errors by policy.", ["policy"],
                 registry=REGISTRY)
POLICIES = Gauge("admission_policy_policies_loaded", "AdmissionPolicies loaded and enforced by this replica.",
                 registry=REGISTRY)
REJECTED = Gauge("admission_policy_policies_rejected", "AdmissionPolicy generations that failed to compile.",
                 registry=REGISTRY)

NO_POLICY = "(none)"


def observe(decision: Decision, operation: str, webhook: str, seconds: float) -> None:
    _child(LATENCY, webhook).observe(seconds)
    if not decision.outcomes:
        _child(REQUESTS, NO_POLICY, operation, "allowed").inc()
    for outcome in decision.outcomes:
        _child(REQUESTS, outcome.policy, operation, outcome.result).inc()
        if outcome.errors:
            _child(ERRORS, outcome.policy).inc(len(outcome.errors))


_children: dict[tuple[object, tuple[str, ...]], Any] = {}


def _child(metric: Counter | Histogram, *labels: str) -> Any:
    """``metric.labels(...)`` validates and locks on every call: a measurable share of a request."""
    key = (metric, labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


async def serve_metrics(host: str, port: int) -> aiohttp.web.AppRunner:
    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get("/metrics", metrics)])
    return await _start(app, host, port)


async def serve_probes(host: str, port: int, ready: Callable[[], bool]) -> aiohttp.web.AppRunner:
    """/healthz answers while the event loop runs; /readyz once policies are loaded and served."""
    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="ok")

    async def readyz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        if ready():
            return aiohttp.web.Response(text="ready")
        return aiohttp.web.Response(status=503, text="not ready: policies not loaded or webhook server not listening")

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get("/healthz", healthz), aiohttp.web.get("/readyz", readyz)])
    return await _start(app, host, port)


async def _start(app: aiohttp.web.Application, host: str, port: int) -> aiohttp.web.AppRunner:
    runner = aiohttp.web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner
