"""openreports.io/v1alpha1 ``Report`` and ``ClusterReport`` bodies from audit results.

Pure data, shared by the operator's report writer and ``admission-policy audit -o json|yaml``,
so what the CLI prints is what the cluster would hold. One ``Report`` per namespace and one
``ClusterReport`` for cluster-scoped objects, each holding every policy's results there.

A report holds at most ``MAX_RESULTS`` results (the API server stores an object of at most
~1.5 MB): failures, warnings and errors first, then passes; ``summary`` counts all of them and
``configuration.limits.maxResults`` says a cap applies. A result's ``timestamp`` is when it was
first seen, so a scan that finds what the last one found writes nothing.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final

from .engine.background import MUTATION_RULE, PASS, SKIP, WARN, AuditResult

GROUP: Final = "openreports.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
REPORT, CLUSTER_REPORT = "Report", "ClusterReport"
REPORTS, CLUSTER_REPORTS = "reports", "clusterreports"
SOURCE: Final = "admission-policy-operator"
NAME: Final = "admission-policy"           # each report's name (one per namespace, one cluster-wide)
MANAGED_BY: Final = ("app.kubernetes.io/managed-by", "admission-policy-operator")
MAX_RESULTS: Final = 1_000
RESULTS: Final = ("fail", "error", "warn", "skip", "pass")   # the order results are listed in
ORIGIN_BACKGROUND, ORIGIN_ADMISSION = "background", "admission"


@dataclasses.dataclass(frozen=True)
class ObjectRef:
    """The object a result is about (``corev1.ObjectReference``)."""
    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """Kind, namespace and name: an object admitted on CREATE has no uid yet."""
        return self.kind, self.namespace, self.name

    @property
    def identity(self) -> str:
        """What names the object in ``Entry.key``: its uid, else kind/namespace/name."""
        return self.uid or f"{self.kind}/{self.namespace}/{self.name}"

    def as_dict(self) -> dict[str, str]:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref

    @classmethod
    def read(cls, ref: Mapping[str, Any]) -> ObjectRef:
        """From ``as_dict``'s shape (a report's or a hand-over's ``resources[0]``)."""
        return cls(*(str(ref.get(key) or "") for key in ("apiVersion", "kind", "name", "namespace", "uid")))

    @classmethod
    def of(cls, body: Mapping[str, Any], api_version: str, kind: str, namespaced: bool = True) -> ObjectRef:
        """From an object's body; a cluster-scoped kind (``namespaced=False``) gets no namespace
        whatever its metadata says, so its results go to the ClusterReport."""
        metadata = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
        assert isinstance(metadata, Mapping)
        return cls(api_version, kind, str(metadata.get("name") or ""),
                   str(metadata.get("namespace") or "") if namespaced else "", str(metadata.get("uid") or ""))


@dataclasses.dataclass(frozen=True)
class Entry:
    """One result: a policy's rule on one object."""
    policy: str
    rule: str
    result: str          # pass | fail | warn | error | skip
    message: str
    ref: ObjectRef
    enforcement: str
    seen: int            # seconds since the epoch the result was first seen
    origin: str = ORIGIN_BACKGROUND

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What makes a result the same result scan after scan (its timestamp stays)."""
        return self.policy, self.ref.identity, self.rule, self.result, self.message

    would_mutate: bool = False
    exception: str = ""  # skip: the AdmissionPolicyException ("namespace/name") that waived the rule

    def as_dict(self) -> dict[str, Any]:
        """An openreports ``results[]`` item; ``ObjectRef.read`` and ``first_seen`` read it back."""
        properties = {"enforcement": self.enforcement, "origin": self.origin}
        if self.would_mutate:
            properties["wouldMutate"] = "true"
        if self.exception:
            properties["exception"] = self.exception
        result: dict[str, Any] = {
            # A warning does not count against a score (openreports; Kyverno's scored: "false").
            "source": SOURCE, "policy": self.policy, "result": self.result, "scored": self.result != WARN,
            "timestamp": {"seconds": self.seen, "nanos": 0}, "resources": [self.ref.as_dict()],
            "properties": properties,
        }
        if self.rule:
            result["rule"] = self.rule
        if self.message:
            result["message"] = self.message
        return result


def entries(result: AuditResult, ref: ObjectRef, seen: int, origin: str = ORIGIN_BACKGROUND) -> list[Entry]:
    """A policy's result on an object as report results: one per failed validation (``error`` for
    one that could not be evaluated), or one ``pass`` (saying so when the policy would mutate it).
    A Pod policy's result on a workload says it judged the Pod template. A rule an exception
    waived is one ``skip`` naming the exception and its expiry (openreports' result for it)."""
    about = f"the Pod template of {result.template_of}: " if result.template_of else ""
    failed = WARN if result.result == WARN else "fail"
    found = [Entry(result.policy, finding.rule, "error" if finding.error else failed,
                   about + finding.message, ref, result.enforcement, seen, origin)
             for finding in result.findings if finding.rule != MUTATION_RULE or finding.error]
    found += [Entry(result.policy, exempted.rule, SKIP,
                    f"{about}waived by AdmissionPolicyException {exempted.exception} until {exempted.expires_at}",
                    ref, result.enforcement, seen, origin, exception=exempted.exception)
              for exempted in result.exempted]
    if found:
        return found
    message = next((f.message for f in result.findings if f.rule == MUTATION_RULE), "")
    return [Entry(result.policy, "", PASS, about + message if message else "", ref, result.enforcement, seen, origin,
                  result.would_mutate)]


@dataclasses.dataclass
class Results:
    """Results by namespace ("" for cluster-scoped objects): the entries kept (at most
    ``MAX_RESULTS`` per namespace, failures before passes) and counts of all of them, so that
    memory is bounded by namespaces, not by objects."""
    entries: dict[str, list[Entry]] = dataclasses.field(default_factory=dict)
    counts: dict[str, collections.Counter[str]] = dataclasses.field(default_factory=dict)

    def add(self, entry: Entry) -> None:
        """Count the entry; keep it if there is room, or in place of a kept pass if it is not one."""
        namespace = entry.ref.namespace
        counts = self.counts.setdefault(namespace, collections.Counter())
        counts[entry.result] += 1
        kept = self.entries.setdefault(namespace, [])
        if len(kept) < MAX_RESULTS:
            kept.append(entry)
        elif entry.result != "pass":   # make room: a failure matters more than a pass
            for index in range(len(kept) - 1, -1, -1):
                if kept[index].result == "pass":
                    kept[index] = entry
                    break

    @property
    def namespaces(self) -> set[str]:
        return set(self.counts)

    def with_objects(self, objects: Iterable[tuple[ObjectRef, Iterable[Entry]]]) -> Results:
        """A copy where each object's results are the given entries (an admission's, newer than a
        scan's): one copy for all of them, since admissions may come by the thousand."""
        by_namespace: dict[str, dict[tuple[str, str, str], Iterable[Entry]]] = {}
        for ref, entries in objects:
            by_namespace.setdefault(ref.namespace, {})[ref.key] = entries
        copied = Results(dict(self.entries), dict(self.counts))
        for namespace, replaced in by_namespace.items():
            counts = copied.counts[namespace] = collections.Counter(self.counts.get(namespace, ()))
            kept = copied.entries[namespace] = []
            for entry in self.entries.get(namespace, ()):
                if entry.ref.key in replaced:
                    counts[entry.result] -= 1
                else:
                    kept.append(entry)
            for entries in replaced.values():
                for entry in entries:
                    copied.add(entry)
        return copied


def first_seen(report: Mapping[str, Any]) -> dict[str, dict[tuple[str, str, str, str, str], int]]:
    """When each result in a written report was first seen, by policy and ``Entry.key``: a restarted
    operator (or a new reconciling replica) keeps the timestamps, so it rewrites nothing."""
    found: dict[str, dict[tuple[str, str, str, str, str], int]] = {}
    for result in report.get("results") or ():
        if not isinstance(result, Mapping):
            continue
        resources, timestamp, policy = result.get("resources"), result.get("timestamp"), result.get("policy")
        if not isinstance(policy, str) or not resources or not isinstance(resources[0], Mapping) \
                or not isinstance(timestamp, Mapping) or not isinstance(timestamp.get("seconds"), int):
            continue
        key = (policy, ObjectRef.read(resources[0]).identity, str(result.get("rule", "")),
               str(result.get("result")), str(result.get("message", "")))
        found.setdefault(policy, {})[key] = timestamp["seconds"]
    return found


def summary(counts: Mapping[str, int]) -> dict[str, int]:
    """A report's ``summary``: all five counts, zeros included, as openreports readers expect."""
    return {name: int(counts.get(name, 0)) for name in ("pass", "fail", "warn", "error", "skip")}


def build_report(namespace: str, entries: Iterable[Entry], counts: Mapping[str, int]) -> dict[str, Any]:
    """The ``Report`` of a namespace (``ClusterReport`` for ``""``): ``counts`` by result, for the
    summary, may exceed the entries kept."""
    ordered = sorted(entries, key=_order)
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": REPORT if namespace else CLUSTER_REPORT,
        "metadata": {"name": NAME, **({"namespace": namespace} if namespace else {}),
                     "labels": {MANAGED_BY[0]: MANAGED_BY[1]}},
        "source": SOURCE,
        "summary": summary(counts),
        "configuration": {"limits": {"maxResults": MAX_RESULTS}},
        "results": [entry.as_dict() for entry in ordered[:MAX_RESULTS]],
    }
    return body


def build_reports(results: Results) -> list[dict[str, Any]]:
    """Every namespace's report, the ClusterReport first."""
    return [build_report(namespace, results.entries.get(namespace, ()), results.counts[namespace])
            for namespace in sorted(results.counts)]


def content(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a report the operator owns, to tell whether a write would change anything."""
    return {key: body.get(key) for key in ("source", "summary", "configuration", "results")}


def _order(entry: Entry) -> tuple[int, str, str, str, str, str]:
    rank = RESULTS.index(entry.result) if entry.result in RESULTS else len(RESULTS)
    return rank, entry.policy, entry.ref.kind, entry.ref.namespace, entry.ref.name, entry.rule
