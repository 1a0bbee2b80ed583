"""The openreports Reports in the cluster: every policy's latest results, one Report per namespace.

Each scan replaces one policy's results here (``put``; a deleted policy's go with ``drop``), which
marks the namespaces they touch; ``flush`` then writes only the reports whose content differs
from what the cluster holds, creates the missing and deletes those nothing is left in. Results
keep the time they were first seen (``reports.Entry.seen``), so an idle cluster writes nothing.
Written only while the Report CRDs are installed; the operator does not install them.
"""
from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from .. import reports
from ..cluster.client import call_json, message_of, resource_path
from ..cluster.routing import BREAK_GLASS_LABEL

logger = logging.getLogger(__name__)

READ_BACKOFF = 60.0   # seconds before reading the reports again after a failure


class ReportBook:
    """The reports as they should be and as the cluster holds them, on the reconciling replica
    only: it alone writes reports, so two replicas never overwrite each other's."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.results: dict[str, reports.Results] = {}
        self.dirty: set[str] = set()
        self.failed: set[str] = set()   # written again after the next scan, not every round (a namespace being deleted)
        self.written: dict[str, Mapping[str, Any]] | None = None   # namespace → content; None: not read yet
        self._read_again = 0.0
        self._first_seen: dict[str, dict[tuple[str, str, str, str, str], int]] = {}   # see seen()

    def put(self, policy: str, results: reports.Results) -> None:
        """A scan's results for ``policy``, replacing its previous ones; ``flush`` writes them."""
        old = self.results.get(policy)
        self.dirty |= results.namespaces | (old.namespaces if old else set()) | self.failed
        self.failed.clear()
        self.results[policy] = results

    def drop(self, policy: str) -> None:
        """Forget a deleted policy's results; ``flush`` removes them from the reports."""
        self._first_seen.pop(policy, None)
        old = self.results.pop(policy, None)
        if old is not None:
            self.dirty |= old.namespaces

    def desired(self, namespace: str) -> dict[str, Any] | None:
        """The report this namespace should hold, or None when no policy has a result there."""
        entries: list[reports.Entry] = []
        counts: collections.Counter[str] = collections.Counter()
        found = False
        for results in self.results.values():
            if namespace in results.counts:
                found = True
                entries += results.entries.get(namespace, ())
                counts.update(results.counts[namespace])
        return reports.build_report(namespace, entries, counts) if found else None

    def seen(self, policy: str) -> dict[tuple[str, str, str, str, str], int]:
        """When the reports read from the cluster first saw each of a policy's results: a restarted
        operator's first scan keeps them, so it rewrites nothing that did not change. Asked once per
        policy (its first scan): the answer is not kept."""
        return self._first_seen.pop(policy, {})

    async def load(self, installed: bool) -> bool:
        """Read the reports the cluster holds, unless done already; False while they cannot be read."""
        if not installed:
            self.written = None
            return False
        if self.written is None:
            if time.monotonic() < self._read_again:
                return False
            try:
                self.written = await self._read_cluster()
                self._first_seen = {}   # read once here, not per policy scanned
                for content in self.written.values():
                    for policy, seen in reports.first_seen(content).items():
                        self._first_seen.setdefault(policy, {}).update(seen)
            except client.ApiException as exc:   # RBAC, say: said once a minute, not every round
                self._read_again = time.monotonic() + READ_BACKOFF
                logger.warning("Reading the audit reports failed (trying again in %.0f s): %s", READ_BACKOFF,
                               exc.reason)
                return False
            self.dirty |= set(self.written) | {ns for results in self.results.values() for ns in results.namespaces}
        return True

    async def flush(self, installed: bool) -> int:
        """Write what changed; the number of API writes (0 when nothing changed)."""
        if not await self.load(installed):
            return 0
        assert self.written is not None
        writes = 0
        for namespace in sorted(self.dirty):
            body = self.desired(namespace)
            try:
                if body is None:
                    if namespace in self.written:
                        await self._delete(namespace)
                        writes += 1
                        del self.written[namespace]
                elif self.written.get(namespace) != reports.content(body):
                    await self._write(namespace, body)
                    writes += 1
                    self.written[namespace] = reports.content(body)
            except client.ApiException as exc:
                logger.warning("Writing the audit report of %s failed (retried after the next scan): %s",
                               _where(namespace), exc.reason)
                self.failed.add(namespace)
            self.dirty.discard(namespace)
        return writes

    async def _read_cluster(self) -> dict[str, Mapping[str, Any]]:
        """The reports of ours the cluster holds (an earlier run's, or another replica's)."""
        found: dict[str, Mapping[str, Any]] = {}
        for resource in (reports.REPORTS, reports.CLUSTER_REPORTS):
            status, listing = await call_json(
                self.api, "GET", resource_path(reports.GROUP, reports.VERSION, resource),
                query=[("labelSelector", "=".join(reports.MANAGED_BY))])
            _check(status, listing, f"listing {resource}.{reports.GROUP}")
            for item in listing.get("items") or []:
                metadata = item.get("metadata") or {}
                if metadata.get("name") == reports.NAME:
                    found[str(metadata.get("namespace") or "")] = reports.content(item)
        return found

    def _path(self, namespace: str, name: str = "") -> str:
        resource = reports.REPORTS if namespace else reports.CLUSTER_REPORTS
        return resource_path(reports.GROUP, reports.VERSION, resource, namespace, name)

    async def _write(self, namespace: str, body: Mapping[str, Any]) -> None:
        # Break-glass labelled: a policy wide enough to match Reports never refuses the operator's
        # own (its ServiceAccount is a break-glass identity in the chart).
        metadata = {**body["metadata"], "labels": {**body["metadata"]["labels"], BREAK_GLASS_LABEL: "true"}}
        patch = {**reports.content(body), "metadata": {"labels": metadata["labels"]}}
        status, answer = await call_json(self.api, "PATCH", self._path(namespace, reports.NAME), body=patch,
                                         content_type="application/merge-patch+json")
        if status == 404:
            status, answer = await call_json(self.api, "POST", self._path(namespace),
                                             body={**body, "metadata": metadata})
        _check(status, answer, f"writing the report of {_where(namespace)}")

    async def _delete(self, namespace: str) -> None:
        status, answer = await call_json(self.api, "DELETE", self._path(namespace, reports.NAME))
        if status != 404:
            _check(status, answer, f"deleting the report of {_where(namespace)}")


def _check(status: int, answer: Any, what: str) -> None:
    if not 200 <= status <= 299:
        raise client.ApiException(status=status, reason=f"{what}: {status} {message_of(answer)}".strip())


def _where(namespace: str) -> str:
    return f"namespace {namespace}" if namespace else "cluster-scoped objects"
