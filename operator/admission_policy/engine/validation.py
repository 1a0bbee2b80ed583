"""The validation stage: one policy's validations judged on the view's object, each verdict
recorded with its rule's identity; a messageExpression is evaluated only for a failure.

Most policies run as one batch program (``compiler``: every validation's result, or False when a
match condition does not hold); when it errs, the validations run one program at a time to find
which rule erred.
"""
from __future__ import annotations

from typing import Any

from ..cel import CelEvaluationError
from . import plugincalls
from .compiler import CompiledPolicy, CompiledValidation
from .plugincalls import PluginCallError
from .scope import Scope, View
from .selection import conditions_hold, selected
from .verdicts import PolicyVerdict, rule_of


def validate(view: View, policy: CompiledPolicy, verdict: PolicyVerdict) -> None:
    if not selected(view, policy):
        return
    scope = Scope(view, policy)
    if policy.validation_batch is not None:
        try:
            results = scope.evaluate(policy.validation_batch)
        except CelEvaluationError:
            results = None   # find out which expression erred, one program at a time
        if results is False:
            return           # a match condition does not hold
        if isinstance(results, list) and len(results) == len(policy.validations) and all(
                isinstance(result, (bool, list)) for result in results):
            verdict.applies = True
            for validation, result in zip(policy.validations, results, strict=True):
                if result is False:   # with a messageExpression only when the batch could not hold it
                    _failed(scope, validation, verdict)
                elif isinstance(result, list) and result:   # [messageExpression's result]
                    _record_failure(validation, result[0], verdict)
            return
    if not conditions_hold(scope, verdict):
        return
    verdict.applies = True
    for validation in policy.validations:
        if validation.check is None:
            _plugin_validation(scope, validation, verdict)
            continue
        try:
            if scope.evaluate(validation.check):
                continue
        except CelEvaluationError as error:
            if scope.fail(verdict, error, rule=rule_of(validation.path)):
                verdict.failed(validation.path, f"{error.path}: {error.message}{view.with_param()}", error=True)
                verdict.reason = verdict.reason or "Forbidden"
            continue
        _failed(scope, validation, verdict)


def _failed(scope: Scope, validation: CompiledValidation, verdict: PolicyVerdict) -> None:
    """Record a failed validation, with its messageExpression evaluated now."""
    text: Any = None
    if validation.message is not None:
        try:
            text = scope.evaluate(validation.message)
        except CelEvaluationError as error:
            verdict.erred(scope.policy, rule_of(validation.path), str(error))
    _record_failure(validation, text, verdict)


def _record_failure(validation: CompiledValidation, text: Any, verdict: PolicyVerdict) -> None:
    """A failed validation with its message: ``text`` (its messageExpression's result) when that
    is a string with something in it, else its message, else its source."""
    verdict.reason = verdict.reason or validation.spec.reason
    if not (isinstance(text, str) and text.strip()):
        source = validation.check.expression.source.strip() if validation.check is not None else validation.path
        text = validation.spec.message or f"failed expression: {source}"
    verdict.failed(validation.path, text)


def _plugin_validation(scope: Scope, validation: CompiledValidation, verdict: PolicyVerdict) -> None:
    bound = validation.plugin
    assert bound is not None
    if not bound.enabled:
        return
    try:
        failures = scope.call(bound, plugincalls.validate, lambda found: "failed" if found else "passed")
    except PluginCallError as error:
        if scope.fail(verdict, error, rule=rule_of(bound.path)):
            verdict.failed(bound.path, str(error), error=True)
            verdict.reason = verdict.reason or "Forbidden"
        return
    if failures:
        verdict.reason = verdict.reason or validation.spec.reason
        for failure in failures:
            verdict.failed(bound.path, failure)
