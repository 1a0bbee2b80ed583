"""An AdmissionPolicy as the objects Kubernetes enforces itself: a ValidatingAdmissionPolicy and
its binding per place the policy judges (the Pods it names, and the Pod templates of workloads).

The API server then decides without calling the operator, and goes on deciding with every
replica down. Only what decides the same way there is generated (``blockers`` says what keeps a
policy on the webhook, each at its field); what is generated matches what the webhooks route,
down to the exemptions: the same resource atoms (``routing.atoms``, so a wildcard never reaches
the never-routed kinds), the exempt namespaces, the break-glass condition, the operator's own
CRDs. Pure: the operator (``operator/native.py``) and ``admission-policy convert --to-native``
build the same objects.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import weakref
from collections.abc import Collection, Mapping
from typing import Any, Final

from .. import api, celast
from ..cel import check
from ..cellib import compat
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
from ..engine.podcontrollers import JOB_TEMPLATE, POD_TEMPLATE, Location, selected
from .lowering import NotLowerable, lower_optionals
from .objects import BINDING, GROUP, POLICY
from .portability import Finding, kubernetes_cel, portability

MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "admission-policy-operator"}
# Every generated object says whose it is: the cleanup (a policy deleted, ``helm uninstall``)
# finds them by these, and a NamespacedAdmissionPolicy cannot own a cluster-scoped object.
POLICY_KIND_LABEL: Final = f"{api.GROUP}/policy-kind"
POLICY_NAME_LABEL: Final = f"{api.GROUP}/policy-name"
POLICY_NAMESPACE_LABEL: Final = f"{api.GROUP}/policy-namespace"
GENERATION_ANNOTATION: Final = f"{api.GROUP}/policy-generation"
# The policy's whole name ("namespace/name" for a tenant's): a label value is cut to a digest past 63 characters.
POLICY_ANNOTATION: Final = f"{api.GROUP}/policy"
# Kept on every generated object: one deleted by hand stays in effect, terminating, until the
# operator has handed its policy back to the webhooks (make-before-break even then).
FINALIZER: Final = f"{api.GROUP}/native"
ACTIONS: Final[Mapping[str, str]] = {"Enforce": "Deny", "Warn": "Warn", "Audit": "Audit"}
# ValidatingAdmissionPolicy: v1 from Kubernetes 1.30, v1beta1 from 1.28 (behind its gate until 1.30).
VALIDATING_VERSIONS: Final = ("v1", "v1beta1")
OPTIONAL_TYPES: Final = (1, 29)   # Kubernetes' CEL has optional types from this version
_OPTIONAL_CALLS: Final = frozenset({"_?._", "_[?_]", "optional.of", "optional.ofNonZeroValue", "optional.none"})
_PLACES: Final[Mapping[Location, str]] = {(): "policy", POD_TEMPLATE: "podtemplate", JOB_TEMPLATE: "jobtemplate"}


@dataclasses.dataclass(frozen=True)
class Target:
    """What the generated objects are for: the cluster's API and the operator's exemptions."""
    version: str                          # the ValidatingAdmissionPolicy API version served
    kubernetes: tuple[int, int]           # the API server's version: which CEL libraries it has
    served: ServedIndex                   # discovery, to expand rules as the webhooks do
    exempt_namespaces: tuple[str, ...] = ()
    break_glass: Mapping[str, str] | None = None   # routing.break_glass_condition


@dataclasses.dataclass(frozen=True)
class Plan:
    """The objects to write (policies before their bindings), or what keeps the policy on the
    webhook (``blockers``: then there are no objects)."""
    objects: tuple[dict[str, Any], ...] = ()
    blockers: tuple[Finding, ...] = ()

    @property
    def native(self) -> bool:
        return not self.blockers


def blockers(compiled: CompiledPolicy, body: Mapping[str, Any], kubernetes: tuple[int, int]) -> list[Finding]:
    """What Kubernetes (at this version) cannot decide as this operator does, field by field.
    Checked once per compiled generation and version: the operator asks again on every pass."""
    known = _BLOCKERS.setdefault(compiled, {})
    if kubernetes not in known:
        known[kubernetes] = tuple(_blockers(compiled, body, kubernetes))
    return list(known[kubernetes])


# The CEL compiles behind a verdict cost milliseconds per expression; a generation is immutable.
_BLOCKERS: weakref.WeakKeyDictionary[CompiledPolicy, dict[tuple[int, int], tuple[Finding, ...]]] = \
    weakref.WeakKeyDictionary()


def _blockers(compiled: CompiledPolicy, body: Mapping[str, Any], kubernetes: tuple[int, int]) -> list[Finding]:
    policy = compiled.policy
    found = [*portability(compiled, body).blockers, *_newer_libraries(compiled, kubernetes)]
    if kubernetes < OPTIONAL_TYPES:
        for expression in policy.expressions():
            if _optional(expression.source):
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
    found = blockers(compiled, body, target.kubernetes)
    if found:
        return Plan(blockers=tuple(found))
    objects: list[dict[str, Any]] = []
    for part in (compiled, *compiled.derived):
        try:
            policy_object = _policy_object(part, target, handed_back)
        except _NotNative as error:
            return Plan(blockers=(dataclasses.replace(error.finding, message=f"{error.finding.message} "
                                                      "(spec.podControllers: [] judges Pods alone)"),))
        if policy_object is None:
            continue
        objects += [policy_object, _binding(part, target, policy_object["metadata"])]
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


def _policy_object(part: CompiledPolicy, target: Target, handed_back: Collection[str]) -> dict[str, Any] | None:
    policy = part.policy
    scope = "Namespaced" if policy.namespace else "*"
    rules = admission_rules(atoms(routes(part, derived=False), target.served), scope)
    if not rules:
        return None
    conditions = [] if target.break_glass is None else [dict(target.break_glass)]
    if any((rule["apiGroups"][0], plural(resource)) == CRDS for rule in rules for resource in rule["resources"]):
        conditions.append(dict(NOT_OWN_CRD))
    lower = target.kubernetes < OPTIONAL_TYPES
    conditions += [{"name": c.name, "expression": _source(c.expression.source, part.template, c.expression.path,
                                                          lower)} for c in policy.match.conditions]
    spec: dict[str, Any] = {
        "failurePolicy": policy.failure_policy,
        "matchConstraints": {
            "resourceRules": rules,
            "namespaceSelector": _namespace_selector(policy, target, handed_back),
            "objectSelector": _selector(policy.match.object_selector),
            "matchPolicy": "Equivalent",
        },
        "validations": [_validation(v, part.template, lower) for v in policy.validations],
    }
    if conditions:
        spec["matchConditions"] = conditions
    if policy.variables:
        spec["variables"] = [{"name": v.name, "expression": _source(v.expression.source, part.template,
                                                                    v.expression.path, lower)}
                             for v in policy.variables]
    if policy.param_kind is not None:
        spec["paramKind"] = {"apiVersion": policy.param_kind.api_version, "kind": policy.param_kind.kind}
    return {
        "apiVersion": f"{GROUP}/{target.version}",
        "kind": POLICY,
        "metadata": {"name": object_name(policy, part.template), "labels": owner_labels(policy),
                     "annotations": {GENERATION_ANNOTATION: str(policy.generation), POLICY_ANNOTATION: policy.name},
                     "finalizers": [FINALIZER]},
        "spec": spec,
    }


def _binding(part: CompiledPolicy, target: Target, metadata: Mapping[str, Any]) -> dict[str, Any]:
    policy = part.policy
    spec: dict[str, Any] = {"policyName": metadata["name"], "validationActions": [ACTIONS[policy.enforcement]]}
    ref = policy.param_ref
    if ref is not None:
        param_ref: dict[str, Any] = {"parameterNotFoundAction": ref.not_found_action}
        if ref.name is not None:
            param_ref["name"] = ref.name
        if ref.selector is not None:
            param_ref["selector"] = _selector(ref.selector)
        if ref.namespace is not None:
            param_ref["namespace"] = ref.namespace
        spec["paramRef"] = param_ref
    return {"apiVersion": f"{GROUP}/{target.version}", "kind": BINDING,
            "metadata": {"name": metadata["name"], "labels": dict(metadata["labels"]),
                         "annotations": dict(metadata["annotations"]), "finalizers": [FINALIZER]},
            "spec": spec}


def _validation(validation: api.Validation, template: Location, lower: bool) -> dict[str, Any]:
    assert validation.expression is not None   # a plugin validation is a blocker
    out: dict[str, Any] = {"expression": _source(validation.expression.source, template, validation.expression.path,
                                                 lower), "reason": validation.reason}
    if validation.message is not None:
        out["message"] = validation.message
    if validation.message_expression is not None:
        out["messageExpression"] = _source(validation.message_expression.source, template,
                                           validation.message_expression.path, lower)
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


# ---- Pod templates ----------------------------------------------------------------------------


class _NotNative(Exception):
    """Raised while building: this part of the policy does not port (``finding`` says why)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(str(finding))
        self.finding = finding


@functools.lru_cache(maxsize=4096)
def _source(source: str, template: Location, path: str, lower: bool = False) -> str:
    """The expression as written (``lower``: without optional syntax, for Kubernetes before 1.29;
    ``blockers`` has said that it can be), or, for a workload's Pod template, reading the template
    where it read the Pod: ``object.spec`` and ``object.metadata.labels`` become the template's,
    while ``object.metadata.name`` (and ``namespace``, ``generateName``) stay the workload's, as in
    ``podcontrollers.pod_view``. Typed, as Kubernetes checks it; what reads the Pod otherwise (as
    a whole, its ``kind``) does not port."""
    if lower and _optional(source):
        source = lower_optionals(source)
    if not template:
        return source
    text = compat.respell(source)
    checked = celast.Checked.decode(check(kubernetes_cel().environment(), text).serialize())
    parents = {child.id: node for node in celast.walk(checked.root) for child in node.children()}
    nodes = {node.id: node for node in celast.walk(checked.root)}
    positions = checked.positions
    edits = set()
    for node_id, name in checked.names.items():
        node = nodes.get(node_id)
        if name not in ("object", "oldObject") or node is None or node.kind != "ident" or node_id not in positions:
            continue
        if _reads_template(node, parents, name, path):
            edits.add((positions[node_id], name))
    path_text = "".join(f".{key}" for key in template)
    for position, name in sorted(edits, reverse=True):   # from the end: earlier offsets stay valid
        if text[position:position + len(name)] != name:
            raise _NotNative(Finding(path, "cannot be rewritten for Pod templates"))
        text = text[:position] + name + path_text + text[position + len(name):]
    return text


def _reads_template(node: celast.Expr, parents: Mapping[int, celast.Expr], name: str, path: str) -> bool:
    """Whether this read of ``object``/``oldObject`` goes to the template (else it stays)."""
    parent = parents.get(node.id)
    first = _field(parent, node)
    if first == "spec":
        return True
    if first == "metadata" and parent is not None:
        second = _field(parents.get(parent.id), parent)
        if second in ("name", "namespace", "generateName"):
            return False
        if second is not None:
            return True
    if first is None and parent is not None and parent.kind == "call" and parent.name in ("_==_", "_!=_") \
            and any(arg.kind == "const" and arg.constant() is None and arg is not node for arg in parent.args):
        return False   # null or not: the same for the workload and the Pod it stands for
    what = f"{name}.{first}" if first else name
    raise _NotNative(Finding(path, f"reads {what}, which a Pod template does not stand for natively"))


def _field(parent: celast.Expr | None, child: celast.Expr) -> str | None:
    """The field ``parent`` reads of ``child`` (``child.f``, ``has(child.f)``, ``child.?f``, ``child['f']``)."""
    found = selected(parent) if parent is not None else None
    return found[1] if found is not None and found[0] is child else None


# ---- versions ---------------------------------------------------------------------------------


def _newer_libraries(compiled: CompiledPolicy, kubernetes: tuple[int, int]) -> list[Finding]:
    """Each expression that calls a library this cluster's Kubernetes does not have yet (a 1.28
    API server has no IP or CIDR functions, a 1.32 one no semver)."""
    environment = kubernetes_cel()
    newer = [library for library in environment.libraries if library.functions and _version(library.since) > kubernetes]
    return [Finding(expression.path, f"needs Kubernetes {library.since} or later (library {library.name}); "
                                     f"this cluster is {kubernetes[0]}.{kubernetes[1]}")
            for expression in compiled.policy.expressions()
            # One that does not compile at all is portability's blocker, not every library's.
            if newer and environment.compile_error(expression.source) is None
            for library in newer if environment.compile_error(expression.source, library.name) is not None]


def _version(text: str) -> tuple[int, int]:
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def _optional(source: str) -> bool:
    """Whether the expression uses optional types (they always begin with one of these)."""
    try:
        root = celast.Checked.decode(check(kubernetes_cel().environment(), compat.respell(source)).serialize()).root
    except RuntimeError:
        return False   # not Kubernetes' CEL at all: portability's blocker already says so
    return any((node.kind == "call" and node.name in _OPTIONAL_CALLS) or any(e.optional for e in node.entries)
               or (node.kind == "list" and bool(node.raw)) for node in celast.walk(root))


def _names_crds(rule: api.ResourceRule) -> bool:
    return any(group in ("*", CRDS[0]) for group in rule.api_groups) and any(
        plural(resource) in ("*", CRDS[1]) for resource in rule.resources)
