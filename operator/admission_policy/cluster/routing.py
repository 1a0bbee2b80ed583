"""Which API requests reach the webhooks: the policies' routes, as discovery expands them.

The webhook configurations, the background audit and the CLI's cluster audit must agree on what
admission judges, or the audit would report objects the webhooks never see (and miss some they
do); so the expansion lives here once and each of them reads it.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Iterable
from typing import Any, Protocol

from ..api import FailurePolicy, split_resource
from ..engine import CompiledPolicy, PolicySet
from .discovery import DiscoveredResource

DOMAIN = "policy-operator.dev"
# Break-glass: the webhooks skip a write of an object with this label only when the requester is an
# identity the cluster admin named (``break_glass_condition``). The label alone exempts nothing:
# anyone who may write an object may label it.
BREAK_GLASS_LABEL = f"{DOMAIN}/exempt"

# Resources the webhooks never see: routing them could deadlock the cluster (leases, webhook
# configurations), flood the operator (events), is meaningless (review "virtual" resources), or
# would let a policy judge the objects that fix it: AdmissionPolicies (a wildcard policy would
# otherwise refuse its own repair, its deletion and the operator's status writes, issue 18), the
# tenants' NamespacedAdmissionPolicies and the AdmissionPolicyExceptions (judged by the operator's
# own fixed webhook entries instead), and Kopf's peering objects, which the replicas must write to
# elect the reconciler.
NEVER_ROUTED: frozenset[tuple[str, str]] = frozenset(
    {
        (DOMAIN, "admissionpolicies"),
        (DOMAIN, "namespacedadmissionpolicies"),
        (DOMAIN, "admissionpolicyexceptions"),
        ("kopf.dev", "clusterkopfpeerings"),
        ("kopf.dev", "kopfpeerings"),
        ("coordination.k8s.io", "leases"),
        ("", "events"),
        ("events.k8s.io", "events"),
        ("authentication.k8s.io", "tokenreviews"),
        ("authentication.k8s.io", "selfsubjectreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
        ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ("authorization.k8s.io", "localsubjectaccessreviews"),
        ("authorization.k8s.io", "selfsubjectrulesreviews"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
        ("admissionregistration.k8s.io", "validatingadmissionpolicies"),
        ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"),
    }
)

# The CRDs of the objects above. Webhook rules cannot name objects, and routing no CRD at all
# would take every CRD away from policies, so the webhooks that route CRDs skip these by name in a
# matchCondition (and the handler skips them too, for API servers without matchConditions).
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
OWN_CRDS: tuple[str, ...] = (f"admissionpolicies.{DOMAIN}", f"namespacedadmissionpolicies.{DOMAIN}",
                              f"admissionpolicyexceptions.{DOMAIN}", "clusterkopfpeerings.kopf.dev",
                              "kopfpeerings.kopf.dev")
NOT_SERVED = "(not served by the cluster)"   # how unserved_resources marks what discovery lacks
ALL_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"   # every namespace carries it: selectors name namespaces by it

# The matchCondition that keeps the operator's own CRDs from any rule routing CRDs.
NOT_OWN_CRD = {
    "name": "not-the-operators-own-crds",
    "expression": (f"!(request.resource.group == '{CRDS[0]}' && request.resource.resource == '{CRDS[1]}'"
                   f" && request.name in [{', '.join(repr(name) for name in OWN_CRDS)}])"),
}

# (group, version, resource-with-optional-subresource) → operations: the routes as discovery expands
# them, which the webhook configurations and the generated ValidatingAdmissionPolicies both name.
Atoms = dict[tuple[str, str, str], set[str]]



@dataclasses.dataclass(frozen=True)
class RouteRule:
    """One ``match.resources`` entry of a loaded policy: what the webhooks must send us."""

    api_groups: tuple[str, ...]
    api_versions: tuple[str, ...]
    resources: tuple[str, ...]  # "pods", "*", "pods/exec", "*/status", "pods/*"
    operations: tuple[str, ...]  # CREATE | UPDATE | DELETE | CONNECT | "*"
    failure_policy: FailurePolicy
    mutating: bool
    namespace: str = ""   # a NamespacedAdmissionPolicy's: routed for that namespace only


def routes(policy: CompiledPolicy, *, derived: bool = True) -> list[RouteRule]:
    """What the webhooks must send for one policy: its rules, on the webhooks it uses; for a Pod
    policy, also (``derived``) the workloads whose Pod templates it judges, so that they are
    routed only while some policy needs them."""
    return [
        RouteRule(rule.api_groups, rule.api_versions, rule.resources, rule.operations,
                  compiled.policy.failure_policy, mutating, compiled.policy.namespace or "")
        for compiled in ((policy, *policy.derived) if derived else (policy,))
        for rule in compiled.policy.match.resources
        for mutating, wanted in ((False, compiled.validations), (True, compiled.mutations)) if wanted
    ]


def all_routes(policies: PolicySet) -> list[RouteRule]:
    """Every policy's routes; a policy Kubernetes enforces (``PolicySet.scoped``) is routed only in
    the namespaces left to the webhooks."""
    found = []
    for policy in policies:
        scope = policies.scope(policy.name)
        if scope is None:
            found += routes(policy)
            continue
        for namespace in sorted(scope):
            found += [dataclasses.replace(route, namespace=namespace) for route in routes(policy)
                      if route.namespace in ("", namespace)]
    return found



class Exemptions(Protocol):
    """What exempts namespaces from every policy (``OperatorConfig`` has it; the CLI builds one too)."""

    @property
    def namespace(self) -> str: ...

    @property
    def exempt_namespaces(self) -> tuple[str, ...]: ...


def break_glass_condition(users: Collection[str], groups: Collection[str]) -> dict[str, str] | None:
    """The webhooks' ``matchCondition`` that holds back a break-glass write from them: the object
    (the old one on DELETE) carries ``BREAK_GLASS_LABEL=true`` and the requester is one of ``users``
    or in one of ``groups``. None when nobody is named: the label then exempts nothing.

    The API server evaluates it, so the break-glass works with every replica down; an API server
    that ignores matchConditions (older than 1.28) calls the webhook, which judges the write. It
    never errs (an erring condition would answer by the webhook's failurePolicy): every field it
    reads is tested with ``has`` first."""
    who = []
    if users:
        who.append(f"(has(request.userInfo.username) && request.userInfo.username in {_cel_list(users)})")
    if groups:
        who.append(f"(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in {_cel_list(groups)}))")
    if not who:
        return None
    key = json.dumps(BREAK_GLASS_LABEL)

    def labelled(var: str) -> str:
        return (f"{var} != null && has({var}.metadata) && has({var}.metadata.labels) && "
                f"{key} in {var}.metadata.labels && {var}.metadata.labels[{key}] == 'true'")

    return {"name": "not-break-glass", "expression": (
        f"!(({' || '.join(who)}) && ({labelled('object')} || (object == null && {labelled('oldObject')})))")}


def _cel_list(items: Collection[str]) -> str:
    """A CEL list of string literals (JSON's string syntax is CEL's, escapes included)."""
    return f"[{', '.join(json.dumps(item) for item in items)}]"


def unserved_resources(routes: Iterable[RouteRule], discovered: Collection[DiscoveredResource]) -> list[str]:
    """Describe the routes' group/resources that will not reach us (the policy goes Degraded).

    That is: explicit resources the cluster does not serve, wildcards that match nothing, and
    explicitly named never-routed resources (a policy naming them would silently never run).
    """
    index = ServedIndex(discovered)
    problems: dict[str, None] = {}
    for route in routes:
        for group in route.api_groups:
            for resource in route.resources:
                if group != "*" and plural(resource) != "*" and (group, plural(resource)) in NEVER_ROUTED:
                    problems[f"{_display(group, resource)} (never sent to admission webhooks)"] = None
                elif not _served(group, resource, index):
                    problems[f"{_display(group, resource)} {NOT_SERVED}"] = None
    return sorted(problems)


def listable_resources(routes: Iterable[RouteRule], discovered: Collection[DiscoveredResource],
                       operation: str = "CREATE") -> list[DiscoveredResource]:
    """The served main resources these routes send for ``operation`` (or ``*``), as the webhook
    rules expand them (wildcards from discovery, never the never-routed ones): what the background
    audit lists."""
    index = ServedIndex(discovered)
    found: dict[tuple[str, str], DiscoveredResource] = {}
    for route in routes:
        if operation not in route.operations and "*" not in route.operations:
            continue
        for group in route.api_groups:
            for resource in route.resources:
                for target_group, _, target in expand(group, resource, route.api_versions, index):
                    served = index.by_key.get((target_group, target))   # a subresource is not listed
                    if served is not None:
                        found[target_group, target] = served
    return [found[key] for key in sorted(found)]


def never_judged(exemptions: Exemptions, group: str, resource: str, namespace: str, name: str) -> bool:
    """A request no user policy may decide, should the API server send it anyway (a webhook
    configuration edited by hand, an API server without matchConditions): the same exclusions
    as the webhooks' rules, namespaceSelector and matchConditions."""
    if (group, resource) in NEVER_ROUTED:
        return True
    if (group, resource) == CRDS:
        return name in OWN_CRDS
    def exempt(name: str) -> bool:   # all_exempt_namespaces, without building it per request
        return name == exemptions.namespace or name in exemptions.exempt_namespaces

    return exempt(namespace) or (group == "" and resource == "namespaces" and exempt(name))


class ServedIndex:
    """Discovery indexed by group and by (group, resource)."""

    def __init__(self, discovered: Iterable[DiscoveredResource]) -> None:
        self.by_key = {(d.group, d.resource): d for d in discovered}
        self.groups = sorted({group for group, _ in self.by_key})


def expand(group: str, resource: str, versions: Iterable[str], index: ServedIndex) -> list[tuple[str, str, str]]:
    """Concrete (group, version, resource[/sub]) targets of one group x resource pair.

    Wildcards expand from discovery at preferred versions and skip the never-routed list.
    An explicit resource is kept as written, at its group's preferred version when discovery
    knows it: Kopf serves only the preferred version, and matchPolicy Equivalent makes the API
    server convert the others. An undiscovered one (a CRD not installed yet) keeps its versions.
    """
    plural, sub = split_resource(resource)
    if group != "*" and plural != "*":
        if (group, plural) in NEVER_ROUTED:
            return []
        found = index.by_key.get((group, plural))
        if found is not None:
            return [(group, found.version, resource)]
        return [(group, version, resource) for version in versions]

    targets = []
    for found in _candidates(group, plural, index):
        if (found.group, found.resource) in NEVER_ROUTED:
            continue
        if not sub:
            targets.append((found.group, found.version, found.resource))
        elif sub == "*":
            targets += [(found.group, found.version, f"{found.resource}/{s}") for s in found.subresources]
        elif sub in found.subresources:
            targets.append((found.group, found.version, f"{found.resource}/{sub}"))
    return targets


def _served(group: str, resource: str, index: ServedIndex) -> bool:
    """Whether discovery has anything routable for this group x resource pair."""
    plural, sub = split_resource(resource)
    if group != "*" and plural != "*":
        found = index.by_key.get((group, plural))
        return found is not None and (not sub or sub == "*" or sub in found.subresources)
    return bool(expand(group, resource, (), index))


def _candidates(group: str, plural: str, index: ServedIndex) -> list[DiscoveredResource]:
    groups = set(index.groups) if group == "*" else {group}
    return [d for (g, p), d in sorted(index.by_key.items()) if g in groups and (plural == "*" or p == plural)]


def plural(resource: str) -> str:
    return split_resource(resource)[0]


def _display(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


def admission_rules(atoms: Atoms, scope: str = "*") -> list[dict[str, Any]]:
    """Group atoms sharing (group, version, operations) into one rule; sorted for stable output."""
    grouped: dict[tuple[str, str, tuple[str, ...]], set[str]] = {}
    for (group, version, resource), operations in atoms.items():
        grouped.setdefault((group, version, _sorted_operations(operations)), set()).add(resource)
    return [
        {
            "apiGroups": [group],
            "apiVersions": [version],
            "operations": list(operations),
            "resources": sorted(resources),
            "scope": scope,
        }
        for (group, version, operations), resources in sorted(grouped.items())
    ]


def _sorted_operations(operations: set[str]) -> tuple[str, ...]:
    if "*" in operations or set(ALL_OPERATIONS) <= operations:
        return ("*",)
    return tuple(sorted(operations))


def atoms(routes: Iterable[RouteRule], index: ServedIndex) -> Atoms:
    atoms: Atoms = {}
    for route in routes:
        for group in route.api_groups:
            for resource in route.resources:
                for target in expand(group, resource, route.api_versions, index):
                    atoms.setdefault(target, set()).update(route.operations)
    return atoms


def subtract(atoms: Atoms, covered: Atoms) -> Atoms:
    result: Atoms = {}
    for target, operations in atoms.items():
        taken = covered.get(target, set())
        left = explicit(operations) - explicit(taken)
        if left:
            result[target] = left
    return result


def explicit(operations: set[str]) -> set[str]:
    return set(ALL_OPERATIONS) if "*" in operations else set(operations)
