"""Calls of Kubernetes functions that return an optional, rewritten to run in cel-expr-python.

cel-expr-python cannot return an optional from a Python function. So such a function is declared
with its Kubernetes result (for the checker), and in the checked program each call of it becomes
``optional.ofNonZeroValue(<helper>(<its operands>))``: the helper, declared alongside, returns the
value, or its zero value for none (an empty list, a message with no field set), which
``ofNonZeroValue`` turns into ``optional.none()``. Done before any other rewrite, which may copy
calls into nodes the checker never saw.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Final

from ..syntax import Checked, Expr, walk
from .formats import OPTIONAL_RESULTS

# Overload id of a function declared with an optional result → the function that computes it.
HELPERS: Final[Mapping[str, str]] = {**OPTIONAL_RESULTS}


def optional_results(checked: Checked, helpers: Mapping[str, str] = HELPERS) -> bool:
    """Rewrite every call whose overload is in ``helpers`` (see the module doc); True if any was."""
    nodes = list(walk(checked.root))
    ids = itertools.count(max(node.id for node in nodes) + 1)
    changed = False
    for node in nodes:
        chosen = checked.overloads.get(node.id, ())
        if node.kind != "call" or len(chosen) != 1 or chosen[0] not in helpers:
            continue
        operands = ([node.target] if node.target is not None else []) + node.args
        inner = Expr(next(ids), "call", name=helpers[chosen[0]], args=operands)
        node.name, node.target, node.args = "optional.ofNonZeroValue", None, [inner]
        changed = True
    return changed
