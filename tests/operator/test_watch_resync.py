"""The policy watcher resuming into a 410 Gone (issue 12, scenario 3, at unit level), and a stalled watch.

A watch that ends cleanly is resumed from the last resourceVersion; when history has been
compacted past it meanwhile, the API server answers 410 Gone and the watcher lists again. What
changed while it was not watching must then be right: a policy that still exists stays enforced
(never dropped and reloaded), one deleted meanwhile is forgotten, one edited meanwhile is loaded
at its new generation. The emulator compacts like etcd (``Emulator.compact``); here the
watcher's next watch request is also held back for a moment, so that the changes land while no
watch is open.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import kmock
import pytest
from emulator import ADMISSION_POLICIES, Emulator, wait_for
from kubernetes_asyncio import client
from outages import Outage, refuse, stalled

from admission_policy.cluster import watch as cluster_watch
from admission_policy.cluster.client import new_api_client
from admission_policy.operator import watcher
from admission_policy.operator.store import FINALIZER, ExceptionStore, PolicyStore
from builders import policy_body


def enforced_policy(name: str, expression: str) -> dict[str, Any]:
    """As the operator leaves a policy it enforces: with its finalizer."""
    return policy_body(name, metadata={"finalizers": [FINALIZER]},
                       validations=[{"expression": expression, "message": f"{name} says no"}])


def policy_lists(emulator: Emulator) -> int:
    policies = kmock.resource(ADMISSION_POLICIES)
    return sum(r.action == kmock.action.LIST and r.resource == policies for r in emulator.kmock)


async def test_a_watch_resumed_into_410_lists_again_keeping_what_exists_and_forgetting_what_went(
        emulator: Emulator, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cluster_watch, "WATCH_SECONDS", 1)   # each watch ends cleanly after a second
    open_ = asyncio.Event()
    open_.set()
    held = asyncio.Event()
    list_policies = client.CustomObjectsApi.list_cluster_custom_object

    async def gated(self: client.CustomObjectsApi, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("watch") and not open_.is_set():
            held.set()
            await open_.wait()
        return await list_policies(self, *args, **kwargs)

    monkeypatch.setattr(client.CustomObjectsApi, "list_cluster_custom_object", gated)
    for name in ("kept", "dropped", "edited"):
        await emulator.create(ADMISSION_POLICIES, enforced_policy(name, "object.metadata.name != 'bad'"))

    store = PolicyStore()
    api_client = await new_api_client()
    task = asyncio.create_task(watcher.watch_policies(api_client, store))
    try:
        await wait_for(lambda: set(store.generations) == {"kept", "dropped", "edited"}, timeout=10)
        kept = store.policies.get("kept")
        lists = policy_lists(emulator)

        open_.clear()
        await asyncio.wait_for(held.wait(), 10)   # the watch ended; its resume waits at the door
        await emulator.patch(ADMISSION_POLICIES, "dropped", {"metadata": {"finalizers": []}})
        await emulator.delete(ADMISSION_POLICIES, "dropped")
        await emulator.patch(ADMISSION_POLICIES, "edited", {"spec": {"validations": [
            {"expression": "object.metadata.name != 'worse'", "message": "edited says no"}]}})
        emulator.compact(ADMISSION_POLICIES)
        with caplog.at_level(logging.INFO, logger=cluster_watch.__name__):
            open_.set()
            await wait_for(lambda: store.generations == {"kept": 1, "edited": 2}, timeout=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api_client.close()

    messages = [r.getMessage() for r in caplog.records]
    assert any("AdmissionPolicies: resourceVersion" in m and "410 Gone" in m for m in messages), messages
    assert policy_lists(emulator) == lists + 1, "one listing after the 410, no more"
    assert store.policies.get("kept") is kept, "a policy that still exists was dropped and reloaded"
    assert "dropped" not in store.policies and store.uids.keys() == {"kept", "edited"}
    assert not store.readiness.unsynced, "a 410 is not a disconnection: /readyz must not say a watch is down"
    assert not [m for m in messages if "failed" in m], messages



async def test_a_stalled_policy_watch_counts_as_down_until_listed_again(
        emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A half-open connection sends nothing and never ends. Without a read timeout the watcher
    would wait on it for ever, /readyz saying all is well while policy changes go unseen."""
    monkeypatch.setattr(cluster_watch, "WATCH_SECONDS", 1)
    monkeypatch.setattr(cluster_watch, "STALL_MARGIN", 1)
    await emulator.create(ADMISSION_POLICIES, enforced_policy("kept", "object.metadata.name != 'bad'"))
    store = PolicyStore()
    api_client = await new_api_client()
    task = asyncio.create_task(watcher.watch_policies(api_client, store))
    try:
        await wait_for(lambda: set(store.generations) == {"kept"}, timeout=10)
        with stalled(emulator, ADMISSION_POLICIES) as outage:
            await wait_for(lambda: "AdmissionPolicies" in store.readiness.unsynced, timeout=10)
            assert "not watching AdmissionPolicies" in store.readiness.out_of_sync()
            assert set(store.generations) == {"kept"}, "the last state seen is kept meanwhile"
            outage.on = False
            await emulator.create(ADMISSION_POLICIES, enforced_policy("added", "object.metadata.name != 'worse'"))
            await wait_for(lambda: set(store.generations) == {"kept", "added"} and not store.readiness.unsynced,
                           timeout=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api_client.close()


TENANT_POLICIES = "policy-operator.dev/v1alpha1/namespacedadmissionpolicies"
EXCEPTIONS = "policy-operator.dev/v1alpha1/admissionpolicyexceptions"


def tenant_policy() -> dict[str, Any]:
    tenant = {**enforced_policy("p", "object.metadata.name != 'worse'"), "kind": "NamespacedAdmissionPolicy"}
    tenant["metadata"]["namespace"] = "team-a"
    return tenant


def exception() -> dict[str, Any]:
    return {"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicyException",
            "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"policies": [{"name": "cluster-wide"}], "reason": "r", "expiresAt": "2099-01-01T00:00:00Z"}}


@pytest.mark.parametrize("kind", ["NamespacedAdmissionPolicies", "AdmissionPolicyExceptions"])
async def test_a_resource_whose_crd_is_missing_is_none_said_once_and_watched_once_served(
        emulator: Emulator, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The quick start, or an operator upgraded before its new CRDs are applied: the 404 says there
    is nothing to wait for (readiness would otherwise wait for ever, and no replica serve). It is
    said once, not at every retry, and is not an outage (``unsynced``, which /readyz reports);
    the resource is looked for again, and what it holds applies once its CRD is in."""
    monkeypatch.setattr(cluster_watch, "ABSENT_RECHECK", 0.2)
    path, body = (TENANT_POLICIES, tenant_policy()) if kind.startswith("Namespaced") else (EXCEPTIONS, exception())
    not_served = Outage(refuse(404, "NotFound"))
    emulator.kmock[kmock.action.LIST, kmock.resource(path)] << not_served
    store, exceptions = PolicyStore(), ExceptionStore("admission-policy-system")
    store.observe(enforced_policy("cluster-wide", "object.metadata.name != 'bad'"))
    caplog.set_level(logging.INFO, logger=cluster_watch.__name__)
    api_client = await new_api_client()
    task = asyncio.create_task(watcher.watch_tenant_policies(api_client, store) if path == TENANT_POLICIES else
                               watcher.watch_exceptions(api_client, exceptions, store.readiness.unsynced))
    loaded = store.readiness.tenant_policies_loaded if path == TENANT_POLICIES else exceptions.loaded
    try:
        await asyncio.wait_for(loaded.wait(), 10)
        await asyncio.sleep(1.0)   # several looks meanwhile
        said = [r for r in caplog.records if r.levelno >= logging.WARNING]
        crd = "namespacedadmissionpolicy" if path == TENANT_POLICIES else "admissionpolicyexception"
        assert [r.getMessage() for r in said] == [f"{kind} are not served (is crds/{crd}.yaml applied?): none "
                                                  "applies until they are; looking again every 0s"], said
        assert not store.readiness.unsynced
        not_served.on = False
        await emulator.create(path, body, namespace="team-a")
        if path == TENANT_POLICIES:
            await wait_for(lambda: "team-a/p" in store.generations, timeout=10)
            assert sorted(p.name for p in store.policies) == ["cluster-wide", "team-a/p"]
        else:
            await wait_for(lambda: "team-a/p" in exceptions.seen, timeout=10)
        assert any(r.getMessage() == f"{kind} are served now: watching them" for r in caplog.records)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api_client.close()
