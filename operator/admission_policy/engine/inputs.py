"""Params and context: what a policy reads from the cluster besides the request, as plain data.

The engine stays pure: it asks an ``Inputs`` for the objects of a source in a namespace and gets
them at once, from memory. Who fills it is not its concern: the operator's watch-backed caches
(``operator/sources.py``), the CLI's files (``StaticInputs``), a test's dict. A source that is
not in sync says so (``Listing.problem``): the engine then answers with the policy's
failurePolicy rather than judge by a stale or partial list.

Which objects apply to a request (the namespace, paramRef's name or selector) is decided here,
once, for every supplier.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .. import api
from ..errors import AdmissionPolicyError
from .request import AdmissionRequest


@dataclasses.dataclass(frozen=True)
class Listing:
    """The objects of a source in one namespace (or everywhere), as last seen."""
    objects: Sequence[Mapping[str, Any]] = ()
    problem: str = ""     # "" when in sync; else why not (never listed yet, watch down since ...)


class Inputs(Protocol):
    """Where params and context come from. Both calls answer from memory, never waiting."""

    def params(self, kind: api.ParamKind, namespace: str | None) -> Listing:
        """The objects of ``kind`` in ``namespace`` (None: everywhere; ignored for a kind that is
        not namespaced)."""

    def context(self, entry: api.ContextEntry, namespace: str | None) -> Listing:
        """The objects of ``entry.source`` (its label selector applied) in ``namespace`` (None:
        everywhere)."""


class NoInputs:
    """For callers that supply nothing: a policy that reads params or context cannot run."""

    def params(self, kind: api.ParamKind, namespace: str | None) -> Listing:
        return Listing(problem=f"no {kind.kind} objects were supplied")

    def context(self, entry: api.ContextEntry, namespace: str | None) -> Listing:
        return Listing(problem="no objects were supplied for it")


@dataclasses.dataclass(frozen=True)
class StaticInputs:
    """Objects given up front (files, offline; tests): params of any kind, and context lists by
    entry name. An object without ``metadata.namespace`` counts as being in every namespace, so a
    test file need not repeat the namespace its request is in."""
    param_objects: Sequence[Mapping[str, Any]] = ()
    context_objects: Mapping[str, Sequence[Mapping[str, Any]]] = dataclasses.field(default_factory=dict)

    def params(self, kind: api.ParamKind, namespace: str | None) -> Listing:
        return Listing(tuple(body for body in self.param_objects
                             if is_of_kind(body, kind) and _in_namespace(body, namespace)))

    def context(self, entry: api.ContextEntry, namespace: str | None) -> Listing:
        if entry.name not in self.context_objects:
            return Listing(problem=f"no objects were supplied for context {entry.name!r} (give them, even none, in "
                                   f"a test case's context or with --context {entry.name}=FILE_OR_DIR)")
        selector = entry.source.label_selector
        return Listing(tuple(body for body in self.context_objects[entry.name]
                             if _in_namespace(body, namespace) and selector.matches(labels_of(body))))


def is_of_kind(body: Mapping[str, Any], kind: api.ParamKind) -> bool:
    """Whether ``body`` is a ``kind`` object, at any version of its group: the operator finds
    paramKind by group and kind, and the API server serves every version converted to the one watched."""
    return str(body.get("apiVersion", "")).rpartition("/")[0] == kind.group and body.get("kind") == kind.kind


def _in_namespace(body: Mapping[str, Any], namespace: str | None) -> bool:
    found = (body.get("metadata") or {}).get("namespace")
    return namespace is None or not found or found == namespace


def labels_of(body: Any) -> Mapping[str, Any]:
    """``metadata.labels``, or none where the object is shaped otherwise."""
    metadata = body.get("metadata") if isinstance(body, Mapping) else None
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def describe(body: Mapping[str, Any]) -> str:
    """``ConfigMap team-a/quota``: how messages name a param."""
    metadata = body.get("metadata") or {}
    name = f"{metadata.get('namespace')}/{metadata.get('name')}" if metadata.get("namespace") else metadata.get("name")
    return f"{body.get('kind', 'object')} {name}"


class InputsError(AdmissionPolicyError):
    """Params or context that cannot be had for this request: the policy's failurePolicy decides."""


def param_namespace(ref: api.ParamRef, request: AdmissionRequest) -> str | None:
    """paramRef.namespace, else the request's (None for a cluster-scoped request), as a
    ValidatingAdmissionPolicyBinding reads it."""
    return ref.namespace or request.namespace or None


def select_params(policy: api.AdmissionPolicy, request: AdmissionRequest,
                  inputs: Inputs) -> list[Mapping[str, Any]] | None:
    """The param objects to evaluate the policy with, one evaluation each; None when there is
    none and paramRef says Allow (the policy does not apply). Raises InputsError when the objects
    cannot be read, or none is found and paramRef says Deny."""
    kind, ref = policy.param_kind, policy.param_ref
    assert kind is not None and ref is not None
    namespace = param_namespace(ref, request)
    listing = inputs.params(kind, namespace)

    def wanted() -> str:   # for the messages only: not built for a request that finds its param
        matching = api.selector_text(ref.selector or api.LabelSelector()) or "everything"
        return f"{kind.kind} {f'{namespace}/' if namespace else ''}" + (
            ref.name if ref.name is not None else f"objects matching {matching}")

    if listing.problem:
        raise InputsError(f"param {wanted()} cannot be read: {listing.problem}")
    if namespace is None and any((body.get("metadata") or {}).get("namespace") for body in listing.objects):
        # As ValidatingAdmissionPolicy: a namespaced param needs a namespace to be read in.
        raise InputsError(f"param {wanted()} cannot be chosen for a cluster-scoped object: {kind.kind} is namespaced "
                          "and spec.paramRef.namespace is unset")
    if ref.name is not None:
        found = [body for body in listing.objects if (body.get("metadata") or {}).get("name") == ref.name]
    else:
        selector = ref.selector or api.LabelSelector()
        found = [body for body in listing.objects if selector.matches(labels_of(body))]
    found.sort(key=lambda body: ((body.get("metadata") or {}).get("namespace") or "",
                                 (body.get("metadata") or {}).get("name") or ""))
    if found:
        return found
    if ref.not_found_action == "Allow":
        return None
    raise InputsError(f"param {wanted()} not found (spec.paramRef.parameterNotFoundAction is Deny)")


def context_lists(policy: api.AdmissionPolicy, request: AdmissionRequest,
                  inputs: Inputs) -> dict[str, list[Mapping[str, Any]]]:
    """``context.<name>`` for each entry; InputsError when one is not in sync or over its cap."""
    lists: dict[str, list[Mapping[str, Any]]] = {}
    for entry in policy.context:
        namespace = (request.namespace or None) if entry.scope == "RequestNamespace" else None
        listing = inputs.context(entry, namespace)
        if listing.problem:
            raise InputsError(f"context {entry.name!r} ({entry.source}) is not in sync: {listing.problem}")
        if len(listing.objects) > entry.max_objects:
            where = f" in namespace {namespace}" if namespace else ""
            raise InputsError(f"context {entry.name!r} ({entry.source}) holds {len(listing.objects):,} objects{where}, "
                              f"over its maxObjects of {entry.max_objects:,} ({entry.path}.maxObjects)")
        lists[entry.name] = list(listing.objects)
    return lists
