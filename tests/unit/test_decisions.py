"""Decision log lines: what an INFO line says, the per-policy rate limit, DEBUG for everything."""
from __future__ import annotations

import functools
import logging

import pytest

import builders
from admission_policy.engine import Decision, Finding, PolicyOutcome
from admission_policy.operator.decisions import DecisionLog

LOGGER = "admission_policy.operator.decisions"


# Each request logged here: alice creating Pod team-a/web.
request = functools.partial(builders.request, builders.pod(namespace="team-a"), kind="Pod", name="web",
                            namespace="team-a", user_info={"username": "alice"})


def denied(policy: str = "p", message: str = "no") -> Decision:
    outcome = PolicyOutcome(policy, "Enforce", (Finding("spec.validations[0]", message),), denied=True)
    return Decision(allowed=False, code=403, outcomes=(outcome,))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def info_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


def test_each_verdict_is_one_info_line_naming_policy_object_user_and_message(
        caplog: pytest.LogCaptureFixture) -> None:
    log = DecisionLog()
    decision = Decision(allowed=True, outcomes=(
        PolicyOutcome("warn-team", "Warn", (Finding("spec.validations[0]", "pods need a team"),)),
        PolicyOutcome("audit-images", "Audit", (Finding("spec.validations[0]", "pin images"),)),
        PolicyOutcome("lenient", "Enforce", errors=("no such key: labels",)),
        PolicyOutcome("quiet", "Enforce"),
        PolicyOutcome("label", "Enforce", mutated=True),
    ))
    with caplog.at_level(logging.INFO, LOGGER):
        log.record(request(), denied("deny-x", "bad\nname"), "validate")
        log.record(request(dryRun=True, sub_resource="exec"), decision, "validate")
    assert info_lines(caplog) == [
        "AdmissionPolicy deny-x: denied CREATE Pod team-a/web by alice: bad\\nname",
        "AdmissionPolicy warn-team: warned CREATE Pod team-a/web (pods/exec) by alice (dry run): pods need a team",
        "AdmissionPolicy audit-images: audited CREATE Pod team-a/web (pods/exec) by alice (dry run): pin images",
        "AdmissionPolicy lenient: could not evaluate (ignored, failurePolicy Ignore) CREATE Pod team-a/web "
        "(pods/exec) by alice (dry run): no such key: labels",
    ]


def test_a_flood_is_rate_limited_per_policy_and_the_suppressed_lines_are_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = DecisionLog(burst=3, window=60.0, clock=clock)
    with caplog.at_level(logging.INFO, LOGGER):
        for _ in range(10):
            log.record(request(), denied("flood"), "validate")
        log.record(request(), denied("other"), "validate")   # another policy has its own budget
        clock.now += 30
        log.flush()                                            # the window has not ended: nothing yet
        clock.now += 31
        log.record(request(), denied("flood"), "validate")    # a new window: logged, after the count
        clock.now += 61
        log.flush()
    lines = info_lines(caplog)
    flood = "AdmissionPolicy flood: denied CREATE Pod team-a/web by alice: no"
    assert lines == [flood] * 3 + [
        "AdmissionPolicy other: denied CREATE Pod team-a/web by alice: no",
        "AdmissionPolicy flood: 7 more decision line(s) suppressed in 61s (at most 3 per 60s per policy)",
        flood,
    ]


def test_every_decision_is_a_debug_line_and_nothing_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    log = DecisionLog()
    with caplog.at_level(logging.DEBUG, LOGGER):
        log.record(request(namespace=""), Decision(allowed=True), "mutate")
        log.record(request(), denied(), "validate")
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == ["Admission CREATE Pod web by alice via mutate: allowed, no policy matched",
                     "Admission CREATE Pod team-a/web by alice via validate: denied (403): p denied"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, LOGGER):
        log.record(request(), denied(), "validate")
    assert caplog.records == []


def test_a_long_message_is_cut() -> None:
    from admission_policy.operator.decisions import MAX_MESSAGE, _clean
    assert len(_clean("x" * 10_000)) == MAX_MESSAGE + 1
