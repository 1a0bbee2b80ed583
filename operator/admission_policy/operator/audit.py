"""The background audit: every enforced policy judged against the objects that already exist.

Runs in every replica, scans only in the one that reconciles (Kopf peering: ``reconciles``).
Each policy is scanned every ``audit_interval`` seconds, and at once when its generation changes
(that policy only). A scan lists the resources the policy's rules name for CREATE (as the
webhook rules expand them) page by page (``limit``/``continue``), so it holds one page of
objects at a time, and judges each object with ``engine.background.audit_object`` — the very
``evaluate`` the webhooks call — on a background request (see that module for what the request
holds). What admission never judges is skipped here too: the exempt namespaces and the operator's
own. Objects with the break-glass label are judged: the label says that a named identity wrote
the object past the webhooks, and the reports are where such an object shows.

The results go to the policy's ``status.audit`` (counts and the first violations), to the
per-policy gauges, and to the openreports Reports (``reportwriter``), written after each round.
``spec.reportAdmission`` failures judged by any replica join them (``handoff``).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from kubernetes_asyncio import client

from .. import reports
from ..cluster.discovery import DiscoveredResource, Discovery
from ..cluster.listing import ListingError, display, list_objects
from ..cluster.routing import listable_resources, routes
from ..config import OperatorConfig
from ..engine import AdmissionRequest, CompiledPolicy, Decision, ExceptionSet, Inputs, PolicySet
from ..engine.background import (
    FAIL,
    WARN,
    AuditResult,
    Forks,
    audit_object,
    audits,
    background_request,
    user_info_reads,
)
from . import handoff, metrics
from .apart import run_apart
from .policyio import write_status
from .reportwriter import ReportBook
from .store import PolicyStore

logger = logging.getLogger(__name__)

TICK: Final = 2.0          # how often the loop looks for a policy due (a new generation waits at most this)
YIELD_EVERY: Final = 10    # objects judged between two pauses that give the event loop to admission
# Seconds of pause per second of scanning (listing and judging): 1.0 halves what a scan takes from the
# operator's CPU and the API server, at twice its duration (bench/audit_scan.py prints both sides).
REST_PER_BUSY: Final = 1.0
LEADER_RECHECK: Final = 15.0   # seconds a "this replica reconciles" answer is trusted
MAX_RELISTS: Final = 3     # a listing whose continue token expired starts over at most this often
HANDOFF_EVERY: Final = 5.0  # seconds between two reads of the other replicas' admission results
HANDOFF_RETRY: Final = 30.0  # seconds before a failed hand-over read or write is tried again (RBAC, say)
# An admission result a replica hands over is dropped after this many audit intervals: a scan has
# superseded it by then (a scan starts at most one interval after the last one ended).
HANDOFF_INTERVALS: Final = 3


@dataclasses.dataclass
class Scan:
    """What one scan of one policy found; ``status`` is its ``status.audit``."""
    generation: int
    finished: float
    results: reports.Results
    status: dict[str, Any]
    began: int = 0     # seconds since the epoch: what was admitted before, the scan has judged


class Auditor:
    def __init__(self, api_client: client.ApiClient, settings: OperatorConfig, store: PolicyStore,
                 discovery: Discovery, reconciles: Callable[[], Awaitable[bool]],
                 clock: Callable[[], float] = time.monotonic, inputs: Inputs | None = None,
                 exceptions: Callable[[], ExceptionSet] | None = None) -> None:
        self.api = api_client
        self.inputs = inputs   # the params and context caches the webhooks read (sources.py)
        self.exceptions = exceptions   # the AdmissionPolicyExceptions in the cluster now (store.ExceptionStore)
        self.settings = settings
        self.store = store
        self.discovery = discovery
        self.reconciles = reconciles
        self.clock = clock
        self.book = ReportBook(api_client)
        self.handoff = handoff.Handoff(api_client, settings.namespace, settings.pod_name)
        self.scans: dict[str, Scan] = {}
        self.leading = False
        self._asked: tuple[float, bool] | None = None
        self._collected: float | None = None   # when the others' admission results were last read
        self._publish_after = 0.0               # a failed hand-over write waits until then
        # Admission results of reportAdmission policies, by policy and object, until a scan supersedes
        # them (the reconciling replica) or they are handed over (the others).
        self.admissions: handoff.Admissions = {}
        self.changed: set[str] = set()   # the policies whose admission results changed since written

    def admitted(self, request: AdmissionRequest, decision: Decision) -> None:
        """Keep an Audit or Warn policy's failures at admission for the reports, when the policy
        asks for it (``spec.reportAdmission``), whichever replica serves the request: the one that
        reconciles writes them, the others hand them over."""
        if not self.settings.audit_interval or request.dry_run or request.operation not in ("CREATE", "UPDATE") \
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
            if ref.key in kept or len(kept) < reports.MAX_RESULTS:
                kept[ref.key] = ref, reports.entries(result, ref, int(time.time()), reports.ORIGIN_ADMISSION)
                self.changed.add(outcome.policy)

    async def run(self) -> None:
        """Forever: a round every ``TICK``; a failed round is logged and tried again."""
        if not self.settings.audit_interval:
            logger.info("Background audit disabled (AP_AUDIT_INTERVAL=0)")
            return
        # Namespace labels decide namespaceSelector: judge nothing before they are known.
        await self.store.readiness.policies_loaded.wait()
        await self.store.readiness.namespaces_loaded.wait()
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("Background audit round failed (retrying): %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(min(TICK, self.settings.audit_interval))

    async def round(self) -> None:
        """Scan the policies that are due, forget the deleted ones, write the reports that changed
        (or, in a replica that does not reconcile, hand its admission results over)."""
        policies = {policy.name: policy for policy in self.store.policies}
        for name in set(self.admissions) - set(policies):
            del self.admissions[name]
        if not await self._leads():
            if self.leading:   # another replica took over: start afresh should this one lead again
                for name in self.scans:
                    metrics.audit_forget(name)   # the replica that reconciles exports them now
                self.scans.clear()
                self.book = ReportBook(self.api)
                self.leading = False
            self._expire_admissions()
            if self.changed and self.clock() >= self._publish_after:
                # Encoded and compared only then: they may be thousands.
                if await self.handoff.publish(self.admissions):
                    self.changed.clear()
                else:
                    self._publish_after = self.clock() + HANDOFF_RETRY
            return
        if not self.leading:
            self.leading = True
            self._collected = None   # read what the others handed over at once
        await self._collect(policies)
        for name in set(self.scans) - set(policies):
            del self.scans[name]
            self.book.drop(name)
            metrics.audit_forget(name)
            logger.info("AdmissionPolicy %s: its audit results are removed", name)
        due = [policy for name, policy in policies.items() if self._due(name)]
        for name in self.changed & set(self.scans):
            self.book.put(name, self._with_admissions(name, self.scans[name].results))
        self.changed.clear()
        if not (due or self.book.dirty or self.book.written is None):
            return   # nothing to scan or write: an idle round costs no API call
        discovered = await self.discovery.resources()
        installed = any(d.group == reports.GROUP and d.resource == reports.REPORTS for d in discovered)
        if due:
            await self.book.load(installed)   # the reports' timestamps carry over into a first scan
        for policy in due:
            generation = self.store.generations.get(policy.name, 0)
            scan = await self.scan(policy, generation, discovered)
            if self.store.policies.get(policy.name) is not policy:
                continue   # changed or deleted during the scan: the next round scans it again
            self.scans[policy.name] = scan
            self._drop_before(policy.name, scan.began)   # the scan judged what was admitted before it began
            self.book.put(policy.name, self._with_admissions(policy.name, scan.results))
            metrics.audit_scanned(policy.name, scan.status["objectsScanned"], scan.status["violations"],
                                  scan.status["scanSeconds"])
            await self._write_status(policy.name, scan.status)
        await self.book.flush(installed)

    def _with_admissions(self, name: str, results: reports.Results) -> reports.Results:
        admitted = self.admissions.get(name)
        return results.with_objects(admitted.values()) if admitted else results

    def _drop_before(self, name: str, oldest: float) -> bool:
        """Drop a policy's admission results about objects last admitted before ``oldest``; whether any went."""
        kept = self.admissions.get(name, {})
        fresh = {key: value for key, value in kept.items() if handoff.newest(value[1]) >= oldest}
        if len(fresh) == len(kept):
            return False
        if fresh:
            self.admissions[name] = fresh
        else:
            del self.admissions[name]
        return True

    def _expire_admissions(self) -> None:
        """In a replica that does not reconcile: forget results a scan has certainly judged since."""
        oldest = time.time() - HANDOFF_INTERVALS * self.settings.audit_interval - TICK
        self.changed |= {name for name in list(self.admissions) if self._drop_before(name, oldest)}

    async def _collect(self, policies: Mapping[str, CompiledPolicy]) -> None:
        """Take over what the other replicas judged: on taking over, then every ``HANDOFF_EVERY``
        seconds while some policy reports admissions. A ConfigMap holding nothing a scan has not
        superseded is deleted (its replica may be gone)."""
        if self._collected is not None and (self.clock() - self._collected < HANDOFF_EVERY or not any(
                policy.policy.report_admission for policy in policies.values())):
            return
        self._collected = self.clock()
        found = await self.handoff.collect()
        if found is None:   # said in the log: once per HANDOFF_RETRY, not every round
            self._collected += HANDOFF_RETRY - HANDOFF_EVERY
        for name, entries in (found or {}).items():
            current = False
            for policy, objects in handoff.by_object(entries).items():
                compiled, scan = policies.get(policy), self.scans.get(policy)
                if compiled is None or not compiled.policy.report_admission:
                    continue
                kept = self.admissions.setdefault(policy, {})
                for key, (ref, admitted) in objects.items():
                    if scan is not None and handoff.newest(admitted) < scan.began:
                        continue
                    current = True
                    have = kept.get(key)
                    if (have is None and len(kept) < reports.MAX_RESULTS) or \
                            (have is not None and handoff.newest(have[1]) < handoff.newest(admitted)):
                        kept[key] = ref, admitted
                        self.changed.add(policy)
                if not kept:
                    del self.admissions[policy]
            if not current:
                await self.handoff.remove(name)

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
        first_seen = {entry.key: entry.seen for entries in previous.results.entries.values()
                      for entry in entries} if previous else self.book.seen(policy.name)
        now = int(time.time())
        results = reports.Results()
        tally: collections.Counter[str] = collections.Counter()
        violations: list[dict[str, Any]] = []
        problems: list[str] = []
        targets = listable_resources(routes(policy), discovered) if audits(policy) else []
        own = policy.policy.namespace or ""   # a tenant policy judges its own namespace's objects only
        if own:
            targets = [target for target in targets if target.namespaced]
        single = PolicySet([policy])
        exceptions = self.exceptions() if self.exceptions is not None else None
        busy_since = self.clock()
        for target in targets:
            try:
                async for resource, item in list_objects(self.api, self.settings, target, namespace=own):
                    tally["scanned"] += 1
                    ref = reports.ObjectRef.of(item, resource.api_version, resource.kind, resource.namespaced)
                    namespace = self.store.namespaces.get(ref.namespace) if ref.namespace else None
                    request = background_request(item, resource)
                    try:
                        judged = audit_object(single, request, namespace, self.inputs, exceptions=exceptions,
                                              may_fork=False)
                    except Forks:   # the child is waited for on a thread: admission shares the loop
                        judged = await run_apart(audit_object, single, request, namespace, self.inputs,
                                                 exceptions=exceptions)
                    for result in judged:
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
                    _status(policy, generation, tally, violations, problems, targets, seconds), began=now - 1)

    async def _write_status(self, name: str, audit: Mapping[str, Any]) -> None:
        try:
            await write_status(self.api, name, {"audit": dict(audit)})
        except client.ApiException as exc:
            if exc.status != 404:   # 404: deleted meanwhile
                logger.warning("AdmissionPolicy %s: writing status.audit failed: %s %s", name, exc.status, exc.reason)


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
