"""Issue 33: a policy evaluated in a forked child (``cel.fork``) must not stall the replica.

The parent waits for the child on a thread of its own (``operator/apart.py``), so while one
user's 1.2 MiB ConfigMap is judged by a costly policy, the event loop goes on answering other
admission requests and the probes. Checked by order, not by time: ``/healthz`` and small reviews
are answered while the child still runs (before, nothing was until the child was done). The 50
reviews' latencies, and the same 50's without the large one, are printed (``pytest -s``) as the
figures docs/design.md states.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import statistics
import time
from typing import Any

import aiohttp
import pytest
from emulator import ADMISSION_POLICIES, Emulator, wait_for
from operator_env import pod_request, wait_phase

from admission_policy.operator.webhookconfig import VALIDATE_PATH
from builders import admission_request, configmap, policy_body

SMALL = 50
# Each replace doubles the 'a's: eight make ~300 MB of string work, about two seconds of CEL in the
# child (twice what the 50 small reviews cost this process, client and server), and an estimated
# cost far over the budget of one evaluation in the webhook's process.
GROWS = "object.data.blob" + ".replace('a', 'aa')" * 8 + ".size() > 0"
BLOB = "abcdefgh" * (150 * 1024)   # 1.2 MiB
ANSWERED = [0]   # small reviews answered in the current round


def children() -> list[int]:
    """This process's child processes (the forked evaluations), from /proc."""
    found = []
    for task in pathlib.Path(f"/proc/{os.getpid()}/task").iterdir():
        found += [int(pid) for pid in (task / "children").read_text().split()]
    return found


def large_update() -> dict[str, Any]:
    new, old = configmap("big", namespace="apps", data={"blob": BLOB}), configmap("big", namespace="apps")
    return admission_request(new, operation="UPDATE", old=old, resource="configmaps", kind="ConfigMap",
                             name="big", namespace="apps", uid="b16b16b1-0000-4000-8000-000000000001")


async def small_reviews(webhook: Any, session: aiohttp.ClientSession) -> list[float]:
    """SMALL pod reviews at once over ``session``'s keep-alive connections, as the API server sends
    them; their latencies in seconds. Every answer must be the policy's."""
    async def one(i: int) -> float:
        started = time.perf_counter()
        uid = f"00000000-0000-4000-8000-{i:012d}"
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": pod_request(f"offensive-{i}", uid=uid)}
        async with session.post(f"{webhook.base}{VALIDATE_PATH}", json=body) as answer:
            review = (await answer.json())["response"]
        assert review["allowed"] is False and "offensive" in review["status"]["message"], review
        ANSWERED[0] += 1
        return time.perf_counter() - started
    ANSWERED[0] = 0
    return list(await asyncio.gather(*(one(i) for i in range(SMALL))))


async def test_the_loop_serves_on_while_a_child_evaluates_a_large_object(
        serving: Any, emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AP_WEBHOOK_TIMEOUT", "20")   # room for the child on a slow machine
    async with serving() as webhook, contextlib.AsyncExitStack() as stack:
        await emulator.create(ADMISSION_POLICIES, policy_body(
            "costly", match={"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                                            "operations": ["UPDATE"]}]},
            validations=[{"expression": GROWS, "message": "the blob must grow"}]))
        await wait_phase(emulator, "costly", "Active")
        session = await stack.enter_async_context(aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=webhook.context, limit=SMALL)))
        await small_reviews(webhook, session)   # the connections opened (the API server keeps them too)
        quiet = await small_reviews(webhook, session)

        large = asyncio.create_task(webhook.review(VALIDATE_PATH, large_update()))
        await wait_for(lambda: bool(children()) or large.done(), timeout=20)
        # Answered already: the loop did not run until the evaluation was over (no child, or waited for on it).
        assert not large.done(), "the event loop was held for the whole evaluation of the large ConfigMap"
        # The 50 reviews and the probe go out at once; the first answers must come while the child
        # runs (all 50 may or may not: the test client shares the loop, and pays their TLS too).
        busy_task = asyncio.create_task(small_reviews(webhook, session))
        health = f"http://127.0.0.1:{os.environ['AP_HEALTH_PORT']}/healthz"
        async with aiohttp.ClientSession() as probe, probe.get(health) as answer:
            assert answer.status == 200, await answer.text()
        await wait_for(lambda: ANSWERED[0] > 0 or busy_task.done(), timeout=20)
        assert not large.done(), "no small review was answered while the child ran"
        busy = await busy_task
        judged = await large
        assert judged["allowed"] is True, judged   # the real answer, not a refusal for the size

    def figures(latencies: list[float]) -> str:
        return (f"p50 {statistics.median(latencies) * 1000:.0f} ms, "
                f"max {max(latencies) * 1000:.0f} ms")
    print(f"\n{SMALL} small reviews at once: alone {figures(quiet)}; while a child evaluates a 1.2 MiB "
          f"UPDATE: {figures(busy)}")


async def test_a_stalled_event_loop_shows_in_the_loop_lag_metric() -> None:
    """``admission_policy_event_loop_lag_seconds``: a step that holds the loop for 0.3 s is one
    sample in the 0.5 s bucket and none below 0.25 s (what an operator alerts on)."""
    from prometheus_client import generate_latest

    from admission_policy.operator import metrics
    lag = metrics.LoopLag()
    monitor = asyncio.create_task(metrics.watch_loop_lag(lag))
    try:
        await asyncio.sleep(0.25)   # a few samples of an idle loop
        time.sleep(0.3)             # the loop held, as a long synchronous step would
        await asyncio.sleep(0.25)
    finally:
        monitor.cancel()
    stalled = lag.counts[metrics.LAG_BUCKETS.index(0.5)]
    assert stalled == 1 and sum(lag.counts[metrics.LAG_BUCKETS.index(0.5) + 1:]) == 0, lag.counts
    assert lag.worst >= 0.3 - metrics.LAG_INTERVAL
    text = generate_latest(metrics.REGISTRY).decode()
    assert 'admission_policy_event_loop_lag_seconds_bucket{le="0.25"}' in text

