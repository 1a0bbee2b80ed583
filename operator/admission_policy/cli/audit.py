"""``admission-policy audit``: the background scan's evaluation, offline.

Objects come from manifests (files, directories, ``-``, multi-document YAML, ``List`` kinds) or
from a live cluster (``--kubeconfig``: paged lists of what each policy's rules name). Each one is
judged by ``engine.background.audit_object`` — what the operator's scan runs — and the results
become the same openreports reports the operator writes (``reports``).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import click

from .. import api, reports
from ..authorization import Authorization, Unanswered
from ..config import OperatorConfig
from ..engine import CompiledPolicy, ExceptionSet, Inputs, PolicySet
from ..engine.background import FAIL, PASS, AuditResult, Resource, audit_object, audits, background_request
from .authorizer import HINT
from .documents import DocumentError, documents_in, is_exception, kubernetes_objects
from .requests import is_namespaced, namespace_object, resource_of
from .suite import is_suite

if TYPE_CHECKING:   # the cluster modules load only for --kubeconfig
    from ..cluster.discovery import DiscoveredResource

DEFAULT_NAMESPACE: Final = "default"
ProgressFn = Callable[[str, int, int | None], None]


@dataclasses.dataclass(frozen=True)
class Target:
    """An object to judge and what it is."""
    source: str
    body: dict[str, Any]
    resource: Resource


@dataclasses.dataclass
class PolicyTally:
    """One policy's results, for the table."""
    enforcement: str
    objects: int = 0
    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    rows: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)   # result, object, rule, message


@dataclasses.dataclass
class AuditRun:
    """Every object's results: per policy for the table, per namespace for the reports."""
    policies: PolicySet
    now: int
    inputs: Inputs | None = None   # params and context, from files (--param, --context)
    authorization: Authorization | None = None   # declared authorizer answers (--authorizer)
    exceptions: ExceptionSet | None = None   # AdmissionPolicyExceptions, judged at ``now``
    tallies: dict[str, PolicyTally] = dataclasses.field(default_factory=dict)
    results: reports.Results = dataclasses.field(default_factory=reports.Results)
    scanned: int = 0
    unlisted: list[str] = dataclasses.field(default_factory=list)   # "cannot list pods: 403 ...", per resource

    def judge(self, target: Target, namespace: Mapping[str, Any] | None) -> None:
        self.scanned += 1
        ref = reports.ObjectRef.of(target.body, target.resource.api_version, target.resource.kind,
                                   target.resource.namespaced)
        try:
            results = audit_object(self.policies, background_request(target.body, target.resource), namespace,
                                   self.inputs, self.authorization, self.exceptions, self.now)
        except Unanswered as exc:
            raise DocumentError(f"{target.source}: {exc}: {HINT}") from None
        for result in results:
            self._record(result, ref)

    def _record(self, result: AuditResult, ref: reports.ObjectRef) -> None:
        tally = self.tallies.setdefault(result.policy, PolicyTally(result.enforcement))
        tally.objects += 1
        tally.counts[result.result] += 1
        where = f"{ref.kind} {ref.namespace + '/' if ref.namespace else ''}{ref.name}"
        for entry in reports.entries(result, ref, self.now):
            self.results.add(entry)
            if entry.result != PASS or entry.would_mutate:
                tally.rows.append((entry.result, where, entry.rule or "-", entry.message))

    @property
    def enforce_violated(self) -> bool:
        return any(tally.enforcement == "Enforce" and tally.counts[FAIL] for tally in self.tallies.values())


def manifest_targets(paths: Iterable[str]) -> Iterator[Target]:
    """The objects in files and directories (policies, exceptions and test suites beside them are
    skipped; Namespaces are audited, and also give namespaceSelector the labels of their namespace)."""
    for root in paths:
        for document in documents_in(root):
            if is_suite(document) or is_exception(document):   # a suite beside the manifests; exceptions apply
                continue
            for source, body in kubernetes_objects(document):
                if body.get("kind") in api.POLICY_KINDS:
                    continue
                yield _target(source, body)


def _target(source: str, body: dict[str, Any]) -> Target:
    gvr = resource_of(body)
    kind = str(body.get("kind"))
    namespaced = is_namespaced(kind)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise DocumentError(f"{source}: metadata must be a mapping")
    if namespaced and not (metadata or {}).get("namespace"):   # as kubectl applies it: to the default namespace
        body = {**body, "metadata": {**(metadata or {}), "namespace": DEFAULT_NAMESPACE}}
    return Target(source, body, Resource(gvr["group"], gvr["version"], gvr["resource"], kind, namespaced))


def namespaces_of(targets: list[Target]) -> dict[str, Mapping[str, Any]]:
    """Namespace objects among the manifests, by name, for namespaceSelector and namespaceObject."""
    return {str(t.body["metadata"]["name"]): t.body for t in targets
            if t.resource.kind == "Namespace" and isinstance(t.body.get("metadata"), dict)
            and t.body["metadata"].get("name")}


def audit_manifests(policies: list[CompiledPolicy], paths: Iterable[str], now: int,
                    inputs: Inputs | None = None, authorization: Authorization | None = None,
                    exceptions: ExceptionSet | None = None) -> AuditRun:
    targets = list(manifest_targets(paths))
    namespaces = namespaces_of(targets)
    run = AuditRun(PolicySet(policies), now, inputs, authorization, exceptions)
    for target in targets:
        namespace = target.body["metadata"]["namespace"] if target.resource.namespaced else ""
        run.judge(target, namespaces.get(namespace) or (namespace_object(namespace, {}) if namespace else None))
    return run


async def audit_cluster(policies: list[CompiledPolicy], kubeconfig: str | None, now: int,
                        settings: OperatorConfig, progress: ProgressFn, inputs: Inputs | None = None,
                        authorization: Authorization | None = None, exceptions: ExceptionSet | None = None) -> AuditRun:
    """List what the policies' rules name in a live cluster, page by page as the operator does,
    and judge it here: nothing is written to the cluster. What only NamespacedAdmissionPolicies
    name is listed in their namespaces only, as the operator's scan lists it: a namespace's admin
    can audit its tenant policies with its own identity."""
    from ..cluster.client import new_api_client
    from ..cluster.discovery import Discovery
    from ..cluster.listing import ListingError, display, list_objects

    run = AuditRun(PolicySet(policies), now, inputs, authorization, exceptions)
    api_client = await new_api_client(kubeconfig)
    async with api_client:
        scopes = listing_scopes(policies, await Discovery(api_client).resources())
        namespaces = await _read_namespaces(api_client, {namespace for _, where in scopes.values()
                                                         for namespace in where})
        for key in sorted(scopes):
            target, where = scopes[key]
            for namespace in where:
                what = f"{display(target)} in {namespace}" if namespace else display(target)
                try:
                    async for resource, item in list_objects(api_client, settings, target,
                                                             functools.partial(progress, what), namespace=namespace):
                        in_namespace = str(item["metadata"].get("namespace") or "") if resource.namespaced else ""
                        run.judge(Target(what, item, resource), namespaces.get(in_namespace))
                except ListingError as exc:   # RBAC, an API down: the other resources are still worth judging
                    run.unlisted.append(f"namespace {namespace}: {exc}" if namespace else str(exc))
    return run


def listing_scopes(policies: Iterable[CompiledPolicy], discovered: Iterable[DiscoveredResource],
                   ) -> dict[tuple[str, str], tuple[DiscoveredResource, tuple[str, ...]]]:
    """Each resource to list, by (group, resource), and where: ("",) cluster-wide when a cluster
    policy names it, else the namespaces of the tenant policies that do (never a cluster-scoped
    resource for those: they judge none)."""
    from ..cluster.routing import listable_resources, routes

    served = list(discovered)
    found: dict[tuple[str, str], tuple[DiscoveredResource, set[str]]] = {}
    for policy in policies:
        if not audits(policy):
            continue
        own = policy.policy.namespace or ""
        for target in listable_resources(routes(policy), served):
            if target.namespaced or not own:
                found.setdefault((target.group, target.resource), (target, set()))[1].add(own)
    return {key: (target, ("",) if "" in where else tuple(sorted(where))) for key, (target, where) in found.items()}


async def _read_namespaces(api_client: Any, wanted: set[str]) -> dict[str, Mapping[str, Any]]:
    """The Namespace objects, by name, for namespaceSelector and namespaceObject: all of them ("" in
    ``wanted``), or only the tenant policies' own, read one by one (what a namespace's admin may read)."""
    from ..cluster.client import call_json, message_of

    if "" in wanted:
        status, listing = await call_json(api_client, "GET", "/api/v1/namespaces")
        if status != 200:
            raise DocumentError(f"cannot list the cluster's namespaces: {status} {message_of(listing)}".strip())
        return {str(item["metadata"]["name"]): item for item in listing.get("items") or []}
    found = {}
    for name in sorted(wanted):
        status, body = await call_json(api_client, "GET", f"/api/v1/namespaces/{name}")
        if status != 200:
            raise DocumentError(f"cannot read namespace {name}: {status} {message_of(body)}".strip())
        found[name] = body
    return found


def table(run: AuditRun) -> str:
    """Per policy: a summary line and a row per failure, warning, error or would-be mutation."""
    lines: list[str] = []
    for policy in run.policies:
        tally = run.tallies.get(policy.name)
        if tally is None:
            note = "" if audits(policy) else " (no rule names CREATE: nothing to audit)"
            lines.append(f"{policy.name} ({policy.policy.enforcement}): no object matched{note}")
            continue
        counts = ", ".join(f"{tally.counts[name]} {name}" for name in ("fail", "warn", "error", "skip", "pass")
                           if tally.counts[name])
        lines.append(f"{policy.name} ({tally.enforcement}): {tally.objects} object(s): {counts}")
        if tally.rows:
            widths = [max(len(row[i]) for row in tally.rows) for i in range(3)]
            heading = ("RESULT", "OBJECT", "RULE")
            widths = [max(w, len(h)) for w, h in zip(widths, heading, strict=True)]
            lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(heading, widths, strict=True)) + "  MESSAGE")
            for row in tally.rows:
                lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True))
                             + f"  {row[3]}")
    lines.append(f"\n{run.scanned} object(s) audited against {len(run.policies)} policy(ies)"
                 + ("; an Enforce policy is violated" if run.enforce_violated else "")
                 + (f"; {len(run.unlisted)} resource(s) could not be listed (see standard error)"
                    if run.unlisted else ""))
    return "\n".join(lines)


def report_list(run: AuditRun) -> dict[str, Any]:
    """The reports the operator would write, as one ``List`` (``kubectl apply -f`` reads it)."""
    return {"apiVersion": "v1", "kind": "List", "items": reports.build_reports(run.results)}


def stderr_progress(enabled: bool) -> ProgressFn:
    """A one-line progress bar on standard error (where it never mixes with the report)."""
    def show(what: str, done: int, total: int | None) -> None:
        if not enabled:
            return
        if total:
            filled = int(30 * min(done, total) / total)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{total}"
        else:
            bar = f"{done}"
        click.echo(f"\r{what}: {bar}\x1b[K", err=True, nl=False)
        if total is not None and done >= total:
            click.echo("", err=True)
    return show


def progress_enabled(choice: str) -> bool:
    return choice == "always" or (choice == "auto" and sys.stderr.isatty())
