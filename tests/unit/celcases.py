"""Evaluate one CEL expression the way a policy's would be: for the per-library tables."""
from __future__ import annotations

from typing import Any

from admission_policy.api import Expression
from admission_policy.cel import CelCompileError, CelEvaluationError, compile_expression, new_activation

__all__ = ["CelCompileError", "CelEvaluationError", "compile_error", "evaluate", "evaluation_error"]


def evaluate(source: str, **bindings: Any) -> Any:
    """The plain result (opaque values as their text), or CelEvaluationError."""
    compiled = compile_expression(Expression(source, "spec.validations[0].expression"))
    return compiled.evaluate(new_activation(bindings))


def evaluation_error(source: str, **bindings: Any) -> str:
    """The message of the evaluation error ``source`` must raise."""
    try:
        value = evaluate(source, **bindings)
    except CelEvaluationError as error:
        return error.message
    raise AssertionError(f"{source} evaluated to {value!r}, not an error")


def compile_error(source: str) -> str:
    """The message of the compile error ``source`` must raise."""
    try:
        compile_expression(Expression(source, "spec.validations[0].expression"))
    except CelCompileError as error:
        return error.message
    raise AssertionError(f"{source} compiled")
