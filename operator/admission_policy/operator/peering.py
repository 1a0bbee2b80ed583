"""Whether Kopf's peering lets this replica reconcile (the serving path never asks)."""
from __future__ import annotations

import datetime
from typing import Any

from kubernetes_asyncio import client


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
