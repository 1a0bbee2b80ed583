"""Issue 12, scenario 7: memory over time — many policies churned through generations under traffic.

``scaled(100)`` policies (``RELIABILITY_SCALE=10``: the issue's 1,000) are created, edited through
several generations (another expression every time; Enforce⇄Warn and the match for some) and
deleted, while requests stream in and every answer is judged against the generations in force.
After each round the operator's resident memory (VmRSS) is sampled and printed as a curve with
its growth per generation: a figure, never asserted (timings and sizes belong to reports). What is
asserted is what users rely on: zero wrong decisions, every generation of every policy Active, all
gone after deletion (no finalizer left behind), and the loaded-policies gauge back to its baseline.
"""
from __future__ import annotations

import math
import pathlib
import time
from collections.abc import Callable

import pytest
import requests
from e2e_kube import AdmissionPolicy, Cluster, OperatorProcess, unique
from prometheus_client.parser import text_string_to_metric_families
from traffic import (
    SCALE,
    Figures,
    PolicyDriver,
    Timeline,
    Traffic,
    Variant,
    report,
    scaled,
)

pytestmark = pytest.mark.e2e

SELECTOR_KEY = "e2e.policy-operator.dev/traffic"
# Policies that touch the traffic at once: the API server keeps at most 4 KiB of warnings per
# answer (k8s.io/apiserver endpoints/filters/warning.go), so a few dozen Warn tags would be cut and
# read as wrong. The others are edited just as often but select another namespace.
JUDGING = 10
PACE_S = 0.04   # per client between requests: traffic all along, without saturating a shared machine


def soak_variant(index: int, round_: int, spread: int) -> Variant:
    """Policy ``index`` at round ``round_``: a new expression every round; about ``JUDGING`` policies
    (those with ``(index + round_) % spread == 0``) select the traffic, half of them Enforce, half Warn."""
    turn = index + round_
    return Variant(enforcement="Warn" if (turn // spread + round_) % 2 else "Enforce",
                   matched=turn % spread == 0, failing=True, expression=round_)


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` (VmRSS), in MiB."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def gauge(operator: OperatorProcess, name: str) -> float:
    """A gauge from the operator's Prometheus metrics port."""
    text = requests.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"no {name} in the metrics of {operator.url}")


def test_policies_churned_through_generations_under_traffic_stay_exact_and_leave_nothing(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str]) -> None:
    assert operator.process is not None and operator.alive()
    pid = operator.process.pid
    selector = (SELECTOR_KEY, unique("soak"))
    ns = namespace({selector[0]: selector[1]})
    count = scaled(100)
    rounds = min(scaled(4), 12)   # edits after the creation: generations 2..rounds+1
    spread = max(1, math.ceil(count / JUDGING))
    settle_timeout = cluster.settings.timeout + count * 0.2
    names = [unique(f"soak-p{i:04d}", limit=40) for i in range(count)]
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector)
    loaded_before = gauge(operator, "admission_policy_policies_loaded")
    rss = [rss_mb(pid)]
    round_seconds: list[float] = []
    started = time.monotonic()
    try:
        with Traffic(cluster, ns, clients=2, pace=PACE_S) as traffic:
            traffic.wait(10, cluster.settings.timeout)
            for round_ in range(rounds + 1):
                began = time.monotonic()
                for index, name in enumerate(names):
                    driver.submit(name, soak_variant(index, round_, spread))
                driver.settle(settle_timeout)   # every policy Active at this generation, or fail
                round_seconds.append(time.monotonic() - began)
                rss.append(rss_mb(pid))
                if round_ == 0:
                    assert gauge(operator, "admission_policy_policies_loaded") == loaded_before + count
            for name in names:
                driver.remove(name)
            driver.settle(settle_timeout)        # every policy gone: its finalizer was released
            rss.append(rss_mb(pid))
            traffic.wait(10, cluster.settings.timeout)   # answers after the last delete, judged too
            answers = traffic.stop()
    finally:
        for name in list(driver.live):
            cluster.delete(AdmissionPolicy, name)
        for name in list(driver.live):
            cluster.wait_gone(AdmissionPolicy, name)

    left = [n for n in cluster.owned_policies() if n in set(names)]
    loaded_after = gauge(operator, "admission_policy_policies_loaded")
    # rss: [before, after creation, after each edit round..., after deletion]. What each further
    # generation costs, over all edit rounds and over their second half (once settled).
    growth = (rss[-2] - rss[1]) / rounds
    half = rounds // 2
    settled_growth = (rss[-2] - rss[1 + half]) / (rounds - half)
    readiness = sorted(driver.readiness)
    figures = report(Figures.of(
        f"soak: {count} policies x {rounds + 1} generations, then deleted", answers, timeline,
        scale=SCALE, policy_writes=count * (rounds + 1), seconds=time.monotonic() - started,
        round_s=[round(s, 1) for s in round_seconds], rss_mb=[round(m, 1) for m in rss],
        rss_growth_per_generation_mb=growth, rss_growth_per_generation_second_half_mb=settled_growth,
        median_write_to_effect_s=readiness[len(readiness) // 2], max_write_to_effect_s=readiness[-1]))
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert figures.errors == 0, figures.line()
    assert left == [], f"policies left after their deletion completed: {left}"
    assert loaded_after == loaded_before, (f"the operator still counts {loaded_after} policies loaded, "
                                           f"{loaded_before} before the soak")
    judged = sum(1 for answer in answers if answer.tags())
    assert judged > len(answers) // 10, f"the policies judged too few requests to prove anything: {figures.line()}"
