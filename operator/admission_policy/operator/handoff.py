"""Admission results handed over to the replica that writes the reports.

Every replica serves the webhooks; only the reconciling one writes reports. A ``reportAdmission``
policy's failure judged by another replica would otherwise reach the reports only at the next
scan, and never when the scan cannot see it (an UPDATE-only rule, ``oldObject``, ``userInfo``).
So a replica that does not reconcile keeps its admission results in a ConfigMap of its own in
the operator's namespace, rewritten only when they change, and the reconciling replica reads them
all (``HANDOFF_LABEL``) while some policy reports admissions, and deletes those holding nothing a
scan has not superseded (a replica that went away leaves its ConfigMap behind).

A ConfigMap, not a custom resource or Events: no CRD to install, no loss to Event aggregation,
and one object per replica bounded by ``reports.MAX_RESULTS`` results per policy.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Final, TypeAlias

from kubernetes_asyncio import client

from .. import reports
from ..cluster.client import call_json, message_of, resource_path

logger = logging.getLogger(__name__)

HANDOFF_LABEL: Final = "policy-operator.dev/admission-results"
DATA_KEY: Final = "results.json"
MAX_BYTES: Final = 900_000   # a ConfigMap holds at most 1 MiB: the oldest objects' results go first

ObjectKey: TypeAlias = tuple[str, str, str]   # kind, namespace, name
# Admission results by policy and object: the object's reference and its entries (reports.entries).
Admissions: TypeAlias = dict[str, dict[ObjectKey, tuple[reports.ObjectRef, list[reports.Entry]]]]


def configmap_name(pod_name: str) -> str:
    """The ConfigMap of the replica running in ``pod_name``: one each, so replicas never write
    the same object; cut to a valid object name."""
    return f"admission-results-{pod_name}"[:253].rstrip("-.")


def newest(entries: Iterable[reports.Entry]) -> int:
    """When the newest of an object's results was seen (0 for none)."""
    return max((entry.seen for entry in entries), default=0)


def encode(admissions: Admissions) -> str:
    """The results as JSON, newest objects first, within ``MAX_BYTES``."""
    objects = sorted((entries for kept in admissions.values() for _, entries in kept.values()),
                     key=newest, reverse=True)
    encoded: list[str] = []
    size = 2
    for entry in (entry for entries in objects for entry in entries):
        text = json.dumps({"policy": entry.policy, "rule": entry.rule, "result": entry.result,
                           "message": entry.message, "enforcement": entry.enforcement, "seen": entry.seen,
                           "resource": entry.ref.as_dict()}, separators=(",", ":"), sort_keys=True)
        size += len(text) + 1
        if size > MAX_BYTES:
            break
        encoded.append(text)
    return "[" + ",".join(encoded) + "]"


def decode(text: str) -> list[reports.Entry]:
    """What ``encode`` wrote; what does not read as a result is skipped (another version's, say)."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    found = []
    for item in items if isinstance(items, list) else ():
        ref = item.get("resource") if isinstance(item, dict) else None
        if not isinstance(ref, dict) or not isinstance(item.get("seen"), int) or not all(
                isinstance(item.get(key), str) for key in ("policy", "rule", "result", "message", "enforcement")):
            continue
        found.append(reports.Entry(
            item["policy"], item["rule"], item["result"], item["message"],
            reports.ObjectRef.read(ref),
            item["enforcement"], item["seen"], reports.ORIGIN_ADMISSION))
    return found


def by_object(entries: Iterable[reports.Entry]) -> Admissions:
    """Entries grouped by policy, then object: an object's admission results go in together,
    in place of the ones a scan found for it."""
    grouped: Admissions = {}
    for entry in entries:
        _, kept = grouped.setdefault(entry.policy, {}).setdefault(entry.ref.key, (entry.ref, []))
        kept.append(entry)
    return grouped


class Handoff:
    """The ConfigMaps: this replica's (``publish``) and everybody's (``collect``, ``remove``)."""

    def __init__(self, api: client.ApiClient, namespace: str, pod_name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = configmap_name(pod_name)
        self.published = ""   # what this replica's ConfigMap holds ("": none)

    def _path(self, name: str = "") -> str:
        return resource_path("", "v1", "configmaps", self.namespace, name)

    async def publish(self, admissions: Admissions) -> bool:
        """Write this replica's results when they changed; delete the ConfigMap when none are left.
        False when the write failed (said in the log): to be tried again."""
        text = encode(admissions) if any(admissions.values()) else ""
        if text == self.published:
            return True
        if not text:
            status, answer = await call_json(self.api, "DELETE", self._path(self.name))
            if status == 404:
                status = 200
        else:
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "labels": {reports.MANAGED_BY[0]: reports.MANAGED_BY[1], HANDOFF_LABEL: "true"}},
                    "data": {DATA_KEY: text}}
            status, answer = await call_json(self.api, "PUT", self._path(self.name), body=body)
            if status == 404:
                status, answer = await call_json(self.api, "POST", self._path(), body=body)
        if 200 <= status <= 299:
            self.published = text
            return True
        logger.warning("Handing admission results over (ConfigMap %s/%s) failed: %s %s", self.namespace,
                       self.name, status, message_of(answer))
        return False

    async def collect(self) -> dict[str, list[reports.Entry]] | None:
        """Every replica's results by ConfigMap name; None when they cannot be read (said in the log)."""
        status, listing = await call_json(self.api, "GET", self._path(),
                                          query=[("labelSelector", f"{HANDOFF_LABEL}=true")])
        if status != 200 or not isinstance(listing, Mapping):
            logger.warning("Reading the admission results of the other replicas failed: %s %s", status,
                           message_of(listing))
            return None
        found: dict[str, list[reports.Entry]] = {}
        for item in listing.get("items") or ():
            name = str((item.get("metadata") or {}).get("name") or "")
            found[name] = decode(str((item.get("data") or {}).get(DATA_KEY) or ""))
        return found

    async def remove(self, name: str) -> None:
        """Delete a ConfigMap that holds nothing left to report (a replica gone, or results superseded)."""
        status, answer = await call_json(self.api, "DELETE", self._path(name))
        if name == self.name:
            self.published = ""
        if status not in (200, 202, 404):
            logger.warning("Deleting the admission results %s/%s failed: %s %s", self.namespace, name, status,
                           message_of(answer))

