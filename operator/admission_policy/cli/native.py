"""``admission-policy convert --to-native``: AdmissionPolicies in, the ValidatingAdmissionPolicies
and bindings the operator would generate for them out (``vap.native``), for a repository that
applies them itself (GitOps) or a cluster the operator does not run in.

Offline there is no discovery: the objects are built from an empty ``ServedIndex``, so a rule
naming a resource keeps the versions it names (the operator would name the group's preferred
version; with ``matchPolicy: Equivalent`` both decide the same), and a ``"*"`` group or resource,
which only discovery expands, keeps its policy on the webhook (``wildcards``).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from .. import api
from ..cluster.routing import ServedIndex, break_glass_condition, plural
from ..config import OperatorConfig
from ..engine import CompiledPolicy
from ..vap import native
from ..vap.portability import Finding
from .documents import DocumentError, compile_document, documents_in, duplicate_policy, policy_kind

# The newest Kubernetes the end-to-end tests run (.ci/run): the default of --kubernetes.
DEFAULT_KUBERNETES: Final = (1, 32)
OLDEST: Final = (1, 28)      # ValidatingAdmissionPolicy v1beta1 (behind its feature gate until 1.30)
V1_FROM: Final = (1, 30)     # ... and v1
# What the operator exempts with its defaults (AP_EXEMPT_NAMESPACES plus AP_NAMESPACE, and
# AP_BREAK_GLASS_*), so that the objects are the ones it would write.
DEFAULTS: Final = OperatorConfig()
_VERSION: Final = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?$")


@dataclasses.dataclass(frozen=True)
class NativeResult:
    objects: tuple[dict[str, Any], ...]   # policies before their bindings, policy by policy
    problems: tuple[str, ...]             # lines for standard error; a policy with one wrote nothing
    converted: int                        # policies whose objects are written
    found: int                            # AdmissionPolicies and NamespacedAdmissionPolicies read


def parse_kubernetes(text: str) -> tuple[int, int]:
    """``1.32`` (or ``v1.32.3``) → (1, 32); a version with no ValidatingAdmissionPolicy is an error."""
    found = _VERSION.match(text.strip())
    if found is None:
        raise DocumentError(f"--kubernetes {text!r}: expected a version such as 1.32")
    version = (int(found[1]), int(found[2]))
    if version < OLDEST:
        raise DocumentError(f"--kubernetes {text}: ValidatingAdmissionPolicy is served from Kubernetes 1.28 "
                            "(v1beta1, behind its feature gate) and 1.30 (v1)")
    return version


def api_version(kubernetes: tuple[int, int]) -> str:
    """The ValidatingAdmissionPolicy version that Kubernetes serves (the operator asks discovery)."""
    return "v1" if kubernetes >= V1_FROM else "v1beta1"


def target(kubernetes: tuple[int, int], exempt_namespaces: Collection[str] = DEFAULTS.all_exempt_namespaces,
           break_glass_users: Collection[str] = DEFAULTS.break_glass_users,
           break_glass_groups: Collection[str] = DEFAULTS.break_glass_groups,
           mutating_version: str | None = None) -> native.Target:
    """``mutating_version``: the MutatingAdmissionPolicy version the cluster serves; none by
    default (behind a feature gate where it exists at all, so it is the user's to say)."""
    return native.Target(api_version(kubernetes), kubernetes, ServedIndex(()), tuple(sorted(set(exempt_namespaces))),
                         break_glass_condition(break_glass_users, break_glass_groups), mutating_version)


def to_native(paths: Sequence[str], goal: native.Target) -> NativeResult:
    """Every policy under ``paths``, as native objects or as the lines saying why not. Unreadable
    input raises DocumentError; a policy that does not compile or port is a problem of its own."""
    objects: list[dict[str, Any]] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    converted = found = 0
    for root in paths:
        for document in documents_in(root):
            if document.kind not in api.POLICY_KINDS:
                continue   # exceptions, params, tests: the operator's business, not the objects'
            found += 1
            try:
                compiled = compile_document(document)
            except DocumentError as exc:
                problems += [f"error: {line}" for line in str(exc).splitlines()]
                continue
            if compiled.name in seen:
                problems.append(f"error: {duplicate_policy(document, compiled.name, seen[compiled.name])}")
                continue
            seen[compiled.name] = document.source
            blockers = wildcards(compiled)
            if blockers:   # plan() would leave those rules out: say them, and whatever else stops it
                blockers += native.blockers(compiled, document.body, goal.kubernetes)
            else:
                plan = native.plan(compiled, document.body, goal)
                blockers = list(plan.blockers)
                objects += [committable(obj) for obj in plan.objects]
            if blockers:
                policy = f"{document.source}: {policy_kind(document)} {compiled.name!r}"
                problems += [f"not portable  {policy}: {finding}" for finding in blockers]
            else:
                converted += 1
    return NativeResult(tuple(objects), tuple(problems), converted, found)


def wildcards(compiled: CompiledPolicy) -> list[Finding]:
    """The rules only discovery can expand: offline they would expand to nothing, and the objects
    would judge less than the operator's (``routing.expand``)."""
    return [Finding(f"spec.match.resources[{i}]", '"*" in apiGroups or resources is expanded from the cluster\'s '
                                                  "discovery, which is not at hand offline: name the groups and "
                                                  "resources, or let the operator generate the objects")
            for i, rule in enumerate(compiled.policy.match.resources)
            if "*" in rule.api_groups or any(plural(resource) == "*" for resource in rule.resources)]


def committable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object as a repository's own: its name, and its labels but the one the operator finds
    its objects by (a running operator would take it for its own, and delete or rewrite it as its
    policies say). Without what only the operator keeps true: its finalizer (no one would remove it
    without the operator, and a deletion would hang) and its annotations (the policy generation)."""
    labels = {key: value for key, value in obj["metadata"]["labels"].items() if key not in native.MANAGED_BY}
    return {**obj, "metadata": {"name": obj["metadata"]["name"], "labels": labels}}
