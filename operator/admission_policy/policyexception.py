"""The AdmissionPolicyException API: "this workload may break that rule, for now".

An exception is namespaced and waives, for the objects it matches in its own namespace (a
cluster-scoped object: in the operator's namespace, which only cluster admins write), the
failures of the policies (or of some of their validations and mutations, by name) it names,
until ``expiresAt``. It always says why (``reason``). A policy decides what exceptions may do
to it (``spec.exceptions``: allowed at all, how far ahead they may end, whether they need an
approval): ``check_exception`` says what is wrong with one, field by field, and
``engine.exceptions`` applies them. The name of this module avoids any confusion with Python's
exceptions (the package's errors are in ``errors.py``).

Who created an exception, who last changed its spec and who approved it, and when, are recorded
in annotations that the operator's webhook sets from the request and refuses from anyone else
(docs/exceptions.md); an approval counts only for the generation it approved, so editing the spec
voids it, and only from someone other than those who wrote that spec (four eyes). Parsing is as
strict as a policy's, and errors are ``api.PolicyError`` naming the field path.
"""
from __future__ import annotations

import dataclasses
import datetime
import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any, Final

from . import api, fields
from .api import (
    LabelSelector,
    NamedExpression,
    ResourceRule,
    format_duration,
    object_header,
    parse_named,
    parse_rule,
    parse_selector,
)
from .fields import PolicyError

KIND: Final = "AdmissionPolicyException"
PLURAL: Final = "admissionpolicyexceptions"
API_VERSION: Final = api.API_VERSION
# The namespace whose exceptions cover cluster-scoped objects, unless the caller says another:
# the operator's (its chart installs it there), which only cluster admins may write to.
DEFAULT_CLUSTER_NAMESPACE: Final = "admission-policy-system"

# Recorded by the operator from the requests that created and approved the exception; a user
# cannot set them (the operator's webhook refuses it), so offline they stand for that record.
ANNOTATION_PREFIX: Final = f"{api.GROUP}/"
CREATED_BY: Final = ANNOTATION_PREFIX + "created-by"
CREATED_AT: Final = ANNOTATION_PREFIX + "created-at"
APPROVED_BY: Final = ANNOTATION_PREFIX + "approved-by"
APPROVED_AT: Final = ANNOTATION_PREFIX + "approved-at"
APPROVED_GENERATION: Final = ANNOTATION_PREFIX + "approved-generation"
SPEC_CHANGED_BY: Final = ANNOTATION_PREFIX + "spec-changed-by"   # who last wrote the spec (creating it too)

ACCEPTED_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "": frozenset({"apiVersion", "kind", "metadata", "spec", "status"}),
    "spec": frozenset({"policies", "match", "conditions", "reason", "expiresAt"}),
    "spec.policies[]": frozenset({"name", "rules"}),
    "spec.match": frozenset({"resources", "names", "objectSelector"}),
}


@dataclasses.dataclass(frozen=True)
class PolicyRef:
    """A policy an exception waives, and which of its rules (empty: all of them)."""
    name: str
    rules: tuple[str, ...]
    path: str     # "spec.policies[0]"


@dataclasses.dataclass(frozen=True)
class ExceptionMatch:
    """Which objects of its namespace an exception covers; an empty field limits nothing.
    ``names`` may hold ``*`` and ``?`` wildcards: the Pods a controller makes are named after it
    (``legacy-app-5d9c7-x2x8k``)."""
    resources: tuple[ResourceRule, ...] = ()
    names: tuple[str, ...] = ()
    object_selector: LabelSelector = dataclasses.field(default_factory=LabelSelector)

    def names_match(self, name: str) -> bool:
        return not self.names or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.names)


@dataclasses.dataclass(frozen=True)
class Record:
    """Who created and approved the exception, and when (seconds since the epoch), and who last
    changed its spec."""
    created_by: str = ""
    created_at: float | None = None
    approved_by: str = ""
    approved_at: float | None = None
    approved_generation: int | None = None
    spec_changed_by: str = ""

    @property
    def authors(self) -> frozenset[str]:
        """Whoever wrote what is approved: an approval counts only from someone else (four eyes)."""
        return frozenset(who for who in (self.created_by, self.spec_changed_by) if who)

    @property
    def self_approved(self) -> bool:
        return self.approved_by in self.authors


@dataclasses.dataclass(frozen=True)
class PolicyException:
    """An exception as parsed: immutable and checked field by field. Its CEL ``conditions`` are
    compiled by ``engine.compile_exception``; whether the policies it names exist and allow it is
    ``check_exception``'s."""
    namespace: str
    name: str
    generation: int
    policies: tuple[PolicyRef, ...]
    match: ExceptionMatch
    conditions: tuple[NamedExpression, ...]
    reason: str
    expires_at: float          # seconds since the epoch; in force while now < expires_at
    record: Record = Record()

    @property
    def key(self) -> str:
        """``namespace/name``, as warnings, reports and messages name it."""
        return str(api.PolicyKey(KIND, self.namespace, self.name))

    @property
    def approved(self) -> bool:
        """Approved for this very spec (an edit, a new generation, voids an approval), by someone
        other than who created it or last changed its spec."""
        return (bool(self.record.approved_by) and self.record.approved_generation == self.generation
                and not self.record.self_approved)

    def in_force(self, now: float) -> bool:
        return now < self.expires_at


def parse_exception(obj: Any) -> PolicyException:
    """Turn an AdmissionPolicyException object (as stored in the cluster or a file) into typed values."""
    root = fields.mapping(obj, "")
    fields.check_fields(root, "", "", ACCEPTED_FIELDS)
    metadata, name, generation = object_header(root, KIND)
    namespace = fields.required_string(metadata.get("namespace"), "metadata.namespace")
    record = _parse_record(fields.mapping(metadata.get("annotations") or {}, "metadata.annotations"))

    spec = fields.mapping(root.get("spec"), "spec")
    fields.check_fields(spec, "spec", "spec", ACCEPTED_FIELDS)
    raw_policies = fields.array(spec.get("policies"), "spec.policies")
    if not raw_policies:
        raise PolicyError("spec.policies", "needs at least one policy")
    policies = tuple(_parse_policy_ref(item, f"spec.policies[{i}]") for i, item in enumerate(raw_policies))
    fields.check_unique([p.name for p in policies], "spec.policies", "policy")
    conditions = tuple(parse_named(item, f"spec.conditions[{i}]", "spec.match.conditions[]")
                       for i, item in enumerate(fields.array(spec.get("conditions", []), "spec.conditions")))
    fields.check_unique([c.name for c in conditions], "spec.conditions", "condition")
    reason = fields.string(spec.get("reason"), "spec.reason")
    if not reason.strip():
        raise PolicyError("spec.reason", "must say why the exception is granted")
    if spec.get("expiresAt") is None:
        raise PolicyError("spec.expiresAt", "is required: an exception ends (an RFC 3339 time, "
                                            "e.g. 2026-12-31T00:00:00Z)")
    return PolicyException(namespace, name, generation, policies, _parse_match(spec.get("match")), conditions,
                           reason, parse_time(spec["expiresAt"], "spec.expiresAt"), record)


def _parse_policy_ref(value: Any, path: str) -> PolicyRef:
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, "spec.policies[]", ACCEPTED_FIELDS)
    rules = tuple(fields.strings(raw.get("rules", []), f"{path}.rules"))
    fields.check_unique(rules, f"{path}.rules", "rule", named=False)
    return PolicyRef(fields.required_string(raw.get("name"), f"{path}.name"), rules, path)


def _parse_match(value: Any) -> ExceptionMatch:
    if value is None:
        return ExceptionMatch()
    path = "spec.match"
    raw = fields.mapping(value, path)
    fields.check_fields(raw, path, path, ACCEPTED_FIELDS)
    resources = tuple(parse_rule(item, f"{path}.resources[{i}]")
                      for i, item in enumerate(fields.array(raw.get("resources", []), f"{path}.resources")))
    names = tuple(fields.strings(raw.get("names", []), f"{path}.names"))
    for i, item in enumerate(names):
        if not item:
            raise PolicyError(f"{path}.names[{i}]", "must not be empty")
    selector = parse_selector(raw.get("objectSelector"), f"{path}.objectSelector", "spec.match.objectSelector")
    return ExceptionMatch(resources, names, selector)


def _parse_record(annotations: Mapping[str, Any]) -> Record:
    def text(key: str) -> str:
        return fields.string(annotations.get(key, ""), f"metadata.annotations[{key!r}]")

    def time(key: str) -> float | None:
        return parse_time(annotations[key], f"metadata.annotations[{key!r}]") if annotations.get(key) else None

    generation = None
    if annotations.get(APPROVED_GENERATION):
        raw = text(APPROVED_GENERATION)
        if not raw.isdigit():
            raise PolicyError(f"metadata.annotations[{APPROVED_GENERATION!r}]", f"{raw!r} is not a generation")
        generation = int(raw)
    return Record(text(CREATED_BY), time(CREATED_AT), text(APPROVED_BY), time(APPROVED_AT), generation,
                  text(SPEC_CHANGED_BY))


def parse_time(value: Any, path: str) -> float:
    """Seconds since the epoch of an RFC 3339 time with its offset (``2026-12-31T00:00:00Z``).
    YAML reads an unquoted time as a datetime, which is taken as it is (with its offset)."""
    if isinstance(value, datetime.datetime):
        moment = value
    else:
        text = fields.string(value, path)
        try:
            if "T" not in text.upper():
                raise ValueError(text)
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise PolicyError(path, f"{text!r} is not an RFC 3339 time (e.g. 2026-12-31T00:00:00Z)") from None
    if moment.tzinfo is None:
        raise PolicyError(path, f"{moment.isoformat()!r} has no offset: add Z (UTC) or +hh:mm")
    return moment.timestamp()


def format_time(seconds: float) -> str:
    """A time as Kubernetes writes one: RFC 3339, UTC, to the second."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_exception(exception: PolicyException, policies: Iterable[api.AdmissionPolicy], now: float, *,
                    expiry: bool = True) -> list[str]:
    """What would make the exception refused at ``kubectl apply``, one line each naming the field:
    a policy that does not exist or allows no exceptions, a rule name it does not have, an expiry
    in the past (unless ``expiry`` is False: for an exception that may have been valid when it was
    made) or further ahead of the exception's creation (``now`` for a new one) than the policy's
    ``spec.exceptions.maxDuration``."""
    by_name = {policy.name: policy for policy in policies}
    problems = check_references(exception, by_name.values())
    created = exception.record.created_at if exception.record.created_at is not None else now
    if expiry and exception.expires_at <= now:
        problems.append(f"spec.expiresAt: {format_time(exception.expires_at)} is not in the future "
                        f"(now: {format_time(now)})")
    for ref in exception.policies:
        policy = by_name.get(ref.name)
        if policy is None:
            continue
        rules = policy.exceptions
        if rules.max_duration is not None and exception.expires_at - created > rules.max_duration:
            problems.append(f"spec.expiresAt: {format_time(exception.expires_at)} is more than "
                            f"{format_duration(rules.max_duration)} after the exception's creation "
                            f"({format_time(created)}), AdmissionPolicy {ref.name!r}'s "
                            "spec.exceptions.maxDuration")
    return problems


def check_references(exception: PolicyException, policies: Iterable[api.AdmissionPolicy]) -> list[str]:
    """The part of ``check_exception`` that time does not change: the policies named exist and
    allow exceptions, and so do the rules named. What an offline suite checks of the exceptions
    it is given (an expired one is still a valid object there)."""
    by_name = {policy.name: policy for policy in policies}
    problems: list[str] = []
    for ref in exception.policies:
        policy = by_name.get(ref.name)
        if policy is None:
            problems.append(f"{ref.path}.name: no AdmissionPolicy {ref.name!r}")
            continue
        if not policy.exceptions.allowed:
            problems.append(f"{ref.path}.name: AdmissionPolicy {ref.name!r} allows no exceptions "
                            "(its spec.exceptions.allowed is false)")
        known = policy.rule_names()
        for i, rule in enumerate(ref.rules):
            if rule not in known:
                problems.append(f"{ref.path}.rules[{i}]: AdmissionPolicy {ref.name!r} has no validation or mutation "
                                f"named {rule!r} (it has: {', '.join(known)})")
    return problems


def within_limits(exception: PolicyException, policy: api.AdmissionPolicy) -> bool:
    """Whether the policy lets this exception apply at all: exceptions allowed, approved when it
    requires approval, and within its maxDuration (when the creation time is recorded: a policy
    may lower its cap after the exception was granted)."""
    rules = policy.exceptions
    if not rules.allowed or (rules.approval == "Required" and not exception.approved):
        return False
    created = exception.record.created_at
    return rules.max_duration is None or created is None or exception.expires_at - created <= rules.max_duration

