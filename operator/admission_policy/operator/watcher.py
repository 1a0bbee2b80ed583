"""Every replica's own list+watch of AdmissionPolicies and Namespaces into the PolicyStore.

Kopf's watch streams pause when peering makes another replica the active one; admission must
not (``cluster.watch``). Events are applied idempotently: a replayed or status-only event
changes nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from .. import api
from ..cluster.watch import list_and_watch
from .store import PolicyStore


async def watch_policies(api_client: client.ApiClient, store: PolicyStore) -> None:
    objects = client.CustomObjectsApi(api_client)

    def on_event(kind: str, body: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            store.forget(str(body["metadata"]["name"]), "deleted")
        else:
            store.observe(body)

    await list_and_watch(
        "AdmissionPolicies",
        lambda **kw: objects.list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL, **kw),
        on_event, store.sync, store.policies_loaded, store.unsynced)


async def watch_namespaces(api_client: client.ApiClient, store: PolicyStore) -> None:
    core = client.CoreV1Api(api_client)

    def on_event(kind: str, body: Mapping[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        if kind == "DELETED":
            store.namespaces.pop(name, None)
        else:
            store.namespaces[name] = body

    def on_listed(names: set[str]) -> None:
        for name in set(store.namespaces) - names:
            store.namespaces.pop(name, None)

    await list_and_watch("Namespaces", core.list_namespace, on_event, on_listed, store.namespaces_loaded,
                          store.unsynced)


