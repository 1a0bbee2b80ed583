"""Type-checking a policy in the cluster: the engine's check (``engine.typecheck``) against the
built-in kinds and the CustomResourceDefinitions of the custom kinds it names, read as needed.

Both the webhook that checks policies at `kubectl apply` (admission warnings) and reconciliation
(the ``TypeChecked`` condition, ``status.typeChecking``) run it. A CRD that cannot be read leaves its
kind unchecked, as Kubernetes does with a schema it cannot resolve: type checking never changes
what a policy enforces.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from .. import api
from ..cluster.client import call_json
from ..engine.kinds import Catalog
from ..engine.typecheck import TypeCheck, type_check
from .conditions import TYPE_CHECKED, Condition
from .state import Operator

logger = logging.getLogger(__name__)

_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


async def check(op: Operator, policy: api.AdmissionPolicy, timeout: float) -> TypeCheck | None:
    """The policy's check; None when its custom kinds could not be read within ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            catalog = Catalog(await _crds(op, policy))
    except (TimeoutError, client.ApiException, aiohttp.ClientError) as exc:
        logger.info("type checking %s skipped: cannot read its CustomResourceDefinitions (%s)", policy.name, exc)
        return None
    return type_check(policy, catalog)


async def _crds(op: Operator, policy: api.AdmissionPolicy) -> list[Any]:
    """The CRDs of the custom resources the policy's rules and paramKind name (by name: a CRD is
    ``<plural>.<group>``); a built-in kind or a resource no CRD serves is not looked up."""
    builtin = Catalog()
    names = {f"{resource}.{group}" for rule in policy.match.resources if not any("*" in v for v in rule.api_versions)
             for group in rule.api_groups for resource in rule.resources
             if group and "*" not in group and "*" not in resource and "/" not in resource
             and not any(builtin.for_resource(group, version, resource) for version in rule.api_versions)}
    kind = policy.param_kind
    if kind is not None and kind.group and builtin.for_kind(kind.group, kind.version, kind.kind) is None:
        names |= {f"{found.resource}.{found.group}" for found in await op.discovery.resources()
                  if (found.group, found.kind) == (kind.group, kind.kind)}
    found: list[Any] = []
    for name in sorted(names):
        status, answer = await call_json(op.api_client, "GET", f"{_CRDS}/{name}")
        if status == 200 and isinstance(answer, dict):
            found.append(answer)
        elif status != 404:
            raise client.ApiException(status=status, reason=str((answer or {}).get("message", "")))
    return found


def condition(checked: TypeCheck | None) -> Condition:
    """``TypeChecked``: an observation only, never a change of phase (warnings are not refusals)."""
    if checked is None:
        return Condition(TYPE_CHECKED, "Unknown", "SchemaUnavailable",
                         "the CustomResourceDefinitions of the kinds it names could not be read; checked again "
                         "with the next generation or restart")
    if not checked.kinds:
        return Condition(TYPE_CHECKED, "True", "NoSchema",
                         "no kind it matches has a known schema (a wildcard, a subresource, or a custom kind without "
                         "a CustomResourceDefinition), so its expressions are checked as dyn only")
    against = ", ".join(checked.kinds)
    if checked.warnings:
        first = checked.warnings[0]
        return Condition(TYPE_CHECKED, "False", "Warnings",
                         f"{len(checked.warnings)} expression(s) do not type-check against {against} (see "
                         f"status.typeChecking): {first.field_ref}: {first.warning.splitlines()[0]}")
    return Condition(TYPE_CHECKED, "True", "Checked", f"every expression type-checks against {against}")


def admission_warnings(key: api.PolicyKey, checked: TypeCheck | None) -> tuple[str, ...]:
    """The warnings `kubectl apply` prints: one line per expression and kind, naming the policy,
    the field, and the line and column."""
    if checked is None:
        return ()
    return tuple(f"{key.kind} {str(key)!r}: {line}" for warning in checked.warnings for line in warning.lines())
