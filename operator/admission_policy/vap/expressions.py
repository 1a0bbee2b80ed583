"""An AdmissionPolicy's expressions as a given Kubernetes reads them: which libraries it lacks
(``newer_libraries``), its optional syntax written in plain CEL before 1.29 (``vap/lowering``),
and, for a workload's Pod template, reading the template where the policy reads the Pod
(``source``). What every generated object (``native``, ``mutating``) writes of an expression.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final

from ..cel import check, syntax
from ..cel.lib import compat
from ..engine import CompiledPolicy
from ..engine.podcontrollers import Location, selected
from .lowering import is_optional_syntax, lower_optionals
from .portability import Finding, kubernetes_cel

OPTIONAL_TYPES: Final = (1, 29)   # Kubernetes' CEL has optional types from this version


class NotNative(Exception):
    """Raised while building: this part of the policy does not port (``finding`` says why)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(str(finding))
        self.finding = finding


@functools.lru_cache(maxsize=4096)
def source(source: str, template: Location, path: str, lower: bool = False) -> str:
    """The expression as written (``lower``: without optional syntax, for Kubernetes before 1.29;
    ``blockers`` has said that it can be), or, for a workload's Pod template, reading the template
    where it read the Pod: ``object.spec`` and ``object.metadata.labels`` become the template's,
    while ``object.metadata.name`` (and ``namespace``, ``generateName``) stay the workload's, as in
    ``podcontrollers.pod_view``. Typed, as Kubernetes checks it; what reads the Pod otherwise (as
    a whole, its ``kind``) does not port."""
    if lower and uses_optionals(source):
        source = lower_optionals(source)
    if not template:
        return source
    text = compat.respell(source)
    checked = checked_tree(text)
    parents = {child.id: node for node in syntax.walk(checked.root) for child in node.children()}
    nodes = {node.id: node for node in syntax.walk(checked.root)}
    positions = checked.positions
    edits = set()
    for node_id, name in checked.names.items():
        node = nodes.get(node_id)
        if name not in ("object", "oldObject") or node is None or node.kind != "ident" or node_id not in positions:
            continue
        if _reads_template(node, parents, name, path):
            edits.add((positions[node_id], name))
    path_text = "".join(f".{key}" for key in template)
    for position, name in sorted(edits, reverse=True):   # from the end: earlier offsets stay valid
        if text[position:position + len(name)] != name:
            raise NotNative(Finding(path, "cannot be rewritten for Pod templates"))
        text = text[:position] + name + path_text + text[position + len(name):]
    return text


def checked_tree(respelt: str) -> syntax.Checked:
    """The checked tree of an expression (``compat.respell`` already applied) in Kubernetes' CEL
    environment; RuntimeError where it does not compile there."""
    return syntax.Checked.decode(check(kubernetes_cel().environment(), respelt).serialize())


def _reads_template(node: syntax.Expr, parents: Mapping[int, syntax.Expr], name: str, path: str) -> bool:
    """Whether this read of ``object``/``oldObject`` goes to the template (else it stays)."""
    parent = parents.get(node.id)
    first = _field(parent, node)
    if first == "spec":
        return True
    if first == "metadata" and parent is not None:
        second = _field(parents.get(parent.id), parent)
        if second in ("name", "namespace", "generateName"):
            return False
        if second is not None:
            return True
    if first is None and parent is not None and parent.kind == "call" and parent.name in ("_==_", "_!=_") \
            and any(arg.kind == "const" and arg.constant() is None and arg is not node for arg in parent.args):
        return False   # null or not: the same for the workload and the Pod it stands for
    what = f"{name}.{first}" if first else name
    raise NotNative(Finding(path, f"reads {what}, which a Pod template does not stand for natively"))


def _field(parent: syntax.Expr | None, child: syntax.Expr) -> str | None:
    """The field ``parent`` reads of ``child`` (``child.f``, ``has(child.f)``, ``child.?f``, ``child['f']``)."""
    found = selected(parent) if parent is not None else None
    return found[1] if found is not None and found[0] is child else None


def newer_libraries(compiled: CompiledPolicy, kubernetes: tuple[int, int]) -> list[Finding]:
    """Each expression that calls a library this cluster's Kubernetes does not have yet (a 1.28
    API server has no IP or CIDR functions, a 1.32 one no semver)."""
    environment = kubernetes_cel()
    newer = [library for library in environment.libraries if library.functions and _version(library.since) > kubernetes]
    return [Finding(expression.path, f"needs Kubernetes {library.since} or later (library {library.name}); "
                                     f"this cluster is {kubernetes[0]}.{kubernetes[1]}")
            for expression in compiled.policy.expressions()
            # One that does not compile at all is portability's blocker, not every library's.
            if newer and environment.compile_error(expression.source) is None
            for library in newer if environment.compile_error(expression.source, library.name) is not None]


def _version(text: str) -> tuple[int, int]:
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def uses_optionals(source: str) -> bool:
    """Whether the expression uses optional types (they always begin with one of these)."""
    try:
        root = checked_tree(compat.respell(source)).root
    except RuntimeError:
        return False   # not Kubernetes' CEL at all: portability's blocker already says so
    return any(is_optional_syntax(node) for node in syntax.walk(root))


def template_changed(location: Location) -> dict[str, str]:
    """The match condition that skips an UPDATE leaving the Pod template as it was, as the webhook
    does (``engine.selection``): scaling or relabelling a workload whose template the
    policy refuses must keep working. Plain CEL, for every Kubernetes."""
    def template(name: str) -> str:
        steps = [name + "".join(f".{key}" for key in location[:i + 1]) for i in range(len(location))]
        return f"({' && '.join(f'has({step})' for step in steps)} ? {steps[-1]} : null)"
    return {"name": "pod-template-changed",
            "expression": f"request.operation != 'UPDATE' || oldObject == null || "
                          f"{template('object')} != {template('oldObject')}"}


def inline_variables(text: str, variables: Mapping[str, str], path: str) -> str:
    """``text`` with each ``variables.<name>`` replaced by that variable's expression, in
    parentheses (``variables``: each name's text, its own variables inlined already). For what
    must not carry variables: Kubernetes 1.32 validates a MutatingAdmissionPolicy's mutations
    without them, now and then on its creation and always on its updates ("undefined field")."""
    if "variables" not in text:
        return text
    respelt = compat.respell(text)
    checked = checked_tree(respelt)
    parents = {child.id: node for node in syntax.walk(checked.root) for child in node.children()}
    nodes = {node.id: node for node in syntax.walk(checked.root)}
    edits = []
    for node_id, name in checked.names.items():
        node, parent = nodes.get(node_id), parents.get(node_id)
        if name != "variables" or node is None or node.kind != "ident":
            continue
        read = f"variables.{parent.name}" if parent is not None and parent.kind == "select" else None
        at = checked.positions.get(node_id, -1)
        if read is None or parent is None or parent.name not in variables or respelt[at:at + len(read)] != read:
            raise NotNative(Finding(path, "reads its variables otherwise than as variables.<name>, which a "
                                          "MutatingAdmissionPolicy cannot carry"))
        edits.append((at, len(read), f"({variables[parent.name]})"))
    for at, length, replacement in sorted(edits, reverse=True):   # from the end: earlier offsets stay valid
        respelt = respelt[:at] + replacement + respelt[at + length:]
    return respelt

