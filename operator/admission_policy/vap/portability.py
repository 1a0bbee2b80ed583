"""Could an AdmissionPolicy be a ValidatingAdmissionPolicy? What stops it, what would differ.

Some of what an AdmissionPolicy does has no ValidatingAdmissionPolicy form at all: mutations,
Python plugins, context lists. Its CEL ports when it compiles in Kubernetes' environment: the
one this project checks policies in, without the libraries marked ``since="ours"`` (ours only
add, so leaving them out leaves Kubernetes' own). A library with a Kubernetes version is
there from that version on, which sets the oldest Kubernetes a policy can run on; an
expression needs a library when it does not compile without it.

The rest ports with a translation, and says how (``notes``): excludeNamespaces becomes a
namespaceSelector, a rule's "pods/*" an exclusion, an unset reason an explicit one.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .. import api
from ..api import split_resource
from ..cel import check, lib, new_environment, referenced_variables, syntax
from ..engine import CompiledPolicy

# ValidatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1) from Kubernetes 1.30.
BASELINE: Final = "1.30"
_ERROR: Final = re.compile(r"<input>:(\d+):(\d+): (.*)")
# As ``cel`` declares them (``context`` too: an expression reading it is not reported twice, since
# spec.context is).

@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing about a policy, at the field it concerns."""
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclasses.dataclass(frozen=True)
class Portability:
    """``lint``'s answer to "could this run as a ValidatingAdmissionPolicy, and from which
    Kubernetes on": portable when nothing blocks it."""
    blockers: tuple[Finding, ...] = ()   # what a ValidatingAdmissionPolicy cannot do
    notes: tuple[Finding, ...] = ()      # what ports with a translation, or behaves otherwise
    needs: tuple[Finding, ...] = ()      # expressions that need a Kubernetes newer than BASELINE
    kubernetes: str = BASELINE           # the oldest Kubernetes whose environment has all it calls

    @property
    def portable(self) -> bool:
        return not self.blockers

    def as_json(self) -> dict[str, Any]:
        """For ``lint -o json``: findings as their message text."""
        return {"portable": self.portable, "kubernetes": self.kubernetes,
                "blockers": [str(f) for f in self.blockers], "needs": [str(f) for f in self.needs],
                "notes": [str(f) for f in self.notes]}


def portability(compiled: CompiledPolicy, body: Mapping[str, Any], environment: KubernetesCel | None = None,
                ) -> Portability:
    """The verdict for a policy that compiles here; ``body`` is the object as written (to tell
    an unset field from its default)."""
    kubernetes = environment or kubernetes_cel()
    policy = compiled.policy
    blockers = []
    if policy.mutations:
        blockers.append(Finding("spec.mutations", "a ValidatingAdmissionPolicy only validates (Kubernetes' "
                                                  "MutatingAdmissionPolicy mutates, with an API of its own)"))
    blockers += [Finding(v.plugin.path, f"the Python plugin {v.plugin.name!r} runs only in this operator")
                 for v in policy.validations if v.plugin is not None]
    if policy.context:
        blockers.append(Finding("spec.context", "a ValidatingAdmissionPolicy reads no lists of other objects "
                                                "(its params are one object per evaluation)"))
    needs = []
    for expression in policy.expressions():
        if expression.path.startswith("spec.mutations"):
            continue
        hidden = _hidden(expression.path)
        problem = kubernetes.compile_error(expression.source, hidden=hidden)
        if problem is not None:
            blockers.append(Finding(expression.path, problem))
            continue
        needs += [(Finding(expression.path, f"needs Kubernetes {library.since} or later (library {library.name})"),
                   library.since) for library in kubernetes.recent()
                  if kubernetes.compile_error(expression.source, library.name, hidden) is not None]
    oldest = max((since for _, since in needs), key=_version, default=BASELINE)
    return Portability(tuple(blockers), tuple(_notes(compiled, body)), tuple(f for f, _ in needs), oldest)


def _hidden(path: str) -> tuple[str, ...]:
    """The variables Kubernetes does not give an expression of this field: match conditions are
    checked without the policy's variables, messages without the authorizer."""
    if path.startswith("spec.match.conditions"):
        return ("variables",)
    if path.endswith(".messageExpression"):
        return ("authorizer", "authorizer.requestResource")
    return ()


def _notes(compiled: CompiledPolicy, body: Mapping[str, Any]) -> list[Finding]:
    policy = compiled.policy
    notes = []
    if policy.match.exclude_namespaces:
        names = ", ".join(sorted(policy.match.exclude_namespaces))
        notes.append(Finding("spec.match.excludeNamespaces", "a ValidatingAdmissionPolicy has none: add the "
                                                             "namespaceSelector requirement {key: kubernetes.io/"
                                                             f"metadata.name, operator: NotIn, values: [{names}]}}"))
    for i, rule in enumerate(policy.match.resources):
        for entry in rule.resources:
            resource, subresource = split_resource(entry)
            if subresource == "*" and resource not in rule.resources:
                notes.append(Finding(f"spec.match.resources[{i}].resources",
                                     f"{entry!r} in a ValidatingAdmissionPolicy rule also matches {resource!r} "
                                     "itself: exclude it with excludeResourceRules"))
    if compiled.coverage is not None and compiled.coverage.kinds:
        notes.append(Finding("spec.podControllers", "this policy also judges the Pod templates of "
                                                    f"{', '.join(compiled.coverage.kinds)}; a ValidatingAdmission"
                                                    "Policy on Pods judges Pods only"))
    raw = body.get("spec", {}).get("validations") or []
    notes += [Finding(f"spec.validations[{i}].reason", "unset: a denial is 403 Forbidden here but 422 Invalid from "
                                                       "a ValidatingAdmissionPolicy; set it to keep the code")
              for i, validation in enumerate(raw)
              if isinstance(validation, Mapping) and "reason" not in validation and "plugin" not in validation]
    notes += _eager_messages(policy)
    if policy.report_admission:
        notes.append(Finding("spec.reportAdmission", "the reports are this operator's (a ValidatingAdmission"
                                                     "Policy's Audit action writes to the API server's audit log)"))
    if policy.namespace is not None:   # a NamespacedAdmissionPolicy
        own = policy.namespace
        notes.append(Finding("metadata.namespace", "a ValidatingAdmissionPolicy is cluster-scoped: its binding judges "
                                                   f"{own} only with matchResources.namespaceSelector {{matchLabels: "
                                                   f"{{kubernetes.io/metadata.name: {own}}}}} (a cluster admin's "
                                                   "objects, not a namespace admin's)"))
    return notes


class KubernetesCel:
    """Kubernetes' CEL environment as far as this project has it: cel-go's extensions Kubernetes
    has, and the given libraries but those marked "ours"; the variables of a ValidatingAdmission
    Policy, typed as ``cel`` declares them."""

    def __init__(self, libraries: Sequence[lib.Library]) -> None:
        self.libraries = tuple(library for library in libraries if library.since != "ours")
        self._environments: dict[tuple[str, tuple[str, ...]], Any] = {}

    def recent(self) -> list[lib.Library]:
        """The libraries that came after BASELINE."""
        return [library for library in self.libraries
                if library.functions and _version(library.since) > _version(BASELINE)]

    def compile_error(self, source: str, left_out: str = "", hidden: tuple[str, ...] = ()) -> str | None:
        """Why ``source`` does not compile here, without library ``left_out`` and the ``hidden``
        variables; or None."""
        try:
            program = check(self._environment(left_out, hidden), source)
        except RuntimeError as exc:
            found = _ERROR.search(str(exc))
            if found is None:
                return f"does not compile in Kubernetes' CEL environment: {exc}"
            message = found[3].replace(" (in container '')", "")
            return f"(line {found[1]}, column {found[2]}) not in Kubernetes' CEL environment: {message}"
        return None if left_out else mixed_literal(source, syntax.Checked.decode(program.serialize()))

    def environment(self) -> Any:
        """The whole environment, every variable declared."""
        return self._environment("", ())

    def _environment(self, left_out: str, hidden: tuple[str, ...]) -> Any:
        key = (left_out, hidden)
        if key not in self._environments:
            functions = [declared for library in self.libraries if library.name != left_out
                         for declared in library.functions]
            self._environments[key] = new_environment(functions, hidden=hidden)
        return self._environments[key]


@functools.cache
def kubernetes_cel() -> KubernetesCel:
    """The environment of the libraries this project has (built once: about 30 ms each)."""
    return KubernetesCel(lib.libraries())


def _version(text: str) -> tuple[int, ...]:
    """"1.33" → (1, 33); anything else counts as the baseline."""
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return _version(BASELINE)


# --- homogeneous aggregate literals --------------------------------------------------------------

_PRIMITIVES: Final = {1: "bool", 2: "int", 3: "uint", 4: "double", 5: "string", 6: "bytes"}


def mixed_literal(source: str, checked: syntax.Checked) -> str | None:
    """Kubernetes compiles with cel-go's homogeneous-aggregate-literal validator: each list
    literal's elements, and each map literal's keys and values, must be of equivalent types (a
    ``dyn`` only with a ``dyn``), but within ``format()``'s arguments. The environment here does
    not check that; a policy mixing them would be refused by the API server."""
    kinds = syntax.types(checked)
    parents = {child.id: node for node in syntax.walk(checked.root) for child in node.children()}
    for node in syntax.walk(checked.root):
        if node.kind == "list":
            indices = set(node.optional_indices())
            groups = [("list", [(item, i in indices) for i, item in enumerate(node.args)])]
        elif node.kind == "struct" and not node.name:   # a map literal (a message's fields are typed)
            groups = [("map", [(e.key, False) for e in node.entries if e.key is not None]),
                      ("map", [(e.value, e.optional) for e in node.entries])]
        else:
            continue
        if _in_format(node, parents):
            continue
        for what, items in groups:
            first: syntax.Type | None = None
            for item, optional in items:
                current = kinds.get(item.id, ("dyn",))
                if optional and current[0] == "abstract" and len(current) > 2:
                    current = current[2]   # ``?x``: the optional's value
                if first is None:
                    first = current
                elif current != first:
                    where = _line_column(source, checked.positions.get(node.id, 0))
                    return (f"{where} a {what} literal mixes {_name(first)} and {_name(current)}, which Kubernetes' "
                            "CEL refuses (one type per list, and per map's keys and values): make them one type, "
                            "e.g. wrap each in dyn()")
    return None


def _in_format(node: syntax.Expr, parents: Mapping[int, syntax.Expr]) -> bool:
    """Within ``format()``'s arguments, through enclosing lists and maps: exempt (a format's
    arguments are of many types by design)."""
    parent = parents.get(node.id)
    while parent is not None and (parent.kind == "list" or (parent.kind == "struct" and not parent.name)):
        parent = parents.get(parent.id)
    return parent is not None and parent.kind == "call" and parent.name == "format"


def _name(kind: syntax.Type) -> str:
    if kind[0] == "primitive":
        return _PRIMITIVES.get(kind[1], "a primitive")
    if kind[0] in ("list", "map"):
        return f"{kind[0]}({', '.join(_name(part) for part in kind[1:])})"
    if kind[0] == "message":
        return str(kind[1])
    return str(kind[0])


def _line_column(source: str, offset: int) -> str:
    before = source[:offset]
    return f"(line {before.count(chr(10)) + 1}, column {offset - (before.rfind(chr(10)) + 1) + 1})"


def _eager_messages(policy: api.AdmissionPolicy) -> list[Finding]:
    """The messageExpressions that read variables no validation reads: the API server evaluates
    every messageExpression of a policy it applies, whatever the validations decided, so natively
    those variables are computed for every request, where the engine computes them for a denial
    only. Under ``failurePolicy: Fail`` the generated policy's last match condition
    (``vap.shortcut``) keeps the API server from applying it to a request
    every validation admits, so no message is built then; under Ignore there is no such condition."""
    if policy.failure_policy == "Fail":
        return []
    names = [v.name for v in policy.variables]

    def reads(source: str) -> set[str]:
        found = referenced_variables(source)
        return set(names if found is None else found)

    checked: set[str] = set()
    for validation in policy.validations:
        if validation.expression is not None:
            checked |= reads(validation.expression.source)
    for variable in reversed(policy.variables):   # a variable may read earlier ones
        if variable.name in checked:
            checked |= reads(variable.expression.source)
    notes = []
    for i, validation in enumerate(policy.validations):
        if validation.message_expression is None:
            continue
        only = [name for name in names if name in reads(validation.message_expression.source) - checked]
        if only:
            listed = ", ".join(f"variables.{name}" for name in only)
            notes.append(Finding(f"spec.validations[{i}].messageExpression",
                                 f"reads {listed}, which no validation reads: under failurePolicy Ignore a "
                                 "ValidatingAdmissionPolicy evaluates every messageExpression on every request, "
                                 f"so it computes {'them' if len(only) > 1 else 'it'} for every request, not only "
                                 "for a denial"))
    return notes
