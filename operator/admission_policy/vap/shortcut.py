"""``any-validation-fails``: the last match condition of a generated ValidatingAdmissionPolicy,
which lets Kubernetes skip a request every validation admits.

Kubernetes evaluates every messageExpression of a policy it applies, on every request, whatever
the validations decided, in a pass of its own that computes the variables they read again (the
engine builds a message only for a failure). A policy whose messages name what is at fault would
build those lists for every request. With this condition false, the policy does not apply: the
validations do not run a second time, and no message is built.

It decides as the validations do, under ``failurePolicy: Fail`` (the caller's to ensure): it is
false only when every check is true, so nothing they would refuse is skipped; an error where no
check is false goes to the failurePolicy, as the failed validation's error would. Match
conditions have no variables: each is written out where it is read, or, where a check cannot be
true once that variable errs (it reads it strictly: ``variables.x.all(…)``, ``a && variables.x``),
evaluated once up front (``[x].all(_x, …)``), since the validations would then refuse as well.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Final

from ..cel import syntax
from ..cel.lib import compat
from .expressions import NotNative, checked_tree, inline_variables

ANY_VALIDATION_FAILS: Final = "any-validation-fails"
# What Kubernetes binds otherwise in match conditions than in validations: no namespace
# (namespaceObject is null there), and request.resource is the request's own where validations
# see the one the policy matched (they differ under matchPolicy: Equivalent).
_UNLIKE_IN_CONDITIONS: Final = frozenset({"namespaceObject"})
_UNLIKE_REQUEST_FIELDS: Final = frozenset({"resource"})
_GLOBALS: Final = frozenset({"object", "oldObject", "request", "params", "namespaceObject", "authorizer", "variables"})
# cel-go's default limit of an expression's length, in code points.
_EXPRESSION_LIMIT: Final = 100_000
# Calls whose argument's error need not be theirs (besides &&, || and ?:, which _strict reads):
# the optional functions may not evaluate an argument, a loop's condition is not strict.
_NOT_STRICT: Final = frozenset({"@not_strictly_false", "or", "orValue", "optional.none", "optional.of",
                                "optional.ofNonZeroValue", "hasValue", "value"})


@functools.lru_cache(maxsize=1024)
def any_validation_fails(checks: tuple[str, ...], variables: tuple[tuple[str, str], ...]) -> dict[str, str] | None:
    """The condition for these ``checks`` (the validations' expressions, as generated) and the
    policy's ``variables`` (name, text). ``None`` where the checks read what Kubernetes binds
    otherwise in match conditions, or do not rewrite faithfully.

    Kubernetes evaluates every match condition, so this one runs the checks where an earlier one
    is false too (an UPDATE that leaves the Pod alone). Repeating the earlier ones in front of the
    checks would spare that, but cost more on every other request, measured (bench/README.md)."""
    try:
        upfront = _read_strictly(checks, variables)
        reads: dict[str, str] = {}        # what ``variables.<name>`` becomes
        bindings: list[tuple[str, str]] = []
        for name, text in variables:      # each may read those before it
            own = inline_variables(text, reads, f"spec.variables[{name}]")
            if name in upfront:
                bindings.append((f"_{name}", own))
                own = f"_{name}"
            reads[name] = own
        body = " && ".join(f"({inline_variables(text, reads, 'spec.validations')})" for text in checks)
    except (NotNative, RuntimeError):   # RuntimeError: not our CEL to rewrite (portability says so)
        return None
    for binder, own in reversed(bindings):
        body = f"[{own}].all({binder}, {body})"
    if not _reads_alike_in_conditions(body, [binder for binder, _ in bindings]):
        return None
    expression = f"!({body})"
    if len(expression) > _EXPRESSION_LIMIT:
        return None
    return {"name": ANY_VALIDATION_FAILS, "expression": expression}


def _read_strictly(checks: Iterable[str], variables: tuple[tuple[str, str], ...]) -> set[str]:
    """The variables some check cannot be true without: an error in one makes that check false or
    an error, and so the validation refuses (under Fail) whenever it errs. Evaluating those before
    every check changes no answer; any other is written out where it is read."""
    found: set[str] = set()
    for text in checks:
        errs, not_true = _strict(_tree(text))
        found |= errs | not_true
    for name, text in reversed(variables):   # one read strictly reads strictly what it errs without
        if name in found:
            found |= _strict(_tree(text))[0]
    return found


def _tree(text: str) -> tuple[syntax.Expr, Mapping[int, str]]:
    checked = checked_tree(compat.respell(text))
    return checked.root, checked.names


def _strict(tree: tuple[syntax.Expr, Mapping[int, str]]) -> tuple[set[str], set[str]]:
    """(the variables whose error makes ``tree`` an error, those whose error makes it false or an error)."""
    root, names = tree

    def walk(node: syntax.Expr) -> tuple[set[str], set[str]]:
        if node.kind == "select" and node.target is not None and names.get(node.target.id) == "variables":
            return (set(), set()) if node.test_only else ({node.name}, set())
        if node.kind == "comprehension":   # the range and the initial value; the steps may not run
            return set().union(*(walk(node.comprehension[key])[0] for key in ("iter_range", "accu_init")
                                 if key in node.comprehension)), set()
        if node.kind == "call" and node.name in _NOT_STRICT:
            return set(), set()
        parts = [walk(child) for child in node.children()]
        if node.kind == "call" and node.name == "_&&_":
            return parts[0][0] & parts[1][0], set().union(*(errs | not_true for errs, not_true in parts))
        if node.kind == "call" and node.name == "_||_":
            (first, first_not), (second, second_not) = parts
            return first & second, (first | first_not) & (second | second_not)
        if node.kind == "call" and node.name == "_?_:_":
            (cond, _), (then, then_not), (other, other_not) = parts
            return cond | (then & other), cond | ((then | then_not) & (other | other_not))
        return set().union(*(errs for errs, _ in parts)), set()
    return walk(root)


def _reads_alike_in_conditions(expression: str, binders: Iterable[str]) -> bool:
    """Whether ``expression`` reads only what match conditions bind as validations do, and binds
    no loop variable by a name the written-out variables read (it would capture their reads)."""
    try:
        root, names = _tree(expression)
    except RuntimeError:
        return False
    parents = {child.id: node for node in syntax.walk(root) for child in node.children()}
    bound: list[str] = []
    for node in syntax.walk(root):
        name = names.get(node.id)
        if name in _UNLIKE_IN_CONDITIONS:
            return False
        if name == "request":
            parent = parents.get(node.id)
            if parent is None or parent.kind != "select" or parent.name in _UNLIKE_REQUEST_FIELDS:
                return False
        if node.kind == "comprehension":
            bound += [str(node.comprehension[key]) for key in ("iter_var", "iter_var2") if node.comprehension.get(key)]
    return not _GLOBALS & set(bound) and all(bound.count(binder) == 1 for binder in binders)
