"""Kubernetes API access for the operator's own tasks (Kopf has its own connection)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kubernetes_asyncio import client, config

from .webhookconfig import DiscoveredResource

logger = logging.getLogger(__name__)


async def new_api_client() -> client.ApiClient:
    """In-cluster credentials when running in a pod, the kubeconfig otherwise (like Kopf)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration=configuration)


class Discovery:
    """Served resources at their preferred versions, cached for a while.

    Webhook rules name resources at the version Kopf serves (the preferred one), and a policy
    that names a resource the cluster does not serve is reported Degraded.
    """

    def __init__(self, api: client.ApiClient, max_age: float = 60.0) -> None:
        self._api = api
        self._max_age = max_age
        self._cached: tuple[float, tuple[DiscoveredResource, ...]] | None = None
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._cached = None

    async def resources(self) -> tuple[DiscoveredResource, ...]:
        async with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] > self._max_age:
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
        response = await self._api.call_api(path, "GET", header_params={"Accept": "application/json"},
                                            response_types_map={200: "object"}, auth_settings=["BearerToken"],
                                            _return_http_data_only=True)
        return dict(response or {})


def _resources(group: str, version: str, listing: dict[str, Any]) -> list[DiscoveredResource]:
    mains: dict[str, dict[str, Any]] = {}
    subresources: dict[str, list[str]] = {}
    for item in listing.get("resources", []):
        name = str(item.get("name", ""))
        main, _, sub = name.partition("/")
        if sub:
            subresources.setdefault(main, []).append(sub)
        else:
            mains[main] = item
    return [DiscoveredResource(group=group, version=version, resource=name,
                               subresources=tuple(sorted(subresources.get(name, ()))),
                               namespaced=bool(item.get("namespaced", True)))
            for name, item in mains.items()]
