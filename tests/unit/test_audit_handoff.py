"""What a replica that does not reconcile hands over to the one writing the reports
(operator/handoff.py), and how the audit lists a resource whose continue token expired."""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from admission_policy import reports
from admission_policy.cluster import listing
from admission_policy.cluster.discovery import DiscoveredResource
from admission_policy.config import OperatorConfig
from admission_policy.engine import AdmissionRequest, Decision, Finding, PolicyOutcome, PolicySet
from admission_policy.operator import audit, handoff, metrics
from admission_policy.operator.store import PolicyStore
from builders import object_request, policy, rule


def entry(name: str, seen: int, policy: str = "team", rule: str = "spec.validations[0]",
          namespace: str = "apps") -> reports.Entry:
    return reports.Entry(policy, rule, "warn", f"{name} needs a team", reports.ObjectRef(
        "v1", "ConfigMap", name, namespace), "Warn", seen, reports.ORIGIN_ADMISSION)


def test_admission_results_read_back_as_written_grouped_by_policy_and_object() -> None:
    written = handoff.by_object([entry("a", 10), entry("a", 10, rule="spec.validations[1]"), entry("b", 11),
                                 entry("a", 12, policy="other")])
    read = handoff.by_object(handoff.decode(handoff.encode(written)))
    assert read == written
    assert set(read["team"]) == {("ConfigMap", "apps", "a"), ("ConfigMap", "apps", "b")}
    assert [e.rule for e in read["team"]["ConfigMap", "apps", "a"][1]] == ["spec.validations[0]",
                                                                            "spec.validations[1]"]


def test_what_does_not_read_as_a_result_is_skipped() -> None:
    good = json.loads(handoff.encode(handoff.by_object([entry("a", 10)])))[0]
    text = json.dumps([good, {**good, "seen": "10"}, {"policy": "team"}, "text", {**good, "resource": None}])
    assert [e.ref.name for e in handoff.decode(text)] == ["a"]
    assert handoff.decode("not json") == [] and handoff.decode('{"a": 1}') == []


def test_the_newest_objects_are_kept_within_a_configmaps_size() -> None:
    many = handoff.by_object([entry(f"object-{i:05}", seen=i) for i in range(20_000)])
    text = handoff.encode(many)
    assert len(text) <= handoff.MAX_BYTES
    kept = handoff.decode(text)
    assert 1_000 < len(kept) < 20_000
    assert {e.seen for e in kept} == set(range(20_000 - len(kept), 20_000))


def test_the_configmap_name_is_a_valid_name_for_any_pod_name() -> None:
    assert handoff.configmap_name("operator-7d9f-x2") == "admission-results-operator-7d9f-x2"
    long = handoff.configmap_name("p" * 300)
    assert len(long) <= 253 and long.startswith("admission-results-ppp")


# --- listing page by page ---------------------------------------------------------------------------------

ITEMS = [("apps", "a"), ("apps", "b"), ("apps", "c"), ("db", "a"), ("db", "b")]
TARGET = DiscoveredResource("", "v1", "configmaps", "ConfigMap", True)


def page(start: int, token: str = "") -> dict[str, Any]:
    items = [{"metadata": {"namespace": ns, "name": name}} for ns, name in ITEMS[start:start + 2]]
    return {"kind": "ConfigMapList", "metadata": {"continue": token} if token else {}, "items": items}


async def listed(monkeypatch: pytest.MonkeyPatch, answer: Callable[[str], tuple[int, Any]]) -> list[str]:
    """What list_objects gives when the API server answers each continue token as ``answer`` does."""
    async def call_json(_: Any, method: str, path: str, *, query: list[tuple[str, str]]) -> tuple[int, Any]:
        return answer(dict(query).get("continue", ""))

    monkeypatch.setattr(listing, "call_json", call_json)
    given: AsyncIterator[tuple[Any, dict[str, Any]]] = listing.list_objects(
        None, OperatorConfig(audit_page_size=2), TARGET)  # type: ignore[arg-type]
    return [f"{item['metadata']['namespace']}/{item['metadata']['name']}" async for _, item in given]


EXPIRED = {"kind": "Status", "code": 410, "reason": "Expired", "message": "The provided continue parameter is too old"}
ALL = ["apps/a", "apps/b", "apps/c", "db/a", "db/b"]


async def test_an_expired_continue_token_is_followed_by_the_one_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {"": (200, page(0, "t1")), "t1": (410, {**EXPIRED, "metadata": {"continue": "n1"}}),
               "n1": (200, page(2, "t2")), "t2": (200, page(4))}
    assert await listed(monkeypatch, answers.__getitem__) == ALL


async def test_a_listing_started_over_gives_no_object_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a token offered, the listing starts over: what it gave before is not given again
    (it was, and a scan's counts and reports doubled)."""
    calls: list[str] = []

    def answer(token: str) -> tuple[int, Any]:
        calls.append(token)
        if token == "":   # the second start gets a fresh snapshot's tokens
            return 200, page(0, "t1" if calls.count("") == 1 else "u1")
        return {"t1": (410, EXPIRED), "u1": (200, page(2, "u2")), "u2": (200, page(4))}[token]

    assert await listed(monkeypatch, answer) == ALL
    assert calls == ["", "t1", "", "u1", "u2"]


# --- the auditor of a replica that does not reconcile ------------------------------------------------------

def admitted_configmap(name: str) -> AdmissionRequest:
    return object_request({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "apps"}})


def warned(policy: str = "team") -> Decision:
    outcome = PolicyOutcome(policy, "Warn", (Finding("spec.validations[0]", "needs a team"),))
    return Decision(allowed=True, outcomes=(outcome,))


def follower(monkeypatch: pytest.MonkeyPatch, *, written: bool = True,
             clock: Callable[[], float] = time.monotonic) -> tuple[audit.Auditor, list[handoff.Admissions]]:
    """An auditor whose replica does not reconcile, and what it publishes (no API server needed)."""
    store = PolicyStore()
    store.policies = PolicySet([policy("team", rules=[rule("configmaps", operations=["CREATE"])], enforcement="Warn",
                                       reportAdmission=True,
                                       validations=[{"expression": "false", "message": "needs a team"}])])

    async def reconciles() -> bool:
        return False

    auditor = audit.Auditor(None, OperatorConfig(audit_interval=60), store, None, reconciles,  # type: ignore[arg-type]
                            clock=clock)
    published: list[handoff.Admissions] = []

    async def publish(admissions: handoff.Admissions) -> bool:
        published.append({name: dict(kept) for name, kept in admissions.items()})
        return written

    monkeypatch.setattr(auditor.handoff, "publish", publish)
    return auditor, published


async def test_a_replica_that_does_not_reconcile_hands_its_admission_results_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It kept nothing before: its Audit/Warn failures reached the reports only at the next scan."""
    auditor, published = follower(monkeypatch)
    auditor.admitted(admitted_configmap("web"), warned())
    auditor.admitted(admitted_configmap("other"), warned("deleted-since"))   # a policy the store no longer holds
    await auditor.round()
    await auditor.round()   # nothing new: nothing written
    (handed,) = published
    assert list(handed) == ["team"]
    ((ref, entries),) = handed["team"].values()
    assert (ref.name, [(e.result, e.message, e.origin) for e in entries]) == (
        "web", [("warn", "needs a team", reports.ORIGIN_ADMISSION)])


async def test_handed_results_expire_once_a_scan_has_judged_them_and_gauges_go_with_leadership(
        monkeypatch: pytest.MonkeyPatch) -> None:
    auditor, published = follower(monkeypatch)
    auditor.admitted(admitted_configmap("web"), warned())
    now = time.time()
    monkeypatch.setattr(audit.time, "time", lambda: now + audit.HANDOFF_INTERVALS * 60 + audit.TICK + 1)
    # This replica led until now: the gauges it exported are the new leader's to export.
    auditor.leading = True
    auditor.scans["team"] = audit.Scan(1, 0.0, reports.Results(), {})
    metrics.audit_scanned("team", 5, 1, 0.1)
    await auditor.round()
    assert published == [{}]
    assert not auditor.leading and auditor.scans == {}
    assert metrics.REGISTRY.get_sample_value("admission_policy_audit_violations", {"policy": "team"}) is None


async def test_a_failed_hand_over_is_tried_again_later_not_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    auditor, published = follower(monkeypatch, written=False, clock=lambda: now[0])
    auditor.admitted(admitted_configmap("web"), warned())
    await auditor.round()
    await auditor.round()
    assert len(published) == 1
    now[0] += audit.HANDOFF_RETRY
    await auditor.round()
    assert len(published) == 2
