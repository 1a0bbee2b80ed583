"""An AdmissionPolicy's mutations as the objects Kubernetes applies itself: a
MutatingAdmissionPolicy and its binding per place the policy mutates (its own resources, and
the Pod templates of workloads), as ``native.py`` does for validations.

Every mutation becomes one JSONPatch mutation, ``condition ? [JSONPatch{...}, ...] : []``, that
changes the object exactly as the engine (``engine/patching.py``) would. Where the two differ by
nature, the generated expression says what the engine does:

- ``add`` creates the missing parents of its path (the engine's choice; Kubernetes' JSON patch
  refuses them): each add tests, on ``object``, where its path first goes missing and adds there
  the nest the engine would build (``/spec/volumes/-`` on a Pod without volumes adds
  ``/spec/volumes: [value]``);
- a merge patch (RFC 7386, or ``IfAbsent``) is the JSON patch of what it changes, key by key,
  with the same presence and type tests as ``patching.merge``: an ApplyConfiguration merges lists
  by server-side-apply rules and cannot remove a field, so it would not be the same.

What cannot be said exactly keeps the policy on the webhook (``mutation_blockers``, each at its
field). Pure, like ``native.py``, whose matching pieces it reuses.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .. import api
from ..cluster.routing import ServedIndex, admission_rules, atoms, explicit, routes
from ..engine import CompiledPolicy
from ..engine.patching import merge
from ..engine.podcontrollers import Location
from .expressions import inline_variables, newer_libraries, source
from .objects import MUTATING_BINDING as MUTATING_BINDING
from .objects import MUTATING_POLICY as MUTATING_POLICY
from .portability import Finding, kubernetes_cel

MUTATING_SINCE: Final = (1, 32)
# Kubernetes carries a patch value as a protobuf Value: a number is a float64, exact up to 2**53.
EXACT_INTEGERS: Final = 2 ** 53
_INDEX: Final = re.compile(r"0|[1-9][0-9]*")
_GO_INTEGER: Final = re.compile(r"[+-]?[0-9]+")   # what Go's strconv.Atoi reads as an array index
_MAX_NUMERIC_PARENTS: Final = 3   # each is a list-or-map branch of the generated expression


# ---- what keeps mutations off a MutatingAdmissionPolicy -----------------------------------------


def mutation_blockers(compiled: CompiledPolicy, kubernetes: tuple[int, int]) -> list[Finding]:
    """What keeps this policy's mutations from being a MutatingAdmissionPolicy that mutates as
    the engine does, at this Kubernetes version, each at its field."""
    policy = compiled.policy
    found: list[Finding] = []
    if not policy.mutations:
        return found
    if kubernetes < MUTATING_SINCE:
        found.append(Finding("spec.mutations", f"Kubernetes has MutatingAdmissionPolicy from 1.32 (this cluster is "
                                               f"{kubernetes[0]}.{kubernetes[1]})"))
    environment = kubernetes_cel()
    for mutation in policy.mutations:
        if mutation.plugin is not None:
            found.append(Finding(mutation.plugin.path, f"the Python plugin {mutation.plugin.name!r} runs only in "
                                                       "this operator"))
            continue
        expressions = [mutation.condition] if mutation.condition is not None else []
        expressions += [op.value_expression for op in mutation.json_patch or () if op.value_expression is not None]
        for expression in expressions:
            problem = environment.compile_error(expression.source)
            if problem is not None:
                found.append(Finding(expression.path, problem))
        if mutation.merge is not None:
            found += [Finding(f"{mutation.path}.merge", why) for why in _value_problems(mutation.merge)]
            continue
        earlier: list[api.PatchOperation] = []
        for op in mutation.json_patch or ():
            found += [Finding(op.field_path, why) for why in _operation_problems(op, earlier)]
            earlier.append(op)
    found += [f for f in newer_libraries(compiled, kubernetes) if f.path.startswith("spec.mutations")]
    return found


def _operation_problems(op: api.PatchOperation, earlier: Sequence[api.PatchOperation]) -> list[str]:
    problems = []
    if op.op == "test":
        problems.append("Kubernetes skips the rest of a JSON patch whose test fails, without an error, where "
                        "the engine fails the mutation (failurePolicy decides); and the two compare values "
                        "differently (a missing path, 1 and true)")
    for name, pointer in (("path", op.path), ("from", op.from_)):
        if pointer is None:
            continue
        if re.search(r"~(?![01])", pointer):
            problems.append(f"{name} {pointer!r} has a '~' that is not ~0 or ~1: an error for the engine, "
                            "a literal '~' for Kubernetes")
            continue
        tokens = _tokens(pointer)
        odd = [t for t in tokens if (_GO_INTEGER.fullmatch(t) or t.isdigit()) and not _INDEX.fullmatch(t)]
        if odd:
            problems.append(f"{name} {pointer!r} has the index {odd[0]!r}, which Kubernetes reads as a number "
                            "(negative: from the end) and the engine does not")
        if "-" in tokens[:-1]:
            problems.append(f"{name} {pointer!r} has '-' before its last token, where the two differ on "
                            "whether it is a key or the end of a list")
    if op.value_expression is None and op.has_value:
        problems += _value_problems(op.value)
    if op.op == "add" and not problems:
        reason = _known_parents(_tokens(op.path)[:-1], earlier)
        if isinstance(reason, str):
            problems.append(reason)
        elif sum(1 for t in _tokens(op.path)[:-1] if _INDEX.fullmatch(t)) > _MAX_NUMERIC_PARENTS:
            problems.append(f"its path has more than {_MAX_NUMERIC_PARENTS} numeric tokens before the last, each "
                            "a list or a map key: the expression that creates missing parents would be too large")
    return problems


def _value_problems(value: Any) -> list[str]:
    """What of a fixed value Kubernetes would not carry exactly: integers past 2**53 (a float64
    there), strings that are not Unicode text."""
    problems: list[str] = []
    pending = [_wire(value)]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > EXACT_INTEGERS:
            problems.append(f"the number {item} is past 2**53: Kubernetes carries patch values as float64, "
                            "which rounds it")
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                problems.append(f"the string {item!r} is not Unicode text (a lone surrogate)")
    return problems


def _known_parents(parents: Sequence[str], earlier: Sequence[api.PatchOperation]) -> int | str:
    """How many leading levels of an add's parent path exist, whatever the object, once the
    earlier operations of its mutation applied (they succeeded, or the mutation fails anyway); or
    why an earlier one makes their presence unknowable from ``object`` alone."""
    known = 0
    for previous in earlier:
        writes = [(_tokens(previous.path), previous.op in ("add", "move", "copy"), previous.op == "remove")]
        if previous.from_ is not None:
            writes.append((_tokens(previous.from_), False, previous.op == "move"))
        for tokens, adds, removes in writes:
            writing = adds or removes or previous.op == "replace"
            if writing and len(tokens) <= len(parents) and list(parents[:len(tokens)]) == tokens:
                if (adds or previous.op == "replace") and len(tokens) == len(parents):
                    known = len(parents)   # the parent itself was just set
                    continue
                return (f"an earlier operation of this mutation ({previous.op} {previous.path}) writes above "
                        "this add's path, so where it goes missing cannot be read from the object")
            above = tokens[:-1]
            if (adds or removes) and len(above) < len(parents) and list(parents[:len(above)]) == above \
                    and (tokens[-1] == "-" or tokens[-1].isdigit()):
                return (f"an earlier operation of this mutation ({previous.op} {previous.path}) changes a list this "
                        "add's path goes through, so its indices cannot be read from the object")
            # What exists after it: the parent of what it removed or appended to, else what it wrote or read.
            reached = above if removes or (adds and tokens[-1] == "-") else tokens
            known = max(known, _common(reached, parents))
    return known


def _common(a: Sequence[str], b: Sequence[str]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


# ---- the objects --------------------------------------------------------------------------------


def rules(part: CompiledPolicy, served: ServedIndex) -> list[dict[str, Any]]:
    """The mutating webhook's resource rules, less DELETE, which a MutatingAdmissionPolicy may not
    match (the engine never mutates a DELETE: it has no object)."""
    scope = "Namespaced" if part.policy.namespace else "*"
    found = atoms([r for r in routes(part, derived=False) if r.mutating], served)
    kept = {key: left for key, operations in found.items() if (left := explicit(operations) - {"DELETE"})}
    return admission_rules(kept, scope)


def spec(part: CompiledPolicy, matching: Mapping[str, Any]) -> dict[str, Any]:
    """A MutatingAdmissionPolicy's spec: what every generated policy of this place matches
    (``matching``, built by ``native``), then the mutations, in order, their variables inlined
    (``expressions.inline_variables`` says why)."""
    policy = part.policy
    variables: dict[str, str] = {}
    for variable in policy.variables:   # each may read those before it
        text = source(variable.expression.source, part.template, variable.expression.path)
        variables[variable.name] = inline_variables(text, variables, variable.expression.path)
    return {**{key: value for key, value in matching.items() if key != "variables"},
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {
                "expression": mutation_expression(m, part.template, variables)}} for m in policy.mutations],
            "reinvocationPolicy": policy.reinvocation_policy}


# ---- one mutation as a JSONPatch expression -----------------------------------------------------


def mutation_expression(mutation: api.Mutation, template: Location = (), variables: Mapping[str, str] | None = None
                        ) -> str:
    """``condition ? [JSONPatch{...}, ...] : []``: the mutation's operations (a merge patch's, key by
    key), their values computed from the object before it, as the engine computes them;
    ``variables``: the policy's, to inline."""
    def source_of(expression: api.Expression) -> str:
        return inline_variables(source(expression.source, template, expression.path), variables or {},
                                expression.path)

    if mutation.merge is not None:
        parts = _merge_patch(mutation.merge, "object", [], if_absent=mutation.merge_mode == "IfAbsent")
    else:
        parts = []
        earlier: list[api.PatchOperation] = []
        for op in mutation.json_patch or ():
            value = None
            if op.has_value:
                value = _wrapped(source_of(op.value_expression)) \
                    if op.value_expression is not None else cel_literal(op.value)
            parts.append(_operation(op, value, earlier))
            earlier.append(op)
    patches = _concatenated(parts)
    if mutation.condition is None:
        return patches
    return f"{_wrapped(source_of(mutation.condition))} ? {patches} : []"


def _operation(op: api.PatchOperation, value: str | None, earlier: Sequence[api.PatchOperation]) -> str:
    """One operation as a CEL list of JSONPatch: itself, or, for an add, the add the engine makes
    where the path first goes missing."""
    plain = f"[{_patch(op.op, op.path, value, op.from_)}]"
    tokens = _tokens(op.path)
    parents = tokens[:-1]
    if op.op != "add" or not parents:
        return plain
    known = _known_parents(parents, earlier)
    assert isinstance(known, int), known   # mutation_blockers said so
    assert value is not None

    def created(level: int) -> str:
        """The add of the nest the engine builds from ``level`` (the first missing parent) down."""
        if level >= len(parents):
            return plain
        nest = _nest(tokens[level + 1:], value)
        return plain if nest is None else f"[{_patch('add', _pointer(tokens[:level + 1]), nest)}]"

    def walk(node: str, level: int) -> str:
        if level == len(parents):
            return plain
        token = parents[level]
        key = cel_string(token)
        missing = created(max(level, known))
        as_map = f"!({key} in {node}) || {node}[{key}] == null ? {missing} : {walk(f'{node}[{key}]', level + 1)}"
        if not _INDEX.fullmatch(token):
            return f"({as_map})"
        as_list = f"{token} < size({node}) ? {walk(f'{node}[{token}]', level + 1)} : {plain}"
        return f"(type({node}) == list ? ({as_list}) : ({as_map}))"

    return walk("object", 0) if known < len(parents) else plain


def _nest(rest: Sequence[str], value: str) -> str | None:
    """The container the engine creates for a missing parent, holding ``value`` at the ``rest``
    of the path (a list when the next token is an index or '-'); None where the engine's add
    fails (an index other than 0 or '-' in a new list, or a new list with more below it)."""
    head = rest[0]
    if head == "-" or head.isdigit():
        return f"[{value}]" if len(rest) == 1 and head in ("-", "0") else None
    inner = value if len(rest) == 1 else _nest(rest[1:], value)
    return None if inner is None else f"{{{cel_string(head)}: {inner}}}"


def _merge_patch(patch: Mapping[str, Any], node: str, prefix: list[str], *, if_absent: bool) -> list[str]:
    """``patching.merge`` of ``patch`` into the object at ``node``, as JSON patch operations on the
    keys it changes (each tested as the engine tests it: present, null, an object)."""
    parts = []
    for key, value in patch.items():
        key = str(key)
        name, here, path = cel_string(key), f"{node}[{cel_string(key)}]", [*prefix, key]
        present = f"{name} in {node}"
        if value is None:
            if not if_absent:
                parts.append(f"({present} ? [{_patch('remove', _pointer(path))}] : [])")
            continue
        if isinstance(value, Mapping):
            # What the engine sets where there is no object yet: the patch without its nulls.
            fresh = f"[{_patch('add', _pointer(path), cel_literal(merge({}, value, if_absent=if_absent)))}]"
            inner = _concatenated(_merge_patch(value, here, path, if_absent=if_absent))
            if if_absent:
                parts.append(f"(!({present}) || {here} == null ? {fresh} : type({here}) == map ? {inner} : [])")
            else:
                parts.append(f"({present} && type({here}) == map ? {inner} : {fresh})")
            continue
        add = f"[{_patch('add', _pointer(path), cel_literal(value))}]"
        parts.append(f"({present} ? [] : {add})" if if_absent else add)
    return parts


def _patch(op: str, path: str, value: str | None = None, from_: str | None = None) -> str:
    fields = [f"op: {cel_string(op)}", f"path: {cel_string(path)}"]
    if from_ is not None:
        fields.append(f"from: {cel_string(from_)}")
    if value is not None:
        fields.append(f"value: {value}")
    return f"JSONPatch{{{', '.join(fields)}}}"


def _concatenated(parts: Sequence[str]) -> str:
    """Lists joined with ``+``; single operations side by side in one list."""
    if not parts:
        return "[]"
    if all(p.startswith("[JSONPatch{") and p.endswith("}]") for p in parts):
        return "[" + ", ".join(p[1:-1] for p in parts) + "]"
    return " + ".join(parts)


def _wrapped(source: str) -> str:
    """A user's expression as an operand: on lines of its own, so a trailing ``//`` comment ends there."""
    return f"(\n{source}\n)"


def _tokens(pointer: str) -> list[str]:
    return [token.replace("~1", "/").replace("~0", "~") for token in pointer.split("/")[1:]]


def _pointer(tokens: Sequence[str]) -> str:
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


# ---- JSON as CEL --------------------------------------------------------------------------------


def cel_literal(value: Any) -> str:
    """A JSON value as a CEL literal that Kubernetes turns back into the same JSON: the value as
    the webhook would send it (``json`` spelling of keys), each item of a list or map whose items
    differ in type wrapped in ``dyn()`` (Kubernetes' CEL wants literals of one element type)."""
    return _literal(_wire(value))[0]


def _wire(value: Any) -> Any:
    """The value as JSON carries it (a YAML key 1 is "1")."""
    return json.loads(json.dumps(value, allow_nan=False))


def _literal(value: Any) -> tuple[str, str]:
    """(CEL source, its type) of a JSON value."""
    if value is None:
        return "null", "null"
    if isinstance(value, bool):
        return ("true" if value else "false"), "bool"
    if isinstance(value, int):
        return str(value), "int"
    if isinstance(value, float):
        assert math.isfinite(value)
        text = repr(value)
        return (text if any(c in text for c in ".en") else f"{text}.0"), "double"
    if isinstance(value, str):
        return cel_string(value), "string"
    if isinstance(value, list):
        items = _homogeneous([_literal(item) for item in value])
        return f"[{', '.join(items[0])}]", f"list({items[1]})"
    assert isinstance(value, dict)
    entries = _homogeneous([_literal(item) for item in value.values()])
    pairs = [f"{cel_string(key)}: {item}" for key, item in zip(value, entries[0], strict=True)]
    return f"{{{', '.join(pairs)}}}", f"map({entries[1]})"


def _homogeneous(items: list[tuple[str, str]]) -> tuple[list[str], str]:
    types = {kind for _, kind in items}
    if len(types) <= 1:
        return [source for source, _ in items], next(iter(types), "dyn")
    return [f"dyn({source})" for source, _ in items], "dyn"


_ESCAPES: Final = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def cel_string(text: str) -> str:
    """A CEL string literal of ``text``: double-quoted, control characters escaped."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
