"""The watch-backed caches that supply policies' params and context (the engine's ``Inputs``).

One cache per source — (group, version, resource, label selector) — shared by every policy that
declares it, as a context entry or as its paramKind (resolved to a resource through discovery).
A cache is started when the first loaded policy needs it and stopped when the last one that did is
gone. Each is a list+watch with the policy watcher's machinery (``cluster.watch.list_and_watch``:
resume from the last resourceVersion, list again on 410 Gone or failure, back off), so a request
reads memory only and never waits on the API server.

A cache that has not listed yet, or whose watch has failed (or stalled) and not listed again, is
*not in sync*: requests that read it get their policy's failurePolicy answer naming the source (never
a stale or partial list taken for the truth), the policy reports ``InputsSynced=False`` (phase
``Degraded``), and the metric ``admission_policy_context_synced`` is 0. So does a paramKind that
discovery cannot resolve (looked up again with backoff), and a context holding more objects than its
``maxObjects`` somewhere (requests there are evaluation errors).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import marshal
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes_asyncio import client

from .. import api
from ..cluster.discovery import Discovery
from ..cluster.watch import failure_text, list_and_watch
from ..engine import Listing, PolicySet

logger = logging.getLogger(__name__)

RETRY_MIN, RETRY_MAX = 1.0, 30.0   # backoff of discovery lookups that failed or found nothing


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A paramKind as discovery serves it."""
    source: api.ContextSource
    namespaced: bool


@dataclasses.dataclass(frozen=True)
class InputProblems:
    """What keeps a policy's params or context from its requests (``Sources.problems``)."""
    unsynced: tuple[str, ...] = ()   # not listed yet, watch down, kind not resolved: wait or fix RBAC
    over_cap: tuple[str, ...] = ()   # a context holding more than its maxObjects: fix the policy

    def __bool__(self) -> bool:
        return bool(self.unsynced or self.over_cap)


Limit = tuple[bool, int]   # (per namespace, maxObjects) of a context entry reading a cache


class SourceCache:
    """The objects of one source, by namespace and name, as the watch last delivered them."""

    def __init__(self, source: api.ContextSource, on_limit_crossed: Callable[[], None] | None = None) -> None:
        self.source = source
        self.objects: dict[str, dict[str, Mapping[str, Any]]] = {}   # namespace ("" cluster-scoped) → name → object
        self.sizes: dict[tuple[str, str], int] = {}                   # marshalled bytes of each, for the metric
        self.total_bytes = 0
        self._snapshots: dict[str | None, tuple[Mapping[str, Any], ...]] = {}
        self.loaded = asyncio.Event()
        self.unsynced: dict[str, float] = {}       # see cluster.watch.list_and_watch: set while the watch is down
        self.last_error = ""
        # When the watch began to fail, absolute: a status message that says "for 3s" would be
        # rewritten by every pass only because the number grew.
        self.failed_at = ""
        self.task: asyncio.Task[None] | None = None
        # The maxObjects of the context entries reading this cache: crossing one changes their
        # policies' status, so it is announced as a change of sync state is.
        self.limits: frozenset[Limit] = frozenset()
        self._on_limit_crossed = on_limit_crossed

    @property
    def count(self) -> int:
        return len(self.sizes)

    def problem(self) -> str:
        """"" while in sync; else why not, for messages and the policy's condition."""
        error = f" ({self.last_error})" if self.last_error else ""
        if not self.loaded.is_set():
            return f"{self.source} has not been listed yet{error}"
        if self.unsynced:
            since = f" since {self.failed_at}" if self.failed_at else ""
            return f"the watch of {self.source} has failed{since} and not listed again{error}"
        return ""

    def failed(self, error: str) -> None:
        """Note a watch failure; the time kept is the first one's, until the cache is in sync again."""
        self.last_error = error
        self.failed_at = self.failed_at or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def apply(self, kind: str, body: Mapping[str, Any]) -> None:
        """One watch event (``kind``: ADDED, MODIFIED or DELETED). Objects are kept without their
        managedFields; crossing a context's maxObjects, either way, is announced."""
        metadata = body.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        key = (namespace, name)
        before = len(self.objects.get(namespace, ())), self.count
        self.total_bytes -= self.sizes.pop(key, 0)
        if kind == "DELETED":
            self.objects.get(namespace, {}).pop(name, None)
        else:
            body = _without_managed_fields(body)
            self.objects.setdefault(namespace, {})[name] = body
            self.sizes[key] = size = _size(body)
            self.total_bytes += size
        self._snapshots.pop(namespace, None)
        self._snapshots.pop(None, None)
        after = len(self.objects.get(namespace, ())), self.count
        if before != after and self._on_limit_crossed is not None and self._crossed(before, after):
            self._on_limit_crossed()

    def _crossed(self, before: tuple[int, int], after: tuple[int, int]) -> bool:
        """Whether counts (in the namespace, in all) went over a limit or back under it."""
        return any((before[0 if per_namespace else 1] > limit) != (after[0 if per_namespace else 1] > limit)
                   for per_namespace, limit in self.limits)

    def over(self, per_namespace: bool, limit: int) -> list[tuple[str, int]]:
        """Where a listing holds more than ``limit`` objects: (namespace, objects), largest first;
        one ("", all objects) for a listing of every namespace."""
        if not per_namespace:
            return [("", self.count)] if self.count > limit else []
        return sorted(((namespace, len(names)) for namespace, names in self.objects.items() if len(names) > limit),
                      key=lambda item: (-item[1], item[0]))

    def listed(self, keys: set[str]) -> None:
        """After a full listing: drop what it no longer holds (deleted while not watching)."""
        for namespace, names in list(self.objects.items()):
            for name in list(names):
                if _key(namespace, name) not in keys:
                    self.apply("DELETED", {"metadata": {"namespace": namespace, "name": name}})
        self.last_error = self.failed_at = ""

    def listing(self, namespace: str | None) -> Listing:
        """The objects in ``namespace`` (None: all), one tuple shared until the namespace changes."""
        problem = self.problem()
        if problem:
            return Listing(problem=problem)
        snapshot = self._snapshots.get(namespace)
        if snapshot is None:
            # Each dict copied in one step (a C call, under the GIL): an evaluation on a thread
            # (operator/apart.py) never iterates a dict that a watch event changes meanwhile.
            if namespace is None:
                snapshot = tuple(body for names in self.objects.copy().values() for body in names.copy().values())
            else:
                snapshot = tuple(self.objects.get(namespace, {}).copy().values())
            self._snapshots[namespace] = snapshot
        return Listing(snapshot)


class Sources:
    """Every cache this replica runs, and the engine's ``Inputs`` over them."""

    def __init__(self, api_client: client.ApiClient | None, discovery: Discovery | None) -> None:
        self.api_client = api_client
        self.discovery = discovery
        self.caches: dict[api.ContextSource, SourceCache] = {}
        self.kinds: dict[api.ParamKind, Resolved | str] = {}     # resolved, or why not
        self.wanted: set[api.ContextSource] = set()
        self.wanted_kinds: set[api.ParamKind] = set()
        self.limits: dict[api.ContextSource, frozenset[Limit]] = {}
        self.changed = asyncio.Event()            # what the policies want changed
        self._sync_changed = asyncio.Event()      # see sync_changed

    # --- the engine's Inputs -----------------------------------------------------------------------------

    def params(self, kind: api.ParamKind, namespace: str | None) -> Listing:
        resolved = self.kinds.get(kind)
        if resolved is None:
            return Listing(problem=f"{kind} has not been looked up in discovery yet")
        if isinstance(resolved, str):
            return Listing(problem=resolved)
        cache = self.caches.get(resolved.source)
        if cache is None:
            return Listing(problem=f"{kind} is not being watched yet")
        return cache.listing(namespace if resolved.namespaced else None)

    def context(self, entry: api.ContextEntry, namespace: str | None) -> Listing:
        cache = self.caches.get(entry.source)
        if cache is None:
            return Listing(problem=f"{entry.source} is not being watched yet")
        return cache.listing(namespace)

    # --- which caches run ----------------------------------------------------------------------------------

    def want(self, policies: PolicySet) -> None:
        """What the loaded policies read; the caches follow in ``run``."""
        entries = [entry for policy in policies for entry in policy.policy.context]
        sources = {entry.source for entry in entries}
        kinds = {policy.policy.param_kind for policy in policies if policy.policy.param_kind is not None}
        limits: dict[api.ContextSource, set[Limit]] = {}
        for entry in entries:
            limits.setdefault(entry.source, set()).add((entry.scope == "RequestNamespace", entry.max_objects))
        self.limits = {source: frozenset(found) for source, found in limits.items()}
        for source, cache in self.caches.items():
            cache.limits = self.limits.get(source, frozenset())
        if sources != self.wanted or kinds != self.wanted_kinds:
            self.wanted, self.wanted_kinds = sources, kinds
            self.changed.set()

    def problems(self, policy: api.AdmissionPolicy) -> InputProblems:
        """Why requests reading this policy's params or context get its failurePolicy answer (none:
        they do not), for its condition."""
        unsynced = []
        if policy.param_kind is not None:
            problem = self.params(policy.param_kind, None).problem
            if problem:
                unsynced.append(f"params ({policy.param_kind}): {problem}")
        over_cap = []
        for entry in policy.context:
            problem = self.context(entry, None).problem
            if problem:
                unsynced.append(f"context {entry.name!r}: {problem}")
            elif over := self.caches[entry.source].over(entry.scope == "RequestNamespace", entry.max_objects):
                over_cap.append(_over_cap(entry, over))
        return InputProblems(tuple(unsynced), tuple(over_cap))

    def sync_changed(self) -> asyncio.Event:
        """An event set at the next change of any cache's sync state (or of a context's count across
        its maxObjects). Take it before reading the state, then wait on it: a change in between is
        not missed."""
        return self._sync_changed

    def _announce(self) -> None:
        self._sync_changed.set()
        self._sync_changed = asyncio.Event()

    async def run(self) -> None:
        """Start and stop caches as the policies change; look up again, with backoff, the kinds
        discovery could not resolve (it failed, or the kind is not served yet)."""
        backoff = RETRY_MIN
        while True:
            self.changed.clear()
            try:
                await self._reconcile()
                retry = any(not isinstance(self.kinds.get(kind), Resolved) for kind in self.wanted_kinds)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("Updating the context and param caches failed, retrying in %.0fs: %s", backoff, exc)
                retry = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff if retry else None):
                    await self.changed.wait()
            backoff = min(backoff * 2, RETRY_MAX) if retry else RETRY_MIN

    async def _reconcile(self) -> None:
        for kind in list(self.kinds):
            if kind not in self.wanted_kinds:
                del self.kinds[kind]
        for kind in self.wanted_kinds:   # one failing does not keep the others, nor the context, waiting
            if not isinstance(self.kinds.get(kind), Resolved):
                self.kinds[kind] = await self._resolve(kind)
        needed = set(self.wanted) | {r.source for r in self.kinds.values() if isinstance(r, Resolved)}
        for source in needed - set(self.caches):
            self.start(source)
        for source in set(self.caches) - needed:
            await self.stop(source)
        self._announce()

    async def _resolve(self, kind: api.ParamKind) -> Resolved | str:
        """paramKind → its resource, through discovery (which knows preferred versions: another
        version of the same group and kind has the same plural); or why not."""
        assert self.discovery is not None
        try:
            for fresh in (False, True):
                served = await (self.discovery.fresh_resources() if fresh else self.discovery.resources())
                for resource in served:
                    if resource.group == kind.group and resource.kind == kind.kind:
                        return Resolved(api.ContextSource(kind.group, kind.version, resource.resource),
                                        resource.namespaced)
        except Exception as exc:   # the API server briefly down, say: looked up again in run()
            logger.warning("Looking up %s in discovery failed (retrying): %s", kind, failure_text(exc))
            return f"looking up {kind} in discovery failed (retrying): {failure_text(exc)}"
        return f"the cluster serves no kind {kind} (install its API, or fix spec.paramKind)"

    def start(self, source: api.ContextSource) -> SourceCache:
        """A cache of ``source``, watched from now on (without an API client: filled by hand, in tests)."""
        cache = self.caches[source] = SourceCache(source, on_limit_crossed=self._announce)
        cache.limits = self.limits.get(source, frozenset())
        if self.api_client is not None:
            cache.task = asyncio.create_task(self._watch(cache), name=f"admission-policy: cache of {source}")
        logger.info("Watching %s for policies' params and context", source)
        return cache

    async def stop(self, source: api.ContextSource) -> None:
        """Stop watching ``source`` and drop its objects: no policy reads it any more."""
        cache = self.caches.pop(source)
        if cache.task is not None:
            cache.task.cancel()
            await asyncio.gather(cache.task, return_exceptions=True)
        logger.info("Stopped watching %s: no policy reads it any more", source)

    async def close(self) -> None:
        """Stop every watch, at shutdown."""
        for source in list(self.caches):
            await self.stop(source)

    async def _watch(self, cache: SourceCache) -> None:
        assert self.api_client is not None
        was = cache.problem()

        def changed() -> None:
            nonlocal was
            now = cache.problem()
            if bool(now) != bool(was):
                self._announce()
                logger.log(logging.WARNING if now else logging.INFO, "%s: %s", cache.source,
                           now or "in sync again")
            was = now

        def on_event(kind: str, body: Mapping[str, Any]) -> None:
            cache.apply(kind, body)

        def on_listed(keys: set[str]) -> None:
            cache.listed(keys)
            asyncio.get_running_loop().call_soon(changed)   # after list_and_watch marks it loaded

        def on_error(error: str) -> None:
            cache.failed(error)
            changed()

        await list_and_watch(str(cache.source), lister(self.api_client, cache.source), on_event, on_listed,
                             cache.loaded, cache.unsynced, on_error=on_error)

    def stats(self) -> Iterator[tuple[str, int, float, bool]]:
        """(source, objects, bytes per object, in sync) per cache, for the metrics."""
        for source, cache in sorted(self.caches.items(), key=lambda item: str(item[0])):
            per_object = cache.total_bytes / cache.count if cache.count else 0.0
            yield str(source), cache.count, per_object, not cache.problem()


def lister(api_client: client.ApiClient, source: api.ContextSource) -> Callable[..., Any]:
    """A list/watch call for any resource (core or grouped) across namespaces, with the source's
    label selector applied by the API server: the shape ``cluster.watch.list_and_watch`` calls."""
    prefix = f"/apis/{source.group}/{source.version}" if source.group else f"/api/{source.version}"
    path = f"{prefix}/{source.resource}"
    selector = api.selector_text(source.label_selector)

    async def call(**kwargs: Any) -> Any:
        query: list[tuple[str, str]] = []
        if selector:
            query.append(("labelSelector", selector))
        if kwargs.get("watch"):
            query.append(("watch", "true"))
        if kwargs.get("resource_version"):
            query.append(("resourceVersion", str(kwargs["resource_version"])))
        if kwargs.get("timeout_seconds"):
            query.append(("timeoutSeconds", str(kwargs["timeout_seconds"])))
        if kwargs.get("allow_watch_bookmarks"):
            query.append(("allowWatchBookmarks", "true"))
        return await api_client.call_api(path, "GET", query_params=query, header_params={"Accept": "application/json"},
                                         auth_settings=["BearerToken"], _preload_content=False,
                                         _request_timeout=kwargs.get("_request_timeout"))
    return call


def _over_cap(entry: api.ContextEntry, over: list[tuple[str, int]]) -> str:
    """A context over its maxObjects, as its policy's condition says it."""
    cap = f"its maxObjects of {entry.max_objects:,} ({entry.path}.maxObjects)"
    if entry.scope == "All":
        return f"context {entry.name!r} holds {over[0][1]:,} objects, over {cap}"
    shown = ", ".join(f"{namespace} ({count:,})" for namespace, count in over[:3])
    more = f" and {len(over) - 3} more" if len(over) > 3 else ""
    return f"context {entry.name!r} holds more objects than {cap} in namespace(s) {shown}{more}"


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def _without_managed_fields(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """Kept without ``metadata.managedFields``: often the largest part of an object, never what a
    context is for (see docs/params-and-context.md)."""
    metadata = body.get("metadata")
    if not isinstance(metadata, Mapping) or "managedFields" not in metadata:
        return body
    return {**body, "metadata": {key: value for key, value in metadata.items() if key != "managedFields"}}


def _size(body: Mapping[str, Any]) -> int:
    try:
        return len(marshal.dumps(dict(body), 2))
    except ValueError:
        return 0
