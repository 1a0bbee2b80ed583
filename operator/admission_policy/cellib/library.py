"""What one CEL library is: its functions, and where it comes from (for the docs' table)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from cel_expr_python import cel


@dataclasses.dataclass(frozen=True)
class Library:
    """A set of CEL functions added to every policy's environment.

    ``since``: the Kubernetes version whose ValidatingAdmissionPolicy environment has it
    ("1.30"), or "ours" for an extension of this project (which only adds: no Kubernetes
    expression means something else because of it).
    """
    name: str
    since: str
    functions: tuple[cel.FunctionDecl, ...] = ()
    summary: str = ""


def overload(overload_id: str, result: cel.Type, params: Sequence[cel.Type], impl: Callable[..., Any], *,
             member: bool = False) -> cel.Overload:
    """One overload; ``impl`` raising ValueError is a CEL error whose message is the exception's text
    (``ValueError("invalid ip: x")`` reads "invalid ip: x"), as Kubernetes' ``types.NewErr`` would."""
    return cel.Overload(overload_id, return_type=result, parameters=list(params), is_member=member, impl=impl)


def function(name: str, *overloads: cel.Overload) -> cel.FunctionDecl:
    return cel.FunctionDecl(name, list(overloads))
