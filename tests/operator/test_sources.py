"""The params and context caches (operator/sources.py) against the emulator: shared, started and
stopped with the policies that read them, following the cluster, and never silently stale.

Some tests run the whole operator (the status, the metrics and the webhook are what users see);
the others run ``Sources`` alone over a real API client, as the operator does. The emulator's own
reactions (kmock's DSL) make the API server refuse a list, stall a watch or fail discovery.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import pathlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import kmock
import pytest
from emulator import (
    ADMISSION_POLICIES,
    CONFIGMAPS,
    DEPLOYMENTS,
    Emulator,
    wait_for,
)
from operator_env import (
    conditions,
    operator_environment,
    operator_running,
    pod_request,
    wait_phase,
    webhook_client,
)
from outages import Outage, refuse, stalled

import builders
from admission_policy import api
from admission_policy.cluster import watch as cluster_watch
from admission_policy.cluster.client import new_api_client
from admission_policy.cluster.discovery import Discovery
from admission_policy.engine import PolicySet, load_policy
from admission_policy.operator import sources
from builders import policy_body

CMS = "configmaps/v1"   # how statuses and metrics name the ConfigMaps source
FEW_CONFIGMAPS = [{"expression": "context.cms.size() < 2", "message": "too many configmaps"}]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> dict[str, str]:
    return operator_environment(monkeypatch, tmp_path / "certs")


def context_policy(name: str, resource: str = "configmaps", group: str = "", *, max_objects: int = 100,
                   **spec: Any) -> dict[str, Any]:
    """A policy on Pods that reads one context (``context.cms``, the request's namespace) and fails closed."""
    entry = {"name": "cms", "group": group, "version": "v1", "resource": resource, "scope": "RequestNamespace",
             "maxObjects": max_objects}
    spec.setdefault("validations", FEW_CONFIGMAPS)
    return policy_body(name, failurePolicy="Fail", context=[entry], **spec)


configmap = functools.partial(builders.configmap, namespace="apps")   # where the requests below are


def requests_to(emulator: Emulator, action: kmock.action, resource: str) -> int:
    """Cluster-wide requests, as the caches make (the audit's hand-over lists ConfigMaps in one namespace)."""
    wanted = kmock.resource(resource)
    return sum(r.action == action and r.resource == wanted and not r.namespace for r in emulator.kmock)


async def scrape(env: dict[str, str], family: str) -> dict[str, float]:
    """source → value of one of the caches' metric families."""
    async with aiohttp.ClientSession() as session, \
            session.get(f"http://127.0.0.1:{env['AP_METRICS_PORT']}/metrics") as response:
        text = await response.text()
    return {source: float(value) for source, value in re.findall(rf'^{family}{{source="([^"]*)"}} (\S+)$', text, re.M)}


def async_equals(read: Callable[[], Any], expected: Any) -> Callable[[], Any]:
    """A ``wait_for`` predicate: what ``read()`` returns is ``expected``."""
    async def check() -> bool:
        found = await read()
        assert found == expected, found
        return True
    return check


async def not_(predicate: Callable[[], Any]) -> bool:
    return not await predicate()


def pod_in(namespace: str) -> dict[str, Any]:
    request = pod_request("probe")
    request["namespace"] = request["object"]["metadata"]["namespace"] = namespace
    return request


@contextlib.asynccontextmanager
async def running_sources(*bodies: dict[str, Any]) -> AsyncIterator[sources.Sources]:
    """``Sources`` as the operator runs it, wanting what ``bodies`` read."""
    api_client = await new_api_client()
    running = sources.Sources(api_client, Discovery(api_client))
    running.want(PolicySet(load_policy(body, "Fail") for body in bodies))
    task = asyncio.create_task(running.run())
    try:
        yield running
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await running.close()
        await api_client.close()


def names(listing: Any) -> set[str]:
    assert not listing.problem, listing.problem
    return {body["metadata"]["name"] for body in listing.objects}


# --- the whole operator -----------------------------------------------------------------------------------

async def test_policies_reading_one_source_share_one_cache_that_stops_with_the_last_of_them(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    managed = [{"manager": f"controller-{i}", "operation": "Update", "fieldsV1": {"f:data": {f"f:k{i}": {}}}}
               for i in range(300)]
    settings = configmap("settings", data={"color": "blue"})
    settings["metadata"]["managedFields"] = managed
    emulator.kmock.put_object(CONFIGMAPS, settings)
    async with operator_running(run_operator):
        for name in ("first", "second"):
            await emulator.create(ADMISSION_POLICIES, context_policy(name))
            body = await wait_phase(emulator, name, "Active")
            assert conditions(body)["InputsSynced"]["status"] == "True"
        assert await scrape(env, "admission_policy_context_objects") == {CMS: 1.0}
        assert requests_to(emulator, kmock.action.LIST, CONFIGMAPS) == 1, "one cache, listed once, for both"
        # Memory per cached object, without managedFields (often most of an object, never read).
        per_object = (await scrape(env, "admission_policy_context_object_bytes"))[CMS]
        assert 0 < per_object < len(json.dumps(managed)) / 10, per_object

        # The second reads Deployments instead: a cache of those starts, the ConfigMaps' one stays.
        await emulator.patch(ADMISSION_POLICIES, "second", {"spec": {"context": [
            {"name": "cms", "group": "apps", "version": "v1", "resource": "deployments"}]}})
        await wait_for(async_equals(lambda: scrape(env, "admission_policy_context_synced"),
                                    {CMS: 1.0, "deployments.apps/v1": 1.0}), timeout=20)
        # The last policy reading ConfigMaps goes: so does their cache.
        await emulator.delete(ADMISSION_POLICIES, "first")
        await wait_for(lambda: emulator.peek(ADMISSION_POLICIES, "first") is None, timeout=20)
        await wait_for(async_equals(lambda: scrape(env, "admission_policy_context_synced"),
                                    {"deployments.apps/v1": 1.0}), timeout=20)


async def test_objects_created_and_deleted_in_the_cluster_are_what_requests_see(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    emulator.kmock.put_object(CONFIGMAPS, configmap("one"))
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, context_policy("few-configmaps"))
        await wait_phase(emulator, "few-configmaps", "Active")
        webhook = webhook_client(emulator, env)

        async def allowed() -> bool:
            return bool((await webhook.review("/validate", pod_in("apps")))["allowed"])

        assert await allowed()
        await emulator.create(CONFIGMAPS, configmap("elsewhere", namespace="other"))   # not in the request's namespace
        await wait_for(async_equals(lambda: scrape(env, "admission_policy_context_objects"), {CMS: 2.0}))
        assert await allowed()
        await emulator.create(CONFIGMAPS, configmap("two"))
        await wait_for(lambda: not_(allowed), timeout=10)
        response = await webhook.review("/validate", pod_in("apps"))
        assert "too many configmaps" in response["status"]["message"], response
        await emulator.delete(CONFIGMAPS, "two", namespace="apps")
        await wait_for(allowed, timeout=10)


async def test_a_source_that_cannot_be_listed_degrades_its_policy_until_it_is_listed_again(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_watch, "WATCH_SECONDS", 1)   # the open watch ends and resumes each second
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, context_policy("few-configmaps"))
        await wait_phase(emulator, "few-configmaps", "Active")
        webhook = webhook_client(emulator, env)

        # The operator loses its RBAC for ConfigMaps: the watch and then each list are refused.
        outage = Outage(refuse(403, "Forbidden"))
        for action in (kmock.action.LIST, kmock.action.WATCH):
            emulator.kmock[action, kmock.resource(CONFIGMAPS)] << outage
        body = await wait_phase(emulator, "few-configmaps", "Degraded")
        condition = conditions(body)["InputsSynced"]
        assert (condition["status"], condition["reason"]) == ("False", "NotSynced")
        since = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"   # absolute: an unchanged state rewrites no status
        assert re.fullmatch(
            rf"context 'cms': the watch of configmaps/v1 has failed since {since} and not listed again \(403 "
            r"Forbidden: refused by the test\); requests that read them get the failurePolicy answer until they "
            r"are \(check the operator's RBAC: the chart's rbac.contextResources\)", condition["message"]), condition
        assert conditions(body)["Ready"]["status"] == "False"
        response = await webhook.review("/validate", pod_in("apps"))   # never judged by the last list
        assert not response["allowed"], response
        assert "context 'cms' (configmaps/v1) is not in sync" in response["status"]["message"], response
        assert (await scrape(env, "admission_policy_context_synced")) == {CMS: 0.0}

        outage.on = False
        body = await wait_phase(emulator, "few-configmaps", "Active")
        assert conditions(body)["InputsSynced"]["status"] == "True"
        assert (await webhook.review("/validate", pod_in("apps")))["allowed"]


async def test_a_stalled_watch_is_reported_and_not_served_until_listed_again(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A half-open connection sends nothing and never ends: past the server-side timeout and the
    margin, the watch counts as failed (not as quiet), and its cache as not in sync."""
    monkeypatch.setattr(cluster_watch, "WATCH_SECONDS", 1)
    monkeypatch.setattr(cluster_watch, "STALL_MARGIN", 1)
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, context_policy("few-configmaps"))
        await wait_phase(emulator, "few-configmaps", "Active")
        webhook = webhook_client(emulator, env)
        with stalled(emulator, CONFIGMAPS) as outage:
            body = await wait_phase(emulator, "few-configmaps", "Degraded")
            message = conditions(body)["InputsSynced"]["message"]
            assert "the watch of configmaps/v1 has failed since" in message, message
            assert "(the connection stalled: no data from the API server for 2s)" in message, message
            response = await webhook.review("/validate", pod_in("apps"))
            assert not response["allowed"] and "is not in sync" in response["status"]["message"], response
            outage.on = False
            await emulator.create(CONFIGMAPS, configmap("one"))
            await emulator.create(CONFIGMAPS, configmap("two"))
            await wait_phase(emulator, "few-configmaps", "Active")
        response = await webhook.review("/validate", pod_in("apps"))
        assert not response["allowed"] and "too many configmaps" in response["status"]["message"], response


async def test_a_context_over_its_max_objects_degrades_its_policy_naming_the_namespace_and_counts(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    for name in ("a", "b"):
        emulator.kmock.put_object(CONFIGMAPS, configmap(name))
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, context_policy(
            "capped", max_objects=2, validations=[{"expression": "context.cms.size() >= 0", "message": "never"}]))
        await wait_phase(emulator, "capped", "Active")
        webhook = webhook_client(emulator, env)
        assert (await webhook.review("/validate", pod_in("apps")))["allowed"]

        await emulator.create(CONFIGMAPS, configmap("c"))
        body = await wait_phase(emulator, "capped", "Degraded")
        condition = conditions(body)["InputsSynced"]
        assert (condition["status"], condition["reason"]) == ("False", "OverMaxObjects")
        assert condition["message"].startswith(
            "context 'cms' holds more objects than its maxObjects of 2 (spec.context[0].maxObjects) in namespace(s) "
            "apps (3); requests that read it there get the failurePolicy answer (raise maxObjects"), condition
        response = await webhook.review("/validate", pod_in("apps"))   # what the condition warns of
        assert not response["allowed"] and "over its maxObjects of 2" in response["status"]["message"], response
        assert (await webhook.review("/validate", pod_in("other")))["allowed"]

        await emulator.delete(CONFIGMAPS, "a", namespace="apps")
        body = await wait_phase(emulator, "capped", "Active")
        assert conditions(body)["InputsSynced"]["status"] == "True"


# --- Sources alone --------------------------------------------------------------------------------------------

PARAMS_AND_CONTEXT = context_policy(
    "quota", resource="deployments", group="apps", paramKind={"apiVersion": "v1", "kind": "ConfigMap"},
    paramRef={"name": "quota"}, validations=[{"expression": "has(params.data)", "message": "no data"}])
QUOTA_KIND = api.ParamKind("v1", "ConfigMap")


async def test_a_failed_discovery_is_reported_and_retried_while_the_context_is_served(emulator: Emulator) -> None:
    """Before: one failed lookup stopped every cache until some policy changed."""
    emulator.kmock.put_object(CONFIGMAPS, configmap("quota", data={"cpu": "4"}))
    emulator.kmock.put_object(DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment",
                                            "metadata": {"name": "web", "namespace": "apps"}})
    outage = Outage(refuse(503, "ServiceUnavailable"))
    emulator.kmock["get /api/v1"] << outage
    policy = load_policy(PARAMS_AND_CONTEXT, "Fail").policy
    async with running_sources(PARAMS_AND_CONTEXT) as running:
        (entry,) = policy.context
        await wait_for(lambda: names(running.context(entry, "apps")) == {"web"}, timeout=10)
        problems = running.problems(policy)
        assert problems.unsynced == ("params (ConfigMap.v1): looking up ConfigMap.v1 in discovery failed (retrying): "
                                     "503 Service Unavailable",), problems
        outage.on = False
        await wait_for(lambda: not running.problems(policy), timeout=10)
        assert [body["data"] for body in running.params(QUOTA_KIND, "apps").objects] == [{"cpu": "4"}]


async def test_a_watch_resumed_into_410_lists_again_and_serves_what_changed_meanwhile(
        emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_watch, "WATCH_SECONDS", 1)   # each watch ends cleanly after a second
    gate, held = asyncio.Event(), asyncio.Event()
    gate.set()
    make_lister = sources.lister

    def gated_lister(api_client: Any, source: api.ContextSource) -> Callable[..., Any]:
        call = make_lister(api_client, source)

        async def gated(**kwargs: Any) -> Any:
            if kwargs.get("watch") and not gate.is_set():
                held.set()
                await gate.wait()
            return await call(**kwargs)
        return gated

    monkeypatch.setattr(sources, "lister", gated_lister)
    for name in ("kept", "dropped", "edited"):
        emulator.kmock.put_object(CONFIGMAPS, configmap(name, data={"v": "1"}))
    body = context_policy("reader")
    (entry,) = load_policy(body, "Fail").policy.context
    async with running_sources(body) as running:
        await wait_for(lambda: names(running.context(entry, "apps")) == {"kept", "dropped", "edited"}, timeout=10)
        lists = requests_to(emulator, kmock.action.LIST, CONFIGMAPS)

        gate.clear()
        await asyncio.wait_for(held.wait(), 10)   # the watch ended; its resume waits at the door
        await emulator.delete(CONFIGMAPS, "dropped", namespace="apps")
        await emulator.patch(CONFIGMAPS, "edited", {"data": {"v": "2"}}, namespace="apps")
        await emulator.create(CONFIGMAPS, configmap("added"))
        emulator.compact(CONFIGMAPS)
        gate.set()
        await wait_for(lambda: names(running.context(entry, "apps")) == {"kept", "edited", "added"}, timeout=10)
        (edited,) = [b for b in running.context(entry, "apps").objects if b["metadata"]["name"] == "edited"]
        assert edited["data"] == {"v": "2"}
        assert requests_to(emulator, kmock.action.LIST, CONFIGMAPS) == lists + 1, "one listing after the 410"
        assert not running.caches[entry.source].unsynced, "a 410 is not a failure: the cache stayed in sync"


async def test_a_failing_source_says_so_in_words_that_do_not_change_while_it_keeps_failing(
        emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy's condition is written again only when its text changes: "failed for 3s" would
    rewrite it on every pass over the policies while the outage lasts."""
    monkeypatch.setattr(cluster_watch, "WATCH_SECONDS", 1)   # the open watch ends and resumes each second
    body = context_policy("reader")
    policy = load_policy(body, "Fail").policy
    async with running_sources(body) as running:
        await wait_for(lambda: not running.problems(policy), timeout=10)
        outage = Outage(refuse(403, "Forbidden"))
        for action in (kmock.action.LIST, kmock.action.WATCH):
            emulator.kmock[action, kmock.resource(CONFIGMAPS)] << outage
        first = await wait_for(lambda: running.problems(policy).unsynced, timeout=10)
        assert "the watch of configmaps/v1 has failed since" in first[0], first
        tried = requests_to(emulator, kmock.action.LIST, CONFIGMAPS)
        await wait_for(lambda: requests_to(emulator, kmock.action.LIST, CONFIGMAPS) >= tried + 2, timeout=10)
        assert running.problems(policy).unsynced == first
        outage.on = False
        await wait_for(lambda: not running.problems(policy), timeout=10)
