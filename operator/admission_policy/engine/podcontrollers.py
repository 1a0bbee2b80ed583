"""Pod controllers: a policy written for Pods also judges the Pod templates of workloads.

A Deployment whose template a Pod policy would refuse is otherwise accepted, and so is its
ReplicaSet; only the Pods are refused, by a controller, and the author sees a Deployment stuck at
0 ready with the reason in another object's events. So, like Kyverno's auto-gen rules, a policy
that matches ``pods`` (CREATE or UPDATE) is compiled a second time for the workloads that carry a
Pod template, once per place the template sits (``spec.template``, or a CronJob's
``spec.jobTemplate.spec.template``): same expressions, but ``object`` and ``oldObject`` read the
template as a Pod, and JSON-patch paths point into the template. All of that is decided here, at
compile time; a request only builds the Pod view of its object.

This module is the pure part: which workloads there are, the Pod view of a workload, and what
of a policy cannot be applied to a template (and why). ``compiler`` builds the policies from it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final

from .. import api
from ..cel import CompiledExpression, syntax

Location = tuple[str, ...]   # the keys from a workload to its Pod template

POD_TEMPLATE: Final[Location] = ("spec", "template")
JOB_TEMPLATE: Final[Location] = ("spec", "jobTemplate", "spec", "template")


@dataclasses.dataclass(frozen=True)
class Controller:
    """A workload kind that makes Pods from a template, and where the template sits in it: a
    Pod policy judges that template as the Pods it will make."""
    kind: str
    group: str
    version: str
    resource: str
    location: Location


CONTROLLERS: Final[tuple[Controller, ...]] = (
    Controller("Deployment", "apps", "v1", "deployments", POD_TEMPLATE),
    Controller("ReplicaSet", "apps", "v1", "replicasets", POD_TEMPLATE),
    Controller("StatefulSet", "apps", "v1", "statefulsets", POD_TEMPLATE),
    Controller("DaemonSet", "apps", "v1", "daemonsets", POD_TEMPLATE),
    Controller("Job", "batch", "v1", "jobs", POD_TEMPLATE),
    Controller("CronJob", "batch", "v1", "cronjobs", JOB_TEMPLATE),
    Controller("ReplicationController", "", "v1", "replicationcontrollers", POD_TEMPLATE),
)
BY_RESOURCE: Final[Mapping[tuple[str, str], Controller]] = {(c.group, c.resource): c for c in CONTROLLERS}

# What a Pod has and its template never does: set by the API server, the scheduler or the
# controller that creates the Pod. An expression reading them cannot mean the same on a template.
POD_ONLY_METADATA: Final = frozenset({
    "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
    "generation", "ownerReferences", "managedFields",
})
# The Pod view's name and namespace are the workload's (see pod_view): a mutation cannot set them.
_FIXED_METADATA: Final = frozenset({"name", "generateName", "namespace"}) | POD_ONLY_METADATA


@dataclasses.dataclass(frozen=True)
class NotApplied:
    """A part of a Pod policy that does not judge templates, and why."""
    path: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Coverage:
    """What a Pod policy does to workloads: for its status."""
    kinds: tuple[str, ...]                   # the workload kinds whose Pod templates it judges
    not_applied: tuple[NotApplied, ...] = ()
    reason: str = ""                         # why it judges none (when ``kinds`` is empty)

    def as_status(self) -> dict[str, Any]:
        """``status.podControllers`` as the CRD declares it (empty fields left out)."""
        status: dict[str, Any] = {"kinds": list(self.kinds)}
        if self.not_applied:
            status["notApplied"] = [{"path": n.path, "reason": n.reason} for n in self.not_applied]
        if self.reason:
            status["reason"] = self.reason
        return status


def pod_rules(policy: api.AdmissionPolicy) -> list[api.ResourceRule]:
    """The rules that select Pods (main resource, CREATE or UPDATE): what makes a policy a Pod
    policy. A rule for every resource ("*") is not one: it already names the workloads."""
    return [rule for rule in policy.match.resources
            if "pods" in rule.resources and any(g in ("", "*") for g in rule.api_groups)
            and any(v in ("v1", "*") for v in rule.api_versions) and _operations(rule)]


def _operations(rule: api.ResourceRule) -> tuple[str, ...]:
    if "*" in rule.operations:
        return ("CREATE", "UPDATE")
    return tuple(op for op in ("CREATE", "UPDATE") if op in rule.operations)


def controller_rules(policy: api.AdmissionPolicy, controllers: Iterable[Controller]) -> tuple[api.ResourceRule, ...]:
    """The rules for these workloads, with the operations the policy's Pod rules name."""
    operations = sorted({op for rule in pod_rules(policy) for op in _operations(rule)})
    by_group: dict[str, list[str]] = {}
    for controller in controllers:
        by_group.setdefault(controller.group, []).append(controller.resource)
    return tuple(api.ResourceRule((group,), ("v1",), tuple(resources), tuple(operations))
                 for group, resources in by_group.items())


def already_matched(policy: api.AdmissionPolicy, controller: Controller) -> bool:
    """The policy's own rules match this workload (e.g. resources "*"): it judges it as written."""
    return any((controller.group in rule.api_groups or "*" in rule.api_groups)
               and (controller.resource in rule.resources or "*" in rule.resources)
               for rule in policy.match.resources)


def pod_view(workload: Any, location: Location) -> Any:
    """The Pod a workload's template stands for, as a Pod policy reads it: ``metadata`` and
    ``spec`` from the template, with the workload's ``name`` and ``namespace`` (its Pods live in
    that namespace and are named after it: ``web`` → ``web-5d9c7-x2x8k``). None stays None."""
    if not isinstance(workload, Mapping):
        return workload
    template: Any = workload
    for key in location:
        template = template.get(key) if isinstance(template, Mapping) else None
    if not isinstance(template, Mapping):
        template = {}
    own = workload.get("metadata")
    own = own if isinstance(own, Mapping) else {}
    found = template.get("metadata")
    metadata = {key: value for key, value in found.items() if key not in ("name", "generateName", "namespace")} \
        if isinstance(found, Mapping) else {}
    for key in ("name", "namespace"):
        if isinstance(own.get(key), str) and own[key]:
            metadata[key] = own[key]
    if "name" not in metadata and isinstance(own.get("generateName"), str) and own["generateName"]:
        metadata["generateName"] = own["generateName"]
    view: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}
    if "spec" in template:
        view["spec"] = template["spec"]
    return view


def template_of(workload: Any, location: Location) -> Any:
    """The workload's Pod template as sent, or None."""
    for key in location:
        workload = workload.get(key) if isinstance(workload, Mapping) else None
    return workload


def rewrite_pointer(pointer: str, location: Location) -> str | None:
    """A JSON pointer into the Pod, pointing into the template instead; None when the Pod's
    field has no place in a template (``/status``, ``/metadata/name``, the whole ``/metadata``)."""
    prefix = "/" + "/".join(location)
    tokens = pointer.split("/")
    if tokens[1] == "spec":
        return prefix + pointer
    if tokens[1] == "metadata" and len(tokens) > 2 and tokens[2] not in _FIXED_METADATA:
        return prefix + pointer
    return None


def rewrite_merge(merge: Mapping[str, Any], location: Location) -> dict[str, Any] | None:
    """A merge patch for the Pod, nested to reach the template; None when it sets what a
    template has no place for."""
    if set(merge) - {"metadata", "spec"}:
        return None
    metadata = merge.get("metadata")
    if metadata is not None and (not isinstance(metadata, Mapping) or set(metadata) & _FIXED_METADATA):
        return None
    nested: dict[str, Any] = dict(merge)
    for key in reversed(location):
        nested = {key: nested}
    return nested


def pod_only_read(expression: CompiledExpression) -> str | None:
    """Why an expression cannot hold for a template (it reads a Pod's ``status`` or a field of
    ``metadata`` only a live Pod has), or None. Read from the checked tree, so that a string
    literal or a comment that says ``object.status`` is not taken for a read of it."""
    for node in syntax.walk(expression.tree().root):
        read = selected(node)
        if read is None:
            continue
        target, field = read
        if field == "status" and _is_object(target):
            return f"reads {target.name}.status, which a Pod template does not have"
        inner = selected(target)
        if field in POD_ONLY_METADATA and inner is not None and inner[1] == "metadata" and _is_object(inner[0]):
            return (f"reads {inner[0].name}.metadata.{field}, which only a created Pod has "
                    "(a template never carries it)")
    return None


def selected(node: syntax.Expr) -> tuple[syntax.Expr, str] | None:
    """(operand, field) for ``a.f``, ``has(a.f)``, ``a.?f`` and ``a['f']``."""
    if node.kind == "select" and node.target is not None:
        return node.target, node.name
    if node.kind == "call" and node.name in ("_?._", "_[_]", "_[?_]") and len(node.args) == 2 \
            and node.args[1].kind == "const" and isinstance(node.args[1].constant(), str):
        return node.args[0], str(node.args[1].constant())
    return None


def _is_object(node: syntax.Expr) -> bool:
    return node.kind == "ident" and node.name in ("object", "oldObject")
