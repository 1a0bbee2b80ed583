"""The mutation stage: one policy's mutations applied to the view's object, in order.

Each mutation sees the object as the ones before it left it; a mutation an exception in force
covers is skipped (``waiver``), its verdict still computed so that the exception never changes
what the policy means. The order across policies (and the second pass) is ``evaluation``'s.
"""
from __future__ import annotations

from typing import Any

from ..api import non_finite
from ..cel import CelEvaluationError
from . import plugincalls
from .compiler import BoundPlugin, CompiledMutation, CompiledPatchOperation, CompiledPolicy
from .patching import PatchError, apply_operation, clone, json_equal, merge
from .plugincalls import PluginCallError
from .scope import Scope, View
from .selection import conditions_hold, selected
from .verdicts import PolicyVerdict
from .waiver import Waiver


def mutate(view: View, policy: CompiledPolicy, verdict: PolicyVerdict, waiver: Waiver | None) -> None:
    if view.object is None:
        return  # DELETE: nothing to mutate, and the API server ignores patches there
    if not selected(view, policy):
        return
    scope = Scope(view, policy)
    if not conditions_hold(scope, verdict):
        return
    verdict.applies = True
    for mutation in policy.mutations:
        try:
            changed = _apply(mutation, scope)
        except (CelEvaluationError, PatchError, PluginCallError) as error:
            if waiver is not None and waiver.waived(view, policy, mutation.spec.name):
                continue
            path = mutation.spec.path if isinstance(error, PatchError) else ""
            if scope.fail(verdict, error, path):
                verdict.fatal = True
                return
            continue
        if changed is None or (waiver is not None and waiver.waived(view, policy, mutation.spec.name)):
            continue
        view.replace(changed)
        verdict.mutated = True
        scope = Scope(view, policy, apart=scope.apart)


def _apply(mutation: CompiledMutation, scope: Scope) -> Any:
    """The object after this mutation, or None when it does not apply or changes nothing."""
    if mutation.plugin is not None and not mutation.plugin.enabled:
        return None
    if mutation.condition is not None and not scope.evaluate(mutation.condition):
        return None
    before = result = scope.view.object
    if mutation.plugin is not None:
        result = _plugin_mutation(mutation.plugin, scope)
    elif mutation.spec.merge is not None:
        if_absent = mutation.spec.merge_mode == "IfAbsent"
        result = merge(result, clone(mutation.spec.merge), if_absent=if_absent)
    else:
        # Values are computed against the object as it was before this mutation.
        operations = [_operation(op, scope) for op in mutation.operations]
        for operation in operations:
            result = apply_operation(result, operation)
    return None if json_equal(result, before) else result


def _operation(compiled: CompiledPatchOperation, scope: Scope) -> dict[str, Any]:
    """The RFC 6902 operation, its value computed now when it is an expression."""
    spec = compiled.spec
    operation: dict[str, Any] = {"op": spec.op, "path": spec.path}
    if spec.from_ is not None:
        operation["from"] = spec.from_
    if spec.has_value:
        # A copy of the policy's own value: the patched object must not share it (apply_operation).
        if compiled.value is None:
            operation["value"] = clone(spec.value)
        else:
            value = operation["value"] = scope.evaluate(compiled.value)
            if non_finite(value):
                raise CelEvaluationError(compiled.value.path, f"evaluated to {non_finite(value)}, which is "
                                                              "not a JSON number and cannot go into a patch")
    return operation


def _plugin_mutation(bound: BoundPlugin, scope: Scope) -> Any:
    answer = scope.call(bound, plugincalls.mutate, lambda found: "unchanged" if found is None else "mutated")
    obj = scope.view.object
    if answer is None:
        return obj
    if isinstance(answer, dict):
        return answer
    for operation in answer:   # JSON data the plugin no longer holds (plugincalls.mutate)
        obj = apply_operation(obj, operation)
    return obj
