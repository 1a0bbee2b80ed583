"""What one CEL library is: its functions, and where it comes from (for the docs' table).

cel-expr-python registers a function's implementation under its name, call style and the
*kinds* of its arguments, and every message type is the same kind: ``isGreaterThan`` of
semvers and of quantities, or ``sum`` of a list of ints and of a list of quantities, collide
("CelFunction with specified parameters already registered"). So a library states its overloads
as plain data, and ``implementations`` gives the runtime one function per such group, which
picks the overload by the Python types of the arguments. Declarations keep every overload, so
the type-checker still tells them apart as Kubernetes' does.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from cel_expr_python import cel

from .types import NAMES, opaque


@dataclasses.dataclass(frozen=True)
class Overload:
    """One overload; ``impl`` raising ValueError is a CEL error whose message is the exception's text
    (``ValueError("invalid ip: x")`` reads "invalid ip: x"), as Kubernetes' ``types.NewErr`` would."""
    id: str
    result: cel.Type
    params: tuple[cel.Type, ...]
    impl: Callable[..., Any]
    member: bool = False


@dataclasses.dataclass(frozen=True)
class Function:
    """A CEL function as the environment declares it: one name, the overloads it accepts."""
    name: str
    overloads: tuple[Overload, ...]


@dataclasses.dataclass(frozen=True)
class Library:
    """A set of CEL functions added to every policy's environment.

    ``since``: the Kubernetes version whose ValidatingAdmissionPolicy environment has it
    ("1.30"), or "ours" for an extension of this project (which only adds: no Kubernetes
    expression means something else because of it).
    """
    name: str
    since: str
    functions: tuple[Function, ...] = ()
    summary: str = ""

    def names(self) -> tuple[str, ...]:
        """The function names it declares, for the docs and for portability checks."""
        return tuple(dict.fromkeys(function.name for function in self.functions))


def overload(overload_id: str, result: cel.Type, params: Sequence[cel.Type], impl: Callable[..., Any], *,
             member: bool = False) -> Overload:
    """An Overload, as the libraries' tables write it (parameters as any sequence)."""
    return Overload(overload_id, result, tuple(params), impl, member)


def function(name: str, *overloads: Overload) -> Function:
    """A Function, as the libraries' tables write it."""
    return Function(name, overloads)


def accepts(convert: Callable[..., object], refusal: type[Exception] = ValueError) -> Callable[..., bool]:
    """The implementation of a test such as ``isIP(s)`` from that of its conversion ``ip(s)``:
    Kubernetes' tests answer exactly "would the conversion succeed", so they cannot drift apart.
    Only ``refusal`` means "no"; any other error stays an error."""
    def test(*args: Any) -> bool:
        try:
            convert(*args)
        except refusal:
            return False
        return True
    return test


# Functions of the standard library that libraries add overloads to. The environment refuses a
# second declaration of these ("declared multiple times"), so their overloads go in an extension,
# which registers an implementation per overload: they cannot share a group (see the module doc).
# The orderings (<, <=, >, >=) are not here: ``compat`` declares them anew, all overloads together.
STANDARD: Final = frozenset({"string", "_+_", "_-_", "_==_", "_!=_", "size", "int", "double", "uint", "bytes",
                             "reverse", "indexOf", "lastIndexOf"})


def declarations(functions: Iterable[Function]) -> list[cel.FunctionDecl]:
    """What the type-checker sees: every overload of a new function, without implementations."""
    merged: dict[str, list[Overload]] = {}
    for declared in functions:
        if declared.name not in STANDARD:
            merged.setdefault(declared.name, []).extend(declared.overloads)
    return [cel.FunctionDecl(name, [cel.Overload(o.id, return_type=o.result, parameters=list(o.params),
                                                 is_member=o.member) for o in overloads])
            for name, overloads in merged.items()]


def extension(functions: Iterable[Function]) -> cel.CelExtension:
    """The overloads added to standard functions, each with its implementation."""
    merged: dict[str, list[Overload]] = {}
    for declared in functions:
        if declared.name in STANDARD:
            merged.setdefault(declared.name, []).extend(declared.overloads)
    return cel.CelExtension("kubernetes-standard", [
        cel.FunctionDecl(name, [cel.Overload(o.id, return_type=o.result, parameters=list(o.params),
                                             is_member=o.member, impl=o.impl) for o in overloads])
        for name, overloads in merged.items()])


def implementations(functions: Iterable[Function]) -> dict[str, Callable[..., Any]]:
    """The runtime's implementations by overload id: one per group the runtime cannot tell apart."""
    groups: dict[tuple[str, bool, tuple[str, ...]], list[Overload]] = {}
    for declared in functions:
        if declared.name in STANDARD:
            continue
        for one in declared.overloads:
            groups.setdefault((declared.name, one.member, tuple(_kind(p) for p in one.params)), []).append(one)
    result: dict[str, Callable[..., Any]] = {}
    for (name, _, _), overloads in groups.items():
        result[overloads[0].id] = overloads[0].impl if len(overloads) == 1 else _dispatcher(name, overloads)
    return result


def _kind(type_: cel.Type) -> str:
    if type_.is_message():
        return "message"
    name = type_.name()
    return "list" if name.startswith("LIST") else "map" if name.startswith("MAP") else name


def _dispatcher(name: str, overloads: Sequence[Overload]) -> Callable[..., Any]:
    """The first overload whose message-typed parameters the arguments are values of."""
    def dispatch(*args: Any) -> Any:
        for one in overloads:
            if all(_accepts(param, arg) for param, arg in zip(one.params, args, strict=False)):
                return one.impl(*args)
        raise ValueError(f"no such overload: {name}")
    return dispatch


def _accepts(param: cel.Type, arg: Any) -> bool:
    name = param.name()
    if param.is_message():
        return name in NAMES and opaque(name).is_value(arg)
    if name.startswith("LIST<") and name[5:-1] in NAMES:   # a list of one opaque type: not empty
        element = opaque(name[5:-1])
        return isinstance(arg, list) and bool(arg) and all(element.is_value(item) for item in arg)
    return True
