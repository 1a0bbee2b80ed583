"""ValidatingAdmissionPolicies and their bindings → AdmissionPolicies that decide the same.

Kubernetes applies a policy once per binding that selects the request, with the binding's
params and validation actions, so each binding becomes one AdmissionPolicy, named after it. A
policy no binding names is enforced by nothing, and becomes nothing (with a notice).

What an AdmissionPolicy cannot say is a ``Problem``: a line naming the object and the field.
A policy is still written when what is lost does not change which requests it judges and how
it decides them (audit annotations; a second validation action). It is not written when its
objects cannot be read, or when the policy it would be does not compile here (a function this
project lacks): a policy that matched other requests, or could not be loaded, would be worse
than none. Every policy written is compiled here first, as ``kubectl apply`` would.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from .. import api
from ..cel import CelCompileError
from ..engine import PolicyCompileError, load_policy
from ..engine.podcontrollers import pod_rules
from . import matching
from .objects import (
    BINDING,
    GROUP,
    POLICY,
    VERSIONS,
    Binding,
    MatchResources,
    Origin,
    Policy,
    Validation,
    VapObjectError,
    origin_of,
    read_binding,
    read_policy,
    version_of,
)
from .rules import Rule, resource_rules

_CONDITION_PATH: Final = re.compile(r"^spec\.match\.conditions\[(\d+)\]")


@dataclasses.dataclass(frozen=True)
class Problem:
    """What could not be converted, or not faithfully: one line, naming the object and field."""
    origin: Origin
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.path}: {self.message}" if self.path else f"{self.origin}: {self.message}"


@dataclasses.dataclass
class Conversion:
    """What ``convert`` made of the objects, and what it could not carry over faithfully: each
    problem is reported (the CLI exits 2 for any), never silently approximated."""
    policies: list[dict[str, Any]] = dataclasses.field(default_factory=list)   # AdmissionPolicy objects
    problems: list[Problem] = dataclasses.field(default_factory=list)          # each one: not faithful
    notices: list[str] = dataclasses.field(default_factory=list)               # faithful, but worth saying

    def problem(self, origin: Origin, path: str, message: str) -> None:
        """Record a problem once, however many bindings of the policy meet it."""
        found = Problem(origin, path, message)
        if found not in self.problems:
            self.problems.append(found)


def convert(objects: Iterable[tuple[str, Mapping[str, Any]]]) -> Conversion:
    """Convert every binding among ``objects`` ((where read, object) pairs) with its policy.
    Objects of other API groups (the params, say) are not converted: the AdmissionPolicies read
    the same params from the cluster."""
    result = Conversion()
    policies, bindings, unreadable = _read_all(objects, result)
    bound: set[str] = set()
    for binding in bindings:
        policy = policies.get(binding.policy_name)
        if policy is None:
            if binding.policy_name not in unreadable:   # else the policy's own line says why
                result.problem(binding.origin, "spec.policyName",
                               f"no {POLICY} named {binding.policy_name!r} among the inputs")
            continue
        bound.add(policy.origin.name)
        _convert_pair(policy, binding, result)
    for name, policy in policies.items():
        if name not in bound:
            result.notices.append(f"{policy.origin}: no binding names it, so Kubernetes does not enforce it; "
                                  "nothing is written for it")
    return result


def _read_all(objects: Iterable[tuple[str, Mapping[str, Any]]], result: Conversion,
              ) -> tuple[dict[str, Policy], list[Binding], set[str]]:
    """The policies by name, the bindings, and the names of the policies that could not be read."""
    policies: dict[str, Policy] = {}
    bindings: list[Binding] = []
    unreadable: set[str] = set()
    for source, body in objects:
        version = version_of(body)
        if version is None:
            continue
        origin = origin_of(source, body)
        if origin.kind not in (POLICY, BINDING):
            result.problem(origin, "", f"not converted: only {POLICY} and {BINDING} objects are")
        elif version not in VERSIONS:
            result.problem(origin, "apiVersion", f"{GROUP}/{version} is not one of "
                                                 f"{', '.join(f'{GROUP}/{v}' for v in VERSIONS)}")
        elif origin.kind == POLICY and origin.name in policies:
            result.problem(origin, "metadata.name", f"is also the name of the {POLICY} in "
                                                    f"{policies[origin.name].origin.source}")
        else:
            try:
                if origin.kind == BINDING:
                    bindings.append(read_binding(source, body, version))
                else:
                    policies[origin.name] = read_policy(source, body)
            except VapObjectError as exc:
                result.problem(origin, exc.path, exc.message)
                if origin.kind == POLICY:
                    unreadable.add(origin.name)
    return policies, bindings, unreadable


def _convert_pair(policy: Policy, binding: Binding, result: Conversion) -> None:
    """One AdmissionPolicy for a policy applied through one binding."""
    if policy.audit_annotations:
        left = ("its validations are converted without them" if policy.validations
                else "it has no validations, so nothing is written for it")
        result.problem(policy.origin, "spec.auditAnnotations",
                       f"not converted: an AdmissionPolicy writes no audit annotations of its own ({left})")
    if not policy.validations:
        return
    side = binding.match or MatchResources(None)
    routed = matching.routing(policy.match, side)
    if not routed:
        result.notices.append(f"{binding.origin}: its matchResources and the resourceRules of {POLICY} "
                              f"{policy.origin.name!r} have no request in common; nothing is written for it")
        return
    enforcement = _enforcement(binding, result)
    generated = matching.conditions(policy.match, side)
    spec: dict[str, Any] = {
        "description": f"Converted from {POLICY} {policy.origin.name!r} with binding {binding.origin.name!r}.",
        "enforcement": enforcement,
        "failurePolicy": policy.failure_policy,
    }
    if policy.param_kind is not None and binding.param_ref is not None:
        spec["paramKind"] = {"apiVersion": policy.param_kind[0], "kind": policy.param_kind[1]}
        spec["paramRef"] = _param_ref(binding)
    spec["match"] = _match(policy, side, routed, generated)
    if policy.variables:
        spec["variables"] = [{"name": name, "expression": text} for name, text in policy.variables]
    spec["validations"] = [_validation(v) for v in policy.validations]
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": binding.origin.name},
            "spec": spec}
    errors = _compile_errors(body, len(generated))
    if errors:
        for path, message in errors:
            result.problem(policy.origin, path, f"not converted (no AdmissionPolicy is written for binding "
                                                f"{binding.origin.name!r}): {message}")
        return
    result.policies.append(body)


def _enforcement(binding: Binding, result: Conversion) -> str:
    """validationActions as one enforcement: Deny (with or without Audit) denies, Warn warns."""
    actions = binding.actions
    enforcement = "Enforce" if "Deny" in actions else "Warn" if "Warn" in actions else "Audit"
    if len(actions) > 1:
        result.problem(binding.origin, "spec.validationActions",
                       f"{'+'.join(actions)} is converted as enforcement: {enforcement}, without Kubernetes' "
                       "audit annotation of each failure (an AdmissionPolicy has one enforcement)")
    return enforcement


def _match(policy: Policy, side: MatchResources, routed: Iterable[Rule],
           generated: list[tuple[str, str]]) -> dict[str, Any]:
    match: dict[str, Any] = {"resources": resource_rules(routed)}
    namespace_selector = matching.namespace_selector(policy.match, side)
    if not namespace_selector.empty:
        match["namespaceSelector"] = namespace_selector.as_yaml()
    object_selector = matching.object_selector(policy.match, side)
    if not object_selector.empty:
        match["objectSelector"] = object_selector.as_yaml()
    taken = {name for name, _ in policy.conditions}
    conditions = [{"name": _free(name, taken), "expression": text} for name, text in generated]
    conditions += [{"name": name, "expression": text} for name, text in policy.conditions]
    if conditions:
        match["conditions"] = conditions
    return match


def _free(name: str, taken: set[str]) -> str:
    """``name``, or ``name-2``... when the policy's own conditions already use it."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    taken.add(candidate)
    return candidate


def _param_ref(binding: Binding) -> dict[str, Any]:
    ref = binding.param_ref
    assert ref is not None
    body: dict[str, Any] = {}
    if ref.name is not None:
        body["name"] = ref.name
    if ref.selector is not None:
        body["selector"] = ref.selector.as_yaml()
    if ref.namespace is not None:
        body["namespace"] = ref.namespace
    body["parameterNotFoundAction"] = ref.not_found_action
    return body


def _validation(validation: Validation) -> dict[str, Any]:
    body: dict[str, Any] = {"expression": validation.expression}
    if validation.message is not None:
        body["message"] = validation.message
    if validation.message_expression is not None:
        body["messageExpression"] = validation.message_expression
    body["reason"] = validation.reason   # written even when unset: Kubernetes' default (Invalid) is not ours
    return body


def _compile_errors(body: dict[str, Any], generated: int) -> list[tuple[str, str]]:
    """(path in the ValidatingAdmissionPolicy, message) of what keeps the policy from loading here.
    A policy matching Pods is kept to Pods: Kubernetes does not judge workloads' Pod templates."""
    try:
        if pod_rules(api.parse_policy(body)):
            spec = body["spec"]
            body["spec"] = {**{k: spec.pop(k) for k in ("description", "enforcement", "failurePolicy")},
                            "podControllers": [], **spec}
        load_policy(body, "Fail")
    except api.PolicyError as exc:
        return [(_policy_path(exc.path, generated), exc.message)]
    except PolicyCompileError as exc:
        return [(_policy_path(error.path, generated) + _position(error), error.message) for error in exc.errors]
    return []


def _position(error: CelCompileError) -> str:
    return f" (line {error.line}, column {error.column})" if error.column is not None else ""


def _policy_path(path: str, generated: int) -> str:
    """An AdmissionPolicy's field path as the ValidatingAdmissionPolicy's (its own match
    conditions come after the generated ones)."""
    found = _CONDITION_PATH.match(path)
    if found and int(found[1]) >= generated:
        return f"spec.matchConditions[{int(found[1]) - generated}]" + path[found.end():]
    return path
