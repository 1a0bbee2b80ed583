"""Kubernetes API access for the operator's own tasks (Kopf has its own connection)."""
from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from .webhookconfig import DiscoveredResource

logger = logging.getLogger(__name__)

# Seconds an API call of the operator's own (not a watch) may take: without a limit the client
# waits on a half-open connection for ever, and the audit, the reports or discovery with it.
CALL_TIMEOUT = 60.0
NO_ANSWER = "no answer from the API server within {:g} s"


async def new_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster credentials when running in a pod, the kubeconfig otherwise (like Kopf);
    with ``kubeconfig``, that file's current context."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return client.ApiClient(configuration=configuration)
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration=configuration)


async def leads_peering(api: client.ApiClient, name: str, priority: int) -> bool:
    """Whether Kopf's peering lets the replica of this ``priority`` reconcile: no live peer of a
    higher priority and no other of the same one in the ClusterKopfPeering ``name`` — the rule by
    which Kopf pauses the others (kopf/_core/engines/peering.py: process_peering_event). Without
    the object, Kopf does not pause."""
    objects = client.CustomObjectsApi(api)
    try:
        listing: Any = await objects.list_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", field_selector=f"metadata.name={name}")
    except client.ApiException as exc:
        if exc.status == 404:   # no peering CRD
            return True
        raise
    items = [item for item in listing.get("items") or [] if item.get("metadata", {}).get("name") == name]
    if not items:
        return True
    return first_in_peering(items[0].get("status") or {}, priority, datetime.datetime.now(datetime.UTC))


def first_in_peering(peers: dict[str, Any], priority: int, now: datetime.datetime) -> bool:
    """Given a peering object's status (identity → priority, lifetime, lastseen)."""
    live = [int(peer.get("priority") or 0) for peer in peers.values()
            if isinstance(peer, dict) and not _expired(peer, now)]
    return not any(other > priority for other in live) and live.count(priority) <= 1


def _expired(peer: dict[str, Any], now: datetime.datetime) -> bool:
    try:
        seen = datetime.datetime.fromisoformat(str(peer["lastseen"]))
    except (KeyError, ValueError):
        return False
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=datetime.UTC)
    return seen + datetime.timedelta(seconds=int(peer.get("lifetime") or 60)) <= now


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
        try:
            response = await self._api.call_api(path, "GET", header_params={"Accept": "application/json"},
                                                response_types_map={200: "object"}, auth_settings=["BearerToken"],
                                                _return_http_data_only=True,
                                                _request_timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT))
        except TimeoutError:
            raise client.ApiException(status=504, reason=f"discovery of {path}: {NO_ANSWER.format(CALL_TIMEOUT)}") \
                from None
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
                               namespaced=bool(item.get("namespaced", True)), kind=str(item.get("kind", "")))
            for name, item in mains.items()]


async def call_json(api: client.ApiClient, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                    body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
    """One API call on a path of any resource (the typed clients know only built-in kinds):
    the HTTP status and the decoded JSON body, whatever the status (the caller decides). No answer
    within ``CALL_TIMEOUT`` is a 504, an API server that cannot be reached a 503, each with a message."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    try:
        async with asyncio.timeout(CALL_TIMEOUT):
            response: Any = await api.call_api(path, method, query_params=query or [], header_params=headers,
                                               body=body, auth_settings=["BearerToken"], _preload_content=False)
            try:
                data = await response.read()
            finally:
                response.release()
    except TimeoutError:
        return 504, {"message": NO_ANSWER.format(CALL_TIMEOUT)}
    except aiohttp.ClientError as exc:
        return 503, {"message": f"cannot reach the API server: {exc}"}
    try:
        decoded = json.loads(data) if data else None
    except ValueError:
        decoded = {"message": data[:500].decode("utf-8", "replace")}
    return int(response.status), decoded


def message_of(answer: Any) -> str:
    """A failed call's Status message ("" when the answer has none)."""
    return str(answer.get("message", "")) if isinstance(answer, Mapping) else ""


def resource_path(group: str, version: str, resource: str, namespace: str = "", name: str = "") -> str:
    """``/api/v1/namespaces/NS/pods/NAME``, ``/apis/GROUP/VERSION/RESOURCE`` and the like."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{resource}" + (f"/{name}" if name else "")
