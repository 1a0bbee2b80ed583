"""AdmissionPolicyExceptions as the engine applies them: compiled once, indexed by policy name.

``evaluate`` judges a request with every matching policy as usual, then drops the failures (and
skips the mutations) that an exception in force covers, and says which exception waived what
(``Decision.exempted``): the verdict of every rule is still computed, so an exception never
changes what a policy means, only whether its verdict counts here (docs/design.md, "Exceptions").
This module is the part without CEL: which exceptions could cover a policy's verdict on a
request (namespace, in force, approved, match); ``evaluation`` evaluates their ``conditions``.

An exception matching Pods covers a Pod policy's verdict on a workload's Pod template too
(``podcontrollers``): there it is matched against the Pod the template stands for, as the
derived policy judges it (its labels, and the workload's name and namespace).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ..api import PolicyError
from ..cel import CelCompileError, CompiledExpression, compile_expression
from ..policyexception import DEFAULT_CLUSTER_NAMESPACE, PolicyException, PolicyRef, format_time, within_limits
from .compiler import CompiledPolicy
from .inputs import labels_of
from .request import AdmissionRequest

# How a Pod policy's derived policy (a workload's Pod template) is matched: as a Pod.
_POD: Final = ("", "v1", "pods")


class ExceptionCompileError(PolicyError):
    """An exception whose CEL conditions do not compile: the first one's field path and column."""


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledException:
    """An exception with its conditions compiled in the policies' CEL environment."""
    exception: PolicyException
    conditions: tuple[tuple[str, CompiledExpression], ...] = ()

    @property
    def key(self) -> str:
        return self.exception.key


def compile_exception(exception: PolicyException) -> CompiledException:
    """Compile the exception's conditions (bool CEL over ``request``, ``object``, ``oldObject``)."""
    compiled = []
    for condition in exception.conditions:
        try:
            compiled.append((condition.name, compile_expression(condition.expression, "bool")))
        except CelCompileError as error:
            where = f"line {error.line}, column {error.column}: " if error.column is not None else ""
            raise ExceptionCompileError(error.path, where + error.message) from None
    return CompiledException(exception, tuple(compiled))


@dataclasses.dataclass(frozen=True)
class Exemption:
    """A rule's verdict that an exception waived on one request: for the warning, the reports
    and (later) the metrics. ``rule`` is the validation's or mutation's name."""
    policy: str
    rule: str
    exception: str       # "namespace/name"
    expires_at: str      # RFC 3339

    @property
    def warning(self) -> str:
        return f"admitted under exception {self.exception}, expires {self.expires_at}"


class ExceptionSet:
    """Exceptions by the policies they name, built once (like ``PolicySet``): a request looks up
    only those naming a policy that judged it. ``cluster_namespace``: where the exceptions for
    cluster-scoped objects live (the operator's namespace)."""

    def __init__(self, exceptions: Iterable[CompiledException] = (), *,
                 cluster_namespace: str = DEFAULT_CLUSTER_NAMESPACE) -> None:
        self.cluster_namespace = cluster_namespace
        self._all: dict[str, CompiledException] = {}
        self._by_policy: dict[str, list[tuple[CompiledException, PolicyRef]]] = {}
        for compiled in exceptions:
            if compiled.key in self._all:
                raise ValueError(f"exception names must be unique in an ExceptionSet: {compiled.key!r}")
            self._all[compiled.key] = compiled
            for ref in compiled.exception.policies:
                self._by_policy.setdefault(ref.name, []).append((compiled, ref))

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Any:
        return iter(self._all[key] for key in sorted(self._all))

    def candidates(self, policy: CompiledPolicy, request: AdmissionRequest, obj: Any, old: Any,
                   now: float) -> list[tuple[CompiledException, frozenset[str] | None]]:
        """The exceptions that cover ``policy``'s verdict on this request but for their CEL
        conditions, each with the rule names it waives (None: all). ``obj``/``old``: the objects
        as the policy judges them (a workload's Pod template: the Pod it stands for)."""
        found = []
        namespace = request.namespace or self.cluster_namespace
        for compiled, ref in self._by_policy.get(policy.name, ()):
            exception = compiled.exception
            if exception.namespace != namespace or not exception.in_force(now):
                continue
            if not within_limits(exception, policy.policy) or not _matches(exception, policy, request, obj, old):
                continue
            found.append((compiled, frozenset(ref.rules) if ref.rules else None))
        return found


def _matches(exception: PolicyException, policy: CompiledPolicy, request: AdmissionRequest, obj: Any,
             old: Any) -> bool:
    match = exception.match
    if match.resources:
        group, version, resource = _POD if policy.template else (request.group, request.version, request.resource)
        sub = "" if policy.template else request.sub_resource
        if not any(rule.covers(group, version, resource, sub, request.operation) for rule in match.resources):
            return False
    body = obj if obj is not None else old    # a DELETE: the object being deleted
    metadata = body.get("metadata") if isinstance(body, Mapping) else None
    name = request.name
    if isinstance(metadata, Mapping) and isinstance(metadata.get("name"), str) and metadata["name"]:
        name = metadata["name"]
    if not match.names_match(name):
        return False
    return match.object_selector.is_empty or match.object_selector.matches(labels_of(body))


def exemption(compiled: CompiledException, policy: str, rule: str) -> Exemption:
    return Exemption(policy, rule, compiled.key, format_time(compiled.exception.expires_at))
