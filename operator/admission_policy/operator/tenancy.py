"""What a NamespacedAdmissionPolicy may be, beyond its fields: checked at `kubectl apply`.

Parsing already refuses what the spec alone shows (``api._check_tenant``: namespace selectors,
params or context of other namespaces). What needs the cluster is here: the kinds it matches, its
param kind and its context must be namespaced (discovery says), its namespace must be one the
webhooks serve, and the namespace's tenant policies together must stay within the limits the
cluster admin sets (``AP_TENANT_MAX_POLICIES``, ``AP_TENANT_MAX_COST``). The limits keep one
tenant from slowing the webhook that every routed request of the cluster goes through; they are
counted over the policies this replica enforces, so two applied at the same instant may both pass.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .. import api
from ..cel import estimation
from ..cluster.discovery import DiscoveredResource
from ..cluster.routing import plural
from ..config import OperatorConfig
from ..engine import CompiledPolicy

# The request a tenant policy's cost is estimated on: 64 KiB with up to 1,024 items in a list (a
# large Deployment). Absolute figures only matter against AP_TENANT_MAX_COST, whose default is
# four policies at the per-policy budget (cel.POLICY_BUDGET) on this request.
COST_SIZES: Final = estimation.Sizes(65_536, 1_024)


def tenant_problems(config: OperatorConfig, compiled: CompiledPolicy, discovered: Iterable[DiscoveredResource],
                    enforced: Iterable[CompiledPolicy]) -> list[str]:
    """Why this NamespacedAdmissionPolicy is refused ([]: it is not), one line each naming the field."""
    policy = compiled.policy
    namespace = policy.namespace
    assert namespace is not None
    problems: list[str] = []
    if namespace in config.all_exempt_namespaces:
        problems.append(f"metadata.namespace: {namespace} is exempt from the operator's webhooks "
                        "(AP_EXEMPT_NAMESPACES and the operator's own): a policy there would never be called")
    served = list(discovered)
    by_key = {(d.group, d.resource): d for d in served}
    for i, rule in enumerate(policy.match.resources):
        for j, resource in enumerate(rule.resources):
            name = plural(resource)
            if name == "*":
                continue   # the engine judges only objects in the policy's own namespace
            for found in ([d for d in served if d.resource == name] if "*" in rule.api_groups else
                          [by_key[(g, name)] for g in rule.api_groups if (g, name) in by_key]):
                if not found.namespaced:
                    problems.append(f"spec.match.resources[{i}].resources[{j}]: {_display(found)} is cluster-scoped: "
                                    f"a {api.NAMESPACED_KIND} judges objects in its own namespace only")
                    break
    if policy.param_kind is not None:
        group, _, _version = policy.param_kind.api_version.rpartition("/")
        for found in served:
            if found.group == group and found.kind == policy.param_kind.kind and not found.namespaced:
                problems.append(f"spec.paramKind: {policy.param_kind.kind} is cluster-scoped: a "
                                f"{api.NAMESPACED_KIND} reads params in its own namespace only")
    for entry in policy.context:
        found_context = by_key.get((entry.source.group, entry.source.resource))
        if found_context is not None and not found_context.namespaced:
            problems.append(f"{entry.path}.resource: {_display(found_context)} is cluster-scoped: a "
                            f"{api.NAMESPACED_KIND} reads objects of its own namespace only")
    others = [p for p in enforced if p.policy.namespace == namespace and p.name != policy.name]
    if len(others) + 1 > config.tenant_max_policies:
        problems.append(f"metadata.namespace: {namespace} already holds {len(others)} {api.NAMESPACED_KIND}(s), the "
                        f"most the cluster admin allows per namespace (AP_TENANT_MAX_POLICIES="
                        f"{config.tenant_max_policies})")
    cost = compiled.cost(COST_SIZES) + sum(p.cost(COST_SIZES) for p in others)
    if cost > config.tenant_max_cost:
        problems.append(f"spec: the estimated CEL cost of the tenant policies of {namespace} with this one would be "
                        f"{cost:,.0f} on a 64 KiB request, over the {config.tenant_max_cost:,} the cluster admin "
                        "allows per namespace (AP_TENANT_MAX_COST): simplify its expressions, or remove another policy")
    return problems


def _display(found: DiscoveredResource) -> str:
    return f"{found.resource}.{found.group}" if found.group else found.resource
