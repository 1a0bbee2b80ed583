"""Whether a candidate policy judges this request: first the checks that need no CEL (a tenant
policy's namespace, excluded namespaces, selectors, a workload's unchanged Pod template), then
its match conditions. ``PolicySet.candidates`` has already matched the resource and operation.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..api import LabelSelector
from ..cel import CelEvaluationError
from .compiler import CompiledPolicy
from .inputs import labels_of
from .patching import json_equal
from .podcontrollers import template_of
from .request import AdmissionRequest
from .scope import Abort, Scope, View
from .verdicts import PolicyVerdict


def selected(view: View, policy: CompiledPolicy) -> bool:
    """The checks that need no CEL: a tenant policy's own namespace, excluded namespaces and
    label selectors; and, for a Pod policy on a workload, that the Pod template is new or
    changed (see ``_template_changed``)."""
    match = policy.policy.match
    request = view.context.request
    namespace = request.namespace
    if policy.policy.namespace is not None and (namespace != policy.policy.namespace or _is_namespace(
            request)):   # a Namespace's request carries its own name as namespace
        return False
    if namespace and namespace in match.exclude_namespaces:
        return False
    if policy.template and not _template_changed(view, policy.template):
        return False
    if not match.namespace_selector.is_empty and not _namespace_matches(view, match.namespace_selector):
        return False
    return match.object_selector.is_empty or any(
        match.object_selector.matches(labels) for labels in _labels(view, policy.template))


def conditions_hold(scope: Scope, verdict: PolicyVerdict) -> bool:
    """The policy's matchConditions; one that cannot be evaluated is the policy's error."""
    for _name, condition in scope.policy.conditions:
        try:
            if not scope.evaluate(condition):
                return False
        except CelEvaluationError as error:
            if scope.fail(verdict, error):
                verdict.fatal = True
            return False
    return True


def _is_namespace(request: AdmissionRequest) -> bool:
    return request.resource == "namespaces" and request.group == ""


def _template_changed(view: View, location: tuple[str, ...]) -> bool:
    """An UPDATE of a workload that leaves its Pod template as it was makes no Pod unlike
    those it already has, which were judged (or admitted before the policy existed): scaling,
    relabelling the workload, a controller writing its annotations must keep working."""
    request = view.context.request
    if request.operation != "UPDATE" or request.old_object is None:
        return True
    # Once per object (a mutation makes a new one), not once per Pod policy.
    return view.kept(("template changed", location), lambda: not json_equal(
        template_of(view.object, location), template_of(request.old_object, location)))


def _labels(view: View, template: tuple[str, ...] = ()) -> Iterator[Mapping[str, Any]]:
    """The object's labels, old and new; a Pod template's for a Pod policy on a workload
    (the labels its Pods will have)."""
    for body in (view.object, view.context.request.old_object):
        if isinstance(body, Mapping):
            yield labels_of(template_of(body, template) if template else body)


def _namespace_matches(view: View, selector: LabelSelector) -> bool:
    """A cluster-scoped object is not subject to a namespaceSelector; a Namespace is its own."""
    context = view.context
    if _is_namespace(context.request):
        return any(selector.matches(labels) for labels in _labels(view))
    if not context.request.namespace:
        return True
    if context.namespace_error:   # unknown labels are no reason to skip the policy
        raise Abort(f"spec.match.namespaceSelector cannot be judged: {context.namespace_error}")
    return selector.matches(labels_of(context.namespace_object))
