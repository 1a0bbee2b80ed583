"""The phase state machine and the store's rules for what gets enforced."""
from __future__ import annotations

import datetime
from typing import Any

import pytest

from admission_policy.operator import conditions
from admission_policy.operator.conditions import Condition, Observation
from admission_policy.operator.store import FINALIZER, PolicyStore

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def observation(compiled: str, registered: str) -> Observation:
    return Observation(Condition("Compiled", compiled, "R1", "m1"),  # type: ignore[arg-type]
                       Condition("Registered", registered, "R2", "m2"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("compiled", "registered", "phase", "ready"), [
    ("Unknown", "Unknown", "Pending", "Unknown"),
    ("True", "Unknown", "Pending", "Unknown"),
    ("True", "True", "Active", "True"),
    ("True", "False", "Degraded", "False"),
    ("False", "Unknown", "Failed", "False"),
])
def test_phase_summarises_conditions(compiled: str, registered: str, phase: str, ready: str) -> None:
    seen = observation(compiled, registered)
    assert seen.phase == phase
    assert seen.ready.status == ready


def test_ready_explains_what_blocks_it() -> None:
    ready = observation("True", "False").ready
    assert (ready.reason, ready.message) == ("R2", "m2")


def test_transition_time_moves_only_when_a_status_changes() -> None:
    first = conditions.status_patch(None, observation("True", "Unknown"), 1, T0)
    second = conditions.status_patch(first, observation("True", "True"), 2, T1)
    by_type = {c["type"]: c for c in second["conditions"]}
    assert by_type["Compiled"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert by_type["Registered"]["lastTransitionTime"] == "2026-01-01T00:05:00Z"
    assert all(c["observedGeneration"] == 2 for c in second["conditions"])
    assert second["phase"] == "Active" and second["observedGeneration"] == 2


def test_terminating_keeps_the_other_conditions() -> None:
    active = conditions.status_patch(None, observation("True", "True"), 3, T0)
    terminating = conditions.terminating_patch(active, T1)
    by_type = {c["type"]: c for c in terminating["conditions"]}
    assert terminating["phase"] == "Terminating"
    assert by_type["Ready"]["status"] == "False" and by_type["Ready"]["reason"] == "Terminating"
    assert by_type["Compiled"]["status"] == "True"


def body(name: str, generation: int, expression: str = "true", finalizer: bool = True,
         deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "generation": generation, "uid": f"uid-{name}"}
    if finalizer:
        metadata["finalizers"] = [FINALIZER]
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicy", "metadata": metadata,
            "spec": {"match": {"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                              "operations": ["CREATE"]}]},
                     "validations": [{"expression": expression}]}}


def test_a_policy_is_enforced_only_once_the_finalizer_is_on() -> None:
    store = PolicyStore()
    store.observe(body("p", 1, finalizer=False))
    assert len(store.policies) == 0 and not store.changed.is_set()
    store.observe(body("p", 1))
    assert [p.name for p in store.policies] == ["p"] and store.changed.is_set()


def test_a_broken_generation_keeps_the_last_good_one() -> None:
    store = PolicyStore()
    store.observe(body("p", 1, "object.metadata.name == 'a'"))
    first = store.policies
    store.observe(body("p", 2, "object.metadata.name =="))
    assert store.policies is first and store.generations["p"] == 1
    assert store.rejected["p"].generation == 2 and "spec.validations[0].expression" in store.rejected["p"].message
    store.observe(body("p", 3, "true"))
    assert store.generations["p"] == 3 and "p" not in store.rejected


def test_replays_change_nothing_and_deletion_unloads() -> None:
    store = PolicyStore()
    store.observe(body("p", 1))
    loaded = store.policies
    store.changed.clear()
    store.observe(body("p", 1))
    assert store.policies is loaded and not store.changed.is_set()
    store.observe(body("p", 1, deleting=True))
    assert len(store.policies) == 0 and store.changed.is_set()


def test_sync_forgets_policies_deleted_while_not_watching() -> None:
    store = PolicyStore()
    store.observe(body("a", 1))
    store.observe(body("b", 1))
    store.sync({"b"})
    assert [p.name for p in store.policies] == ["b"]


async def test_waiting_for_registration() -> None:
    store = PolicyStore()
    assert not await store.wait_registered("p", 1, timeout=0.05)
    await store.mark_registered({"p": 2})
    assert await store.wait_registered("p", 1, timeout=0.05)
    assert not await store.wait_unregistered("p", timeout=0.05)
    await store.mark_registered({})
    assert await store.wait_unregistered("p", timeout=0.05)
