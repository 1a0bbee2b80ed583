"""Params and context objects given in files (``--param``, ``--context``, a suite's ``params`` and
``context``), checked against the policies that read them.

An object no policy would read, or a context name no policy declares, is a typo until shown
otherwise: silently ignored, it would turn into an "allowed" or a "no policy matched". Objects are
matched as the operator's caches match them: params by paramKind's group and kind, context by the
entry's group and resource, at any version of the group (the API server serves each stored
version converted to the one watched).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import api
from ..engine import CompiledPolicy, StaticInputs
from ..engine.inputs import describe, is_of_kind
from .documents import DocumentError, Found
from .requests import resource_of


def checked_inputs(policies: Iterable[CompiledPolicy], params: Sequence[Found],
                   context: Mapping[str, tuple[str, Sequence[Found]]]) -> StaticInputs:
    """``context``: by entry name, where the name was given (for the message) and its objects."""
    policies = list(policies)
    kinds = {kind for p in policies if (kind := p.policy.param_kind) is not None}
    for found in params:
        _check_param(kinds, *found)
    for name, (where, objects) in context.items():
        entries = _entries(policies, name, where)
        for found in objects:
            _check_context_object(entries, name, *found)
    return StaticInputs([body for _, body in params],
                        {name: [body for _, body in objects] for name, (_, objects) in context.items()})


def _check_param(kinds: set[api.ParamKind], source: str, body: Mapping[str, Any]) -> None:
    if any(is_of_kind(body, kind) for kind in kinds):
        return
    read = f"they read {', '.join(sorted(map(str, kinds)))}" if kinds else "none sets spec.paramKind"
    raise DocumentError(f"{source}: {describe(body)} ({body.get('apiVersion')}) is not the spec.paramKind of any "
                        f"policy ({read})")


def _entries(policies: list[CompiledPolicy], name: str, where: str) -> list[tuple[str, api.ContextEntry]]:
    entries = [(f"{p.policy.kind} {p.name!r}", entry) for p in policies for entry in p.policy.context
               if entry.name == name]
    if not entries:
        declared = sorted({entry.name for p in policies for entry in p.policy.context})
        raise DocumentError(f"{where}: no policy declares context {name!r} in spec.context "
                            f"(declared: {', '.join(declared) or 'none'})")
    return entries


def _check_context_object(entries: list[tuple[str, api.ContextEntry]], name: str, source: str,
                          body: Mapping[str, Any]) -> None:
    for policy, entry in entries:
        if not _is_of_source(body, entry.source):
            group = entry.source.group or "core"
            raise DocumentError(f"{source}: {describe(body)} ({body.get('apiVersion')}) is not what context "
                                f"{name!r} of {policy} lists: {entry.source.resource} of API group "
                                f"{group} ({entry.path})")


def _is_of_source(body: Mapping[str, Any], source: api.ContextSource) -> bool:
    """Offline there is no discovery: the kind's plural stands for its resource (a kind named
    like its resource, as Endpoints, counts too)."""
    gvr = resource_of(body)
    return gvr["group"] == source.group and source.resource in (gvr["resource"], str(body.get("kind", "")).lower())
