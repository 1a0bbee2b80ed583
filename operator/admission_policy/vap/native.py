"""An AdmissionPolicy as the objects Kubernetes enforces itself: per place the policy judges (the
Pods it names, and the Pod templates of workloads), a ValidatingAdmissionPolicy and its binding
for its validations, a MutatingAdmissionPolicy and its binding for its mutations (``mutating``).

The API server then decides without calling the operator, and goes on deciding with every
replica down. Only what decides the same way there is generated (``blockers`` says what keeps a
policy on the webhook, each at its field); what is generated matches what the webhooks route,
down to the exemptions: the same resource atoms (``routing.atoms``, so a wildcard never reaches
the never-routed kinds), the exempt namespaces, the break-glass condition, the operator's own
CRDs. Pure: the operator (``operator/native.py``) and ``admission-policy convert --to-native``
build the same objects.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import weakref
from collections.abc import Collection, Mapping
from typing import Any, Final

from .. import api
from ..cluster.routing import (
    CRDS,
    NAMESPACE_NAME_LABEL,
    NOT_OWN_CRD,
    ServedIndex,
    admission_rules,
    atoms,
    plural,
    routes,
)
from ..engine import CompiledPolicy
from ..engine.podcontrollers import JOB_TEMPLATE, POD_TEMPLATE, Location
from . import mutating
from .expressions import OPTIONAL_TYPES, NotNative, newer_libraries, source, template_changed, uses_optionals
from .lowering import NotLowerable, lower_optionals
from .objects import BINDING, GROUP, POLICY
from .portability import Finding, portability
from .shortcut import ANY_VALIDATION_FAILS, any_validation_fails

MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "admission-policy-operator"}
# Every generated object says whose it is: the cleanup (a policy deleted, ``helm uninstall``)
# finds them by these, and a NamespacedAdmissionPolicy cannot own a cluster-scoped object.
POLICY_KIND_LABEL: Final = f"{api.GROUP}/policy-kind"
POLICY_NAME_LABEL: Final = f"{api.GROUP}/policy-name"
POLICY_NAMESPACE_LABEL: Final = f"{api.GROUP}/policy-namespace"
GENERATION_ANNOTATION: Final = f"{api.GROUP}/policy-generation"
# The policy's whole name ("namespace/name" for a tenant's): a label value is cut to a digest past 63 characters.
POLICY_ANNOTATION: Final = f"{api.GROUP}/policy"
# Kept on every generated ValidatingAdmissionPolicy and binding: one deleted by hand stays in
# effect, terminating, until the operator has handed its policy back to the webhooks
# (make-before-break even then). Not on MutatingAdmissionPolicies: see ``_place``.
FINALIZER: Final = f"{api.GROUP}/native"
ACTIONS: Final[Mapping[str, str]] = {"Enforce": "Deny", "Warn": "Warn", "Audit": "Audit"}
# ValidatingAdmissionPolicy: v1 from Kubernetes 1.30, v1beta1 from 1.28 (behind its gate until 1.30).
VALIDATING_VERSIONS: Final = ("v1", "v1beta1")
_PLACES: Final[Mapping[Location, str]] = {(): "policy", POD_TEMPLATE: "podtemplate", JOB_TEMPLATE: "jobtemplate"}
# The webhook's words for a Pod template's failure (``engine.assembly``): the workload's kind and
# name (or generateName), then the message.
_TEMPLATE_OF: Final = (
    "'the Pod template of ' + request.kind.kind + (request.name != '' ? ' \"' + request.name + '\"' : "
    "has(object.metadata.generateName) ? ' \"' + object.metadata.generateName + '\"' : '') + "
    "' would violate the policy: '")


@dataclasses.dataclass(frozen=True)
class Target:
    """What the generated objects are for: the cluster's API and the operator's exemptions."""
    version: str                          # the ValidatingAdmissionPolicy API version served
    kubernetes: tuple[int, int]           # the API server's version: which CEL libraries it has
    served: ServedIndex                   # discovery, to expand rules as the webhooks do
    exempt_namespaces: tuple[str, ...] = ()
    break_glass: Mapping[str, str] | None = None   # routing.break_glass_condition
    mutating_version: str | None = None   # the MutatingAdmissionPolicy API version served, if any


@dataclasses.dataclass(frozen=True)
class Plan:
    """The objects to write (policies before their bindings), or what keeps the policy on the
    webhook (``blockers``: then there are no objects)."""
    objects: tuple[dict[str, Any], ...] = ()
    blockers: tuple[Finding, ...] = ()

    @property
    def native(self) -> bool:
        return not self.blockers


def blockers(compiled: CompiledPolicy, body: Mapping[str, Any], kubernetes: tuple[int, int],
             mutating_version: str | None = None) -> list[Finding]:
    """What Kubernetes (at this version, serving MutatingAdmissionPolicy at ``mutating_version``)
    cannot decide or mutate as this operator does, field by field. Checked once per compiled
    generation and cluster: the operator asks again on every pass."""
    known = _BLOCKERS.setdefault(compiled, {})
    key = (kubernetes, mutating_version)
    if key not in known:
        known[key] = tuple(_blockers(compiled, body, kubernetes, mutating_version))
    return list(known[key])


# The CEL compiles behind a verdict cost milliseconds per expression; a generation is immutable.
_BLOCKERS: weakref.WeakKeyDictionary[CompiledPolicy, dict[tuple[tuple[int, int], str | None], tuple[Finding, ...]]] \
    = weakref.WeakKeyDictionary()


def _blockers(compiled: CompiledPolicy, body: Mapping[str, Any], kubernetes: tuple[int, int],
              mutating_version: str | None) -> list[Finding]:
    policy = compiled.policy
    # portability() speaks of a ValidatingAdmissionPolicy, which only validates: mutations are
    # mutating's to judge, against the MutatingAdmissionPolicy this cluster serves.
    found = [f for f in portability(compiled, body).blockers if f.path != "spec.mutations"]
    found += newer_libraries(compiled, kubernetes)
    if policy.mutations and mutating_version is None:
        found.append(Finding("spec.mutations", "the API server serves no MutatingAdmissionPolicy "
                                               "(admissionregistration.k8s.io v1alpha1 from Kubernetes 1.32, behind "
                                               "its feature gate)"))
    elif policy.mutations:
        found += [f for f in mutating.mutation_blockers(compiled, kubernetes) if f not in found]
    if kubernetes < OPTIONAL_TYPES:
        for expression in policy.expressions():
            if uses_optionals(expression.source):
                try:
                    lower_optionals(expression.source)
                except NotLowerable as error:
                    found.append(Finding(expression.path, f"uses CEL's optional syntax (.?field, ?key, optional.*), "
                                                          f"which Kubernetes has from 1.29 (this cluster is "
                                                          f"{kubernetes[0]}.{kubernetes[1]}), in a way plain CEL "
                                                          f"cannot say: {error}"))
    if policy.report_admission:
        found.append(Finding("spec.reportAdmission", "the operator reports each admission decision only when it "
                                                     "makes it"))
    if policy.param_kind is not None and any(_names_crds(rule) for rule in policy.match.resources):
        found.append(Finding("spec.paramKind", "a policy that judges CustomResourceDefinitions and reads params "
                                               "could refuse the very CRD that would bring its param kind back"))
    return found


def plan(compiled: CompiledPolicy, body: Mapping[str, Any], target: Target,
         handed_back: Collection[str] = ()) -> Plan:
    """The native objects of this policy; ``handed_back``: namespaces they leave to the webhook
    (where an exception is in force: the webhook applies it, and its expiry, to the second)."""
    found = blockers(compiled, body, target.kubernetes, target.mutating_version)
    if found:
        return Plan(blockers=tuple(found))
    objects: list[dict[str, Any]] = []
    for part in (compiled, *compiled.derived):
        try:
            objects += _place(part, target, handed_back)
        except NotNative as error:
            hint = " (spec.podControllers: [] judges Pods alone)" if part.template else ""
            return Plan(blockers=(dataclasses.replace(error.finding, message=error.finding.message + hint),))
    if not objects:
        return Plan(blockers=(Finding("spec.match.resources", "names nothing this cluster serves"),))
    return Plan(tuple(objects))


def object_name(policy: api.AdmissionPolicy, template: Location = ()) -> str:
    """``ap.<place>.<name>`` for an AdmissionPolicy, ``nap.<namespace>.<place>.<name>`` for a
    NamespacedAdmissionPolicy: never the same for two policies (a namespace has no dots, and the
    place is one of three words), within the 253 characters of a name."""
    place = _PLACES[template]
    short = policy.object_name   # a NamespacedAdmissionPolicy's ``name`` is "namespace/name"
    name = f"nap.{policy.namespace}.{place}.{short}" if policy.namespace else f"ap.{place}.{short}"
    if len(name) > 253:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        name = f"{name[:253 - 17]}.{digest}"
    return name


def owner_labels(policy: api.AdmissionPolicy) -> dict[str, str]:
    labels = {**MANAGED_BY, POLICY_KIND_LABEL: api.NAMESPACED_KIND if policy.namespace else api.KIND}
    short = policy.object_name   # a label value has no "/": the namespace has a label of its own
    labels[POLICY_NAME_LABEL] = short if len(short) <= 63 else hashlib.sha256(short.encode()).hexdigest()[:63]
    if policy.namespace:
        labels[POLICY_NAMESPACE_LABEL] = policy.namespace
    return labels


# ---- building -------------------------------------------------------------------------------


def _place(part: CompiledPolicy, target: Target, handed_back: Collection[str]) -> list[dict[str, Any]]:
    """One place's objects: its validations' policy and binding, its mutations' (both named after
    the place: different kinds), policies before their bindings."""
    policy = part.policy
    scope = "Namespaced" if policy.namespace else "*"
    metadata = {"name": object_name(policy, part.template), "labels": owner_labels(policy),
                "annotations": {GENERATION_ANNOTATION: str(policy.generation), POLICY_ANNOTATION: policy.name},
                "finalizers": [FINALIZER]}
    objects = []
    validating = admission_rules(atoms([r for r in routes(part, derived=False) if not r.mutating], target.served),
                                 scope)
    if validating:
        lower = target.kubernetes < OPTIONAL_TYPES
        spec = {**_matching(part, target, handed_back, validating),
                "validations": [_validation(v, part.template, lower) for v in policy.validations]}
        _skip_when_admitted(spec)
        objects += _pair(target.version, (POLICY, BINDING), metadata, spec,
                         {"validationActions": [ACTIONS[policy.enforcement]]}, policy)
    changing = mutating.rules(part, target.served) if target.mutating_version else []
    if changing:
        spec = mutating.spec(part, _matching(part, target, handed_back, changing))
        # No finalizer: Kubernetes 1.32 refuses every update of a MutatingAdmissionPolicy with
        # variables (it checks its expressions without them), releasing a finalizer included.
        unheld = {key: value for key, value in metadata.items() if key != "finalizers"}
        objects += _pair(target.mutating_version or "", (mutating.MUTATING_POLICY, mutating.MUTATING_BINDING),
                         unheld, spec, {}, policy)
    return objects


def _matching(part: CompiledPolicy, target: Target, handed_back: Collection[str],
              rules: list[dict[str, Any]]) -> dict[str, Any]:
    """What every generated policy of a place has: its failurePolicy, what it matches (the
    webhooks' rules and exemptions, and a Pod template's skip of an UPDATE that leaves it as it
    was), its variables and param kind."""
    policy = part.policy
    lower = target.kubernetes < OPTIONAL_TYPES
    conditions = [] if target.break_glass is None else [dict(target.break_glass)]
    if any((rule["apiGroups"][0], plural(resource)) == CRDS for rule in rules for resource in rule["resources"]):
        conditions.append(dict(NOT_OWN_CRD))
    if part.template and any(operation in ("UPDATE", "*") for rule in rules for operation in rule["operations"]):
        conditions.append(template_changed(part.template))
    conditions += [{"name": c.name, "expression": source(c.expression.source, part.template, c.expression.path,
                                                         lower)} for c in policy.match.conditions]
    spec: dict[str, Any] = {
        "failurePolicy": policy.failure_policy,
        "matchConstraints": {
            "resourceRules": rules,
            "namespaceSelector": _namespace_selector(policy, target, handed_back),
            "objectSelector": _selector(policy.match.object_selector),
            "matchPolicy": "Equivalent",
        },
    }
    if conditions:
        spec["matchConditions"] = conditions
    if policy.variables:
        spec["variables"] = [{"name": v.name, "expression": source(v.expression.source, part.template,
                                                                   v.expression.path, lower)}
                             for v in policy.variables]
    if policy.param_kind is not None:
        spec["paramKind"] = {"apiVersion": policy.param_kind.api_version, "kind": policy.param_kind.kind}
    return spec


def _pair(version: str, kinds: tuple[str, str], metadata: Mapping[str, Any], spec: dict[str, Any],
          binding: dict[str, Any], policy: api.AdmissionPolicy) -> list[dict[str, Any]]:
    """A policy object and the binding that puts it in force, with the policy's params."""
    binding = {"policyName": metadata["name"], **binding}
    ref = policy.param_ref
    if ref is not None:
        param_ref: dict[str, Any] = {"parameterNotFoundAction": ref.not_found_action}
        if ref.name is not None:
            param_ref["name"] = ref.name
        if ref.selector is not None:
            param_ref["selector"] = _selector(ref.selector)
        if ref.namespace is not None:
            param_ref["namespace"] = ref.namespace
        binding["paramRef"] = param_ref
    api_version = f"{GROUP}/{version}"
    return [{"apiVersion": api_version, "kind": kinds[0], "metadata": copy.deepcopy(dict(metadata)), "spec": spec},
            {"apiVersion": api_version, "kind": kinds[1], "metadata": copy.deepcopy(dict(metadata)), "spec": binding}]


def _skip_when_admitted(spec: dict[str, Any]) -> None:
    """Let Kubernetes skip, by one more match condition, a request all the validations admit
    (``shortcut`` says why), only under ``failurePolicy: Fail``: with Ignore, a request whose
    checks together exceed one expression's cost limit would be skipped, where the validations,
    each with a limit of its own, might refuse it."""
    conditions = spec.get("matchConditions", [])
    if spec["failurePolicy"] != "Fail" or any(c["name"] == ANY_VALIDATION_FAILS for c in conditions):
        return
    condition = any_validation_fails(tuple(v["expression"] for v in spec["validations"]),
                                     tuple((v["name"], v["expression"]) for v in spec.get("variables", ())))
    if condition is not None:
        spec["matchConditions"] = [*conditions, condition]


def _validation(validation: api.Validation, template: Location, lower: bool) -> dict[str, Any]:
    assert validation.expression is not None   # a plugin validation is a blocker
    out: dict[str, Any] = {"expression": source(validation.expression.source, template, validation.expression.path,
                                                lower), "reason": validation.reason}
    if validation.message is not None:
        out["message"] = validation.message
    if validation.message_expression is not None:
        out["messageExpression"] = source(validation.message_expression.source, template,
                                          validation.message_expression.path, lower)
    if template:   # says whose Pod template it judged, as the webhook does (the message stays the fallback)
        text = out.get("messageExpression") or json.dumps(
            validation.message or f"failed expression: {validation.expression.source.strip()}", ensure_ascii=False)
        out["messageExpression"] = f"{_TEMPLATE_OF} + ({text})"
    return out


def _namespace_selector(policy: api.AdmissionPolicy, target: Target, handed_back: Collection[str]) -> dict[str, Any]:
    """The policy's selector, and the namespaces the webhooks never route or that the policy
    leaves out; a tenant's policy judges its own namespace alone."""
    selector = _selector(policy.match.namespace_selector)
    expressions = list(selector.get("matchExpressions", ()))
    if policy.namespace:
        expressions.append({"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": [policy.namespace]})
    left_out = sorted({*target.exempt_namespaces, *policy.match.exclude_namespaces, *handed_back})
    if left_out:
        expressions.append({"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": left_out})
    if expressions:
        selector["matchExpressions"] = expressions
    return selector


def _selector(selector: api.LabelSelector) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if selector.match_labels:
        out["matchLabels"] = dict(selector.match_labels)
    if selector.match_expressions:
        out["matchExpressions"] = [{"key": r.key, "operator": r.operator, **(
            {"values": sorted(r.values)} if r.values else {})} for r in selector.match_expressions]
    return out


def _names_crds(rule: api.ResourceRule) -> bool:
    return any(group in ("*", CRDS[0]) for group in rule.api_groups) and any(
        plural(resource) in ("*", CRDS[1]) for resource in rule.resources)
