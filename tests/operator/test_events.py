"""Events on AdmissionPolicies are auxiliary: a post that fails on the way to the API server is
dropped, and the events after it are still posted (the denial poster runs for the life of the process)."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import kmock
import pytest
from emulator import EVENTS, Emulator, wait_for
from kmock._internal import rendering

from admission_policy.cluster import client as kube
from admission_policy.operator.events import PolicyEvents


def cut_connection(request: rendering.Request) -> Any:
    """The API server's connection closes before an answer (a restart, a load balancer's reset)."""
    assert request._raw_request is not None and request._raw_request.transport is not None
    request._raw_request.transport.close()
    return b""


async def never_answer() -> None:
    await asyncio.Event().wait()


class Once:
    """Reacts to the first request as ``react`` says, and steps aside for every later one (kmock
    passes a request a reaction declines to the next, here the emulator's own)."""

    def __init__(self, react: Callable[..., Any]) -> None:
        self.react: Callable[..., Any] | None = react
        self.done = asyncio.Event()

    def __call__(self, request: rendering.Request) -> Any:
        react, self.react = self.react, None
        if react is None:
            return NotImplemented
        self.done.set()
        return react(request) if react is cut_connection else react()


@pytest.mark.parametrize("failure", [cut_connection, never_answer], ids=["connection-closed", "no-answer"])
async def test_after_a_post_that_fails_on_the_connection_later_events_are_still_posted(
        emulator: Emulator, monkeypatch: pytest.MonkeyPatch, failure: Callable[..., Any]) -> None:
    monkeypatch.setattr(kube, "CALL_TIMEOUT", 0.5)
    failing = Once(failure)
    emulator.kmock["create", kmock.resource(EVENTS)] << failing
    events = PolicyEvents("test", interval=0.05)
    api = await kube.new_api_client()   # the emulator's kubeconfig
    async with api:
        poster = asyncio.create_task(events.run(api, lambda _: None))
        try:
            events.record_denial("first", "denied once")
            await asyncio.wait_for(failing.done.wait(), timeout=10)
            events.record_denial("second", "denied again")
            await wait_for(lambda: emulator.events_for("second") or poster.done(), timeout=10)
            assert not poster.done(), poster
            (event,) = emulator.events_for("second")
            assert event["reason"] == "Denied" and "last: denied again" in event["message"]
        finally:
            poster.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poster


async def test_a_tenant_policys_denials_are_posted_in_its_namespace(emulator: Emulator) -> None:
    """``kubectl describe namespacedadmissionpolicy`` in the tenant's namespace lists its events: they
    name the policy by its own name, kind and namespace, not the "namespace/name" the engine uses."""
    events = PolicyEvents("test", interval=0.05)
    asked: list[str] = []

    def uid_of(policy: str) -> str:
        asked.append(policy)
        return f"uid-of-{policy}"

    api = await kube.new_api_client()
    async with api:
        poster = asyncio.create_task(events.run(api, uid_of))
        try:
            events.record_denial("team-a/no-privileged", "no privileged containers")
            await wait_for(lambda: emulator.events_for("no-privileged") or poster.done(), timeout=10)
        finally:
            poster.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poster
    (event,) = emulator.events_for("no-privileged", namespace="team-a")
    assert event["metadata"]["namespace"] == "team-a"
    assert event["involvedObject"] == {"apiVersion": "policy-operator.dev/v1alpha1",
                                       "kind": "NamespacedAdmissionPolicy", "name": "no-privileged",
                                       "namespace": "team-a", "uid": "uid-of-team-a/no-privileged"}
    assert event["reason"] == "Denied" and "last: no privileged containers" in event["message"]
    assert asked == ["team-a/no-privileged"]
