"""The policies this replica enforces, fed by its own watcher and read by every request.

The engine's PolicySet is immutable: an update builds a new set and swaps one reference, so a
request in flight keeps the set it started with and never sees half of an update.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .. import api
from ..cluster.client import resource_path
from ..engine import PolicyCompileError, PolicySet, load_policy
from ..engine.exceptions import CompiledException, ExceptionSet, compile_exception
from ..policyexception import PolicyException, parse_exception

logger = logging.getLogger(__name__)

FINALIZER = f"{api.GROUP}/finalizer"


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A generation that failed to load; the previous good one, if any, stays enforced."""
    generation: int
    message: str


def policy_path(key: str) -> str:
    """The API path of the policy named ``key`` (see ``object_key``)."""
    policy = api.PolicyKey.parse(key)
    plural = api.PLURAL if policy.namespace is None else api.NAMESPACED_PLURAL
    return resource_path(api.GROUP, api.VERSION, plural, namespace=policy.namespace or "", name=policy.name)


def object_key(body: Mapping[str, Any]) -> str:
    """How the stores, the engine and the reports name an object of ours (``api.PolicyKey``)."""
    return str(api.PolicyKey.of(body))


def error_text(error: Exception) -> str:
    """A load error on one line, for a status condition, an event or a log: each expression's
    error, not the multi-line report a terminal gets."""
    if isinstance(error, PolicyCompileError):
        return "; ".join(str(e) for e in error.errors)
    return str(error)


class Registration:
    """What the webhook configurations route, as last written, or why the API server lacks it.

    The handlers wait on it (``wait_routed``) before they report a policy as enforced, so a
    status never says Ready before the API server sends the policy's requests here."""

    def __init__(self) -> None:
        self.routed: dict[str, int] = {}   # generation per policy present in the written configurations
        self.writes = 0                    # configurations written so far
        self.probe = ""                    # ... the last of them proven loaded by this name
        self.lost = ""                     # why the API server lacks what we wrote ("": it has it)
        self._changed = asyncio.Event()    # set (and replaced) when ``routed`` or ``lost`` changes
        self._condition = asyncio.Condition()

    async def mark_written(self, generations: Mapping[str, int], probe: str = "") -> None:
        """The configurations now route exactly these policies (at these generations); ``probe``:
        the request only they route (``webhookconfig.probe_name``)."""
        async with self._condition:
            changed = self.routed != generations or self.lost
            self.routed = dict(generations)
            self.probe = probe
            self.lost = ""
            self.writes += 1
            self._condition.notify_all()
        if changed:
            self._announce()

    async def mark_lost(self, problem: str) -> None:
        """The API server no longer holds what was written (deleted or edited by hand) and it could
        not be written again: no policy counts as routed until a write succeeds."""
        async with self._condition:
            changed = bool(self.routed) or self.lost != problem
            self.routed = {}
            self.lost = problem
            self._condition.notify_all()
        if changed:
            self._announce()

    def changed(self) -> asyncio.Event:
        """An event set at the next change of what is routed (or lost). Take it before reading
        the state, then wait on it: a change in between is not missed."""
        return self._changed

    def _announce(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_write_after(self, count: int, timeout: float) -> bool:
        """Wait for a write after the ``count``-th one (e.g. one carrying a renewed CA)."""
        return await self._wait(lambda: self.writes > count, timeout)

    async def wait_routed(self, name: str, generation: int, timeout: float) -> bool:
        """Whether the configurations came to route this generation (or a later one) in time."""
        return await self._wait(lambda: self.routed.get(name, -1) >= generation, timeout)

    async def wait_unrouted(self, name: str, timeout: float) -> bool:
        """Whether the configurations stopped routing ``name`` in time: its finalizer may go then."""
        return await self._wait(lambda: name not in self.routed, timeout)

    async def _wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout), self._condition:
                await self._condition.wait_for(predicate)
        except TimeoutError:
            return False
        return True


class Readiness:
    """Whether this replica serves: its first listings are in and its server listens; and which
    watches are down (they serve the last state seen meanwhile)."""

    def __init__(self) -> None:
        self.policies_loaded = asyncio.Event()           # the first full list is in
        self.tenant_policies_loaded = asyncio.Event()    # ... of NamespacedAdmissionPolicies
        self.namespaces_loaded = asyncio.Event()
        self.listening = asyncio.Event()                 # the webhook server accepts connections
        self.unsynced: dict[str, float] = {}             # watch → since when (monotonic) it failed, until relisted

    @property
    def ready(self) -> bool:
        """Serving: the first listing is in and the server listens. It stays so while the API server is
        unreachable: the last policy set is still the best answer, and an unready replica would only
        leave the API server with no webhook to call (see :meth:`out_of_sync`)."""
        return self.policies_loaded.is_set() and self.tenant_policies_loaded.is_set() and self.listening.is_set()

    def out_of_sync(self) -> str:
        """What /readyz adds while a watch is down ("" while every one is in sync)."""
        now = time.monotonic()
        return "; ".join(f"not watching {what} for {now - since:.0f}s (serving the last state seen, retrying)"
                         for what, since in sorted(self.unsynced.items()))


class PolicyStore:
    """The replica's state shared by its watcher, its webhook and its status handlers: the
    policy set requests read, what failed to load, and (``registration``) what the webhook
    configurations route. The one writer of the policy set (``observe``, ``forget``, ``sync``)."""

    def __init__(self, default_failure_policy: api.FailurePolicy = "Fail",
                 tenant_plugins: Collection[str] = ()) -> None:
        self.default_failure_policy = default_failure_policy
        self.tenant_plugins = tuple(tenant_plugins)
        self.policies = PolicySet()                      # swapped whole: every loaded policy
        self.serving = PolicySet()                       # ... as the webhooks judge them (see native_scopes)
        # Policies Kubernetes enforces itself (their status.native, written by the reconciling
        # replica once the generated objects are in effect): the namespaces left to the webhooks.
        self.native_scopes: dict[str, frozenset[str]] = {}
        self.generations: dict[str, int] = {}            # loaded generation per policy
        self.uids: dict[str, str] = {}
        # Each policy's status and resourceVersion as last watched: native enforcement writes onto them.
        self.statuses: dict[str, tuple[Mapping[str, Any], str]] = {}
        self.rejected: dict[str, Rejected] = {}
        self.namespaces: dict[str, Mapping[str, Any]] = {}
        self.registration = Registration()
        self.readiness = Readiness()
        self.changed = asyncio.Event()                   # the configurations need rewriting
        self._policies_changed = asyncio.Event()         # set (and replaced) when a policy or its enforcer changes
        # Called with each new policy set (the caches of params and context follow it: sources.py).
        self.on_change: Callable[[PolicySet], None] | None = None

    def observe(self, body: Mapping[str, Any]) -> None:
        """A policy as the watcher sees it: load it, or drop it when it is not to be enforced."""
        metadata = body.get("metadata") or {}
        name = object_key(body)
        # Enforced only once our finalizer guarantees its rules are removed before it is gone.
        if metadata.get("deletionTimestamp") or FINALIZER not in (metadata.get("finalizers") or ()):
            self.forget(name, "its deletion began" if metadata.get("deletionTimestamp") else
                        f"our finalizer is not on it (resourceVersion {metadata.get('resourceVersion')})")
            return
        status = body.get("status")
        self.statuses[name] = (status if isinstance(status, Mapping) else {}, str(metadata.get("resourceVersion", "")))
        self._observe_native(name, status)
        generation = int(metadata.get("generation") or 0)
        if self.generations.get(name) == generation or (
                name in self.rejected and self.rejected[name].generation == generation):
            return  # a replayed or status-only event
        try:
            compiled = load_policy(body, self.default_failure_policy, self.tenant_plugins)
        except (api.PolicyError, PolicyCompileError) as error:
            self.rejected[name] = Rejected(generation, error_text(error))
            kept = f"generation {self.generations[name]} stays enforced" if name in self.generations else "not enforced"
            logger.warning("%s %s: generation %d does not compile (%s): %s",
                           api.PolicyKey.parse(name).kind, name, generation, kept, error_text(error))
            return
        self.rejected.pop(name, None)
        self.policies = self.policies.replace(compiled)
        self._changed_policies()
        self.generations[name] = generation
        self.uids[name] = str(metadata.get("uid", ""))
        logger.info("%s %s: generation %d loaded", api.PolicyKey.parse(name).kind, name, generation)
        self.changed.set()

    def apply(self, kind: str, body: Mapping[str, Any]) -> None:
        """A watch event: a deletion forgets the policy, anything else is observed."""
        if kind == "DELETED":
            self.forget(object_key(body), "deleted")
        else:
            self.observe(body)

    def forget(self, name: str, why: str) -> None:
        """Stop enforcing ``name`` (logged with ``why``); the configurations are rewritten without it."""
        self.rejected.pop(name, None)
        self.statuses.pop(name, None)
        if name in self.generations:
            self.policies = self.policies.remove(name)
            self.native_scopes.pop(name, None)
            self._changed_policies()
            del self.generations[name]
            self.uids.pop(name, None)
            logger.info("%s %s: no longer enforced: %s", api.PolicyKey.parse(name).kind, name, why)
            self.changed.set()

    def _observe_native(self, name: str, status: Any) -> None:
        """Follow who enforces the policy: a switch reroutes it (make-before-break is the writer's:
        operator/native.py)."""
        native = status.get("native") if isinstance(status, Mapping) else None
        scope = None
        if isinstance(native, Mapping) and native.get("enforcedBy") == "Native":
            scope = frozenset(str(n) for n in native.get("handedBack") or () if isinstance(n, str))
        if self.native_scopes.get(name) == scope:
            return
        if scope is None:
            del self.native_scopes[name]
        else:
            self.native_scopes[name] = scope
        logger.info("%s %s: enforced by %s", api.PolicyKey.parse(name).kind, name,
                    "the webhooks" if scope is None else "Kubernetes (generated ValidatingAdmissionPolicy)"
                    + (f", but in {', '.join(sorted(scope))}" if scope else ""))
        self._changed_policies()
        self.changed.set()

    def policies_changed(self) -> asyncio.Event:
        """An event set at the next change of a policy or of who enforces it. Take it before
        reading, then wait on it: a change in between is not missed."""
        return self._policies_changed

    def _changed_policies(self) -> None:
        self.serving = self.policies.scoped(self.native_scopes)
        self._policies_changed.set()
        self._policies_changed = asyncio.Event()
        if self.on_change is not None:
            self.on_change(self.policies)

    def sync(self, names: set[str], *, namespaced: bool = False) -> None:
        """After a full list of one kind (cluster or namespaced policies): forget what it no longer
        holds (deleted while not watching)."""
        for name in {key for key in self.generations
                     if (api.PolicyKey.parse(key).namespace is not None) == namespaced} - names:
            self.forget(name, "a fresh listing no longer holds it")


class ExceptionStore:
    """The AdmissionPolicyExceptions this replica applies, fed by its own watcher.

    Like the policy set, the ``ExceptionSet`` is swapped whole on a change. Every valid exception
    is loaded, whatever its state: expiry and approval are judged per request against the clock
    and the policies (``engine.exceptions``), so an exception ends at its ``expiresAt`` whether or
    not anything here notices. One that does not parse or compile (written before the webhook
    checked it, or by hand while the operator was down) is not applied, and ``invalid`` says why.
    Until the first listing is in, none applies: requests are judged by the policies alone, which
    denies what an exception would admit but never admits what a policy denies."""

    def __init__(self, cluster_namespace: str) -> None:
        self.cluster_namespace = cluster_namespace
        self.current = ExceptionSet(cluster_namespace=cluster_namespace)   # swapped whole, read per request
        self.invalid: dict[str, str] = {}          # "namespace/name" → why it is not applied
        self.seen: dict[str, Seen] = {}             # every exception listed or watched, valid or not
        self.loaded = asyncio.Event()
        self._compiled: dict[str, CompiledException] = {}
        self._changed = asyncio.Event()

    def changed(self) -> asyncio.Event:
        """An event set at the next change of an exception (not of its status alone). Take it
        before reading, then wait on it: a change in between is not missed."""
        return self._changed

    def get(self, key: str) -> PolicyException | None:
        compiled = self._compiled.get(key)
        return compiled.exception if compiled is not None else None

    def apply(self, kind: str, body: Mapping[str, Any]) -> None:
        """A watch event: a deletion forgets the exception, anything else is observed."""
        if kind == "DELETED":
            self.forget(object_key(body))
        else:
            self.observe(body)

    def observe(self, body: Mapping[str, Any]) -> None:
        metadata = body.get("metadata") or {}
        key = object_key(body)
        status = body.get("status")
        self.seen[key] = Seen(str(metadata.get("uid", "")), int(metadata.get("generation") or 0),
                              status if isinstance(status, Mapping) else {})
        try:
            exception = parse_exception(body)
            known = self._compiled.get(key)
            if known is not None and known.exception == exception:
                return   # a replayed or status-only event
            compiled = compile_exception(exception)
        except api.PolicyError as error:
            if self.invalid.get(key) == str(error) and key not in self._compiled:
                return   # a replayed or status-only event
            self.invalid[key] = str(error)
            logger.warning("AdmissionPolicyException %s is invalid and not applied: %s", key, error)
            self._compiled.pop(key, None)
            self._rebuild()
            return
        self.invalid.pop(key, None)
        self._compiled[key] = compiled
        self._rebuild()
        logger.info("AdmissionPolicyException %s: generation %d loaded", key, exception.generation)

    def forget(self, key: str) -> None:
        self.invalid.pop(key, None)
        self.seen.pop(key, None)
        if self._compiled.pop(key, None) is not None:
            logger.info("AdmissionPolicyException %s: deleted, no longer applied", key)
        self._rebuild()

    def sync(self, keys: set[str]) -> None:
        """After a full list: forget what the list no longer holds."""
        for key in set(self.seen) - keys:
            self.forget(key)

    def _rebuild(self) -> None:
        self.current = ExceptionSet(self._compiled.values(), cluster_namespace=self.cluster_namespace)
        self._changed.set()
        self._changed = asyncio.Event()


@dataclasses.dataclass(frozen=True)
class Seen:
    """An exception as last listed or watched, for its status: who it is and what it says now."""
    uid: str
    generation: int
    status: Mapping[str, Any]
