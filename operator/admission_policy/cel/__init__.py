"""CEL as policies use it: the environment (compile once, evaluate per request), Kubernetes'
libraries, and what keeps an expression within bounds.

- ``environment``: the environment and ``compile_expression``; errors never escape evaluation;
- ``lib``: Kubernetes' CEL libraries, one module each, and cel-go's behaviour where cel-cpp differs;
- ``syntax``: a compiled program's checked tree, read and rewritten (cel-expr-python shows none);
- ``estimation``: a program's cost, estimated from that tree, as Kubernetes estimates it;
- ``fork``: one expression evaluated in a child process, bounded in memory and by a deadline.

Callers use the names below; the modules are imported by name where their own parts are needed.
"""
from .environment import (
    POLICY_BUDGET,
    VARIABLE_TYPES,
    VARIABLES,
    CelCompileError,
    CelEvaluationError,
    CompiledExpression,
    check,
    compile_expression,
    new_activation,
    new_environment,
    referenced_variables,
)

__all__ = [
    "POLICY_BUDGET",
    "VARIABLES",
    "VARIABLE_TYPES",
    "CelCompileError",
    "CelEvaluationError",
    "CompiledExpression",
    "check",
    "compile_expression",
    "new_activation",
    "new_environment",
    "referenced_variables",
]
