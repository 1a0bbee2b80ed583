"""The AdmissionPolicy API: parse a policy object into immutable typed values.

Parsing is strict: an unknown field is an error, because a misspelt ``validaitons`` that is
silently ignored is a policy that silently allows. Every error names the field path
(``spec.validations[2].expression``) so it can be fixed from the message alone.

``ACCEPTED_FIELDS`` declares, per object in the schema, the fields the parser reads; a test
holds the CRD's structural schema to exactly these fields.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, Final, Literal, NamedTuple, TypeAlias, cast

from . import fields
from .fields import PolicyError as PolicyError  # callers know it as api.PolicyError

GROUP: Final = "policy-operator.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "AdmissionPolicy"
PLURAL: Final = "admissionpolicies"
# A tenant policy: the same spec, namespaced, judging only its own namespace's objects. Everywhere
# a policy is named (the engine, reports, metrics, logs) its name is "namespace/name".
NAMESPACED_KIND: Final = "NamespacedAdmissionPolicy"
NAMESPACED_PLURAL: Final = "namespacedadmissionpolicies"
POLICY_KINDS: Final = (KIND, NAMESPACED_KIND)

Enforcement: TypeAlias = Literal["Enforce", "Warn", "Audit"]
FailurePolicy: TypeAlias = Literal["Fail", "Ignore"]
MergeMode: TypeAlias = Literal["Overwrite", "IfAbsent"]

ENFORCEMENTS: Final = ("Enforce", "Warn", "Audit")
APPROVALS: Final = ("None", "Required")
REINVOCATION_POLICIES: Final = ("Never", "IfNeeded")
ReinvocationPolicy = Literal["Never", "IfNeeded"]
FAILURE_POLICIES: Final = ("Fail", "Ignore")
MERGE_MODES: Final = ("Overwrite", "IfAbsent")
OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT", "*")
PATCH_OPS: Final = ("add", "remove", "replace", "copy", "move", "test")
SELECTOR_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")
# The workloads whose Pod templates a Pod policy also judges (engine/podcontrollers.py).
PARAMETER_NOT_FOUND_ACTIONS: Final = ("Allow", "Deny")
CONTEXT_SCOPES: Final = ("All", "RequestNamespace")
# Objects one context may hold: its declared maxObjects, by default DEFAULT_MAX_OBJECTS. CEL runs at
# most 10,000 loop steps per evaluation (estimation.ITERATION_LIMIT), so a longer list could not be
# read whole; the cap also bounds the compile-time cost estimate (see ``cel.estimation``).
DEFAULT_MAX_OBJECTS: Final = 1_000
MAX_OBJECTS_LIMIT: Final = 10_000
POD_CONTROLLERS: Final = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob",
                          "ReplicationController")

# Validation reasons and the HTTP codes the API server reports for them.
REASON_CODES: Final[Mapping[str, int]] = {
    "Forbidden": 403,
    "Invalid": 422,
    "Unauthorized": 401,
    "RequestEntityTooLarge": 413,
}

# The fields each object may carry, by schema path ("[]" marks list items).
ACCEPTED_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "": frozenset({"apiVersion", "kind", "metadata", "spec", "status"}),
    "spec": frozenset({
        "description", "enforcement", "failurePolicy", "match", "podControllers", "paramKind", "paramRef",
        "context", "variables", "validations", "mutations", "reportAdmission", "exceptions", "reinvocationPolicy",
        "native", "typeChecking",
    }),
    "spec.exceptions": frozenset({"allowed", "maxDuration", "approval"}),
    "spec.paramKind": frozenset({"apiVersion", "kind"}),
    "spec.paramRef": frozenset({"name", "namespace", "selector", "parameterNotFoundAction"}),
    "spec.paramRef.selector": frozenset({"matchLabels", "matchExpressions"}),
    "spec.paramRef.selector.matchExpressions[]": frozenset({"key", "operator", "values"}),
    "spec.context[]": frozenset({"name", "group", "version", "resource", "scope", "labelSelector", "maxObjects"}),
    "spec.context[].labelSelector": frozenset({"matchLabels", "matchExpressions"}),
    "spec.context[].labelSelector.matchExpressions[]": frozenset({"key", "operator", "values"}),
    "spec.match": frozenset({
        "resources", "namespaceSelector", "objectSelector", "excludeNamespaces", "conditions",
    }),
    "spec.match.resources[]": frozenset({"apiGroups", "apiVersions", "resources", "operations"}),
    "spec.match.namespaceSelector": frozenset({"matchLabels", "matchExpressions"}),
    "spec.match.namespaceSelector.matchExpressions[]": frozenset({"key", "operator", "values"}),
    "spec.match.objectSelector": frozenset({"matchLabels", "matchExpressions"}),
    "spec.match.objectSelector.matchExpressions[]": frozenset({"key", "operator", "values"}),
    "spec.match.conditions[]": frozenset({"name", "expression"}),
    "spec.variables[]": frozenset({"name", "expression"}),
    "spec.validations[]": frozenset({"name", "expression", "plugin", "message", "messageExpression", "reason"}),
    "spec.validations[].plugin": frozenset({"name", "config"}),
    "spec.mutations[]": frozenset({"name", "condition", "jsonPatch", "merge", "mergeMode", "plugin"}),
    "spec.mutations[].plugin": frozenset({"name", "config"}),
    "spec.mutations[].jsonPatch[]": frozenset({"op", "path", "from", "value", "valueExpression"}),
    "status": frozenset({"phase", "observedGeneration", "conditions", "podControllers", "audit", "native",
                         "typeChecking"}),
    "status.typeChecking": frozenset({"expressionWarnings"}),
    "status.typeChecking.expressionWarnings[]": frozenset({"fieldRef", "warning"}),
    "status.native": frozenset({"enforcedBy", "reason", "message", "generation", "handedBack", "objects",
                                "typeChecking"}),
    "status.native.objects[]": frozenset({"apiVersion", "kind", "name"}),
    "status.native.typeChecking[]": frozenset({"object", "fieldRef", "warning"}),
    "status.audit": frozenset({
        "lastScanTime", "scannedGeneration", "objectsScanned", "violations", "errors", "wouldMutate",
        "scanSeconds", "message", "firstViolations",
    }),
    "status.audit.firstViolations[]": frozenset({"apiVersion", "kind", "namespace", "name", "uid", "message"}),
    "status.podControllers": frozenset({"kinds", "notApplied", "reason"}),
    "status.podControllers.notApplied[]": frozenset({"path", "reason"}),
    "status.conditions[]": frozenset({
        "type", "status", "reason", "message", "lastTransitionTime", "observedGeneration",
    }),
}


@dataclasses.dataclass(frozen=True)
class Expression:
    """A CEL source with the field path it came from, for error messages."""
    source: str
    path: str


@dataclasses.dataclass(frozen=True)
class NamedExpression:
    """A variable or match condition: its ``name`` is how CEL (``variables.<name>``) and
    messages refer to it, unique within its list."""
    name: str
    expression: Expression


@dataclasses.dataclass(frozen=True)
class ResourceRule:
    """Which requests a policy is about, as a webhook rule says it (``*`` for any); the operator
    registers these in its webhook configurations, so they decide what the API server sends."""
    api_groups: tuple[str, ...]
    api_versions: tuple[str, ...]
    resources: tuple[str, ...]
    operations: tuple[str, ...]

    def covers(self, group: str, version: str, resource: str, subresource: str, operation: str) -> bool:
        """Whether a request for ``resource`` (``subresource``: "" for the main resource) is one this
        rule names: "pods" the main resource only, "pods/*" its subresources only, "*" every main
        resource, "*/status" every status subresource. (Kubernetes' own matcher also takes "pods"
        itself for "pods/*"; ``vap.rules`` says so where it writes rules for the API server.)

        The one reading of a rule: the engine's index (``engine.policyset``, by ``split_resource``)
        and the exceptions (``engine.exceptions``) come to the same answer."""
        return (_names(group, self.api_groups) and _names(version, self.api_versions)
                and _names(operation, self.operations)
                and any(_names(resource, (main,)) and (_names(subresource, (sub,)) if subresource else not sub)
                        for main, sub in map(split_resource, self.resources)))


def split_resource(entry: str) -> tuple[str, str]:
    """A rule's resource entry as (resource, subresource): "pods/status" → ("pods", "status"),
    "pods" → ("pods", ""), "*/*" → ("*", "*")."""
    resource, _, subresource = entry.partition("/")
    return resource, subresource


def _names(value: str, written: tuple[str, ...]) -> bool:
    return "*" in written or value in written


@dataclasses.dataclass(frozen=True)
class LabelRequirement:
    """One ``matchExpressions`` item; ``values`` is empty for Exists and DoesNotExist."""
    key: str
    operator: str
    values: frozenset[str]


@dataclasses.dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes LabelSelector; the empty selector matches everything."""
    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelRequirement, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, Any]) -> bool:
        """Labels are strings; any other value (an object may carry anything) matches no value."""
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        for req in self.match_expressions:
            present = req.key in labels
            label = labels.get(req.key)
            listed = isinstance(label, str) and label in req.values
            if req.operator == "In" and not (present and listed):
                return False
            if req.operator == "NotIn" and present and listed:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


@dataclasses.dataclass(frozen=True)
class Match:
    """Whether a request concerns a policy at all. Rules and selectors are checked without CEL,
    before anything is evaluated; ``conditions`` (all must be true) are CEL, and an error in one
    is the policy's error, which ``failurePolicy`` answers."""
    resources: tuple[ResourceRule, ...]
    namespace_selector: LabelSelector = LabelSelector()
    object_selector: LabelSelector = LabelSelector()
    exclude_namespaces: frozenset[str] = frozenset()
    conditions: tuple[NamedExpression, ...] = ()


@dataclasses.dataclass(frozen=True)
class PluginRef:
    """A Python plugin used as a validation or mutation (``admission_policy.plugins``); its config
    is checked against the plugin's schema when the policy is compiled."""
    name: str
    config: Any   # a JSON object
    path: str     # "spec.validations[1].plugin"


@dataclasses.dataclass(frozen=True)
class Validation:
    """One check: a CEL expression that must be true, or a validator plugin. A failure denies
    (Enforce) with ``reason``'s HTTP code, warns or is audited, as the policy's enforcement says."""
    expression: Expression | None    # exactly one of expression and plugin
    message: str | None
    message_expression: Expression | None
    reason: str
    plugin: PluginRef | None = None
    # What an AdmissionPolicyException names to waive this check alone (``validation-<index>`` unless set).
    name: str = ""

    @property
    def path(self) -> str:
        return self.plugin.path if self.plugin else self.expression.path if self.expression else ""


@dataclasses.dataclass(frozen=True)
class PatchOperation:
    """One RFC 6902 operation; ``value`` is fixed JSON, ``value_expression`` computes it."""
    op: str
    path: str
    from_: str | None
    value: Any
    value_expression: Expression | None
    field_path: str

    @property
    def has_value(self) -> bool:
        return self.op in ("add", "replace", "test")


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One change, applied in order after the previous ones when its ``condition`` holds: a JSON
    patch, a merge patch (``IfAbsent``: only fields the object lacks) or a mutator plugin."""
    name: str
    condition: Expression | None
    json_patch: tuple[PatchOperation, ...] | None
    merge: Any  # a JSON object (RFC 7386 merge patch), or None with json_patch
    merge_mode: MergeMode
    path: str
    plugin: PluginRef | None = None


@dataclasses.dataclass(frozen=True)
class ParamKind:
    """The kind of the objects a policy reads as ``params`` (ValidatingAdmissionPolicy's paramKind)."""
    api_version: str   # "v1", "example.com/v1"
    kind: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def __str__(self) -> str:
        return f"{self.kind}.{self.api_version}"


@dataclasses.dataclass(frozen=True)
class ParamRef:
    """Which objects of ``paramKind`` a request is judged with: one by ``name`` or all matching
    ``selector``, in ``namespace`` (unset: the request's own, for a namespaced kind). One
    evaluation per object found; none found: ``Allow`` skips the policy, ``Deny`` is an error that
    ``failurePolicy`` answers."""
    name: str | None
    selector: LabelSelector | None
    namespace: str | None
    not_found_action: Literal["Allow", "Deny"] = "Deny"


@dataclasses.dataclass(frozen=True)
class ContextSource:
    """What a context entry watches; entries of every policy with equal sources share one cache."""
    group: str
    version: str
    resource: str
    label_selector: LabelSelector = LabelSelector()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        where = f"{self.resource}.{self.group}/{self.version}" if self.group else f"{self.resource}/{self.version}"
        return where + (f" ({selector_text(self.label_selector)})" if not self.label_selector.is_empty else "")


@dataclasses.dataclass(frozen=True)
class ContextEntry:
    """``context.<name>`` in CEL: the listed objects of ``source``, in the request's namespace
    (``scope: RequestNamespace``) or everywhere (``All``), at most ``max_objects`` of them."""
    name: str
    source: ContextSource
    scope: Literal["All", "RequestNamespace"]
    max_objects: int
    path: str   # "spec.context[0]"


@dataclasses.dataclass(frozen=True)
class ExceptionRules:
    """``spec.exceptions``: whether AdmissionPolicyExceptions may waive this policy's rules, how far
    ahead one may end (``max_duration`` seconds from its creation; None: no cap), and whether one
    applies only once approved (``policyexception``, docs/exceptions.md)."""
    allowed: bool = True
    max_duration: int | None = None
    approval: Literal["None", "Required"] = "Required"


@dataclasses.dataclass(frozen=True)
class AdmissionPolicy:
    """A policy as parsed: immutable and already checked field by field, so the compiler and the
    engine never meet a malformed spec. Its CEL is not compiled yet (``engine.compile_policy``)."""
    name: str   # str(self.key): how the engine, reports and metrics name it ("namespace/name": a tenant's)
    generation: int
    description: str
    enforcement: Enforcement
    failure_policy: FailurePolicy
    match: Match
    variables: tuple[NamedExpression, ...]
    validations: tuple[Validation, ...]
    mutations: tuple[Mutation, ...]
    # For a policy matching pods: the workload kinds whose Pod templates it also judges.
    # None (unset): all of POD_CONTROLLERS; () opts out.
    pod_controllers: tuple[str, ...] | None = None
    # Inputs from the cluster (the operator's watch-backed caches; files, offline).
    param_kind: ParamKind | None = None
    param_ref: ParamRef | None = None
    context: tuple[ContextEntry, ...] = ()
    # Audit/Warn failures at admission also go to the audit reports (operator/audit.py).
    report_admission: bool = False
    # Auto: Kubernetes enforces the policy itself when it can (vap/native.py); Never: the webhook
    # always does; None: the cluster's default (AP_NATIVE_DEFAULT).
    native: Literal["Auto", "Never"] | None = None
    # Deny: `kubectl apply` refuses the policy while an expression does not type-check against the
    # schemas of the kinds it matches (engine/typecheck.py); Warn: a warning and status only.
    type_checking: Literal["Warn", "Deny"] = "Warn"
    exceptions: ExceptionRules = ExceptionRules()
    # IfNeeded: its mutations run again when a later policy changed the object, as the API server
    # reinvokes a webhook or a MutatingAdmissionPolicy with this field (their default: Never).
    reinvocation_policy: ReinvocationPolicy = "Never"
    # A NamespacedAdmissionPolicy's namespace; None: cluster-wide.
    namespace: str | None = None

    @property
    def key(self) -> PolicyKey:
        return PolicyKey.policy(self.namespace, self.object_name)

    @property
    def kind(self) -> str:
        return self.key.kind

    @property
    def object_name(self) -> str:
        """``metadata.name``: the name without the namespace."""
        return PolicyKey.parse(self.name).name

    def rule_names(self) -> tuple[str, ...]:
        """The validations' and mutations' names: what an exception may name to waive."""
        return tuple(v.name for v in self.validations) + tuple(m.name for m in self.mutations)

    def expressions(self) -> list[Expression]:
        """Every CEL expression of the policy, in field order."""
        found = [c.expression for c in self.match.conditions]
        found += [v.expression for v in self.variables]
        for validation in self.validations:
            if validation.expression is not None:
                found.append(validation.expression)
            if validation.message_expression is not None:
                found.append(validation.message_expression)
        for mutation in self.mutations:
            if mutation.condition is not None:
                found.append(mutation.condition)
            for op in mutation.json_patch or ():
                if op.value_expression is not None:
                    found.append(op.value_expression)
        return found


def parse_policy(obj: Any, *, default_failure_policy: FailurePolicy = "Fail") -> AdmissionPolicy:
    """Turn an AdmissionPolicy object (as stored in the cluster or a file) into typed values."""
    try:
        return _parse_policy(obj, default_failure_policy)
    except RecursionError:   # a merge patch or value copied (recursively) from a very deep object
        raise PolicyError("spec", "nests too deeply to read (more than about 900 levels)") from None


def _parse_policy(obj: Any, default_failure_policy: FailurePolicy) -> AdmissionPolicy:
    root = fields.mapping(obj, "")
    fields.check_fields(root, "", "", ACCEPTED_FIELDS)
    namespace = None
    if root.get("kind") == NAMESPACED_KIND:
        metadata, name, generation = object_header(root, NAMESPACED_KIND)
        namespace = fields.required_string(metadata.get("namespace"), "metadata.namespace")
    else:
        _, name, generation = object_header(root, KIND)

    spec = fields.mapping(root.get("spec"), "spec")
    fields.check_fields(spec, "spec", "spec", ACCEPTED_FIELDS)
    description = fields.string(spec.get("description", ""), "spec.description")
    enforcement = fields.enum(spec.get("enforcement", "Enforce"), "spec.enforcement", ENFORCEMENTS)
    failure_policy = fields.enum(spec.get("failurePolicy", default_failure_policy), "spec.failurePolicy",
                           FAILURE_POLICIES)
    if "match" not in spec:
        raise PolicyError("spec.match", "is required")
    match = _parse_match(spec["match"])
    variables = tuple(
        parse_named(item, f"spec.variables[{i}]", "spec.variables[]")
        for i, item in enumerate(fields.array(spec.get("variables", []), "spec.variables"))
    )
    fields.check_unique([v.name for v in variables], "spec.variables", "variable")
    validations = tuple(
        _parse_validation(item, f"spec.validations[{i}]", i)
        for i, item in enumerate(fields.array(spec.get("validations", []), "spec.validations"))
    )
    fields.check_unique([v.name for v in validations], "spec.validations", "validation")
    mutations = tuple(
        _parse_mutation(item, f"spec.mutations[{i}]", i)
        for i, item in enumerate(fields.array(spec.get("mutations", []), "spec.mutations"))
    )
    if not validations and not mutations:
        raise PolicyError("spec", "needs at least one validation or mutation")
    pod_controllers = None
    if spec.get("podControllers") is not None:
        pod_controllers = tuple(fields.strings(spec["podControllers"], "spec.podControllers"))
        for i, kind in enumerate(pod_controllers):
            fields.enum(kind, f"spec.podControllers[{i}]", POD_CONTROLLERS)
        fields.check_unique(pod_controllers, "spec.podControllers", "kind", named=False)
    param_kind, param_ref = _parse_params(spec)
    context = tuple(_parse_context(item, f"spec.context[{i}]", "All" if namespace is None else "RequestNamespace")
                    for i, item in enumerate(fields.array(spec.get("context", []), "spec.context")))
    fields.check_unique([c.name for c in context], "spec.context", "context")
    if namespace is not None:
        _check_tenant(namespace, match, param_ref, context)
    return AdmissionPolicy(
        param_kind=param_kind,
        param_ref=param_ref,
        context=context,
        namespace=namespace,
        name=str(PolicyKey.policy(namespace, name)),
        generation=generation,
        description=description,
        enforcement=cast(Enforcement, enforcement),
        failure_policy=cast(FailurePolicy, failure_policy),
        match=match,
        variables=variables,
        validations=validations,
        mutations=mutations,
        pod_controllers=pod_controllers,
        report_admission=fields.boolean(spec.get("reportAdmission", False), "spec.reportAdmission"),
        native=cast(Literal["Auto", "Never"], fields.enum(spec["native"], "spec.native", ("Auto", "Never")))
        if spec.get("native") is not None else None,
        type_checking=cast(Literal["Warn", "Deny"], fields.enum(spec.get("typeChecking", "Warn"), "spec.typeChecking",
                                                                ("Warn", "Deny"))),
        exceptions=_parse_exception_rules(spec.get("exceptions")),
        reinvocation_policy=cast(ReinvocationPolicy, fields.enum(spec.get("reinvocationPolicy", "Never"),
                                                           "spec.reinvocationPolicy", REINVOCATION_POLICIES)),
    )


def _check_tenant(namespace: str, match: Match, param_ref: ParamRef | None, context: tuple[ContextEntry, ...]) -> None:
    """What a NamespacedAdmissionPolicy may not say: it judges, and reads, its own namespace only.
    (That it names no cluster-scoped kind needs discovery: the operator checks it at apply.)"""
    own = f"a {NAMESPACED_KIND} judges objects in its own namespace ({namespace}) only"
    if not match.namespace_selector.is_empty:
        raise PolicyError("spec.match.namespaceSelector", f"is not allowed: {own}")
    if match.exclude_namespaces:
        raise PolicyError("spec.match.excludeNamespaces", f"is not allowed: {own}")
    if param_ref is not None and param_ref.namespace not in (None, namespace):
        raise PolicyError("spec.paramRef.namespace", f"must be {namespace!r} or unset: a {NAMESPACED_KIND} reads "
                                                     "params in its own namespace only")
    for entry in context:
        if entry.scope != "RequestNamespace":
            raise PolicyError(f"{entry.path}.scope", f"must be RequestNamespace (the default here): a "
                                                     f"{NAMESPACED_KIND} reads objects of its own namespace only")


class PolicyKey(NamedTuple):
    """Who one of our objects is: its kind, its namespace (None: cluster-scoped) and its name.

    ``str(key)``, "name" or "namespace/name", is the name the stores, the engine's outcomes, the
    reports, metrics, events and logs give it, as client-go keys its caches; ``parse`` reads it
    back. Only this class writes or splits that text.
    """
    kind: str
    namespace: str | None
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @classmethod
    def policy(cls, namespace: str | None, name: str) -> PolicyKey:
        """A policy's key: a namespace makes it a tenant's (NamespacedAdmissionPolicy)."""
        return cls(NAMESPACED_KIND if namespace else KIND, namespace or None, name)

    @classmethod
    def parse(cls, text: str, kind: str | None = None) -> PolicyKey:
        """The key ``str`` made; without ``kind``, a policy's."""
        namespace, _, name = text.rpartition("/")
        return cls(kind, namespace or None, name) if kind else cls.policy(namespace, name)

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> PolicyKey:
        """The key of an object read from the API; without a kind in its body, a policy's."""
        metadata = body.get("metadata") or {}
        namespace, name = metadata.get("namespace") or None, str(metadata.get("name", ""))
        kind = body.get("kind")
        return cls(str(kind), namespace, name) if kind else cls.policy(namespace, name)


def object_header(root: Mapping[str, Any], kind: str) -> tuple[Mapping[str, Any], str, int]:
    """An object of ours, of ``kind`` (apiVersion and kind may be left out in files): its metadata,
    name and generation."""
    if root.get("apiVersion") not in (None, API_VERSION):
        raise PolicyError("apiVersion", f"must be {API_VERSION!r}, got {root.get('apiVersion')!r}")
    if root.get("kind") not in (None, kind):
        raise PolicyError("kind", f"must be {kind!r}, got {root.get('kind')!r}")
    metadata = fields.mapping(root.get("metadata"), "metadata")
    name = fields.required_string(metadata.get("name"), "metadata.name")
    generation = metadata.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise PolicyError("metadata.generation", "must be an integer")
    return metadata, name, generation


def _parse_exception_rules(value: Any) -> ExceptionRules:
    if value is None:
        return ExceptionRules()
    path = "spec.exceptions"
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, path, ACCEPTED_FIELDS)
    max_duration = None
    if raw.get("maxDuration") is not None:
        max_duration = parse_duration(raw["maxDuration"], f"{path}.maxDuration")
    approval = fields.enum(raw.get("approval", "Required"), f"{path}.approval", APPROVALS)
    return ExceptionRules(fields.boolean(raw.get("allowed", True), f"{path}.allowed"), max_duration,
                          cast(Literal["None", "Required"], approval))


_DURATION_UNITS: Final[Mapping[str, int]] = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?:[0-9]+[dhms])+")


def parse_duration(value: Any, path: str) -> int:
    """Seconds of a duration as Go writes it (``720h``, ``1h30m``), and days (``90d``), which an
    exception's lifetime is usually counted in."""
    text = fields.string(value, path)
    if not _DURATION.fullmatch(text):
        raise PolicyError(path, f"{text!r} is not a duration: write it as \"90d\", \"720h\" or \"1h30m\"")
    seconds = sum(int(amount) * _DURATION_UNITS[unit] for amount, unit in re.findall(r"([0-9]+)([dhms])", text))
    if seconds <= 0:
        raise PolicyError(path, "must be longer than zero")
    return seconds


def format_duration(seconds: int) -> str:
    """``90d``, ``36h``, ``90m``: the largest unit that divides it, for messages."""
    for unit, size in _DURATION_UNITS.items():
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _parse_match(value: Any) -> Match:
    path = "spec.match"
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, path, ACCEPTED_FIELDS)
    resources_raw = fields.array(raw.get("resources"), f"{path}.resources")
    if not resources_raw:
        raise PolicyError(f"{path}.resources", "needs at least one resource rule")
    resources = tuple(parse_rule(item, f"{path}.resources[{i}]") for i, item in enumerate(resources_raw))
    conditions = tuple(
        parse_named(item, f"{path}.conditions[{i}]", f"{path}.conditions[]")
        for i, item in enumerate(fields.array(raw.get("conditions", []), f"{path}.conditions"))
    )
    fields.check_unique([c.name for c in conditions], f"{path}.conditions", "condition")
    return Match(
        resources=resources,
        namespace_selector=parse_selector(raw.get("namespaceSelector"), f"{path}.namespaceSelector"),
        object_selector=parse_selector(raw.get("objectSelector"), f"{path}.objectSelector"),
        exclude_namespaces=frozenset(fields.strings(raw.get("excludeNamespaces", []), f"{path}.excludeNamespaces")),
        conditions=conditions,
    )


def parse_rule(value: Any, path: str) -> ResourceRule:
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, "spec.match.resources[]", ACCEPTED_FIELDS)
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("apiGroups", "apiVersions", "resources", "operations"):
        items = fields.strings(raw.get(key), f"{path}.{key}")
        if not items:
            raise PolicyError(f"{path}.{key}", "needs at least one entry (use \"*\" for all)")
        lists[key] = tuple(items)
    for i, op in enumerate(lists["operations"]):
        fields.enum(op, f"{path}.operations[{i}]", OPERATIONS)
    for i, resource in enumerate(lists["resources"]):
        if not resource or resource.count("/") > 1 or resource.startswith("/") or resource.endswith("/"):
            raise PolicyError(f"{path}.resources[{i}]",
                              f"{resource!r} is not a resource: use \"pods\", \"pods/status\" or \"*\"")
    return ResourceRule(lists["apiGroups"], lists["apiVersions"], lists["resources"], lists["operations"])


def _parse_params(spec: Mapping[str, Any]) -> tuple[ParamKind | None, ParamRef | None]:
    """paramKind and paramRef: both or neither, as in a ValidatingAdmissionPolicy and its binding."""
    if spec.get("paramKind") is None and spec.get("paramRef") is None:
        return None, None
    if spec.get("paramKind") is None:
        raise PolicyError("spec.paramKind", "is required with spec.paramRef (which kind of object to read)")
    if spec.get("paramRef") is None:
        raise PolicyError("spec.paramRef", "is required with spec.paramKind (which objects of that kind to read)")
    raw = fields.mapping(spec["paramKind"], "spec.paramKind")
    fields.check_fields(raw, "spec.paramKind", "spec.paramKind", ACCEPTED_FIELDS)
    api_version = fields.string(raw.get("apiVersion"), "spec.paramKind.apiVersion")
    if not api_version or api_version.count("/") > 1 or api_version.endswith("/") or api_version.startswith("/"):
        raise PolicyError("spec.paramKind.apiVersion", f"{api_version!r} is not an apiVersion (\"v1\", \"group/v1\")")
    kind = fields.required_string(raw.get("kind"), "spec.paramKind.kind")
    ref = fields.mapping(spec["paramRef"], "spec.paramRef")
    fields.check_fields(ref, "spec.paramRef", "spec.paramRef", ACCEPTED_FIELDS)
    name = fields.string(ref["name"], "spec.paramRef.name") if ref.get("name") is not None else None
    selector = None
    if ref.get("selector") is not None:
        selector = parse_selector(ref["selector"], "spec.paramRef.selector")
    if (name is None) == (selector is None):
        raise PolicyError("spec.paramRef", "needs exactly one of name or selector")
    if name == "":
        raise PolicyError("spec.paramRef.name", "must not be empty")
    namespace = fields.string(ref["namespace"], "spec.paramRef.namespace") if ref.get("namespace") is not None else None
    action = fields.enum(ref.get("parameterNotFoundAction", "Deny"), "spec.paramRef.parameterNotFoundAction",
                   PARAMETER_NOT_FOUND_ACTIONS)
    return ParamKind(api_version, kind), ParamRef(name, selector, namespace or None,
                                                  cast(Literal["Allow", "Deny"], action))


def _parse_context(value: Any, path: str, default_scope: str) -> ContextEntry:
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, "spec.context[]", ACCEPTED_FIELDS)
    name = fields.string(raw.get("name"), f"{path}.name")
    if not name.isidentifier():
        raise PolicyError(f"{path}.name", f"{name!r} must be a CEL identifier (letters, digits, _): "
                                          "CEL reads it as context.<name>")
    group = fields.string(raw.get("group", ""), f"{path}.group")
    version = fields.required_string(raw.get("version"), f"{path}.version")
    resource = fields.string(raw.get("resource"), f"{path}.resource")
    if not resource or "/" in resource or resource == "*":
        raise PolicyError(f"{path}.resource", f"{resource!r} is not a resource: name one plural, e.g. \"deployments\"")
    scope = fields.enum(raw.get("scope", default_scope), f"{path}.scope", CONTEXT_SCOPES)
    max_objects = raw.get("maxObjects", DEFAULT_MAX_OBJECTS)
    if not isinstance(max_objects, int) or isinstance(max_objects, bool) or not 1 <= max_objects <= MAX_OBJECTS_LIMIT:
        raise PolicyError(f"{path}.maxObjects", f"must be a whole number from 1 to {MAX_OBJECTS_LIMIT:,} "
                                                f"(CEL's loop budget per evaluation), got {max_objects!r}")
    selector = parse_selector(raw.get("labelSelector"), f"{path}.labelSelector", "spec.context[].labelSelector")
    return ContextEntry(name, ContextSource(group, version, resource, selector),
                        cast(Literal["All", "RequestNamespace"], scope), max_objects, path)


def selector_text(selector: LabelSelector) -> str:
    """A selector as ``kubectl -l`` and the API's ``labelSelector`` parameter write it."""
    parts = [f"{key}={value}" for key, value in selector.match_labels]
    for req in selector.match_expressions:
        values = ",".join(sorted(req.values))
        parts.append({"In": f"{req.key} in ({values})", "NotIn": f"{req.key} notin ({values})",
                      "Exists": req.key, "DoesNotExist": f"!{req.key}"}[req.operator])
    return ",".join(parts)


def parse_selector(value: Any, path: str, schema_path: str | None = None) -> LabelSelector:
    if value is None:
        return LabelSelector()
    schema_path = schema_path or path
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, schema_path, ACCEPTED_FIELDS)
    labels = fields.mapping(raw.get("matchLabels", {}), f"{path}.matchLabels")
    for key, label in labels.items():
        if not isinstance(key, str):   # YAML reads `1: a` as a number
            raise PolicyError(f"{path}.matchLabels", f"label key {key!r} must be a string")
        fields.string(label, f"{path}.matchLabels.{key}")
    requirements = []
    for i, item in enumerate(fields.array(raw.get("matchExpressions", []), f"{path}.matchExpressions")):
        item_path = f"{path}.matchExpressions[{i}]"
        req = fields.mapping(item, item_path)
        fields.check_fields(req, item_path, f"{schema_path}.matchExpressions[]", ACCEPTED_FIELDS)
        key = fields.string(req.get("key"), f"{item_path}.key")
        operator = fields.enum(req.get("operator"), f"{item_path}.operator", SELECTOR_OPERATORS)
        values = fields.strings(req.get("values", []), f"{item_path}.values")
        if operator in ("In", "NotIn") and not values:
            raise PolicyError(f"{item_path}.values", f"must not be empty with operator {operator}")
        if operator in ("Exists", "DoesNotExist") and values:
            raise PolicyError(f"{item_path}.values", f"must be empty with operator {operator}")
        requirements.append(LabelRequirement(key, operator, frozenset(values)))
    return LabelSelector(tuple(sorted(labels.items())), tuple(requirements))


def parse_named(value: Any, path: str, schema_path: str) -> NamedExpression:
    """A variable (whose name CEL reads as ``variables.<name>``) or a match condition."""
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, schema_path, ACCEPTED_FIELDS)
    name = fields.required_string(raw.get("name"), f"{path}.name")
    if schema_path == "spec.variables[]" and not name.isidentifier():
        raise PolicyError(f"{path}.name", f"{name!r} must be a CEL identifier (letters, digits, _)")
    return NamedExpression(name, _expression(raw.get("expression"), f"{path}.expression"))


def _parse_validation(value: Any, path: str, index: int) -> Validation:
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, "spec.validations[]", ACCEPTED_FIELDS)
    name = fields.required_string(raw.get("name", f"validation-{index}"), f"{path}.name")
    message = raw.get("message")
    if message is not None:
        message = fields.string(message, f"{path}.message")
    message_expression = None
    if raw.get("messageExpression") is not None:
        message_expression = _expression(raw["messageExpression"], f"{path}.messageExpression")
    reason = fields.enum(raw.get("reason", "Forbidden"), f"{path}.reason", tuple(REASON_CODES))
    if raw.get("plugin") is not None:
        if raw.get("expression") is not None:
            raise PolicyError(path, "needs exactly one of expression or plugin")
        if message is not None or message_expression is not None:
            raise PolicyError(path, "a plugin's failures carry their own messages: message and messageExpression "
                                    "are for expressions")
        return Validation(None, None, None, reason, _parse_plugin(raw["plugin"], f"{path}.plugin",
                                                                   "spec.validations[].plugin"), name)
    return Validation(_expression(raw.get("expression"), f"{path}.expression"), message,
                      message_expression, reason, name=name)


def _parse_plugin(value: Any, path: str, schema_path: str) -> PluginRef:
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, schema_path, ACCEPTED_FIELDS)
    name = fields.required_string(raw.get("name"), f"{path}.name")
    config = _finite(copy.deepcopy(dict(fields.mapping(raw.get("config", {}), f"{path}.config"))), f"{path}.config")
    return PluginRef(name, config, path)


def _parse_mutation(value: Any, path: str, index: int) -> Mutation:
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, "spec.mutations[]", ACCEPTED_FIELDS)
    name = fields.string(raw.get("name", f"mutation-{index}"), f"{path}.name")
    condition = None
    if raw.get("condition") is not None:
        condition = _expression(raw["condition"], f"{path}.condition")
    has_patch, has_merge = raw.get("jsonPatch") is not None, raw.get("merge") is not None
    if raw.get("plugin") is not None:
        if has_patch or has_merge:
            raise PolicyError(path, "needs exactly one of jsonPatch, merge or plugin")
        return Mutation(name, condition, None, None, "Overwrite", path,
                        _parse_plugin(raw["plugin"], f"{path}.plugin", "spec.mutations[].plugin"))
    if has_patch == has_merge:
        raise PolicyError(path, "needs exactly one of jsonPatch, merge or plugin")
    merge_mode = fields.enum(raw.get("mergeMode", "Overwrite"), f"{path}.mergeMode", MERGE_MODES)
    json_patch = None
    merge = None
    if has_patch:
        ops = fields.array(raw["jsonPatch"], f"{path}.jsonPatch")
        if not ops:
            raise PolicyError(f"{path}.jsonPatch", "needs at least one operation")
        json_patch = tuple(_parse_patch_op(op, f"{path}.jsonPatch[{i}]") for i, op in enumerate(ops))
    else:
        merge = _finite(copy.deepcopy(dict(fields.mapping(raw["merge"], f"{path}.merge"))), f"{path}.merge")
    return Mutation(name, condition, json_patch, merge, cast(MergeMode, merge_mode), path)


def _parse_patch_op(value: Any, path: str) -> PatchOperation:
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, "spec.mutations[].jsonPatch[]", ACCEPTED_FIELDS)
    op = fields.enum(raw.get("op"), f"{path}.op", PATCH_OPS)
    pointer = _pointer(raw.get("path"), f"{path}.path")
    from_ = None
    if op in ("copy", "move"):
        from_ = _pointer(raw.get("from"), f"{path}.from")
    elif "from" in raw:
        raise PolicyError(f"{path}.from", f"is only for copy and move, not {op}")
    has_value, has_expression = "value" in raw, raw.get("valueExpression") is not None
    value_expression = None
    if op in ("add", "replace", "test"):
        if has_value == has_expression:
            raise PolicyError(path, f"op {op} needs exactly one of value or valueExpression")
        if has_expression:
            value_expression = _expression(raw["valueExpression"], f"{path}.valueExpression")
    elif has_value or has_expression:
        raise PolicyError(path, f"op {op} takes no value or valueExpression")
    value = _finite(copy.deepcopy(raw.get("value")), f"{path}.value")
    return PatchOperation(op, pointer, from_, value, value_expression, path)


def _expression(value: Any, path: str) -> Expression:
    source = fields.string(value, path)
    if not source.strip():
        raise PolicyError(path, "must not be empty")
    return Expression(source, path)


def _pointer(value: Any, path: str) -> str:
    pointer = fields.string(value, path)
    if not pointer.startswith("/"):
        raise PolicyError(path, f"{pointer!r} is not a JSON pointer (it must start with '/')")
    return pointer


def non_finite(value: Any) -> str | None:
    """"NaN" or "Infinity" when a number in ``value`` is one (JSON has neither; YAML's .nan and
    .inf, and CEL's double('NaN'), do), else None. Iterative: a value may nest deep."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return "NaN" if math.isnan(item) else "Infinity"
        if isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return None


def _finite(value: Any, path: str) -> Any:
    """``value`` as JSON can carry it in a patch: finite numbers, and keys that are strings
    (YAML reads ``0: x`` with a number for key)."""
    found = non_finite(value)
    if found:
        raise PolicyError(path, f"holds {found}, which is not a JSON number and cannot go into a patch")
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, Mapping):
            for key in item:
                if not isinstance(key, str):
                    raise PolicyError(path, f"holds the key {key!r}, which is not a string: JSON keys are strings")
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return value
