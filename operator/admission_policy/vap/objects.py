"""Reading ValidatingAdmissionPolicies and their bindings (admissionregistration.k8s.io v1,
v1beta1 and v1alpha1) into typed values, with the API server's defaults.

Reading is strict: a field not known here is an error, as ``kubectl apply`` (strict field
validation) would make it, and as a field whose meaning a conversion would silently lose. What
the API server would refuse is refused too, where the conversion depends on it (a binding with
both Deny and Warn, a paramRef without parameterNotFoundAction); the CEL is checked later, by
compiling the converted policy.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..api import split_resource
from ..cluster.client import resource_path
from ..errors import AdmissionPolicyError
from .rules import ANY, OPERATIONS, SCOPES, Rule
from .selectors import OPERATORS, Requirement, Selector

GROUP: Final = "admissionregistration.k8s.io"
VERSIONS: Final = ("v1", "v1beta1", "v1alpha1")
POLICY: Final = "ValidatingAdmissionPolicy"
BINDING: Final = "ValidatingAdmissionPolicyBinding"
MUTATING_POLICY: Final = "MutatingAdmissionPolicy"
MUTATING_BINDING: Final = "MutatingAdmissionPolicyBinding"
# Served as v1alpha1 from Kubernetes 1.32 (behind its feature gate), v1beta1 from 1.34, then v1.
MUTATING_VERSIONS: Final = ("v1", "v1beta1", "v1alpha1")
PLURALS: Final[Mapping[str, str]] = {
    POLICY: "validatingadmissionpolicies", BINDING: "validatingadmissionpolicybindings",
    MUTATING_POLICY: "mutatingadmissionpolicies", MUTATING_BINDING: "mutatingadmissionpolicybindings"}


def api_path(version: str, kind: str, name: str = "") -> str:
    """The API path of the objects of ``kind`` (one of ``PLURALS``), or of one of them."""
    return resource_path(GROUP, version, PLURALS[kind], name=name)
ACTIONS: Final = ("Deny", "Warn", "Audit")
REASONS: Final = ("Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge")

_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "object": frozenset({"apiVersion", "kind", "metadata", "spec", "status"}),
    "policy": frozenset({"paramKind", "matchConstraints", "validations", "failurePolicy", "auditAnnotations",
                         "matchConditions", "variables"}),
    "binding": frozenset({"policyName", "paramRef", "matchResources", "validationActions"}),
    "paramKind": frozenset({"apiVersion", "kind"}),
    "paramRef": frozenset({"name", "namespace", "selector", "parameterNotFoundAction"}),
    "match": frozenset({"namespaceSelector", "objectSelector", "resourceRules", "excludeResourceRules",
                        "matchPolicy"}),
    "rule": frozenset({"resourceNames", "operations", "apiGroups", "apiVersions", "resources", "scope"}),
    "selector": frozenset({"matchLabels", "matchExpressions"}),
    "requirement": frozenset({"key", "operator", "values"}),
    "validation": frozenset({"expression", "message", "reason", "messageExpression"}),
    "auditAnnotation": frozenset({"key", "valueExpression"}),
    "named": frozenset({"name", "expression"}),
}


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where an object was read, for messages: ``file#2: ValidatingAdmissionPolicy 'p'``."""
    source: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.source}: {self.kind}" + (f" {self.name!r}" if self.name else "")


class VapObjectError(AdmissionPolicyError):
    """An object that cannot be read, naming the field: ``convert`` reports it as a problem."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


@dataclasses.dataclass(frozen=True)
class MatchResources:
    """What a policy's matchConstraints or a binding's matchResources select."""
    rules: tuple[Rule, ...] | None          # None: every request (a binding without resourceRules)
    excludes: tuple[Rule, ...] = ()
    exact: bool = False                     # matchPolicy Exact
    namespace_selector: Selector = dataclasses.field(default_factory=Selector)
    object_selector: Selector = dataclasses.field(default_factory=Selector)


@dataclasses.dataclass(frozen=True)
class Validation:
    """A ValidatingAdmissionPolicy's validation, with the API server's default reason filled in."""
    expression: str
    message: str | None
    message_expression: str | None
    reason: str


@dataclasses.dataclass(frozen=True)
class Policy:
    """A ValidatingAdmissionPolicy as read, at any version; alone it judges nothing: each
    binding makes one AdmissionPolicy of it."""
    origin: Origin
    failure_policy: str
    param_kind: tuple[str, str] | None      # (apiVersion, kind)
    match: MatchResources
    conditions: tuple[tuple[str, str], ...]    # (name, expression)
    variables: tuple[tuple[str, str], ...]
    validations: tuple[Validation, ...]
    audit_annotations: tuple[str, ...]      # their keys


@dataclasses.dataclass(frozen=True)
class ParamRef:
    """A binding's paramRef, checked as the API server does (exactly one of name and selector)."""
    name: str | None
    namespace: str | None
    selector: Selector | None
    not_found_action: str


@dataclasses.dataclass(frozen=True)
class Binding:
    """A ValidatingAdmissionPolicyBinding as read: which policy, with which params, where
    (``match`` narrows the policy's), and what a failure does (``actions``)."""
    origin: Origin
    policy_name: str
    param_ref: ParamRef | None
    match: MatchResources | None
    actions: tuple[str, ...]


def version_of(body: Mapping[str, Any]) -> str | None:
    """The version of an admissionregistration object, or None for another group's."""
    group, _, version = str(body.get("apiVersion", "")).rpartition("/")
    return version if group == GROUP else None


def origin_of(source: str, body: Mapping[str, Any]) -> Origin:
    """Where an object came from, for messages; never fails, however malformed the object."""
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return Origin(source, str(body.get("kind", "")), name if isinstance(name, str) else "")


def read_policy(source: str, body: Mapping[str, Any]) -> Policy:
    """A ValidatingAdmissionPolicy (any of VERSIONS: their specs have the same fields)."""
    origin = _checked_origin(source, body)
    spec = _fields(body.get("spec"), "spec", "policy")
    param_kind = None
    if spec.get("paramKind") is not None:
        raw = _fields(spec["paramKind"], "spec.paramKind", "paramKind")
        param_kind = (_text(raw.get("apiVersion"), "spec.paramKind.apiVersion", required=True),
                      _text(raw.get("kind"), "spec.paramKind.kind", required=True))
    if spec.get("matchConstraints") is None:
        raise VapObjectError("spec.matchConstraints", "is required")
    match = _match(spec["matchConstraints"], "spec.matchConstraints")
    if not match.rules:
        raise VapObjectError("spec.matchConstraints.resourceRules", "is required (at least one rule)")
    validations = tuple(_validation(item, f"spec.validations[{i}]")
                        for i, item in enumerate(_list(spec.get("validations"), "spec.validations")))
    annotations = _annotation_keys(spec.get("auditAnnotations"), "spec.auditAnnotations")
    if not validations and not annotations:
        raise VapObjectError("spec.validations", "validations or auditAnnotations must contain at least one item")
    return Policy(
        origin=origin,
        failure_policy=_choice(spec.get("failurePolicy"), "spec.failurePolicy", ("Fail", "Ignore"), "Fail"),
        param_kind=param_kind,
        match=match,
        conditions=_named(spec.get("matchConditions"), "spec.matchConditions"),
        variables=_named(spec.get("variables"), "spec.variables"),
        validations=validations,
        audit_annotations=annotations,
    )


def read_binding(source: str, body: Mapping[str, Any], version: str) -> Binding:
    """A ValidatingAdmissionPolicyBinding; ``version`` decides the default of parameterNotFoundAction."""
    origin = _checked_origin(source, body)
    spec = _fields(body.get("spec"), "spec", "binding")
    actions = tuple(_choice(action, f"spec.validationActions[{i}]", ACTIONS, None)
                    for i, action in enumerate(_list(spec.get("validationActions"), "spec.validationActions")))
    if not actions:
        raise VapObjectError("spec.validationActions", "is required: at least one of Deny, Warn, Audit")
    if len(set(actions)) < len(actions):
        raise VapObjectError("spec.validationActions", f"{list(actions)} names an action twice")
    if {"Deny", "Warn"} <= set(actions):
        raise VapObjectError("spec.validationActions",
                             "must not contain both Deny and Warn (the API server refuses it)")
    match = None
    if spec.get("matchResources") is not None:
        match = _match(spec["matchResources"], "spec.matchResources")
    return Binding(origin, _text(spec.get("policyName"), "spec.policyName", required=True),
                   _param_ref(spec.get("paramRef"), version), match, actions)


def _checked_origin(source: str, body: Mapping[str, Any]) -> Origin:
    _fields(body, "", "object")
    origin = origin_of(source, body)
    if not origin.name:
        raise VapObjectError("metadata.name", "is required")
    return origin


def _param_ref(value: Any, version: str) -> ParamRef | None:
    if value is None:
        return None
    path = "spec.paramRef"
    raw = _fields(value, path, "paramRef")
    name = _text(raw.get("name"), f"{path}.name") or None
    selector = None if raw.get("selector") is None else _selector(raw["selector"], f"{path}.selector")
    if (name is None) == (selector is None):
        raise VapObjectError(path, "needs exactly one of name or selector")
    # v1alpha1 defaults it to Deny; v1beta1 and v1 require it.
    default = "Deny" if version == "v1alpha1" else None
    action = _choice(raw.get("parameterNotFoundAction"), f"{path}.parameterNotFoundAction", ("Allow", "Deny"),
                     default)
    return ParamRef(name, _text(raw.get("namespace"), f"{path}.namespace") or None, selector, action)


def _match(value: Any, path: str) -> MatchResources:
    raw = _fields(value, path, "match")
    rules = tuple(_rule(item, f"{path}.resourceRules[{i}]")
                  for i, item in enumerate(_list(raw.get("resourceRules"), f"{path}.resourceRules")))
    excludes = tuple(_rule(item, f"{path}.excludeResourceRules[{i}]")
                     for i, item in enumerate(_list(raw.get("excludeResourceRules"), f"{path}.excludeResourceRules")))
    policy = _choice(raw.get("matchPolicy"), f"{path}.matchPolicy", ("Exact", "Equivalent"), "Equivalent")
    return MatchResources(rules or None, excludes, policy == "Exact",
                          _selector(raw.get("namespaceSelector"), f"{path}.namespaceSelector"),
                          _selector(raw.get("objectSelector"), f"{path}.objectSelector"))


def _rule(value: Any, path: str) -> Rule:
    raw = _fields(value, path, "rule")
    lists = {key: _texts(raw.get(key), f"{path}.{key}", required=True)
             for key in ("apiGroups", "apiVersions", "resources", "operations")}
    for i, operation in enumerate(lists["operations"]):
        _choice(operation, f"{path}.operations[{i}]", OPERATIONS, None)
    return Rule(lists["apiGroups"], lists["apiVersions"], tuple(split_resource(r) for r in lists["resources"]),
                lists["operations"], _choice(raw.get("scope"), f"{path}.scope", SCOPES, ANY),
                _texts(raw.get("resourceNames"), f"{path}.resourceNames"))


def _selector(value: Any, path: str) -> Selector:
    if value is None:
        return Selector()
    raw = _fields(value, path, "selector")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise VapObjectError(f"{path}.matchLabels", "must be a map of label keys to values")
    pairs = tuple((_string(key, f"{path}.matchLabels"), _string(text, f"{path}.matchLabels.{key}"))
                  for key, text in labels.items())
    requirements = []
    for i, item in enumerate(_list(raw.get("matchExpressions"), f"{path}.matchExpressions")):
        where = f"{path}.matchExpressions[{i}]"
        requirement = _fields(item, where, "requirement")
        operator = _choice(requirement.get("operator"), f"{where}.operator", OPERATORS, None)
        values = _texts(requirement.get("values"), f"{where}.values")
        if (operator in ("In", "NotIn")) != bool(values):
            needed = "given" if operator in ("In", "NotIn") else "empty"
            raise VapObjectError(f"{where}.values", f"must be {needed} with operator {operator}")
        requirements.append(Requirement(_text(requirement.get("key"), f"{where}.key", required=True),
                                        operator, values))
    return Selector(pairs, tuple(requirements))


def _validation(value: Any, path: str) -> Validation:
    raw = _fields(value, path, "validation")
    message = raw.get("message")
    expression = raw.get("messageExpression")
    return Validation(
        _text(raw.get("expression"), f"{path}.expression", required=True),
        None if message is None else _text(message, f"{path}.message").strip() or None,
        None if expression is None else _text(expression, f"{path}.messageExpression") or None,
        _choice(raw.get("reason"), f"{path}.reason", REASONS, "Invalid"),   # unset: 422 Invalid
    )


def _annotation_keys(value: Any, path: str) -> tuple[str, ...]:
    keys = []
    for i, item in enumerate(_list(value, path)):
        raw = _fields(item, f"{path}[{i}]", "auditAnnotation")
        keys.append(_text(raw.get("key"), f"{path}[{i}].key", required=True))
    return tuple(keys)


def _named(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    found = []
    for i, item in enumerate(_list(value, path)):
        raw = _fields(item, f"{path}[{i}]", "named")
        found.append((_text(raw.get("name"), f"{path}[{i}].name", required=True),
                      _text(raw.get("expression"), f"{path}[{i}].expression", required=True)))
    return tuple(found)


# Small typed readers; each raises VapObjectError naming the field.

def _fields(value: Any, path: str, shape: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise VapObjectError(path or "(the object)", f"must be an object, got {_type_name(value)}")
    unknown = sorted(str(key) for key in value if key not in _FIELDS[shape])
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise VapObjectError(where, f"unknown field (known here: {', '.join(sorted(_FIELDS[shape]))})")
    return value


def _list(value: Any, path: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise VapObjectError(path, f"must be a list, got {_type_name(value)}")
    return value


def _text(value: Any, path: str, *, required: bool = False) -> str:
    """A string; absent reads as "" unless ``required`` (then it must hold more than spaces)."""
    if value is None and not required:
        return ""
    text = _string(value, path)
    if required and not text.strip():
        raise VapObjectError(path, "is required")
    return text


def _texts(value: Any, path: str, *, required: bool = False) -> tuple[str, ...]:
    """A list of strings ("" is one: the core API group); ``required``: with at least one."""
    items = tuple(_string(item, f"{path}[{i}]") for i, item in enumerate(_list(value, path)))
    if required and not items:
        raise VapObjectError(path, 'is required (at least one entry; "*" for all)')
    return items


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise VapObjectError(path, f"must be a string, got {_type_name(value)}")
    return value


def _choice(value: Any, path: str, allowed: Sequence[str], default: str | None) -> str:
    if value is None and default is not None:
        return default
    if value not in allowed:
        got = "nothing (it is required)" if value is None else repr(value)
        raise VapObjectError(path, f"must be one of {', '.join(allowed)}, got {got}")
    return str(value)


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)
