"""Issue 12, scenario 5 (b, c): AdmissionPolicy specs wrong in every way, and CEL that tries to
run away, fuzzed with hypothesis (profiles in tests/conftest.py; HYPOTHESIS_PROFILE=long for more).

- A spec, whatever it holds, is compiled or refused with ``PolicyError`` / ``PolicyCompileError``
  naming the field: never another exception (which the operator would log as a traceback and the
  policy webhook answer with a 500), never a message that does not say where.
- An expression within the grammar (nested binds, comprehensions, string operations) is refused
  at compile time as unbounded by construction, or is answered within the webhook's deadline.
"""
from __future__ import annotations

import copy
import json
import re
import time
from typing import Any

from hypothesis import event, example, given, settings, target
from hypothesis import strategies as st

from admission_policy.api import PolicyError, parse_policy
from admission_policy.config import OperatorConfig
from admission_policy.engine import (
    CompiledPolicy,
    PolicyCompileError,
    build_response,
    compile_policy,
)
from builders import CREATE_POD_RULE, container, decide, pod, policy, request
from jsonpaths import Path, get, paths

# Every field the API has, each with a valid value: the fuzzer breaks them one to three at a time.
VALID: dict[str, Any] = {
    "apiVersion": "policy-operator.dev/v1alpha1",
    "kind": "AdmissionPolicy",
    "metadata": {"name": "fuzzed", "generation": 3},
    "spec": {
        "description": "every field of the API",
        "enforcement": "Enforce",
        "failurePolicy": "Fail",
        "match": {
            "resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "pods/status"],
                           "operations": ["CREATE", "UPDATE"]}],
            "namespaceSelector": {"matchLabels": {"env": "prod"},
                                  "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
            "objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
            "excludeNamespaces": ["kube-public"],
            "conditions": [{"name": "not-system", "expression": "!request.userInfo.username.startsWith('system:')"}],
        },
        "variables": [{"name": "name", "expression": "object.metadata.name"},
                      {"name": "images", "expression": "object.spec.containers.map(c, c.image)"}],
        "validations": [
            {"expression": "!variables.name.contains('offensive')", "message": "bad name",
             "messageExpression": "'pod ' + variables.name + ' is offensive'", "reason": "Invalid"},
            {"expression": "variables.images.all(i, i.contains(':'))"},
        ],
        "mutations": [
            {"name": "tolerate", "condition": "has(object.spec)",
             "jsonPatch": [{"op": "add", "path": "/spec/tolerations/-", "valueExpression": "{'key': 'k'}"},
                           {"op": "copy", "from": "/metadata/name", "path": "/metadata/labels/name"},
                           {"op": "test", "path": "/kind", "value": "Pod"}]},
            {"name": "team", "merge": {"metadata": {"labels": {"team": "none"}}}, "mergeMode": "IfAbsent"},
        ],
    },
}


ALL_PATHS = list(paths(VALID))
MAPPINGS = [path for path in ALL_PATHS if isinstance(get(VALID, path), dict)]


def dotted(path: Path) -> str:
    """A path as the API's errors write it: spec.validations[0].expression."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else str(step))
    return text


# What a hand-written (YAML) or hostile spec may hold where something else belongs: every JSON
# type, YAML's own scalars (dates, non-string keys), lone surrogates (JSON's "\ud800" escapes),
# non-finite numbers, and CEL that does not parse, type-check or fit its budget.
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.dates(),
    st.text(max_size=20), st.sampled_from(["", " ", "\ud800", "a\udfffb", "*", "/", "pods/", "/x", "a/b/c",
                                           "CREATE", "Fail", "Enforce", "In", "add", "\x00", "é" * 3]),
    st.sampled_from(["object.metadata.name.startsWith(", "1 + 'a'", "variables.nope", "object.spec.x == 1",
                     "[1, 2].map(x, [1, 2, 3, 4].map(y, [1, 2, 3].map(z, z)))", "true", "'\ud800' == 'x'",
                     "cel.bind(a, 'x' + 'x', cel.bind(b, a + a, cel.bind(c, b + b, c + c))) != ''"]),
)
KEYS = st.one_of(st.text(max_size=12), st.sampled_from(["name", "expression", "op", "value", "spec", "match"]),
                 st.integers(-2, 2), st.booleans(), st.none())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(KEYS, inner, max_size=4)), max_leaves=12)

Edit = tuple[str, Path, Any]
EDITS = st.one_of(
    st.tuples(st.just("replace"), st.sampled_from(ALL_PATHS), VALUES),
    st.tuples(st.just("delete"), st.sampled_from(ALL_PATHS[1:]), st.none()),
    st.tuples(st.just("add"), st.sampled_from(MAPPINGS), st.tuples(KEYS, VALUES)),
)


def edited(edits: list[Edit]) -> tuple[Any, list[Path]]:
    """VALID with the edits made (each on what the earlier ones left), and the paths they touched."""
    body: Any = copy.deepcopy(VALID)
    touched: list[Path] = []
    for action, path, value in edits:
        if action == "replace" and path == ():
            body = value
        else:
            try:
                parent = get(body, path[:-1]) if action != "add" else get(body, path)
                if action == "replace":
                    parent[path[-1]] = value
                elif action == "delete":
                    del parent[path[-1]]
                else:
                    key, item = value
                    parent[key] = item
                    path = (*path, key)
            except (KeyError, IndexError, TypeError):   # an earlier edit removed or replaced the place
                continue
        touched.append(path)
    return body, touched


def related(error_path: str, touched: list[Path], message: str) -> bool:
    """The error names a field that was edited, one inside it, or one that holds it.

    Duplicate names are reported at the later one, which may be the field left alone."""
    def normal(text: str) -> list[str]:
        # "a.b[0]" and "a.b.0" alike: a key may be a number (YAML), written either way.
        found = [s for s in re.split(r"[.\[\]]", text) if s]
        return [re.sub(r"^\d+$", "#", s) for s in found] if "duplicate" in message else found

    found = normal(error_path)
    for path in touched:
        edit = normal(dotted(path))
        shorter = min(len(found), len(edit))
        if found[:shorter] == edit[:shorter]:
            return True
    return False


def compile_body(body: Any) -> CompiledPolicy:
    return compile_policy(parse_policy(body))


def sized_pod(containers: int, labels: int = 8) -> dict[str, Any]:
    """A Pod of this many containers and labels, and a note to split and join."""
    return pod(labels={f"l{i}": f"value-{i}" for i in range(labels)},
               metadata={"annotations": {"note": "a, b, c; " * 20}},
               containers=[container(f"c{i}", f"registry.example/app-{i}:1.{i}") for i in range(containers)])


SMALL_POD = request(sized_pod(3), name="web")
REFERENCE_POD = request(sized_pod(200), name="web")       # about the compile-time reference: 16 KiB, 256 items
NAMESPACE = {"metadata": {"name": "default", "labels": {"env": "prod", "tier": "a"}}}


# --- (b) specs wrong in every way ----------------------------------------------------------------------------

def test_the_valid_spec_the_fuzzer_breaks_compiles() -> None:
    assert compile_body(VALID).name == "fuzzed"


@given(st.lists(EDITS, min_size=1, max_size=3))
@example([("replace", ("spec", "match", "namespaceSelector", "matchLabels"), {1: "a", "b": "c"})])
@example([("add", ("spec",), (3, True)), ("add", ("spec",), ("x", 1))])
@example([("replace", ("spec", "validations", 0, "expression"), "'\ud800' == 'x'")])
@example([("replace", ("metadata", "name"), "\ud800")])
@example([("add", ("spec", "mutations", 1, "merge"), (0, []))])
def test_a_spec_is_compiled_or_refused_naming_the_field(edits: list[Edit]) -> None:
    body, touched = edited(edits)
    try:
        compiled = compile_body(body)
    except PolicyError as error:
        event("refused by the parser")
        assert str(error) == (f"{error.path}: {error.message}" if error.path else error.message)
        assert error.message.strip()
        assert error.path or not isinstance(body, dict), f"a field-less error for a spec object: {error}"
        assert related(error.path, touched, error.message), f"{error} names none of {touched}"
    except PolicyCompileError as error:
        event("refused by the compiler")
        where = {e.path for e in parse_policy(body).expressions()} | {"spec"}
        assert error.errors
        for problem in error.errors:
            assert problem.path in where, f"{problem} names no expression of the policy"
            assert str(problem).startswith(problem.path) and problem.path in str(error)
    else:
        event("compiled")
        # What compiles also evaluates, without the engine's own failure answer (a defect of ours).
        odd = request({**sized_pod(1), "metadata": {"name": "m", "labels": [1]}, "spec": 7}, name="m")
        for req in (SMALL_POD, odd):
            decision = decide(compiled, req, NAMESPACE)
            assert decision.code != 500, decision.message
            json.dumps(build_response(decision, "fuzz"), allow_nan=False)


# --- (c) evaluation is bounded --------------------------------------------------------------------------------
#
# Expressions drawn from a typed grammar, so that most compile and the fuzzer spends its time on
# cost: strings that double at each of nested binds, loops within loops over the request's lists,
# splits and joins and replaces of what the request holds.

STRING_ATOMS = ["object.metadata.name", "object.metadata.annotations.note", "'ab'", "'x,y,z'", "request.operation",
                "object.spec.containers[0].image", "string(object.spec.containers.size())"]
LIST_ATOMS = ["object.spec.containers.map(c, c.name)", "object.spec.containers.map(c, c.image)",
              "object.metadata.labels.map(k, k)", "['a', 'b', 'c']", "object.metadata.annotations.note.split(' ')"]


@st.composite
def cel_string(draw: st.DrawFn, depth: int, scope: tuple[str, ...]) -> str:
    names = [f"s{i}" for i in range(len(scope)) if scope[i] == "s"]
    if depth <= 0:
        return draw(st.sampled_from(STRING_ATOMS + names))
    sub = cel_string(depth - 1, scope)
    choice = draw(st.integers(0, 7))
    if choice == 0:
        return f"({draw(sub)} + {draw(sub)})"
    if choice == 1:
        return f"{draw(sub)}.replace({draw(st.sampled_from(['a', ',', ' ', '']))!r}, {draw(sub)})"
    if choice == 2:
        return f"{draw(cel_list(depth - 1, scope))}.join({draw(st.sampled_from([',', '', '--']))!r})"
    if choice == 3:
        return f"{draw(sub)}.{draw(st.sampled_from(['lowerAscii()', 'upperAscii()', 'trim()']))}"
    if choice == 4:
        name = f"s{len(scope)}"
        return f"cel.bind({name}, {draw(sub)}, {draw(cel_string(depth - 1, (*scope, 's')))})"
    if choice == 5:
        return f"({draw(cel_bool(depth - 1, scope))} ? {draw(sub)} : {draw(sub)})"
    if choice == 6:
        return f"string({draw(cel_int(depth - 1, scope))})"
    return draw(st.sampled_from(STRING_ATOMS + names))


@st.composite
def cel_list(draw: st.DrawFn, depth: int, scope: tuple[str, ...]) -> str:
    if depth <= 0:
        return draw(st.sampled_from(LIST_ATOMS))
    sub = cel_list(depth - 1, scope)
    item = f"i{len(scope)}"
    inner = (*scope, "s")   # the item is a string the body may read as s<n>
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return f"({draw(sub)} + {draw(sub)})"
    if choice == 1:
        return f"{draw(sub)}.map({item}, {draw(cel_string(depth - 1, inner)).replace(f's{len(scope)}', item)})"
    if choice == 2:
        return f"{draw(sub)}.filter({item}, {draw(cel_bool(depth - 1, inner)).replace(f's{len(scope)}', item)})"
    if choice == 3:
        return f"{draw(cel_string(depth - 1, scope))}.split({draw(st.sampled_from([',', ' ', '']))!r})"
    if choice == 4:
        return f"[{draw(cel_string(depth - 1, scope))}, {draw(cel_string(depth - 1, scope))}]"
    return draw(st.sampled_from(LIST_ATOMS))


@st.composite
def cel_int(draw: st.DrawFn, depth: int, scope: tuple[str, ...]) -> str:
    if depth <= 0:
        return draw(st.sampled_from(["1", "7", "object.spec.containers.size()"]))
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return f"size({draw(cel_string(depth - 1, scope))})"
    if choice == 1:
        return f"{draw(cel_list(depth - 1, scope))}.size()"
    if choice == 2:
        return f"({draw(cel_int(depth - 1, scope))} + {draw(cel_int(depth - 1, scope))})"
    return draw(st.sampled_from(["1", "7", "object.spec.containers.size()"]))


@st.composite
def cel_bool(draw: st.DrawFn, depth: int, scope: tuple[str, ...]) -> str:
    if depth <= 0:
        return draw(st.sampled_from(["true", "has(object.spec)", "request.operation == 'CREATE'"]))
    item = f"i{len(scope)}"
    inner = (*scope, "s")
    choice = draw(st.integers(0, 6))
    if choice == 0:
        return f"{draw(cel_string(depth - 1, scope))}.contains({draw(cel_string(depth - 1, scope))})"
    if choice == 1:
        return f"{draw(cel_string(depth - 1, scope))}.startsWith({draw(cel_string(depth - 1, scope))})"
    if choice == 2:
        quantifier = draw(st.sampled_from(["all", "exists", "exists_one"]))
        body = draw(cel_bool(depth - 1, inner)).replace(f"s{len(scope)}", item)
        return f"{draw(cel_list(depth - 1, scope))}.{quantifier}({item}, {body})"
    if choice == 3:
        return f"({draw(cel_string(depth - 1, scope))} in {draw(cel_list(depth - 1, scope))})"
    if choice == 4:
        return f"({draw(cel_int(depth - 1, scope))} < {draw(cel_int(depth - 1, scope))})"
    if choice == 5:
        return f"({draw(cel_bool(depth - 1, scope))} && !({draw(cel_bool(depth - 1, scope))}))"
    return f"{draw(cel_string(depth - 1, scope))}.matches('^[a-z]+(,[a-z]+)*$')"


EXPRESSIONS = st.integers(1, 5).flatmap(lambda depth: cel_bool(depth, ()))
DEADLINE = OperatorConfig().evaluation_deadline   # what the webhook gives a request by default

# Refusals the grammar may meet: the cost estimate, or the parser's nesting limit.
REFUSALS = ("unbounded by construction", "nests too deeply")


def runaway(expression: str) -> CompiledPolicy:
    return policy("runaway", rules=[CREATE_POD_RULE], validations=[{"expression": expression}])


# Twice the profile's examples: most are quick, and the slow ones are what this property is after.
@settings(max_examples=settings().max_examples * 2)
@given(EXPRESSIONS)
@example("cel.bind(s0, object.metadata.annotations.note + object.metadata.annotations.note, "
         "cel.bind(s1, s0 + s0, cel.bind(s2, s1 + s1, cel.bind(s3, s2 + s2, s3 + s3)))).contains('z')")
@example("object.spec.containers.map(c, c.name).all(a, object.spec.containers.map(c, c.image)"
         ".exists(b, object.metadata.labels.map(k, k).exists(d, (a + b + d).contains('zz'))))")
@example("object.metadata.annotations.note.split('').map(i0, object.metadata.annotations.note.replace(',', i0))"
         ".join('').contains('q')")
def test_an_expression_is_refused_by_its_cost_or_evaluates_within_the_deadline(expression: str) -> None:
    try:
        compiled = runaway(expression)
    except PolicyCompileError as error:
        assert any(refusal in str(error) for refusal in REFUSALS), str(error)
        event("refused at compile time")
        return
    event("compiled")
    slowest = 0.0
    for req in (SMALL_POD, REFERENCE_POD):
        started = time.monotonic()
        decision = decide(compiled, req, NAMESPACE, deadline=started + DEADLINE)
        spent = time.monotonic() - started
        assert spent < DEADLINE, f"{spent:.2f} s for {expression}"
        assert decision.code != 500, decision.message
        assert "deadline exceeded" not in decision.message
        slowest = max(slowest, spent)
    target(slowest, label="seconds to evaluate")   # steers the long profile toward slow expressions


def test_the_grammar_reaches_both_sides_of_the_budget() -> None:
    """The property above is only worth something when the grammar makes expressions that the
    estimate refuses as well as ones it lets run: one of each, drawn from the same grammar."""
    doubling = "cel.bind(s0, object.metadata.name + object.metadata.name, " + "".join(
        f"cel.bind(s{i}, s{i - 1} + s{i - 1}, " for i in range(1, 24)) + "s23.contains('x')" + ")" * 24
    try:
        runaway(doubling)
        raise AssertionError("a string doubled 24 times was admitted")
    except PolicyCompileError as error:
        assert "unbounded by construction" in str(error)
    nested = "object.spec.containers.all(c, c.image.split(':').all(part, part != ''))"
    assert decide(runaway(nested), REFERENCE_POD).allowed
