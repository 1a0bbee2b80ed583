"""Steady admission traffic through the real API server, and a verdict on every answer it gets.

The reliability scenarios (issue 12) all ask the same question of every request sent while a
fault is injected: was it answered as the policies said *at that moment*? Three pieces answer it:

- :class:`Traffic`: client threads, each sending dry-run creates of ConfigMaps as fast as they are
  answered (dry run: admission runs in full, nothing is stored, so 20k requests leave no trace);
- :class:`Timeline`: what each policy was and when — every write the test makes, and when the
  operator reported it ``Active`` (or, for a delete, when the object was gone);
- :func:`judge`: each answer against the generations that could have judged it. Every message a
  generation produces carries its tag ``[policy#n]``, so the answer says which one judged it.

A generation *must* judge a request sent after it was seen ``Active`` (and before the next write
of that policy); a request in flight across a write may be judged by either side, but by one
generation only. After a delete is seen complete, the policy judges nothing. With several
replicas, each loads policies from its own watch while only the leader reports ``Active``: an
answer judged by the generation just before is "late" (:func:`verdict`), and a scenario with
replicas may count those apart (``Figures.of(..., late=True)``) with how long after ``Active`` they came.

Scale: ``RELIABILITY_SCALE`` (default 1, the bounded form CI runs) multiplies request counts and
durations; ``reliability/run.py`` runs the same scenarios longer and collects their figures.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import pykube
import requests
from e2e_kube import OWNED_LABEL, AdmissionPolicy, Answer, Cluster, eventually, policy_body

import builders

SCALE = float(os.environ.get("RELIABILITY_SCALE", "").strip() or 1)

Effect = Literal["deny", "warn", "none"]
TAG = re.compile(r"\[(?P<policy>[a-z0-9-]+)#(?P<n>\d+)\]")


def scaled(count: float) -> int:
    """``count`` at the run's scale (at least 1)."""
    return max(1, math.ceil(count * SCALE))


# --- traffic ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Sent:
    """One request and what came back: an HTTP answer (``status``), or none at all (``status`` 0)."""
    client: int
    sent: float                 # time.monotonic() when the request left
    answered: float
    status: int
    message: str
    warnings: tuple[str, ...]
    retry_after: bool           # the API server asked the client to retry

    @property
    def allowed(self) -> bool:
        return 200 <= self.status < 300

    @property
    def denied(self) -> bool:
        """Refused by one of our policies (not an error calling the webhook)."""
        return self.status in (400, 403, 422) and "denied the request" in self.message

    @property
    def error(self) -> bool:
        return not self.allowed and not self.denied

    @property
    def hidden_by_retry(self) -> bool:
        """An error client-go retries by itself (429, or any answer with Retry-After); other errors
        reach kubectl users, and controllers only hide them by requeueing their work."""
        return self.error and (self.status == 429 or self.retry_after)

    def tags(self) -> list[tuple[str, int, str]]:
        """(policy, n, where) of every generation tag in the answer; where: "message" or "warning"."""
        found = [(m["policy"], int(m["n"]), "message") for m in TAG.finditer(self.message)] if self.denied else []
        for warning in self.warnings:
            found += [(m["policy"], int(m["n"]), "warning") for m in TAG.finditer(warning)]
        return found

    def __str__(self) -> str:
        return (f"client {self.client} at {self.sent:.3f}-{self.answered:.3f}: HTTP {self.status} "
                f"{self.message[:300]!r} warnings={list(self.warnings)}")


def configmap(namespace: str, name: str) -> dict[str, Any]:
    """The object each request of the traffic creates (``Traffic``'s default ``body``)."""
    return builders.configmap(name, namespace=namespace, data={"payload": "x"})


class Traffic:
    """``clients`` threads sending dry-run ConfigMap creates into ``namespace`` until stopped or
    ``limit`` requests are sent; every answer is kept (:attr:`answers`).

    Each client has its own connection (its own pykube session), as separate kubectl users or
    controllers would. Used as a context manager: started on entry, stopped on exit.
    """

    def __init__(self, cluster: Cluster, namespace: str, *, clients: int = 4, limit: int | None = None,
                 pace: float = 0.0, body: Callable[[str, str], dict[str, Any]] = configmap) -> None:
        """``pace``: seconds each client waits before each request (0: as fast as answered)."""
        self.cluster, self.namespace, self.clients, self.limit, self.body = cluster, namespace, clients, limit, body
        self.pace = pace
        self.answers: list[Sent] = []
        self._lock = threading.Lock()
        self._sent = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failures: list[BaseException] = []

    def __enter__(self) -> Traffic:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        for client in range(self.clients):
            thread = threading.Thread(target=self._run, args=(client,), name=f"traffic-{client}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> list[Sent]:
        self._stop.set()
        for thread in self._threads:
            thread.join(40)   # Cluster's client waits 30 s for an answer
        if self._failures:
            raise AssertionError(f"a traffic client failed: {self._failures[0]!r}") from self._failures[0]
        return self.answers

    @property
    def done(self) -> bool:
        return self._stop.is_set() or not any(thread.is_alive() for thread in self._threads)

    def wait(self, count: int, timeout: float) -> None:
        """Until ``count`` more answers are in (the traffic is really flowing), or fail."""
        target = len(self.answers) + count
        eventually(lambda: len(self.answers), lambda n: n >= target or self.done,
                   f"{count} answers from the traffic", timeout, interval=0.1)

    def wait_finished(self, timeout: float) -> list[Sent]:
        """Until all ``limit`` requests are answered."""
        eventually(lambda: self.done, bool, "the traffic to finish", timeout, interval=0.2)
        return self.stop()

    def _next(self) -> int | None:
        with self._lock:
            if self._stop.is_set() or (self.limit is not None and self._sent >= self.limit):
                return None
            self._sent += 1
            return self._sent

    def _run(self, client: int) -> None:
        try:
            own = Cluster(self.cluster.settings)   # its own session: its own connection
            while (seq := self._next()) is not None:
                if self.pace:
                    time.sleep(self.pace)
                self._record(client, *_send(own, self.body(self.namespace, f"t-{client}-{seq}")))
        except BaseException as exc:   # reported by stop(), not lost in a thread
            self._failures.append(exc)

    def _record(self, client: int, sent: float, answer: Answer | None, error: str) -> None:
        answered = time.monotonic()
        if answer is None:
            result = Sent(client, sent, answered, 0, error, (), False)
        else:
            retry = isinstance(answer.body, dict) and bool((answer.body.get("details") or {}).get("retryAfterSeconds"))
            result = Sent(client, sent, answered, answer.status, answer.message, tuple(answer.warnings), retry)
        with self._lock:
            self.answers.append(result)


def _send(cluster: Cluster, body: Mapping[str, Any]) -> tuple[float, Answer | None, str]:
    sent = time.monotonic()
    try:
        return sent, cluster.call("POST", pykube.ConfigMap, namespace=body["metadata"]["namespace"], body=body,
                                  params={"dryRun": "All"}), ""
    except requests.RequestException as exc:
        return sent, None, f"no answer: {exc!r}"


# --- what each policy was, when -----------------------------------------------------------------------------

@dataclasses.dataclass
class Generation:
    """One write of a policy, as the traffic sees it: what it does to the traffic's requests."""
    policy: str
    n: int                       # the tag's number; 0 is "not there" (before creation, after deletion)
    effect: Effect
    submitted: float
    ready: float | None = None   # when seen Active at this generation (deleted: seen gone)

    @property
    def expected(self) -> tuple[int, str] | None:
        """The tag this generation leaves on an answer, and where."""
        return {"deny": (self.n, "message"), "warn": (self.n, "warning"), "none": None}[self.effect]


class Timeline:
    """Every generation of every policy the scenario writes, in order."""

    def __init__(self) -> None:
        self.generations: dict[str, list[Generation]] = {}
        self._lock = threading.Lock()

    def submitted(self, policy: str, n: int, effect: Effect) -> Generation:
        """Record a write just before it is sent (a request may meet it from that moment on)."""
        generation = Generation(policy, n, effect, time.monotonic())
        with self._lock:
            self.generations.setdefault(policy, [Generation(policy, 0, "none", -math.inf, -math.inf)])
            self.generations[policy].append(generation)
        return generation

    def candidates(self, policy: str, sent: float, answered: float) -> list[Generation]:
        """The generations that may have judged a request in flight from ``sent`` to ``answered``:
        the last one seen ready before it left, and every one written before it came back."""
        history = self.generations[policy]
        start = self._newest_ready(history, sent)
        return [history[start], *(g for g in history[start + 1:] if g.submitted < answered)]

    def superseded(self, policy: str, sent: float) -> tuple[Generation, Generation] | None:
        """The generation in effect just before the newest one seen ready by ``sent``, and that newest
        one (None before the first write): what a replica that has not caught up yet still applies."""
        history = self.generations[policy]
        start = self._newest_ready(history, sent)
        return (history[start - 1], history[start]) if start > 0 else None

    @staticmethod
    def _newest_ready(history: list[Generation], sent: float) -> int:
        return max(i for i, g in enumerate(history) if g.ready is not None and g.ready <= sent)


def judge(answer: Sent, timeline: Timeline) -> str | None:
    """Why ``answer`` is not what the policies said while it was in flight; None when it is.

    An error (no answer from the webhook) is not a decision and is counted apart; but an error
    that still carries a tag, or a denial nobody could have made, is wrong.
    """
    return verdict(answer, timeline)[0]


def verdict(answer: Sent, timeline: Timeline) -> tuple[str | None, float | None]:
    """:func:`judge`'s reason, and for an answer that is wrong only because it was judged by the
    generation in effect just before the newest one seen ready when it was sent (a replica that had
    not loaded the newer one yet), its lag: seconds from that newer one seen ready to the request."""
    by_policy: dict[str, list[tuple[int, str]]] = {}
    for policy, n, where in answer.tags():
        by_policy.setdefault(policy, []).append((n, where))
    for policy in by_policy:
        if policy not in timeline.generations:
            return f"tagged by {policy}, which the scenario never wrote: {answer}", None
    if answer.error:
        return None, None
    if answer.denied and not by_policy:
        return f"denied, but by no generation of any policy: {answer}", None
    why: str | None = None
    lags: list[float] = []
    for policy, history in timeline.generations.items():
        seen = by_policy.get(policy, [])
        if not seen and all(g.effect == "none" for g in history):
            continue   # never touches the traffic (most of a soak's policies): nothing to check
        if len({n for n, _ in seen}) > 1:
            return f"judged by two generations of {policy} at once: {answer}", None
        observed = seen[0] if seen else None
        candidates = timeline.candidates(policy, answer.sent, answer.answered)
        if observed not in [g.expected for g in candidates]:
            expected = ", ".join(f"#{g.n} ({g.effect})" for g in candidates)
            here = f"{policy}: the answer fits none of {expected}: {answer}"
            superseded = timeline.superseded(policy, answer.sent)
            if superseded is None or observed != superseded[0].expected:
                return here, None
            why = why or here
            lags.append(answer.sent - (superseded[1].ready or answer.sent))
    return why, (max(lags) if why is not None else None)


# --- policies the scenario drives ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Variant:
    """One shape of a traffic policy: does it select the traffic, fail it, and how does it enforce."""
    enforcement: Literal["Enforce", "Warn"] = "Enforce"
    matched: bool = True         # namespaceSelector selects the traffic's namespace
    failing: bool = True         # the validations fail for the traffic's ConfigMaps
    expression: int = 0          # which of several equivalent expressions: a changed program

    @property
    def effect(self) -> Effect:
        if not (self.matched and self.failing):
            return "none"
        return "deny" if self.enforcement == "Enforce" else "warn"


FAILING = ["object.metadata.name.startsWith('never-')", "!('payload' in object.data)",
           "size(object.data.payload) > 5", "object.metadata.?labels.orValue({}).size() > 0"]


def traffic_policy(name: str, n: int, variant: Variant, selector: tuple[str, str],
                   failure_policy: str = "Fail") -> dict[str, Any]:
    """A policy on ConfigMap creates whose every message carries the tag ``[name#n]``.

    Two validations, so that a policy judged half by one generation and half by another would
    show two tags in one answer.
    """
    key, value = selector
    expression = FAILING[variant.expression % len(FAILING)] if variant.failing else "true"
    tag = f"[{name}#{n}]"
    return policy_body(
        name, enforcement=variant.enforcement, failurePolicy=failure_policy,
        match={"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                              "operations": ["CREATE"]}],
               "namespaceSelector": {"matchLabels": {key: value if variant.matched else f"{value}-not"}}},
        validations=[{"expression": expression, "message": f"{tag} first check"},
                     {"expression": expression, "message": f"{tag} second check"}])


class PolicyDriver:
    """Writes traffic policies and records each write in the timeline, with when it took effect.

    ``submit``/``remove`` write at once (recorded in the timeline just before the request leaves);
    ``settle`` then lists the policies until every pending write is seen ``Active`` at its
    generation (a delete: gone) and marks it ready — a little later than it was, which only widens
    the window where either generation may judge. ``write``/``delete``: one of each, settled.
    """

    def __init__(self, cluster: Cluster, timeline: Timeline, selector: tuple[str, str],
                 failure_policy: str = "Fail") -> None:
        self.cluster, self.timeline, self.selector = cluster, timeline, selector
        self.failure_policy = failure_policy
        self.counter = 0
        self.live: dict[str, Variant] = {}
        self.readiness: list[float] = []   # seconds from each write to seen in effect
        self.pending: dict[str, tuple[Generation, int | None]] = {}   # name → (generation, metadata.generation)

    def write(self, name: str, variant: Variant) -> Generation:
        """Create or replace ``name`` as ``variant``; returns once the operator reports it Active."""
        generation = self.submit(name, variant)
        self.settle(self.cluster.settings.timeout)
        return generation

    def delete(self, name: str) -> Generation:
        """Delete ``name``; returns once the object is gone (its finalizer released)."""
        generation = self.remove(name)
        self.settle(self.cluster.settings.timeout)
        return generation

    def submit(self, name: str, variant: Variant) -> Generation:
        """Create or edit ``name`` as ``variant``, without waiting for it to take effect."""
        self.counter += 1
        body = traffic_policy(name, self.counter, variant, self.selector, self.failure_policy)
        generation = self.timeline.submitted(name, self.counter, variant.effect)
        if name in self.live:
            answer = self.cluster.merge_patch(AdmissionPolicy, name, {"spec": body["spec"]})
        else:
            answer = self.cluster.create(AdmissionPolicy, body)
        assert answer.ok, f"writing AdmissionPolicy {name} failed: {answer}"
        self.live[name] = variant
        self.pending[name] = (generation, answer.obj["metadata"]["generation"])
        return generation

    def remove(self, name: str) -> Generation:
        """Delete ``name``, without waiting for it to go."""
        generation = self.timeline.submitted(name, 0, "none")
        self.cluster.delete(AdmissionPolicy, name)
        self.pending[name] = (generation, None)
        del self.live[name]
        return generation

    def settle(self, timeout: float) -> None:
        """Until every pending write is Active at its generation and every pending delete is gone."""
        deadline = time.monotonic() + timeout
        while self.pending:
            listing = self.cluster.items(AdmissionPolicy, label_selector=f"{OWNED_LABEL}=true")
            now = time.monotonic()
            present = {item["metadata"]["name"]: item for item in listing}
            for name, (generation, expected) in list(self.pending.items()):
                if expected is None:
                    done = name not in present
                else:
                    status = (present.get(name) or {}).get("status") or {}
                    if status.get("observedGeneration") == expected:
                        assert status.get("phase") not in ("Failed", "Degraded"), f"AdmissionPolicy {name}: {status}"
                    done = status.get("observedGeneration") == expected and status.get("phase") == "Active"
                if done:
                    generation.ready = now
                    self.readiness.append(now - generation.submitted)
                    del self.pending[name]
            if not self.pending:
                return
            if now >= deadline:
                stuck = {name: (present.get(name) or {}).get("status") if expected is not None else
                         f"still there, finalizers {(present.get(name) or {}).get('metadata', {}).get('finalizers')}"
                         for name, (_, expected) in list(self.pending.items())[:5]}
                raise AssertionError(f"after {timeout:.0f}s, {len(self.pending)} write(s) not in effect, e.g. {stuck}")
            time.sleep(0.05 if len(self.pending) == 1 else 0.2 if len(present) < 300 else 0.5)

    def delete_all(self) -> None:
        """Delete every live policy and wait until all are gone (a test's cleanup)."""
        for name in list(self.live):
            self.remove(name)
        self.settle(self.cluster.settings.timeout + 0.05 * len(self.pending))


# --- figures ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Figures:
    """What a scenario reports: requests, right and wrong decisions, errors and whether a retry hides them."""
    scenario: str
    sent: int = 0
    right: int = 0
    wrong: int = 0
    errors: int = 0
    hidden_by_retry: int = 0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    wrong_examples: list[str] = dataclasses.field(default_factory=list)
    # With ``late=True`` (several replicas, each loading policies from its own watch): answers judged
    # by the generation just before the newest one seen Active, counted apart with their lag.
    late: int = 0
    late_lags: list[float] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, scenario: str, answers: Iterable[Sent], timeline: Timeline | None = None, *, late: bool = False,
           **extra: Any) -> Figures:
        figures = cls(scenario, extra=dict(extra))
        for answer in answers:
            figures.sent += 1
            why, lag = verdict(answer, timeline) if timeline is not None else (None, None)
            if late and lag is not None:
                figures.late += 1
                figures.late_lags.append(lag)
            elif why is not None:
                figures.wrong += 1
                if len(figures.wrong_examples) < 5:
                    figures.wrong_examples.append(why)
            elif answer.error:
                figures.errors += 1
                figures.hidden_by_retry += answer.hidden_by_retry
            else:
                figures.right += 1
        if late:   # among the extra figures, so that reliability/run.py's summary shows them too
            lags = sorted(figures.late_lags)
            figures.extra.update(late=figures.late, late_lag_median_s=lags[len(lags) // 2] if lags else None,
                                 late_lag_max_s=lags[-1] if lags else None)
        return figures

    def line(self) -> str:
        extra = "".join(f", {key} {_format(value)}" for key, value in self.extra.items())
        return (f"{self.scenario}: {self.sent} sent, {self.right} answered as the policies said, "
                f"{self.wrong} wrong, {self.errors} errors ({self.hidden_by_retry} hidden by client-go's retry, "
                f"{self.errors - self.hidden_by_retry} seen by kubectl){extra}")


REPORTED: list[Figures] = []


def report(figures: Figures) -> Figures:
    """Print the figures, keep them for the session's summary, and append them to
    ``$RELIABILITY_REPORT`` (JSON lines) when set, for ``reliability/run.py``."""
    REPORTED.append(figures)
    print(figures.line())
    target = os.environ.get("RELIABILITY_REPORT", "").strip()
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(json.dumps({**dataclasses.asdict(figures), "scale": SCALE}) + "\n")
    return figures


def _format(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
