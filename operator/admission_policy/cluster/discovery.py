"""What the cluster serves: each resource at its group's preferred version."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from kubernetes_asyncio import client

from ..api import split_resource
from . import client as calls

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DiscoveredResource:
    """A served resource at its group's preferred version, as discovery reports it."""

    group: str
    version: str
    resource: str  # the plural, without subresource
    subresources: tuple[str, ...] = ()
    namespaced: bool = True
    kind: str = ""   # for paramKind → resource (operator/sources.py)


class Discovery:
    """Served resources at their preferred versions, cached for a while.

    Webhook rules name resources at the version Kopf serves (the preferred one), and a policy
    that names a resource the cluster does not serve is reported Degraded.
    """

    def __init__(self, api: client.ApiClient, max_age: float = 60.0, min_age: float = 1.0) -> None:
        self._api = api
        self._max_age = max_age
        self._min_age = min_age   # a forced refresh reuses a discovery younger than this
        self._cached: tuple[float, tuple[DiscoveredResource, ...]] | None = None
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._cached = None

    async def resources(self) -> tuple[DiscoveredResource, ...]:
        return await self._within(self._max_age)

    async def fresh_resources(self) -> tuple[DiscoveredResource, ...]:
        """Discover again now, for a miss: a CRD created a moment ago is served at once, while the
        cached discovery may be a minute old. Rate-limited: policies missing the same resource
        together (or one retried) share one discovery per ``min_age``."""
        return await self._within(self._min_age)

    async def _within(self, age: float) -> tuple[DiscoveredResource, ...]:
        async with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] > age:
                self._cached = (time.monotonic(), await self._discover())
            return self._cached[1]

    async def _discover(self) -> tuple[DiscoveredResource, ...]:
        found: list[DiscoveredResource] = []
        core = await self._get("/api/v1")
        found += _resources("", "v1", core)
        groups = await self._get("/apis")
        for group in groups.get("groups", []):
            preferred = (group.get("preferredVersion") or {}).get("version")
            if not preferred:
                continue
            try:
                listing = await self._get(f"/apis/{group['name']}/{preferred}")
            except client.ApiException as exc:  # an aggregated API that is down must not stop us
                logger.warning("Discovery of %s/%s failed: %s", group["name"], preferred, exc.reason)
                continue
            found += _resources(group["name"], preferred, listing)
        return tuple(sorted(found, key=lambda r: (r.group, r.resource)))

    async def _get(self, path: str) -> dict[str, Any]:
        # The typed call, not call_json: a failure keeps the API server's reason ("503 Service Unavailable").
        # Bounded by the client (calls.BoundedApiClient), like every other call.
        try:
            response = await self._api.call_api(path, "GET", header_params={"Accept": "application/json"},
                                                response_types_map={200: "object"}, auth_settings=["BearerToken"],
                                                _return_http_data_only=True)
        except calls.NoAnswer as exc:
            raise client.ApiException(status=exc.status, reason=f"discovery of {path}: {exc.reason}") from None
        return dict(response or {})


def _resources(group: str, version: str, listing: dict[str, Any]) -> list[DiscoveredResource]:
    mains: dict[str, dict[str, Any]] = {}
    subresources: dict[str, list[str]] = {}
    for item in listing.get("resources", []):
        name = str(item.get("name", ""))
        main, sub = split_resource(name)
        if sub:
            subresources.setdefault(main, []).append(sub)
        else:
            mains[main] = item
    return [DiscoveredResource(group=group, version=version, resource=name,
                               subresources=tuple(sorted(subresources.get(name, ()))),
                               namespaced=bool(item.get("namespaced", True)), kind=str(item.get("kind", "")))
            for name, item in mains.items()]
