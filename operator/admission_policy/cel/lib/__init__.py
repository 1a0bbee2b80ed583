"""Kubernetes' own CEL libraries, as the ValidatingAdmissionPolicy environment has them.

One module per library, each exporting ``LIBRARY`` (``library.Library``); opaque types
(``net.IP``, ``kubernetes.Quantity`` …) are protobuf messages declared in ``types``. The
``cel.environment`` adds every library here to the environment policies are checked in, so a new
library is one module, imported here and named in ``_MODULES``.
"""
from __future__ import annotations

from types import ModuleType
from typing import Final

from . import authz, formats, lists, net, quantity, regex, semver, urls
from .library import Function, Library, Overload, declarations, extension, function, implementations, overload
from .types import may_hold_opaque, opaque, pool, to_plain

_MODULES: Final[tuple[ModuleType, ...]] = (net, urls, regex, semver, formats, quantity, lists, authz)


def libraries() -> tuple[Library, ...]:
    """Each module's ``LIBRARY``, and its ``OURS`` where it has this project's additions apart."""
    found: list[Library] = []
    for module in _MODULES:
        found += [module.LIBRARY] + ([module.OURS] if hasattr(module, "OURS") else [])
    return tuple(found)


def functions() -> list[Function]:
    """Every function of every library, for the fullest CEL environment (``cel.environment``'s last tier)."""
    return [declared for library in libraries() for declared in library.functions]


__all__ = ["Function", "Library", "Overload", "declarations", "extension", "function", "functions", "implementations",
           "libraries", "may_hold_opaque", "opaque", "overload", "pool", "to_plain"]
