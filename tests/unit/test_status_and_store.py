"""The phase state machine and the store's rules for what gets enforced."""
from __future__ import annotations

import datetime
import logging
from typing import Any

import pytest

from admission_policy import api
from admission_policy.operator import conditions
from admission_policy.operator.conditions import Condition, Observation
from admission_policy.operator.store import FINALIZER, PolicyStore
from builders import CREATE_POD_RULE, policy_body

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
         deleting: bool = False, namespace: str = "") -> dict[str, Any]:
    """A policy as the store reads it from the cluster: a uid, a generation, our finalizer (unless
    ``finalizer`` is False: not added yet); with a ``namespace``, a NamespacedAdmissionPolicy."""
    metadata: dict[str, Any] = {"generation": generation, "uid": f"uid-{name}"}
    if finalizer:
        metadata["finalizers"] = [FINALIZER]
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if namespace:
        metadata["namespace"] = namespace
    found = policy_body(name, rules=[CREATE_POD_RULE], metadata=metadata, validations=[{"expression": expression}])
    return {**found, "kind": api.NAMESPACED_KIND} if namespace else found


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


def test_each_listing_forgets_only_policies_of_its_own_kind() -> None:
    """AdmissionPolicies and NamespacedAdmissionPolicies are listed apart: a listing of one kind
    says nothing of the other's policies, which stay enforced."""
    store = PolicyStore()
    store.observe(body("a", 1))
    store.observe(body("b", 1))
    store.observe(body("a", 1, namespace="team-a"))
    store.observe(body("b", 1, namespace="team-a"))
    store.sync({"team-a/b"}, namespaced=True)
    assert sorted(p.name for p in store.policies) == ["a", "b", "team-a/b"]
    store.sync({"b"})
    assert sorted(p.name for p in store.policies) == ["b", "team-a/b"]
    store.sync(set(), namespaced=True)
    assert [p.name for p in store.policies] == ["b"]


def test_a_tenant_policy_is_stored_under_its_namespace(caplog: pytest.LogCaptureFixture) -> None:
    """A NamespacedAdmissionPolicy may share its name with a cluster policy, or with one in another
    namespace: each is its own policy, deleted on its own, and logged with its kind."""
    caplog.set_level(logging.INFO)
    store = PolicyStore()
    for namespace in ("", "team-a", "team-b"):
        store.observe(body("p", 1, namespace=namespace))
    assert sorted(store.generations) == ["p", "team-a/p", "team-b/p"]
    assert store.uids["team-a/p"] == "uid-p" and store.policies.get("team-a/p") is not None
    store.observe(body("p", 1, namespace="team-a", deleting=True))
    assert sorted(p.name for p in store.policies) == ["p", "team-b/p"]
    said = [r.getMessage() for r in caplog.records]
    assert "AdmissionPolicy p: generation 1 loaded" in said
    assert "NamespacedAdmissionPolicy team-a/p: generation 1 loaded" in said
    assert any(m.startswith("NamespacedAdmissionPolicy team-a/p: no longer enforced") for m in said), said


def test_a_tenant_policy_calling_a_plugin_not_allowed_is_rejected_by_the_store() -> None:
    """One written while the operator was down (the webhook would have refused it) is never
    enforced; the store says why, naming the field."""
    plugin = {"plugin": {"name": "image-references", "config": {"allowedRegistries": ["registry.acme.com"]}}}
    tenant = body("p", 1, namespace="team-a")
    tenant["spec"]["validations"] = [plugin]
    store = PolicyStore()
    store.observe(tenant)
    assert len(store.policies) == 0 and "spec.validations[0].plugin" in store.rejected["team-a/p"].message
    allowing = PolicyStore(tenant_plugins=("image-references",))
    allowing.observe(tenant)
    assert [p.name for p in allowing.policies] == ["team-a/p"]


@pytest.mark.parametrize("listed", [(), ("policies_loaded",), ("tenant_policies_loaded",)])
def test_ready_needs_both_listings(listed: tuple[str, ...]) -> None:
    """Serving before the tenants' policies are listed would admit what they deny."""
    store = PolicyStore()
    store.readiness.listening.set()
    for event in listed:
        getattr(store.readiness, event).set()
    assert not store.readiness.ready
    store.readiness.policies_loaded.set()
    store.readiness.tenant_policies_loaded.set()
    assert store.readiness.ready


async def test_waiting_for_registration() -> None:
    store = PolicyStore()
    assert not await store.registration.wait_routed("p", 1, timeout=0.05)
    await store.registration.mark_written({"p": 2})
    assert await store.registration.wait_routed("p", 1, timeout=0.05)
    assert not await store.registration.wait_unrouted("p", timeout=0.05)
    await store.registration.mark_written({})
    assert await store.registration.wait_unrouted("p", timeout=0.05)


def test_lost_registration_is_pending_not_degraded_and_not_ready() -> None:
    lost = Observation(Condition("Compiled", "True", "Compiled", "ok"),
                       Condition("Registered", "False", conditions.REGISTRATION_LOST, "gone"))
    assert lost.phase == "Pending"
    assert lost.ready == Condition("Ready", "False", conditions.REGISTRATION_LOST, "gone")


def test_conditions_are_read_back_from_a_status() -> None:
    status = conditions.status_patch(None, observation("True", "True"), 3, T0)
    assert conditions.from_status(status, "Registered") == Condition("Registered", "True", "R2", "m2")
    assert conditions.from_status({}, "Registered") is None


async def test_a_lost_registration_unroutes_everything_until_the_next_write() -> None:
    store = PolicyStore()
    await store.registration.mark_written({"p": 2})
    changed = store.registration.changed()
    await store.registration.mark_lost("ValidatingWebhookConfiguration x is missing")
    assert changed.is_set() and not store.registration.changed().is_set()
    assert store.registration.lost == "ValidatingWebhookConfiguration x is missing"
    assert not await store.registration.wait_routed("p", 2, timeout=0.05)
    changed = store.registration.changed()
    await store.registration.mark_written({"p": 2})
    assert changed.is_set() and store.registration.lost == ""
    assert await store.registration.wait_routed("p", 2, timeout=0.05)
    # A write that changes nothing wakes no one.
    changed = store.registration.changed()
    await store.registration.mark_written({"p": 2})
    assert not changed.is_set()


def test_only_the_first_live_peer_reconciles() -> None:
    """The rule by which Kopf pauses replicas, read from the ClusterKopfPeering's status."""
    from admission_policy.operator.peering import first_in_peering

    def peer(priority: int, seen: datetime.datetime, lifetime: int = 60) -> dict[str, Any]:
        return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}

    assert first_in_peering({"me": peer(5, T0)}, 5, T0)
    assert first_in_peering({"me": peer(5, T0), "other": peer(3, T0)}, 5, T0)
    assert not first_in_peering({"me": peer(5, T0), "other": peer(7, T0)}, 5, T0)
    assert not first_in_peering({"me": peer(5, T0), "twin": peer(5, T0)}, 5, T0)   # Kopf pauses both
    assert first_in_peering({"me": peer(5, T1), "gone": peer(7, T0, lifetime=60)}, 5, T1)
    assert first_in_peering({}, 5, T0)
