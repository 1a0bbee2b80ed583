"""Issue 12, scenario 1: policies created, edited and deleted while requests stream in.

A request sent after a policy is seen ``Active`` is judged by that generation; one sent after
its deletion completes is not judged by it; one in flight across a write is judged by exactly
one generation — never half by each. See ``traffic.py`` for how an answer names its judge.

With two replicas (Kopf peering, behind one address) that guarantee cannot hold for the moment
after ``Active``: only the leader reports it, and the follower loads the same write from its own
watch a little later. The second test measures that window (late answers and their lag, and the
follower's load delay from both logs) and holds every other answer to the strict rule.
"""
from __future__ import annotations

import datetime
import pathlib
import random
import re
from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

import pytest
from e2e_kube import Cluster, OperatorProcess, unique
from replicas import log_of, replicas, requests_judged
from traffic import Figures, PolicyDriver, Sent, Timeline, Traffic, Variant, report, scaled

pytestmark = pytest.mark.e2e

SELECTOR_KEY = "e2e.policy-operator.dev/traffic"


def changed(variant: Variant, rng: random.Random) -> Variant:
    """One edit a user makes: another expression, Enforce⇄Warn, the match, or a check that passes."""
    change = rng.choice(["expression", "enforcement", "match", "passing"])
    if change == "expression":
        return Variant(variant.enforcement, variant.matched, True, variant.expression + 1)
    if change == "enforcement":
        return Variant("Warn" if variant.enforcement == "Enforce" else "Enforce", variant.matched, variant.failing,
                       variant.expression)
    if change == "match":
        return Variant(variant.enforcement, not variant.matched, variant.failing, variant.expression)
    return Variant(variant.enforcement, variant.matched, not variant.failing, variant.expression)


def churn(cluster: Cluster, namespace: str, driver: PolicyDriver, names: list[str]) -> tuple[list[Sent], int]:
    """Traffic into ``namespace`` while ``names`` are created, edited and deleted one write after
    another (each until in effect); the answers and the number of writes. The policies stay."""
    rng = random.Random(12)
    writes = 0
    with Traffic(cluster, namespace, clients=4, limit=scaled(2000)) as traffic:
        traffic.wait(20, cluster.settings.timeout)
        while not traffic.done:
            name = rng.choice(names)
            if name not in driver.live:
                driver.write(name, Variant(rng.choice(["Enforce", "Warn"])))
            elif rng.random() < 0.15:
                driver.delete(name)
            else:
                driver.write(name, changed(driver.live[name], rng))
            writes += 1
        return traffic.wait_finished(cluster.settings.timeout), writes


def write_to_effect(driver: PolicyDriver) -> dict[str, Any]:
    readiness = sorted(driver.readiness)
    return {"median_write_to_effect_s": readiness[len(readiness) // 2], "max_write_to_effect_s": readiness[-1]}


def check(figures: Figures, answers: list[Sent], writes: int) -> None:
    assert writes >= 5, f"too few policy writes during the traffic to prove anything: {figures.line()}"
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert figures.errors == 0, figures.line()
    judged = sum(1 for answer in answers if answer.tags())
    assert judged > len(answers) // 10, f"the policies judged too few requests to prove anything: {figures.line()}"


def test_policies_written_under_load_judge_by_exactly_their_generation(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str]) -> None:
    selector = (SELECTOR_KEY, unique("reload"))
    ns = namespace({selector[0]: selector[1]})
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector)
    try:
        answers, writes = churn(cluster, ns, driver, [unique(f"reload-p{i}") for i in range(3)])
    finally:
        driver.delete_all()
    # One replica: its own load is what it reports Active, so a late answer is a wrong one.
    figures = report(Figures.of("hot reload under load", answers, timeline, writes=writes, **write_to_effect(driver)))
    check(figures, answers, writes)


# --- two replicas: the window between the leader's Active and the follower's load ---------------------------

LOG_LINE = re.compile(r"^\[(?P<at>[\d-]+ [\d:]+,\d+)\] \S+ \[\w+ *\] AdmissionPolicy (?P<policy>\S+): "
                      r"(?P<event>generation \d+ loaded|no longer enforced)")


def load_times(replica: OperatorProcess, names: Collection[str]) -> dict[tuple[str, str, int], float]:
    """(policy, event, its occurrence) → when the replica logged it: each load and unload of ``names``."""
    times: dict[tuple[str, str, int], float] = {}
    seen: Counter[tuple[str, str]] = Counter()
    for line in log_of(replica).splitlines():
        match = LOG_LINE.match(line)
        if match is None or match["policy"] not in names:
            continue
        key = (match["policy"], match["event"])
        seen[key] += 1
        times[(*key, seen[key])] = datetime.datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return times


def test_two_replicas_judge_by_their_generation_or_briefly_by_the_one_before(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    """The chart's HA shape: both replicas serve, each loads policies from its own watch, only the
    leader writes ``Active``. A request sent just after ``Active`` may meet the follower still on the
    generation before: counted apart as late, with its lag; every other answer as strict as with one."""
    selector = (SELECTOR_KEY, unique("reload-ha"))
    ns = namespace({selector[0]: selector[1]})
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector)
    names = [unique(f"reload-ha-p{i}") for i in range(3)]
    with replicas(cluster, operator, tmp_path, request, prefix="ap-e2e-reload-replica") as group:
        leader, follower = group.processes
        try:
            answers, writes = churn(cluster, ns, driver, names)
            served = [sum(requests_judged(replica, name) for name in names) for replica in group.processes]
        finally:
            driver.delete_all()   # while the replicas run: the leader releases the finalizers
        led, followed = load_times(leader, names), load_times(follower, names)
    # The window itself, from both logs: how much later the follower loaded (or unloaded) each write.
    delays = sorted(followed[key] - led[key] for key in led.keys() & followed.keys())
    figures = report(Figures.of(
        "hot reload under load (2 replicas)", answers, timeline, late=True, writes=writes, **write_to_effect(driver),
        evaluations_leader_follower=served, follower_load_delay_median_s=delays[len(delays) // 2] if delays else None,
        follower_load_delay_max_s=delays[-1] if delays else None))
    check(figures, answers, writes)
    assert all(served), f"a replica judged no request, so the window was not exercised: {figures.line()}"
