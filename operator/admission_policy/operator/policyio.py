"""Reading and writing AdmissionPolicies and NamespacedAdmissionPolicies as the API server holds
them: the status writers (reconciliation, its followers, native enforcement) share these."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes_asyncio import client

from .. import api
from ..cluster.client import call_json, message_of
from .store import policy_path

if TYPE_CHECKING:   # the state imports the audit, which writes its status through here
    from .state import Operator


async def list_policies(op: Operator) -> list[kopf.Body]:
    """Every AdmissionPolicy and NamespacedAdmissionPolicy as the API server holds them now."""
    objects = client.CustomObjectsApi(op.api_client)
    found = []
    for plural in (api.PLURAL, api.NAMESPACED_PLURAL):
        listing: Any = await objects.list_cluster_custom_object(api.GROUP, api.VERSION, plural,
                                                                _preload_content=False)
        if listing.status == 404 and plural == api.NAMESPACED_PLURAL:
            continue   # not served: no CRD, no tenant policies
        if not 200 <= listing.status <= 299:   # unread, the client raises on no status
            raise client.ApiException(status=listing.status, reason=(await listing.text())[:500])
        found += [kopf.Body(raw) for raw in (await listing.json()).get("items", [])]
    return found


async def write_status(api_client: client.ApiClient, name: str, new_status: Mapping[str, Any],
                       resource_version: str | None = None) -> bool:
    """A status write now (not at the handler's end), so `kubectl get ap -w` shows the step: every
    writer of a policy's status (its conditions, ``native``, ``audit``) writes through here, a merge
    patch of its own fields. With ``resource_version``, only onto that version: False when the
    policy changed since (409)."""
    body: dict[str, Any] = {"status": dict(new_status)}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    code, answer = await call_json(api_client, "PATCH", policy_path(name) + "/status",
                                   body=body, content_type="application/merge-patch+json")
    if code == 409 and resource_version is not None:
        return False
    if not 200 <= code <= 299:
        raise client.ApiException(status=code, reason=message_of(answer))
    return True
