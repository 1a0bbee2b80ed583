"""Issue 12, scenario 4: the operator SIGKILLed and restarted while requests stream in.

test_e2e_operator_faults.py shows what a dead operator leaves behind, request by request; here
the same faults meet steady traffic, every answer judged against the policies in force (see
``traffic.py``), and after each restart the cluster is checked for anything half-written.

- One replica, failurePolicy ``Fail``: while it is dead every routed request is refused by the API
  server with "failed calling webhook" (an error, not a decision: it never carries a policy's
  verdict), policy writes are refused too, deletes are not; once it is back, nothing is wrong.
- One replica, failurePolicy ``Ignore``: while it is dead requests are allowed unjudged — the
  timeline records that window explicitly (a ``none`` generation at the kill, the policy's own
  generation again at the restart), so the judge accepts it there and nowhere else.
- Two peering replicas behind one address (the chart's Service, here replicas.TcpProxy):
  killing either fails only the calls already on a connection to it — the API server
  does not retry a webhook call and client-go does not retry a 500 — and a policy written while
  the reconciling replica is dead is reconciled once it is back.

After every restart: both webhook configurations present, every live policy routed and ``Active``
at its generation, nothing stuck with a finalizer after its deletion.
"""
from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from e2e_kube import (
    OWNED_LABEL,
    AdmissionPolicy,
    Cluster,
    MutatingWebhookConfiguration,
    OperatorProcess,
    ValidatingWebhookConfiguration,
    eventually,
    policy_body,
    unique,
)
from replicas import (
    BROKEN_CONNECTION,
    FAIL_WEBHOOK,
    IGNORE_WEBHOOK,
    POLICY_WEBHOOK,
    TcpProxy,
    reconciled,
    replicas,
    requests_judged,
    routed,
    webhooks,
)
from traffic import Figures, PolicyDriver, Sent, Timeline, Traffic, Variant, report, scaled

pytestmark = pytest.mark.e2e

SELECTOR_KEY = "e2e.policy-operator.dev/traffic"
PACE_S = 0.02   # per client: a dead Fail webhook refuses at once, and unpaced clients would spin


# --- what the cluster must hold after a restart -------------------------------------------------------------

def half_written(cluster: Cluster, url: str, drivers: Iterable[PolicyDriver]) -> list[str]:
    """What is not whole: a webhook configuration missing or not routing a live policy, or naming
    another address; a live policy not Active at its generation; a deleted one still there."""
    problems: list[str] = []
    name = cluster.settings.webhook_config_name
    configurations = {cls.kind: cluster.get(cls, name) for cls in (ValidatingWebhookConfiguration,
                                                                   MutatingWebhookConfiguration)}
    problems += [f"{kind} {name}: {answer}" for kind, answer in configurations.items() if not answer.ok]
    if problems:
        return problems
    hooks = [hook for answer in configurations.values() for hook in answer.obj.get("webhooks") or []]
    routes = routed(hooks)
    if "admissionpolicies" not in routes.get(POLICY_WEBHOOK, set()):
        problems.append(f"the policy webhook is not routed: {routes}")
    problems += [f"{hook['name']} calls {hook['clientConfig'].get('url')}, not {url}" for hook in hooks
                 if not str(hook["clientConfig"].get("url", "")).startswith(f"{url}/")]
    live = {policy: driver.failure_policy for driver in drivers for policy in driver.live}
    known = {policy for driver in drivers for policy in [*driver.live, *driver.timeline.generations]}
    # A Fail policy's resources go through the Fail webhook, and Ignore ones' too when both route them.
    carrier = FAIL_WEBHOOK if "Fail" in live.values() else IGNORE_WEBHOOK
    if live and "configmaps" not in routes.get(carrier, set()):
        problems.append(f"configmaps not routed by {carrier} for {sorted(live)}: {routes}")
    present = {item["metadata"]["name"]: item for item in cluster.items(AdmissionPolicy,
                                                                         label_selector=f"{OWNED_LABEL}=true")}
    for policy in sorted(known):
        item = present.get(policy)
        if policy not in live:
            if item is not None:
                problems.append(f"{policy} deleted, still there: finalizers {item['metadata'].get('finalizers')}")
            continue
        if item is None:
            problems.append(f"{policy} lost")
            continue
        status, generation = item.get("status") or {}, item["metadata"]["generation"]
        if status.get("observedGeneration") != generation or status.get("phase") != "Active":
            problems.append(f"{policy} at generation {generation}: {status.get('phase')} for "
                            f"{status.get('observedGeneration')}")
        if item["metadata"].get("deletionTimestamp"):
            problems.append(f"{policy} is being deleted")
    return problems


def assert_whole(cluster: Cluster, url: str, drivers: Iterable[PolicyDriver]) -> None:
    listed = list(drivers)
    eventually(lambda: half_written(cluster, url, listed), lambda problems: not problems,
               "the webhook configurations and policies to be whole after the restart", cluster.settings.timeout)


# --- figures ------------------------------------------------------------------------------------------------

def window(answers: Iterable[Sent], start: float, end: float) -> list[Sent]:
    """Answers to requests sent after ``start`` and answered before ``end``: wholly inside a window."""
    return [answer for answer in answers if answer.sent >= start and answer.answered <= end]


def failed_calls(answers: Iterable[Sent], webhook: str) -> list[Sent]:
    return [answer for answer in answers if answer.error and f'failed calling webhook "{webhook}"' in answer.message]


# --- one replica --------------------------------------------------------------------------------------------

def test_the_only_replica_killed_under_load_fails_closed_for_fail_policies(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str]) -> None:
    selector = (SELECTOR_KEY, unique("kill-fail"))
    ns = namespace({selector[0]: selector[1]})
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector)
    steady, edited, doomed = (unique(f"kill-{role}", limit=30) for role in ("steady", "edited", "doomed"))
    timeout = cluster.settings.timeout
    try:
        driver.submit(steady, Variant("Enforce"))
        driver.submit(edited, Variant("Warn"))
        driver.submit(doomed, Variant("Enforce", expression=1))
        driver.settle(timeout)
        with Traffic(cluster, ns, clients=4, pace=PACE_S) as traffic:
            traffic.wait(scaled(150), timeout)
            # An edit the API server accepted a moment before the kill: reconciled or not, it must
            # be Active at its generation after the restart.
            driver.submit(edited, Variant("Enforce", expression=2))
            killed = time.monotonic()
            assert operator.kill() == -9
            dead = time.monotonic()
            traffic.wait(scaled(100), timeout)
            # While dead: a policy write is refused by the policy webhook (failurePolicy Fail) ...
            refused = cluster.create(AdmissionPolicy, policy_body(
                unique("kill-while-dead"), match={"resources": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                                  "resources": ["secrets"], "operations": ["CREATE"]}]},
                validations=[{"expression": "true"}]))
            assert refused.status == 500 and f'failed calling webhook "{POLICY_WEBHOOK}"' in refused.message, (
                f"a policy written while the only replica is dead: {refused}")
            # ... a deletion is not: it waits, finalizer set, for the operator to come back.
            driver.remove(doomed)
            pending = cluster.get(AdmissionPolicy, doomed).obj["metadata"]
            assert pending.get("deletionTimestamp") and pending.get("finalizers"), pending
            restarting = time.monotonic()
            operator.start()   # until ready and reached by the API server
            back = time.monotonic()
            driver.settle(timeout)
            assert_whole(cluster, operator.url, [driver])
            traffic.wait(scaled(150), timeout)
            answers = traffic.stop()
    finally:
        if not operator.alive():
            operator.start()
        driver.delete_all()

    while_dead = window(answers, dead, restarting)
    errors = [answer for answer in answers if answer.error]
    figures = report(Figures.of(
        "operator killed, 1 replica, failurePolicy Fail", answers, timeline,
        dead_s=back - killed, sent_while_dead=len(while_dead),
        failed_calls_while_dead=len(failed_calls(while_dead, FAIL_WEBHOOK)),
        policy_write_while_dead=f"HTTP {refused.status}"))
    print(f"  a policy written while dead: {refused.message}")
    if errors:
        print(f"  e.g. {errors[0]}")
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert while_dead and all(a in errors for a in while_dead), (
        f"a request sent while the only replica was dead was answered: {[a for a in while_dead if not a.error][:3]}")
    assert failed_calls(errors, FAIL_WEBHOOK) == errors, f"other errors than failed webhook calls: {errors[:3]}"
    outside = [a for a in errors if a.answered < killed or a.sent > back]
    assert outside == [], f"errors outside the dead window: {outside[:3]}"


def test_the_only_replica_killed_under_load_lets_ignore_policies_pass_unjudged(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str]) -> None:
    selector = (SELECTOR_KEY, unique("kill-ignore"))
    ns = namespace({selector[0]: selector[1]})
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector, failure_policy="Ignore")
    policy = unique("kill-ignore", limit=30)
    timeout = cluster.settings.timeout
    try:
        generation = driver.submit(policy, Variant("Enforce"))
        driver.settle(timeout)
        routes = routed(webhooks(cluster, ValidatingWebhookConfiguration))
        # The premise: no Fail policy routes configmaps, else their calls would fail closed for it too.
        assert "configmaps" in routes.get(IGNORE_WEBHOOK, set()), routes
        assert "configmaps" not in routes.get(FAIL_WEBHOOK, set()), routes
        with Traffic(cluster, ns, clients=4, pace=PACE_S) as traffic:
            traffic.wait(scaled(150), timeout)
            # The dead window, explicit: from the kill the policy judges nothing ...
            unjudged = timeline.submitted(policy, generation.n, "none")
            assert operator.kill() == -9
            unjudged.ready = dead = time.monotonic()
            traffic.wait(scaled(100), timeout)
            # ... and from the restart, its generation again, certainly once ready and reached.
            again = timeline.submitted(policy, generation.n, generation.effect)
            restarting = again.submitted
            operator.start()
            again.ready = back = time.monotonic()
            assert_whole(cluster, operator.url, [driver])
            traffic.wait(scaled(150), timeout)
            answers = traffic.stop()
    finally:
        if not operator.alive():
            operator.start()
        driver.delete_all()

    while_dead = window(answers, dead, restarting)
    figures = report(Figures.of(
        "operator killed, 1 replica, failurePolicy Ignore", answers, timeline, dead_s=back - dead,
        allowed_unjudged_while_dead=sum(1 for a in while_dead if a.allowed and not a.tags())))
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert figures.errors == 0, figures.line()
    assert while_dead and all(a.allowed and not a.tags() for a in while_dead), figures.line()
    judged_after = [a for a in answers if a.sent > back]
    assert judged_after and all(a.denied for a in judged_after), "the restarted operator does not judge again"


# --- two replicas behind one address ------------------------------------------------------------------------

def kill_behind_proxy(proxy: TcpProxy, victim: OperatorProcess) -> dict[str, Any]:
    """SIGKILL ``victim``; what the API server had open to it then (its calls on those fail)."""
    port = victim.listen_port
    at = {"connections": proxy.connections[port], "open": proxy.open[port], "refused": proxy.refused[port]}
    killed = time.monotonic()
    assert victim.kill() == -9
    # Connections it took between the snapshot and its death; none after (it refuses, the proxy skips it).
    exposed = at["open"] + proxy.connections[port] - at["connections"]
    return {"killed": killed, "dead": time.monotonic(), "exposed": exposed, "port": port,
            "refused_before": at["refused"]}


def test_one_of_two_replicas_killed_under_load_fails_only_calls_in_flight(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    selector = (SELECTOR_KEY, unique("kill-ha"))
    ns = namespace({selector[0]: selector[1]})
    timeout = cluster.settings.timeout
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector)
    steady, late = unique("kill-ha-steady", limit=30), unique("kill-ha-late", limit=30)
    kills: list[dict[str, Any]] = []
    with replicas(cluster, operator, tmp_path, request, prefix="ap-e2e-kill-replica") as group:
        proxy, (leader, follower) = group.proxy, group.processes
        try:
            driver.submit(steady, Variant("Enforce"))
            driver.settle(timeout)
            with Traffic(cluster, ns, clients=4, pace=PACE_S) as traffic:
                traffic.wait(scaled(150), timeout)
                for victim in (follower, leader):
                    served = requests_judged(victim, steady)
                    kills.append(kill_behind_proxy(proxy, victim))
                    traffic.wait(scaled(100), timeout)   # served by the survivor alone
                    if victim is leader:
                        # Written while the reconciling replica is dead: the survivor's policy webhook
                        # admits it, and the restarted leader reconciles it.
                        driver.submit(late, Variant("Warn"))
                        traffic.wait(scaled(50), timeout)
                    refused_while_dead = proxy.refused[kills[-1]["port"]] - kills[-1]["refused_before"]
                    victim.start()
                    kills[-1].update(back=time.monotonic(), served=served, refused=refused_while_dead)
                    driver.settle(timeout)
                    assert_whole(cluster, leader.url, [driver])
                    traffic.wait(scaled(100), timeout)
                answers = traffic.stop()
            assert reconciled(leader, late), f"the restarted leader did not reconcile {late}"
        finally:
            driver.delete_all()

    errors = [answer for answer in answers if answer.error]
    exposed = sum(kill["exposed"] for kill in kills)
    figures = report(Figures.of(
        "operator killed, 1 of 2 replicas, failurePolicy Fail", answers, timeline,
        failed_calls_per_kill=[sum(1 for a in errors if kill["killed"] <= a.answered <= kill["back"])
                               for kill in kills],
        connections_open_to_the_killed=[kill["exposed"] for kill in kills],
        proxy_moved_on_from_the_dead=sum(kill["refused"] for kill in kills),
        dead_s=[round(kill["back"] - kill["killed"], 1) for kill in kills],
        served_before_kill=[kill["served"] for kill in kills]))
    for error in errors[:5]:
        print(f"  failed call: {error}")
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert proxy.unserved == 0, f"{proxy.unserved} connection(s) found no replica, though one was alive"
    assert all(kill["served"] > 0 for kill in kills), f"a killed replica had served nothing: {kills}"
    broken = [a for a in failed_calls(errors, FAIL_WEBHOOK) if BROKEN_CONNECTION.search(a.message)]
    assert broken == errors, f"errors other than calls cut by the kill: {[a for a in errors if a not in broken][:3]}"
    assert len(errors) <= exposed, f"more failed calls ({len(errors)}) than connections to the killed ({exposed})"
