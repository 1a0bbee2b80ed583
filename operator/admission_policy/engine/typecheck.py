"""Type-checking a policy's expressions against the schemas of the kinds it matches.

Compiling checks an expression with ``object`` typed ``dyn``, so ``object.spec.contianers`` (a
typo) compiles, and then errs on every request, or passes everything inside ``has()``. Kubernetes
checks a ValidatingAdmissionPolicy's expressions once more with ``object`` and ``oldObject`` typed
by the schema of each kind its rules name, and reports what fails as warnings
(``status.typeChecking``); so does this, at compile time only, never per request:

- the kinds are those Kubernetes picks (``matched_kinds``): rules naming exact groups, versions and
  resources, no wildcard, no subresource, ten kinds at most;
- ``params`` is typed by ``spec.paramKind``, ``namespaceObject`` as a Namespace, ``request`` as
  an AdmissionRequest, ``authorizer`` and the libraries as always; ``context`` stays ``dyn``;
- each variable is typed by what its expression checks to, in order, for the ones after it;
- every expression is checked: match conditions, variables and mutations as well as validations
  and messages (Kubernetes checks the last two only, and says nothing of a typo in a variable).

A Pod rule judges workloads' templates as Pods (``podcontrollers``), so checking it against Pod
checks it for them too. What a schema leaves open is ``dyn`` (``cel.schemas``): the checker stays
silent there rather than warn about an expression that works.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable
from typing import Final

from cel_expr_python import cel

from .. import api
from ..cel import CelCompileError, environment, schemas
from .kinds import Catalog, Kind, kind_name

MAX_KINDS: Final = 10   # as Kubernetes: a policy over more kinds is checked against the first ten

# Kubernetes' AdmissionRequest as CEL sees it (``request``); ``options`` and ``userInfo.extra``
# (a map of lists) hold anything.
_GROUP_VERSION_KIND: Final = {"type": "object", "properties": {
    "group": {"type": "string"}, "version": {"type": "string"}, "kind": {"type": "string"}}}
_GROUP_VERSION_RESOURCE: Final = {"type": "object", "properties": {
    "group": {"type": "string"}, "version": {"type": "string"}, "resource": {"type": "string"}}}
_REQUEST: Final = {"type": "object", "properties": {
    "uid": {"type": "string"},
    "kind": _GROUP_VERSION_KIND, "resource": _GROUP_VERSION_RESOURCE, "subResource": {"type": "string"},
    "requestKind": _GROUP_VERSION_KIND, "requestResource": _GROUP_VERSION_RESOURCE,
    "requestSubResource": {"type": "string"},
    "name": {"type": "string"}, "namespace": {"type": "string"}, "operation": {"type": "string"},
    "userInfo": {"type": "object", "properties": {
        "username": {"type": "string"}, "uid": {"type": "string"},
        "groups": {"type": "array", "items": {"type": "string"}}, "extra": {}}},
    "dryRun": {"type": "boolean"}, "options": {},
}}


@dataclasses.dataclass(frozen=True)
class TypeWarning:
    """One expression's warning, as a ValidatingAdmissionPolicy's ``status.typeChecking`` has it:
    the field, and what the checker said for each kind it failed on."""
    field_ref: str   # spec.validations[0].expression
    warning: str     # "v1, Kind=Pod: undefined field 'contianers' (line 1, column 15)", one line per kind

    def __str__(self) -> str:
        return f"{self.field_ref}: {self.warning}"

    def lines(self) -> list[str]:
        """One line per kind it failed on, each naming the field (admission warnings, ``lint``)."""
        return [f"{self.field_ref}: {line}" for line in self.warning.splitlines()]

    def as_status(self) -> dict[str, str]:
        return {"fieldRef": self.field_ref, "warning": self.warning}


def matched_kinds(policy: api.AdmissionPolicy, catalog: Catalog) -> list[Kind]:
    """The kinds to check against, as Kubernetes picks them: from each rule whose groups and
    versions are all exact, its exact resources (no wildcard, no subresource); sorted by group,
    version and kind; at most MAX_KINDS; a resource without a known schema is left out."""
    found: dict[tuple[str, str, str], Kind] = {}
    for rule in policy.match.resources:
        if any("*" in value for value in (*rule.api_groups, *rule.api_versions)):
            continue
        resources = sorted(r for r in rule.resources if "*" not in r and "/" not in r)
        for group in sorted(rule.api_groups):
            for version in sorted(rule.api_versions):
                for resource in resources:
                    kind = catalog.for_resource(group, version, resource)
                    if kind is not None:
                        found.setdefault((kind.group, kind.version, kind.kind), kind)
                    if len(found) == MAX_KINDS:
                        return _sorted(found.values())
    return _sorted(found.values())


def _sorted(kinds: Iterable[Kind]) -> list[Kind]:
    return sorted(kinds, key=lambda kind: (kind.group, kind.version, kind.kind))


@dataclasses.dataclass(frozen=True)
class TypeCheck:
    """What a policy was checked against (``apps/v1, Kind=Deployment`` …), and its warnings."""
    kinds: tuple[str, ...]
    warnings: tuple[TypeWarning, ...]


def type_check(policy: api.AdmissionPolicy, catalog: Catalog) -> TypeCheck:
    """Every expression that does not check against a kind the policy matches, in field order;
    none when no matched kind has a known schema. The policy must compile (``compile_policy``)."""
    kinds = matched_kinds(policy, catalog)
    if not kinds:
        return TypeCheck((), ())
    params = _params_type(policy, catalog)
    found: dict[str, list[str]] = {}
    for kind in kinds:
        for error in _check(policy, kind.cel_type(), params):
            found.setdefault(error.path, []).append(f"{kind}: {_located(error)}")
    order = {expression.path: index for index, expression in enumerate(policy.expressions())}
    return TypeCheck(tuple(str(kind) for kind in kinds), tuple(
        TypeWarning(path, "\n".join(messages))
        for path, messages in sorted(found.items(), key=lambda item: order.get(item[0], len(order)))))


def _params_type(policy: api.AdmissionPolicy, catalog: Catalog) -> cel.Type:
    if policy.param_kind is None:
        return cel.Type.DYN
    kind = catalog.for_kind(policy.param_kind.group, policy.param_kind.version, policy.param_kind.kind)
    return kind.cel_type() if kind is not None else cel.Type.DYN


def _check(policy: api.AdmissionPolicy, object_type: cel.Type, params: cel.Type) -> list[CelCompileError]:
    """The errors of the policy's expressions with ``object`` typed ``object_type``; each variable
    typed by its expression (``dyn`` when that fails, so one typo is reported once)."""
    types: dict[str, cel.Type] = {"object": object_type, "oldObject": object_type, "params": params,
                                  "request": _request_type(), "namespaceObject": _namespace_type()}
    errors: list[CelCompileError] = []
    checker = environment.typed_environment(types)
    for variable in policy.variables:
        returned, found = environment.type_of(checker, variable.expression)
        errors += found
        types[f"variables.{variable.name}"] = returned
        checker = environment.typed_environment(types)
    variables = {variable.expression.path for variable in policy.variables}
    for expression in policy.expressions():
        if expression.path not in variables:
            errors += environment.type_of(checker, expression)[1]
    return [error for error in errors if _meant(error.message)]


# What the checker says because a schema's object is a message to it, while a request's object
# is a map: adding a list of containers to one of ephemeral containers, ``x.orValue({})``,
# ``x[?'field']``, iterating over an object's keys all work on the map. Such an error names a
# message type (``k8s.schema.…``); one that follows from an earlier one names ``*error*``. And a
# field may hold null in JSON whatever its schema's type, so ``x.name != null`` is no mistake.
_ARTEFACT = re.compile(r"k8s\.schema\.|\*error\*|\bT%\d|\bnull_type\b")
# A message type's name as the user knows it: V1PodSpec → PodSpec, Widget.SpecType → Widget.spec.
_MESSAGE = re.compile(r"k8s\.schema\.s[0-9a-f]+\.(\w+)")
_NESTED = re.compile(r"\.([A-Z])(\w*?)Type\b")


def _meant(message: str) -> bool:
    """Whether an error says what is wrong with the expression (a field the schema lacks, types
    that do not go together) rather than how a message differs from the map a request holds."""
    return message.startswith("undefined field ") or not _ARTEFACT.search(message)


def _located(error: CelCompileError) -> str:
    where = f" (line {error.line}, column {error.column})" if error.column is not None else ""
    message = _MESSAGE.sub(lambda found: kind_name(found[1]), error.message)
    message = _NESTED.sub(lambda found: f".{found[1].lower()}{found[2]}", message)
    return f"{message}{where}"


@functools.cache
def _request_type() -> cel.Type:
    return schemas.declare(_REQUEST)


@functools.cache
def _namespace_type() -> cel.Type:
    kind = Catalog().for_resource("", "v1", "namespaces")
    return kind.cel_type() if kind is not None else cel.Type.DYN
