"""Which requests a policy applies to through one binding, as an AdmissionPolicy's ``match``.

Kubernetes applies a ValidatingAdmissionPolicy through a binding to a request that both the
policy's ``matchConstraints`` and the binding's ``matchResources`` select (apiserver
``admission/plugin/policy/matching``): each by its namespace and object selectors, its
``excludeResourceRules`` and its ``resourceRules`` (a binding without rules selects every
resource). An AdmissionPolicy gets the intersection of the rules as its ``match.resources``,
both namespace selectors in one, and a CEL condition per side for what its rules say beyond
that. The conditions never err, and go before the policy's own: the engine stops at the first
condition that does not hold, so a request Kubernetes would not select never reaches them.
"""
from __future__ import annotations

from typing import Final

from . import rules
from .objects import MatchResources
from .rules import ANY, ROUTED, SENT, Rule
from .selectors import Selector, both, object_condition

_NO_RESOURCE: Final = ((ANY,), (ANY,), ((ANY, ANY),), (ANY,))


def routing(policy: MatchResources, binding: MatchResources) -> tuple[Rule, ...]:
    """The rules an AdmissionPolicy routes by: every request both sides' rules may select."""
    return tuple(dict.fromkeys(
        met for a in _routed(policy) for b in _routed(binding) if (met := rules.meet(a, b)) is not None))


def _routed(side: MatchResources) -> tuple[Rule, ...]:
    """A side's rules as routing reads them. matchPolicy Exact compares the resource as sent, in
    a condition, while routing sees the version the request was converted to: any version."""
    found = side.rules if side.rules is not None else (rules.EVERYTHING,)
    return tuple(rule.routing().any_version() if side.exact else rule.routing() for rule in found)


def conditions(policy: MatchResources, binding: MatchResources) -> list[tuple[str, str]]:
    """(name, CEL) of the conditions selecting what routing alone cannot."""
    found = [(name, text) for name, text in (("policy-resource-rules", _side_condition(policy)),
                                             ("binding-resource-rules", _side_condition(binding))) if text]
    if not policy.object_selector.empty and not binding.object_selector.empty:
        found.append(("binding-object-selector", object_condition(binding.object_selector)))
    return found


def _side_condition(side: MatchResources) -> str:
    """What a side's rules select beyond routing: names and scopes, the resource as sent (Exact),
    exclusions; "" when routing says it all."""
    target = SENT if side.exact else ROUTED
    parts = []
    if side.rules is not None and (side.exact or any(rule.narrows for rule in side.rules)):
        narrowing = {(rule.scope, rule.names) for rule in side.rules}
        if not side.exact and len(narrowing) == 1:
            # One rule matched to get here, and all narrow alike: only the narrowing is left to check.
            scope, names = narrowing.pop()
            parts.append(rules.rule_condition(Rule(*_NO_RESOURCE, scope, names)))
        else:
            parts.append(rules.condition(side.rules, target))
    if side.excludes:
        parts.append(f"!({rules.condition(side.excludes, target)})")
    return " && ".join(f"({part})" if " || " in part and len(parts) > 1 else part
                       for part in parts if part != "true")


def namespace_selector(policy: MatchResources, binding: MatchResources) -> Selector:
    """The namespaces both sides select: the API server applies both selectors."""
    return both(policy.namespace_selector, binding.namespace_selector)


def object_selector(policy: MatchResources, binding: MatchResources) -> Selector:
    """The selector the AdmissionPolicy carries: the policy's, else the binding's (when both
    have one, the binding's is a condition: see ``selectors``)."""
    return binding.object_selector if policy.object_selector.empty else policy.object_selector
