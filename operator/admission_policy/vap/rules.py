"""Kubernetes' resource rules (``NamedRuleWithOperations``) as routing rules and as CEL.

A ValidatingAdmissionPolicy and its binding each select requests with rules, and a request is
judged only when both select it. An AdmissionPolicy has one list of rules in the webhook-rule
shape, which the engine routes requests by, and match conditions. So the two lists are
intersected into that one (``meet``), and what a rule says beyond it (``resourceNames``,
``scope``, exclusions, ``matchPolicy: Exact``) becomes CEL (``condition``) that never errs.

Kubernetes' own matcher (apiserver ``admission/plugin/webhook/predicates/rules``) reads a
resource entry "a/b" as resource a (``*``: any) and subresource b (``*``: any, *including none*):
so "pods/*" matches pods and every subresource of pods, and "*" only main resources. The
engine reads "pods/*" as the subresources alone (``engine.policyset``), so such an entry
becomes two ("pods" and "pods/*") here.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Final

ANY: Final = "*"
SCOPES: Final = ("*", "Cluster", "Namespaced")
OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT", "*")

# Where a rule reads the request. The engine routes by ``request.resource``: the resource the
# API server converted the request to for the operator's webhook (matchPolicy Equivalent);
# ``request.requestResource`` is the resource as the client sent it, what matchPolicy Exact
# compares (and the same when no conversion happened; absent from hand-written reviews).
ROUTED: Final = "request.resource"
SENT: Final = "request.?requestResource.orValue(request.resource)"
_SUBRESOURCE: Final = "request.?subResource.orValue('')"   # equivalent resources share subresources
_NAMESPACE: Final = "request.?namespace.orValue('')"
_NAME: Final = "request.?name.orValue('')"

Resource = tuple[str, str]   # (resource, subresource): "*" is any; subresource "" is the main resource


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule; "*" in a list stands for any value. ``names`` (resourceNames) and ``scope`` do
    not take part in routing: they are checked by a condition (see ``narrows``)."""
    groups: tuple[str, ...]
    versions: tuple[str, ...]
    resources: tuple[Resource, ...]
    operations: tuple[str, ...]
    scope: str = ANY
    names: tuple[str, ...] = ()    # () matches every name

    @property
    def narrows(self) -> bool:
        """Whether the rule selects less than its routing rule does."""
        return bool(self.names) or self.scope != ANY

    def routing(self) -> Rule:
        """The rule without what routing cannot say."""
        return dataclasses.replace(self, scope=ANY, names=())

    def any_version(self) -> Rule:
        """The rule at every version: how routing must read a matchPolicy Exact rule."""
        return dataclasses.replace(self, versions=(ANY,))


EVERYTHING: Final = Rule((ANY,), (ANY,), ((ANY, ANY),), (ANY,))


def meet(a: Rule, b: Rule) -> Rule | None:
    """The routing rule matching exactly what both match (names and scope aside), or None."""
    groups, versions = _common(a.groups, b.groups), _common(a.versions, b.versions)
    operations = _common(a.operations, b.operations)
    resources = tuple(dict.fromkeys(
        (resource, subresource)
        for ra, sa in a.resources for rb, sb in b.resources
        if (resource := _common_part(ra, rb)) is not None and (subresource := _common_part(sa, sb)) is not None))
    if not (groups and versions and operations and resources):
        return None
    return Rule(groups, versions, resources, operations)


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    if ANY in a:
        return b
    if ANY in b:
        return a
    return tuple(value for value in a if value in b)


def _common_part(a: str, b: str) -> str | None:
    if a == ANY:
        return b
    if b == ANY or a == b:
        return a
    return None


def resource_rules(rules: Iterable[Rule]) -> list[dict[str, Any]]:
    """Routing rules as an AdmissionPolicy's ``match.resources``; rules differing only in their
    resources are merged."""
    merged: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], list[str]] = {}
    for rule in rules:
        entries = merged.setdefault((rule.groups, rule.versions, rule.operations), [])
        entries.extend(entry for entry in _entries(rule.resources) if entry not in entries)
    return [{"apiGroups": list(groups), "apiVersions": list(versions), "resources": entries,
             "operations": list(operations)}
            for (groups, versions, operations), entries in merged.items()]


def _entries(resources: Sequence[Resource]) -> list[str]:
    """Kubernetes' (resource, subresource) as the engine's entries (see the module's doc)."""
    entries: list[str] = []
    for resource, subresource in resources:
        if subresource == "":
            entries.append(resource)
        elif subresource == ANY:
            entries += [resource, f"{resource}/{ANY}"]
        else:
            entries.append(f"{resource}/{subresource}")
    return list(dict.fromkeys(entries))


def condition(rules: Sequence[Rule], resource: str = ROUTED) -> str:
    """CEL that holds when the request matches one of ``rules``; ``resource`` is ROUTED or SENT."""
    terms = [rule_condition(rule, "res" if resource == SENT else resource) for rule in rules]
    text = "true" if "true" in terms else " || ".join(_group(term) for term in terms) if len(terms) > 1 else terms[0]
    if resource == SENT and text != "true":
        return f"[{SENT}].exists(res, {text})"   # a binding Kubernetes has (cel.bind is ours)
    return text


def rule_condition(rule: Rule, resource: str = ROUTED) -> str:
    """CEL for one rule, as Kubernetes' matcher reads it; "true" when it selects everything."""
    terms = [*_member(f"{resource}.group", rule.groups), *_member(f"{resource}.version", rule.versions),
             *_member("request.operation", rule.operations)]
    alternatives = [" && ".join(_member(f"{resource}.resource", (name,)) + _member(_SUBRESOURCE, (sub,)))
                    for name, sub in rule.resources]
    if "" not in alternatives:
        terms.append(_group(" || ".join(_group(a) for a in alternatives)) if len(alternatives) > 1
                     else alternatives[0])
    namespace_object = (f"({resource}.group == '' && {resource}.version == 'v1' && "
                        f"{resource}.resource == 'namespaces')")
    if rule.scope == "Namespaced":   # a Namespace is cluster-scoped, though its request names it
        terms.append(f"{_NAMESPACE} != '' && !{namespace_object}")
    elif rule.scope == "Cluster":
        terms.append(f"({_NAMESPACE} == '' || {namespace_object})")
    if rule.names:
        terms += _member(_NAME, rule.names)
    return " && ".join(terms) or "true"


def _member(expression: str, values: Sequence[str]) -> list[str]:
    if ANY in values:
        return []
    if len(values) == 1:
        return [f"{expression} == {quote(values[0])}"]
    return [f"{expression} in [{', '.join(quote(value) for value in values)}]"]


def _group(text: str) -> str:
    return f"({text})" if " || " in text or " && " in text else text


def quote(text: str) -> str:
    """A CEL string literal."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"
