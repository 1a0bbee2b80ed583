"""The background audit: every enforced policy judged against the objects that already exist.

Runs in every replica, scans only in the one that reconciles (Kopf peering: ``reconciles``).
Each policy is scanned every ``audit_interval`` seconds, and at once when its generation changes
(that policy only). A scan lists the resources the policy's rules name for CREATE (as the
webhook rules expand them) page by page (``limit``/``continue``), so it holds one page of
objects at a time, and judges each object with ``engine.background.audit_object`` — the very
``evaluate`` the webhooks call — on a background request (see that module for what the request
holds). What admission never judges is skipped here too: the exempt namespaces, the operator's
own, and objects labelled ``policy-operator.dev/exempt=true``.

The results go to the policy's ``status.audit`` (counts and the first violations), to the
per-policy gauges, and to the openreports Reports (``reportwriter``), written after each round.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

from kubernetes_asyncio import client

from .. import api, reports
from ..engine import AdmissionRequest, CompiledPolicy, Decision, Inputs, PolicySet
from ..engine.background import (
    FAIL,
    WARN,
    AuditResult,
    Resource,
    audit_object,
    audits,
    background_request,
    user_info_reads,
)
from . import metrics, registration
from .kube import Discovery, call_json, resource_path
from .reportwriter import ReportBook
from .settings import OperatorSettings
from .store import PolicyStore
from .webhookconfig import EXEMPT_LABEL, DiscoveredResource, listable_resources, never_judged

logger = logging.getLogger(__name__)

TICK: Final = 2.0          # how often the loop looks for a policy due (a new generation waits at most this)
YIELD_EVERY: Final = 10    # objects judged between two pauses that give the event loop to admission
# Seconds of pause per second of scanning (listing and judging): 1.0 halves what a scan takes from the
# operator's CPU and the API server, at twice its duration (bench/audit_scan.py prints both sides).
REST_PER_BUSY: Final = 1.0
LEADER_RECHECK: Final = 15.0   # seconds a "this replica reconciles" answer is trusted
MAX_RELISTS: Final = 3     # a listing whose continue token expired starts over at most this often


@dataclasses.dataclass
class Scan:
    """What one scan of one policy found; ``status`` is its ``status.audit``."""
    generation: int
    finished: float
    results: reports.Results
    status: dict[str, Any]


class Auditor:
    def __init__(self, api_client: client.ApiClient, settings: OperatorSettings, store: PolicyStore,
                 discovery: Discovery, reconciles: Callable[[], Awaitable[bool]],
                 clock: Callable[[], float] = time.monotonic, inputs: Inputs | None = None) -> None:
        self.api = api_client
        self.inputs = inputs   # the params and context caches the webhooks read (sources.py)
        self.settings = settings
        self.store = store
        self.discovery = discovery
        self.reconciles = reconciles
        self.clock = clock
        self.book = ReportBook(api_client)
        self.scans: dict[str, Scan] = {}
        self.leading = False
        self._asked: tuple[float, bool] | None = None
        # Admission results of reportAdmission policies, by policy and object, until a scan supersedes them.
        self.admissions: dict[str, dict[tuple[str, str, str], tuple[reports.ObjectRef, list[reports.Entry]]]] = {}
        self.admissions_changed = False

    def admitted(self, request: AdmissionRequest, decision: Decision) -> None:
        """Keep an Audit or Warn policy's failures at admission for the reports, when the policy
        asks for it (``spec.reportAdmission``). Only the reconciling replica writes reports, so only
        the requests it serves are reported at once; the others' objects are judged at the next scan."""
        if not self.leading or request.dry_run or request.operation not in ("CREATE", "UPDATE") \
                or request.sub_resource or not isinstance(request.object, Mapping):
            return
        for outcome in decision.outcomes:
            if not outcome.failures or outcome.enforcement not in ("Audit", "Warn"):
                continue
            policy = self.store.policies.get(outcome.policy)
            if policy is None or not policy.policy.report_admission:
                continue
            kind = request.raw.get("kind") if isinstance(request.raw.get("kind"), Mapping) else {}
            assert isinstance(kind, Mapping)
            ref = reports.ObjectRef.of(request.object, f"{request.group}/{request.version}" if request.group
                                       else request.version, str(kind.get("kind") or ""), bool(request.namespace))
            if not ref.name:
                ref = dataclasses.replace(ref, name=request.name)
            result = AuditResult(outcome.policy, outcome.enforcement, WARN if outcome.enforcement == "Warn" else FAIL,
                                 outcome.findings, template_of=outcome.template_of)
            kept = self.admissions.setdefault(outcome.policy, {})
            if len(kept) < reports.MAX_RESULTS:
                kept[ref.kind, ref.namespace, ref.name] = (
                    ref, reports.entries(result, ref, int(time.time()), reports.ORIGIN_ADMISSION))
                self.admissions_changed = True

    async def run(self) -> None:
        """Forever: a round every ``TICK``; a failed round is logged and tried again."""
        if not self.settings.audit_interval:
            logger.info("Background audit disabled (AP_AUDIT_INTERVAL=0)")
            return
        # Namespace labels decide namespaceSelector: judge nothing before they are known.
        await self.store.policies_loaded.wait()
        await self.store.namespaces_loaded.wait()
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("Background audit round failed (retrying): %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(min(TICK, self.settings.audit_interval))

    async def round(self) -> None:
        """Scan the policies that are due, forget the deleted ones, write the reports that changed."""
        if not await self._leads():
            if self.leading:   # another replica took over: start afresh should this one lead again
                self.scans.clear()
                self.admissions.clear()
                self.book = ReportBook(self.api)
                self.leading = False
            return
        self.leading = True
        policies = {policy.name: policy for policy in self.store.policies}
        for name in set(self.admissions) - set(policies):
            del self.admissions[name]
        for name in set(self.scans) - set(policies):
            del self.scans[name]
            self.book.drop(name)
            metrics.audit_forget(name)
            logger.info("AdmissionPolicy %s: its audit results are removed", name)
        due = [policy for name, policy in policies.items() if self._due(name)]
        if self.admissions_changed:
            self.admissions_changed = False
            for name in self.admissions:
                if name in self.scans:
                    self.book.put(name, self._with_admissions(name, self.scans[name].results))
        if not (due or self.book.dirty or self.book.written is None):
            return   # nothing to scan or write: an idle round costs no API call
        discovered = await self.discovery.resources()
        for policy in due:
            generation = self.store.generations.get(policy.name, 0)
            scan = await self.scan(policy, generation, discovered)
            if self.store.policies.get(policy.name) is not policy:
                continue   # changed or deleted during the scan: the next round scans it again
            self.scans[policy.name] = scan
            self._superseded(policy.name, scan)
            self.book.put(policy.name, self._with_admissions(policy.name, scan.results))
            metrics.audit_scanned(policy.name, scan.status["objectsScanned"], scan.status["violations"],
                                  scan.status["scanSeconds"])
            await self._write_status(policy.name, scan.status)
        await self.book.flush(any(d.group == reports.GROUP and d.resource == reports.REPORTS for d in discovered))

    def _with_admissions(self, name: str, results: reports.Results) -> reports.Results:
        for ref, entries in self.admissions.get(name, {}).values():
            results = results.with_object(ref, entries)
        return results

    def _superseded(self, name: str, scan: Scan) -> None:
        """A scan judged every object admitted before it began: drop those admission results."""
        began = int(time.time() - (scan.status["scanSeconds"] or 0)) - 1
        kept = {key: value for key, value in self.admissions.get(name, {}).items()
                if any(entry.seen >= began for entry in value[1])}
        if kept:
            self.admissions[name] = kept
        else:
            self.admissions.pop(name, None)

    async def _leads(self) -> bool:
        """Whether this replica reconciles, asked at most every ``LEADER_RECHECK`` seconds (the
        question costs an API call with peering)."""
        if self._asked is None or self.clock() - self._asked[0] >= LEADER_RECHECK:
            self._asked = (self.clock(), await self.reconciles())
        return self._asked[1]

    def _due(self, name: str) -> bool:
        scan = self.scans.get(name)
        return scan is None or scan.generation != self.store.generations.get(name) or \
            self.clock() - scan.finished >= self.settings.audit_interval

    async def scan(self, policy: CompiledPolicy, generation: int,
                   discovered: tuple[DiscoveredResource, ...]) -> Scan:
        """List and judge every object the policy selects; never raises for what the cluster holds
        (a listing that fails is named in ``status.audit.message``)."""
        started = self.clock()
        previous = self.scans.get(policy.name)
        first_seen = {entry.key: entry.seen for entries in (previous.results.entries.values() if previous else ())
                      for entry in entries}
        now = int(time.time())
        results = reports.Results()
        tally: collections.Counter[str] = collections.Counter()
        violations: list[dict[str, Any]] = []
        problems: list[str] = []
        targets = listable_resources(registration.routes(policy), discovered) if audits(policy) else []
        single = PolicySet([policy])
        busy_since = self.clock()
        for target in targets:
            try:
                async for resource, item in list_objects(self.api, self.settings, target):
                    tally["scanned"] += 1
                    ref = reports.ObjectRef.of(item, resource.api_version, resource.kind, resource.namespaced)
                    namespace = self.store.namespaces.get(ref.namespace) if ref.namespace else None
                    for result in audit_object(single, background_request(item, resource), namespace,
                                               self.inputs):
                        tally[result.result] += 1
                        tally["wouldMutate"] += result.would_mutate
                        for entry in reports.entries(result, ref, now):
                            seen = first_seen.get(entry.key)
                            results.add(dataclasses.replace(entry, seen=seen) if seen else entry)
                        if result.violates and len(violations) < self.settings.audit_violations_limit:
                            violations.append({**ref.as_dict(), "message": result.message})
                    if tally["scanned"] % YIELD_EVERY == 0:
                        await asyncio.sleep((self.clock() - busy_since) * REST_PER_BUSY)
                        busy_since = self.clock()
            except ListingError as exc:
                problems.append(str(exc))
                logger.warning("AdmissionPolicy %s: audit: %s", policy.name, exc)
        seconds = self.clock() - started
        return Scan(generation, self.clock(), results,
                    _status(policy, generation, tally, violations, problems, targets, seconds))

    async def _write_status(self, name: str, audit: Mapping[str, Any]) -> None:
        status, answer = await call_json(
            self.api, "PATCH", resource_path(api.GROUP, api.VERSION, api.PLURAL, name=name) + "/status",
            body={"status": {"audit": dict(audit)}}, content_type="application/merge-patch+json")
        if status != 404 and not 200 <= status <= 299:   # 404: deleted meanwhile
            message = answer.get("message", "") if isinstance(answer, Mapping) else ""
            logger.warning("AdmissionPolicy %s: writing status.audit failed: %s %s", name, status, message)


async def list_objects(api_client: client.ApiClient, settings: OperatorSettings, target: DiscoveredResource,
                       progress: Callable[[int, int | None], None] | None = None,
                       ) -> AsyncIterator[tuple[Resource, dict[str, Any]]]:
    """The objects of one resource, ``settings.audit_page_size`` at a time, without those
    admission never judges. ``progress(listed, estimated total)`` after each page."""
    path = resource_path(target.group, target.version, target.resource)
    token, relists, listed = "", 0, 0
    while True:
        query = [("limit", str(settings.audit_page_size)), ("labelSelector", f"{EXEMPT_LABEL}!=true")]
        if token:
            query.append(("continue", token))
        status, page = await call_json(api_client, "GET", path, query=query)
        if status == 410 and token and relists < MAX_RELISTS:   # the continue token expired: start over
            token, relists, listed = "", relists + 1, 0
            continue
        if status != 200 or not isinstance(page, Mapping):
            message = page.get("message", "") if isinstance(page, Mapping) else ""
            raise ListingError(f"cannot list {display(target)}: {status} {message}".strip())
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
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", kind)
            metadata = item.get("metadata") or {}
            if (metadata.get("labels") or {}).get(EXEMPT_LABEL) == "true":   # the selector's job, unless ignored
                continue
            namespace = str(metadata.get("namespace") or "") if target.namespaced else ""
            if never_judged(settings, target.group, target.resource, namespace, str(metadata.get("name"))):
                continue
            yield resource, item
        token = str(meta.get("continue") or "")
        if not token:
            return


class ListingError(Exception):
    """A resource the scan could not list (RBAC, an aggregated API down)."""


def display(target: DiscoveredResource) -> str:
    return f"{target.resource}.{target.group}" if target.group else target.resource


def _status(policy: CompiledPolicy, generation: int, tally: Mapping[str, int], violations: list[dict[str, Any]],
            problems: list[str], targets: list[DiscoveredResource], seconds: float) -> dict[str, Any]:
    """``status.audit``: what the last scan found, and in ``message`` what the reader should know."""
    notes: list[str] = []
    if not targets:
        notes.append("nothing to audit: no rule names CREATE on a resource this cluster serves"
                     if policy.validations or policy.mutations else "nothing to audit: no validation or mutation")
    else:
        notes.append(f"audits {', '.join(display(t) for t in targets)}")
    reads = user_info_reads(policy)
    if reads:
        notes.append(f"request.userInfo is empty in a background scan ({', '.join(reads)})")
    notes += problems
    count = tally.get("fail", 0) + tally.get("warn", 0)
    return {
        "lastScanTime": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "scannedGeneration": generation,
        "objectsScanned": tally.get("scanned", 0),
        "violations": count,
        "errors": tally.get("error", 0),
        "wouldMutate": tally.get("wouldMutate", 0),
        "scanSeconds": round(seconds, 3),
        "firstViolations": violations,
        "message": "; ".join(notes),
    }
