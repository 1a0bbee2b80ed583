"""The Validating/MutatingWebhookConfiguration bodies, built from the loaded policies' routes.

The operator writes these itself instead of Kopf's managed mode (docs/design.md, "Webhook
configurations"): rules change at runtime, and every replica must write byte-identical objects,
so the builder is a pure, deterministic function and ``apply_configurations`` only writes when
something differs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol

from kubernetes_asyncio.client.exceptions import ApiException

from ..cluster.discovery import DiscoveredResource
from ..cluster.routing import (
    CRDS,
    DOMAIN,
    NAMESPACE_NAME_LABEL,
    NOT_OWN_CRD,
    Atoms,
    RouteRule,
    ServedIndex,
    admission_rules,
    atoms,
    break_glass_condition,
    explicit,
    plural,
    subtract,
)
from ..config import OperatorConfig

logger = logging.getLogger(__name__)

VALIDATE_PATH = "/validate"  # Kopf routes on the last path segment: handler id "validate"
MUTATE_PATH = "/mutate"  # handler id "mutate"
VALIDATE_POLICY_PATH = "/validate-policy"  # handler id "validate-policy"
VALIDATE_EXCEPTION_PATH = "/validate-exception"  # handler id "validate-exception"
MUTATE_EXCEPTION_PATH = "/mutate-exception"  # handler id "mutate-exception"
VALIDATE_TENANT_POLICY_PATH = "/validate-tenant-policy"  # handler id "validate-tenant-policy"
PROBE_PATH = "/probe"  # handler id "probe"
PROBE_WEBHOOK_NAME = f"probe.validate.{DOMAIN}"
PROBE_PREFIX = "admission-policy-operator.probe."
POLICY_WEBHOOK_NAME = f"policies.validate.{DOMAIN}"
TENANT_POLICY_WEBHOOK_NAME = f"tenant-policies.validate.{DOMAIN}"
EXCEPTION_WEBHOOK_NAMES = (f"exceptions.validate.{DOMAIN}", f"exceptions.mutate.{DOMAIN}")
MAX_CONFLICT_RETRIES = 5



def build_validating_configuration(
    settings: OperatorConfig,
    ca_bundle: str,
    routes: Collection[RouteRule],
    discovered: Collection[DiscoveredResource],
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration: the fixed entries for our own kinds plus routed rules."""
    webhooks = [
        _own_webhook(settings, ca_bundle, POLICY_WEBHOOK_NAME, VALIDATE_POLICY_PATH, "admissionpolicies",
                     ("spec-written", SPEC_WRITTEN)),
        _own_webhook(settings, ca_bundle, TENANT_POLICY_WEBHOOK_NAME, VALIDATE_TENANT_POLICY_PATH,
                     "namespacedadmissionpolicies", ("spec-written", SPEC_WRITTEN)),
        _own_webhook(settings, ca_bundle, EXCEPTION_WEBHOOK_NAMES[0], VALIDATE_EXCEPTION_PATH,
                     "admissionpolicyexceptions", ("record-or-spec-written", RECORD_OR_SPEC_WRITTEN)),
    ]
    webhooks += _routed_webhooks(settings, ca_bundle, routes, discovered, mutating=False)
    webhooks.append(_probe_webhook(settings, ca_bundle, webhooks))
    return _configuration("ValidatingWebhookConfiguration", settings, webhooks)


def probe_name(validating: Mapping[str, Any]) -> str:
    """The name of the dry-run Event that only this configuration routes to the operator: once the
    API server refuses it with that name, it routes by this configuration (operator/native.py)."""
    for webhook in validating.get("webhooks") or ():
        if webhook.get("name") == PROBE_WEBHOOK_NAME:
            return str(webhook["matchConditions"][0]["expression"]).split("'")[1]
    raise ValueError("a ValidatingWebhookConfiguration without the probe entry")


def _probe_webhook(settings: OperatorConfig, ca_bundle: str, webhooks: list[dict[str, Any]]) -> dict[str, Any]:
    """An entry for one Event name, made of a digest of every other entry (so replicas writing the
    same routes write the same name): no request but the operator's own dry-run probe matches it,
    and its failurePolicy is Ignore, in the operator's namespace alone."""
    digest = hashlib.sha256(json.dumps(webhooks, sort_keys=True).encode()).hexdigest()[:20]
    return {
        "name": PROBE_WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "clientConfig": _client_config(settings, ca_bundle, PROBE_PATH),
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchExpressions": [
            {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": [settings.namespace]}]},
        "matchConditions": [{"name": "probe", "expression": f"request.name == '{PROBE_PREFIX}{digest}'"}],
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["events"],
                   "scope": "Namespaced"}],
        "sideEffects": "None",
        "timeoutSeconds": settings.webhook_timeout,
    }


def build_mutating_configuration(
    settings: OperatorConfig,
    ca_bundle: str,
    routes: Collection[RouteRule],
    discovered: Collection[DiscoveredResource],
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration: the fixed entry recording who creates and approves an
    exception, plus the routed rules of the policies that mutate."""
    webhooks = [_own_webhook(settings, ca_bundle, EXCEPTION_WEBHOOK_NAMES[1], MUTATE_EXCEPTION_PATH,
                             "admissionpolicyexceptions", ("record-or-spec-written", RECORD_OR_SPEC_WRITTEN))]
    webhooks += _routed_webhooks(settings, ca_bundle, routes, discovered, mutating=True)
    return _configuration("MutatingWebhookConfiguration", settings, webhooks)


class WebhookConfigurationsApi(Protocol):
    """The part of ``kubernetes_asyncio.client.AdmissionregistrationV1Api`` used here."""

    def read_validating_webhook_configuration(self, name: str) -> Awaitable[Any]: ...
    def create_validating_webhook_configuration(self, body: Any) -> Awaitable[Any]: ...
    def replace_validating_webhook_configuration(self, name: str, body: Any) -> Awaitable[Any]: ...
    def read_mutating_webhook_configuration(self, name: str) -> Awaitable[Any]: ...
    def create_mutating_webhook_configuration(self, body: Any) -> Awaitable[Any]: ...
    def replace_mutating_webhook_configuration(self, name: str, body: Any) -> Awaitable[Any]: ...


async def apply_configurations(
    api: WebhookConfigurationsApi, validating: Mapping[str, Any], mutating: Mapping[str, Any]
) -> bool:
    """Create or replace both configurations, writing only what differs; True if anything was written.

    Replace carries the read ``resourceVersion``; a 409 from a concurrent replica re-reads, and
    since every replica builds identical bodies the retry usually finds nothing left to do.
    """
    wrote_validating = await _apply(
        validating,
        api.read_validating_webhook_configuration,
        api.create_validating_webhook_configuration,
        api.replace_validating_webhook_configuration,
    )
    wrote_mutating = await _apply(
        mutating,
        api.read_mutating_webhook_configuration,
        api.create_mutating_webhook_configuration,
        api.replace_mutating_webhook_configuration,
    )
    return wrote_validating or wrote_mutating


# ---- building -------------------------------------------------------------------------------


def _configuration(kind: str, settings: OperatorConfig, webhooks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {
            "name": settings.webhook_config_name,
            "labels": {"app.kubernetes.io/managed-by": "admission-policy-operator"},
        },
        "webhooks": webhooks,
    }


# Only where a spec is written: an UPDATE that leaves the spec alone (finalizers, labels, status)
# or touches an object being deleted never calls the operator, so a policy can always be released
# and deleted by hand while the operator is down. Kubernetes >= 1.28 (matchConditions beta, on by
# default); older API servers drop the field and call for every UPDATE, which the handler lets through.
SPEC_WRITTEN = ("request.operation == 'CREATE' || (!has(object.metadata.deletionTimestamp)"
                " && (has(object.spec) != has(oldObject.spec) || (has(object.spec) && object.spec != oldObject.spec)))")


def _own_webhook(settings: OperatorConfig, ca_bundle: str, name: str, path: str, resource: str,
                 condition: tuple[str, str]) -> dict[str, Any]:
    """A fixed entry for one of the operator's own kinds, CREATE/UPDATE only, so deleting one never
    depends on the operator being up. No namespaceSelector: an AdmissionPolicy is cluster-scoped,
    the operator's own namespace holds the exceptions for cluster-scoped objects, and a tenant
    policy in an exempt namespace must be refused, not let through. No break-glass either: nothing
    may smuggle in a policy whose CEL does not compile, nor an approval."""
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": _client_config(settings, ca_bundle, path),
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "matchConditions": [{"name": condition[0], "expression": condition[1]}],
        "rules": [
            {
                "apiGroups": [DOMAIN],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": [resource],
                "scope": "*" if resource == "admissionpolicies" else "Namespaced",
            }
        ],
        "sideEffects": "None",
        "timeoutSeconds": settings.webhook_timeout,
    }


# An exception's record is in its annotations (operator/exceptionreview.py): a write of them, as of
# the spec, is reviewed; status, labels and finalizers are not, nor is anything of an exception
# being deleted, so exceptions can always be cleaned up while the operator is down.
RECORD_OR_SPEC_WRITTEN = (
    "request.operation == 'CREATE' || (!has(object.metadata.deletionTimestamp) && ("
    "has(object.spec) != has(oldObject.spec) || (has(object.spec) && object.spec != oldObject.spec)"
    " || has(object.metadata.annotations) != has(oldObject.metadata.annotations)"
    " || (has(object.metadata.annotations) && object.metadata.annotations != oldObject.metadata.annotations)))")


def _routed_webhooks(
    settings: OperatorConfig,
    ca_bundle: str,
    routes: Collection[RouteRule],
    discovered: Collection[DiscoveredResource],
    *,
    mutating: bool,
) -> list[dict[str, Any]]:
    index = ServedIndex(discovered)
    routes = [r for r in routes if r.mutating == mutating]
    fail = atoms([r for r in routes if not r.namespace and r.failure_policy == "Fail"], index)
    ignore = atoms([r for r in routes if not r.namespace and r.failure_policy == "Ignore"], index)
    # A request the Fail webhook already sends us needs no second call from the Ignore one:
    # the handler evaluates every matching policy whichever webhook called it.
    ignore = subtract(ignore, fail)
    kind = "mutate" if mutating else "validate"
    webhooks = _entries(settings, ca_bundle, kind, "", fail, ignore)
    # Tenant policies get entries of their own namespace only: a tenant's failurePolicy Fail must
    # never make another namespace's requests fail while the operator is away. What a cluster-wide
    # entry already sends needs no second call.
    tenants = sorted({r.namespace for r in routes if r.namespace} - set(settings.all_exempt_namespaces))
    for namespace in tenants:
        own = [r for r in routes if r.namespace == namespace]
        tenant_fail = subtract(atoms([r for r in own if r.failure_policy == "Fail"], index), fail)
        tenant_ignore = atoms([r for r in own if r.failure_policy == "Ignore"], index)
        tenant_ignore = subtract(subtract(subtract(tenant_ignore, fail), ignore), tenant_fail)
        webhooks += _entries(settings, ca_bundle, kind, namespace, tenant_fail, tenant_ignore)
    return webhooks


def _entries(settings: OperatorConfig, ca_bundle: str, kind: str, namespace: str, fail: Atoms,
             ignore: Atoms) -> list[dict[str, Any]]:
    """The entries for these atoms: cluster-wide (``namespace`` ""), or for one tenant namespace."""
    prefix = f"{namespace}.tenant." if namespace else ""
    namespaces = ({"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": [namespace]} if namespace else
                  {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": sorted(settings.all_exempt_namespaces)})
    break_glass = break_glass_condition(settings.break_glass_users, settings.break_glass_groups)
    webhooks = []
    for policy, routed in (("Fail", fail), ("Ignore", ignore)):
        objects, connects = _split_connect(routed)
        # A CONNECT's object is its options (PodExecOptions...), which carry no labels: CONNECT
        # rules get entries of their own, without the break-glass (it could never hold).
        for name, part, connect in ((f"{prefix}{policy.lower()}.{kind}.{DOMAIN}", objects, False),
                                    (f"{prefix}{policy.lower()}.connect.{kind}.{DOMAIN}", connects, True)):
            if not part:
                continue
            webhook: dict[str, Any] = {
                "name": name,
                "admissionReviewVersions": ["v1"],
                "clientConfig": _client_config(settings, ca_bundle, MUTATE_PATH if kind == "mutate" else VALIDATE_PATH),
                "failurePolicy": policy,
                "matchPolicy": "Equivalent",
                "namespaceSelector": {"matchExpressions": [namespaces]},
                # A namespaceSelector does not hold back cluster-scoped objects (but Namespaces): a
                # tenant's entry routes namespaced objects only, or its Fail would reach every CRD write.
                "rules": admission_rules(part, "Namespaced" if namespace else "*"),
                "sideEffects": "None",
                "timeoutSeconds": settings.webhook_timeout,
            }
            # No objectSelector: labels are the writer's own, so none may keep a write from the
            # policies; the break-glass label counts only for the identities the admin named.
            conditions = [] if connect or break_glass is None else [dict(break_glass)]
            if any((group, plural(resource)) == CRDS for group, _, resource in part):
                conditions.append(dict(NOT_OWN_CRD))
            if conditions:
                webhook["matchConditions"] = conditions
            if kind == "mutate":
                webhook["reinvocationPolicy"] = "IfNeeded"
            webhooks.append(webhook)
    return webhooks


def _split_connect(routed: Atoms) -> tuple[Atoms, Atoms]:
    """(everything but CONNECT, CONNECT alone); only subresources (pods/exec...) are ever connected."""
    objects: Atoms = {}
    connects: Atoms = {}
    for target, operations in routed.items():
        if "/" in target[2] and "CONNECT" in explicit(operations):
            connects[target] = {"CONNECT"}
            rest = explicit(operations) - {"CONNECT"}
            if rest:
                objects[target] = rest
        else:
            objects[target] = operations
    return objects, connects


def _client_config(settings: OperatorConfig, ca_bundle: str, path: str) -> dict[str, Any]:
    encoded = base64.b64encode(ca_bundle.encode("ascii")).decode("ascii")
    if settings.advertised_url:
        return {"url": f"{settings.advertised_url}{path}", "caBundle": encoded}
    return {
        "service": {
            "namespace": settings.namespace,
            "name": settings.service_name,
            "port": settings.service_port,
            "path": path,
        },
        "caBundle": encoded,
    }


# ---- applying -------------------------------------------------------------------------------


async def _apply(
    desired: Mapping[str, Any],
    read: Callable[[str], Awaitable[Any]],
    create: Callable[[Any], Awaitable[Any]],
    replace: Callable[[str, Any], Awaitable[Any]],
) -> bool:
    name: str = desired["metadata"]["name"]
    kind: str = desired["kind"]
    for _ in range(MAX_CONFLICT_RETRIES):
        try:
            existing = _as_dict(await read(name))
        except ApiException as exc:
            if exc.status != 404:
                raise
            existing = None

        try:
            if existing is None:
                await create(dict(desired))
                logger.info("Created %s %s.", kind, name)
                return True
            if holds(existing, desired):
                return False
            body = {**desired, "metadata": {**desired["metadata"], **_version_of(existing)}}
            await replace(name, body)
            logger.info("Updated %s %s.", kind, name)
            return True
        except ApiException as exc:
            if exc.status != 409:
                raise
    raise RuntimeError(f"{kind} {name} kept changing during {MAX_CONFLICT_RETRIES} attempts")


def _version_of(existing: Mapping[str, Any]) -> dict[str, str]:
    version = existing.get("metadata", {}).get("resourceVersion")
    return {"resourceVersion": version} if version else {}


def _as_dict(obj: Any) -> dict[str, Any]:
    """Plain camelCase dict of what the client returned (a model object, or already a dict)."""
    if isinstance(obj, dict):
        return obj
    result: dict[str, Any] = obj.to_dict(serialize=True)
    return result


def holds(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether a configuration read from the API server is ``desired``: its webhooks exactly (a
    rule removed, a failurePolicy changed or a webhook added by hand is drift) and at least its
    labels (other tools may add their own)."""
    labels = existing.get("metadata", {}).get("labels") or {}
    return equivalent(existing.get("webhooks") or [], desired["webhooks"]) and all(
        labels.get(key) == value for key, value in desired["metadata"]["labels"].items())


async def held_problem(api: WebhookConfigurationsApi, validating: Mapping[str, Any],
                       mutating: Mapping[str, Any]) -> str:
    """What the API server holds differently from these configurations, in words; "" if nothing."""
    problems = []
    for desired, read in ((validating, api.read_validating_webhook_configuration),
                          (mutating, api.read_mutating_webhook_configuration)):
        name, kind = desired["metadata"]["name"], desired["kind"]
        try:
            existing = _as_dict(await read(name))
        except ApiException as exc:
            if exc.status != 404:
                raise
            problems.append(f"{kind} {name} is missing")
            continue
        if not holds(existing, desired):
            problems.append(f"{kind} {name} differs from what the operator wrote")
    return "; ".join(problems)


# What the API server fills in when a field is left out: a field we leave out that holds its
# default (or nothing) is not drift.
SERVER_DEFAULTS: Mapping[str, Any] = {
    "failurePolicy": "Fail", "matchPolicy": "Equivalent", "reinvocationPolicy": "Never", "timeoutSeconds": 10,
    "scope": "*", "port": 443,
}


def equivalent(actual: Any, desired: Any) -> bool:
    """``actual`` is ``desired`` plus, at most, fields holding their server default or nothing."""
    if isinstance(desired, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and equivalent(actual[key], value) for key, value in desired.items()
        ) and all(_empty(value) or SERVER_DEFAULTS.get(key, ...) == value
                  for key, value in actual.items() if key not in desired)
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(desired)
            and all(equivalent(a, d) for a, d in zip(actual, desired, strict=True))
        )
    return bool(actual == desired)


def _empty(value: Any) -> bool:
    """Nothing, however the client spells it: None, [], {} or a model's {"matchLabels": None, ...}."""
    if isinstance(value, Mapping):
        return all(_empty(item) for item in value.values())
    return value is None or value == []
