"""What ``admission-policy cleanup`` (the chart's uninstall hook) deletes: the operator's webhook
configurations (``remove_configurations``), and every Validating- and MutatingAdmissionPolicy and
binding that native enforcement generated (``vap/native.py`` labels them, ``operator/native.py``
writes them).

Left behind, they would go on enforcing policies whose operator is gone, and their finalizer
would keep them terminating for ever once deleted. Each is found by the managed-by label, its
finalizer released (a merge patch of ``metadata.finalizers`` without ours, on the resourceVersion
listed), then deleted; the bindings first, so that nothing is enforced any more from the first
deletion on. Nothing of a Helm release is on them (their names and labels come from the policies,
which every release in a cluster shares), so all of them go. Works without a running operator:
a function of API calls only, with the RBAC the chart's uninstall hook grants (list, patch and
delete; discovery is open to every authenticated user).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Mapping
from typing import Any, Final, Protocol

from kubernetes_asyncio import client

from ..cluster.client import message_of, served_version
from ..vap import native as generate
from ..vap.objects import (
    BINDING,
    GROUP,
    MUTATING_BINDING,
    MUTATING_POLICY,
    MUTATING_VERSIONS,
    PLURALS,
    POLICY,
    api_path,
)

SELECTOR: Final = ",".join(f"{key}={value}" for key, value in generate.MANAGED_BY.items())
ATTEMPTS: Final = 5   # an object changed under us (a replica still shutting down rewrote it): read it again


class Call(Protocol):
    """``cluster.client.call_json`` bound to an API client: the HTTP status and the decoded body."""

    def __call__(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                 body: Any = None, content_type: str = "application/json") -> Awaitable[tuple[int, Any]]: ...


@dataclasses.dataclass
class Removal:
    """What the cleanup did, each entry "Kind name"; ``version`` None: no ValidatingAdmissionPolicy
    API (``mutating_version``: no MutatingAdmissionPolicy API)."""
    version: str | None = None
    mutating_version: str | None = None
    deleted: list[str] = dataclasses.field(default_factory=list)
    terminating: list[str] = dataclasses.field(default_factory=list)   # held by someone else's finalizer
    failed: list[str] = dataclasses.field(default_factory=list)        # "Kind name: why"


async def remove_generated(call: Call) -> Removal:
    """Delete every generated policy and binding; one that cannot be is noted and the rest go on."""
    removal = Removal(await served_version(call, GROUP, generate.VALIDATING_VERSIONS, PLURALS[POLICY]))
    if removal.version is None:
        return removal
    removal.mutating_version = await served_version(call, GROUP, MUTATING_VERSIONS, PLURALS[MUTATING_POLICY])
    kinds = [(BINDING, removal.version), (MUTATING_BINDING, removal.mutating_version),
             (POLICY, removal.version), (MUTATING_POLICY, removal.mutating_version)]
    for kind, version in kinds:   # bindings first: nothing enforced from the first deletion on
        if version is None:
            continue
        try:
            listed = await _list(call, version, kind)
        except RuntimeError as exc:
            removal.failed.append(f"{PLURALS[kind]}: {exc}")
            continue
        for obj in listed:
            await _remove(call, version, kind, obj, removal)
    return removal


async def _list(call: Call, version: str, kind: str, name: str | None = None) -> list[dict[str, Any]]:
    query = [("labelSelector", SELECTOR)]
    if name is not None:   # one object read again: a list (the hook is granted no get)
        query.append(("fieldSelector", f"metadata.name={name}"))
    code, answer = await call("GET", api_path(version, kind), query=query)
    if not 200 <= code <= 299:
        raise RuntimeError(f"listing failed ({code}): {message_of(answer)}")
    return list(answer.get("items") or [])


async def _remove(call: Call, version: str, kind: str, obj: Mapping[str, Any], removal: Removal) -> None:
    name = obj["metadata"]["name"]
    what, path = f"{kind} {name}", api_path(version, kind, name)
    released = False
    for _ in range(ATTEMPTS):
        metadata = obj["metadata"]
        finalizers = list(metadata.get("finalizers") or ())
        if generate.FINALIZER in finalizers:
            kept = [f for f in finalizers if f != generate.FINALIZER]
            code, answer = await call("PATCH", path, body={"metadata": {
                "finalizers": kept or None, "resourceVersion": metadata.get("resourceVersion")}},
                content_type="application/merge-patch+json")
            if code == 404:
                return   # gone meanwhile: not ours to report
            if code == 409:
                again = await _reread(call, version, kind, name, what, removal)
                if again is None:
                    return
                obj = again
                continue
            if not 200 <= code <= 299:
                removal.failed.append(f"{what}: releasing its finalizer failed ({code}): {message_of(answer)}")
                return
            released = True
        code, answer = await call("DELETE", path)
        if code == 404:
            if released:   # it was terminating already: releasing the finalizer let it go
                removal.deleted.append(what)
            return
        if not 200 <= code <= 299:
            removal.failed.append(f"{what}: deleting failed ({code}): {message_of(answer)}")
            return
        # The object as deleted, or a Status when it went at once (both say it is gone).
        answer = answer if isinstance(answer, dict) and answer.get("kind") != "Status" else {}
        left = list((answer.get("metadata") or {}).get("finalizers") or ())
        if generate.FINALIZER in left:
            obj = answer   # written anew between our patch and the delete (a replica still running)
            continue
        if left:
            removal.terminating.append(f"{what} (finalizers: {', '.join(left)})")
        else:
            removal.deleted.append(what)
        return
    else:
        removal.failed.append(f"{what}: still rewritten after {ATTEMPTS} attempts (is an operator still running?)")


async def _reread(call: Call, version: str, kind: str, name: str, what: str,
                  removal: Removal) -> dict[str, Any] | None:
    try:
        found = await _list(call, version, kind, name)
    except RuntimeError as exc:
        removal.failed.append(f"{what}: reading it again failed: {exc}")
        return None
    return found[0] if found else None


async def remove_configurations(api_client: client.ApiClient, name: str) -> list[str]:
    """Delete the webhook configurations ``name`` (both kinds); absent ones are fine. Returns the kinds
    deleted."""
    registrations = client.AdmissionregistrationV1Api(api_client)
    deleted = []
    for kind, delete in (("ValidatingWebhookConfiguration", registrations.delete_validating_webhook_configuration),
                         ("MutatingWebhookConfiguration", registrations.delete_mutating_webhook_configuration)):
        try:
            await delete(name)
            deleted.append(kind)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    return deleted
