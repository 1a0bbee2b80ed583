"""Every object of a resource, page by page, without those admission never judges.

The background audit and the CLI's cluster audit list alike, so both judge what the webhooks
would have judged.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final, Protocol

from kubernetes_asyncio import client

from ..engine.background import Resource
from ..errors import AdmissionPolicyError
from .client import call_json, message_of, resource_path
from .discovery import DiscoveredResource
from .routing import Exemptions, never_judged

MAX_RELISTS: Final = 3     # a listing whose continue token expired starts over at most this often


class ListingSettings(Exemptions, Protocol):
    @property
    def audit_page_size(self) -> int: ...


async def list_objects(api_client: client.ApiClient, settings: ListingSettings, target: DiscoveredResource,
                       progress: Callable[[int, int | None], None] | None = None, *, namespace: str = "",
                       ) -> AsyncIterator[tuple[Resource, dict[str, Any]]]:
    """The objects of one resource, ``settings.audit_page_size`` at a time, without those
    admission never judges, each once. ``progress(listed, estimated total)`` after each page.

    A continue token that expired (410) is followed by the one the API server offers with it (the
    rest of the list from a newer snapshot: right for an audit); without one, the listing starts
    over and skips what it already gave — items come in key order, namespace then name.
    ``namespace``: that namespace's objects only (a tenant policy's)."""
    path = resource_path(target.group, target.version, target.resource, namespace=namespace)
    token, relists, listed = "", 0, 0
    given, skip_to = "", ""   # the key of the last item given; after starting over, skip up to it
    while True:
        query = [("limit", str(settings.audit_page_size))]
        if token:
            query.append(("continue", token))
        status, page = await call_json(api_client, "GET", path, query=query)
        if status == 410 and token and relists < MAX_RELISTS:   # the continue token expired
            offered = (page.get("metadata") or {}).get("continue") if isinstance(page, Mapping) else None
            token, relists = str(offered or ""), relists + 1
            skip_to, listed = ("", listed) if token else (given, 0)
            continue
        if status != 200 or not isinstance(page, Mapping):
            raise ListingError(f"cannot list {display(target)}: {status} {message_of(page)}".strip())
        items = page.get("items") or []
        # The list's kind names its items' (their own kind is usually left out of a list).
        kind = str(page.get("kind") or "").removesuffix("List") or next(
            (str(item.get("kind")) for item in items if isinstance(item, dict) and item.get("kind")), "")
        resource = Resource(target.group, target.version, target.resource, kind, target.namespaced)
        meta = page.get("metadata") or {}
        listed += len(items)
        if progress is not None:
            remaining = meta.get("remainingItemCount")
            progress(listed, listed + int(remaining) if isinstance(remaining, int) else
                     (None if meta.get("continue") else listed))
        for item in items:
            if not isinstance(item, dict):
                continue
            metadata = item.get("metadata") or {}
            key = f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}"
            if skip_to and key <= skip_to:   # (only after starting over: aggregated APIs need not sort)
                continue
            given = key
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", kind)
            namespace = str(metadata.get("namespace") or "") if target.namespaced else ""
            if never_judged(settings, target.group, target.resource, namespace, str(metadata.get("name"))):
                continue
            yield resource, item
        token = str(meta.get("continue") or "")
        if not token:
            return


class ListingError(AdmissionPolicyError):
    """A resource the scan could not list (RBAC, an aggregated API down)."""


def display(target: DiscoveredResource) -> str:
    return f"{target.resource}.{target.group}" if target.group else target.resource
