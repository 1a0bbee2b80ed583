"""Every replica's own list+watch of AdmissionPolicies, AdmissionPolicyExceptions and Namespaces.

Kopf's watch streams pause when peering makes another replica the active one; admission must
not (``cluster.watch``). Events are applied idempotently: a replayed or status-only event
changes nothing.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from .. import api, policyexception
from ..cluster.watch import list_and_watch
from .store import ExceptionStore, PolicyStore

logger = logging.getLogger(__name__)


async def watch_policies(api_client: client.ApiClient, store: PolicyStore) -> None:
    objects = client.CustomObjectsApi(api_client)
    await list_and_watch(
        "AdmissionPolicies",
        lambda **kw: objects.list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL, **kw),
        store.apply, store.sync, store.readiness.policies_loaded, store.readiness.unsynced)


async def watch_tenant_policies(api_client: client.ApiClient, store: PolicyStore) -> None:
    """NamespacedAdmissionPolicies, into the same store under "namespace/name". Readiness waits for
    their first listing too, unless the cluster does not serve them (their CRD not installed)."""
    objects = client.CustomObjectsApi(api_client)
    await list_and_watch(
        "NamespacedAdmissionPolicies",
        lambda **kw: objects.list_cluster_custom_object(api.GROUP, api.VERSION, api.NAMESPACED_PLURAL, **kw),
        store.apply, lambda names: store.sync(names, namespaced=True), store.readiness.tenant_policies_loaded,
        store.readiness.unsynced, crd="crds/namespacedadmissionpolicy.yaml")


async def watch_exceptions(api_client: client.ApiClient, store: ExceptionStore,
                           unsynced: dict[str, float]) -> None:
    """AdmissionPolicyExceptions; as tenant policies, none while their CRD is not installed."""
    objects = client.CustomObjectsApi(api_client)
    await list_and_watch(
        "AdmissionPolicyExceptions",
        lambda **kw: objects.list_cluster_custom_object(api.GROUP, api.VERSION, policyexception.PLURAL, **kw),
        store.apply, store.sync, store.loaded, unsynced, crd="crds/admissionpolicyexception.yaml")


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

    await list_and_watch("Namespaces", core.list_namespace, on_event, on_listed, store.readiness.namespaces_loaded,
                          store.readiness.unsynced)


