"""vap.lowering: CEL's optional syntax rewritten into plain CEL, for Kubernetes 1.28.

The oracle is behaviour, not text: every example policy, with each of its expressions lowered,
must decide every case of its own suite exactly as the original does; and a few pairs are
evaluated directly at the edges (a missing key, null, an empty map, a list too short).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from celcases import evaluate
from hypothesis import given
from hypothesis import strategies as st

from admission_policy import api
from admission_policy.cel import CelEvaluationError, check, syntax
from admission_policy.cli.documents import read_documents
from admission_policy.cli.suite import SuiteResult, is_suite, run_suite
from admission_policy.vap.lowering import NotLowerable, lower_optionals, plain_environment

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
POLICY_KINDS = ("AdmissionPolicy", "NamespacedAdmissionPolicy")
OPTIONAL_CALLS = {"_?._", "_[?_]", "optional.of", "optional.ofNonZeroValue", "optional.none"}

LOWERED = [
    # no optional syntax: the text as it is
    ("has(object.metadata.labels) && object.metadata.labels.size() > 0",
     "has(object.metadata.labels) && object.metadata.labels.size() > 0"),
    ("'a?b' + 'optional' + string(object.x)", "'a?b' + 'optional' + string(object.x)"),
    # e.?f
    ("object.metadata.?labels.orValue({})",
     "has(object.metadata.labels) ? object.metadata.labels : {}"),
    ("object.metadata.?labels.orValue({}).size() > 0",
     "(has(object.metadata.labels) ? object.metadata.labels : {}).size() > 0"),
    ("object.metadata.?labels.?team.orValue('') != ''",
     "(has(object.metadata.labels) && has(object.metadata.labels.team) ? object.metadata.labels.team : '') != ''"),
    ("object.spec.?c.?d.hasValue()", "has(object.spec.c) && has(object.spec.c.d)"),
    ("!object.spec.?c.hasValue()", "!has(object.spec.c)"),
    ("!object.spec.?c.?d.hasValue()", "!(has(object.spec.c) && has(object.spec.c.d))"),
    ("object.spec.?c.value()", "object.spec.c"),
    ("object.spec.?c.?d.value() == 1", "object.spec.c.d == 1"),
    # a plain select or index on an optional: optional too, and tested (cel-go: a.?b.c is a.?b.?c)
    ("object.spec.?x.y.orValue(1)", "has(object.spec.x) && has(object.spec.x.y) ? object.spec.x.y : 1"),
    ("object.spec.?x[0].orValue(1)", "has(object.spec.x) && size(object.spec.x) > 0 ? object.spec.x[0] : 1"),
    ("object.spec.?x['k'].value()", "object.spec.x['k']"),
    # m[?k]: a string key reads a map, a literal int a list
    ("object.metadata.labels[?'app.kubernetes.io/name'].orValue('d')",
     "'app.kubernetes.io/name' in object.metadata.labels ? object.metadata.labels['app.kubernetes.io/name'] : 'd'"),
    ("object.metadata.?labels[?'a.b'].orValue('')",
     "has(object.metadata.labels) && 'a.b' in object.metadata.labels ? object.metadata.labels['a.b'] : ''"),
    ("object.spec.containers[?0].?image.orValue('')",
     "size(object.spec.containers) > 0 && has(object.spec.containers[0].image) ? object.spec.containers[0].image : ''"),
    ("['a'].filter(f, object.spec[?f].orValue(false) == true)",   # f: a string, as the checker says
     "['a'].filter(f, (f in object.spec ? object.spec[f] : false) == true)"),
    ("[1, 2][?object.i].orValue(0)",   # a list, as the checker says
     "object.i >= 0 && object.i < size([1, 2]) ? [1, 2][object.i] : 0"),
    ("{'a': 1}[?object.k].orValue(0)", "object.k in {'a': 1} ? {'a': 1}[object.k] : 0"),
    ("object.spec.?x[?object.y].orValue(1)",   # neither type known: decided when it runs
     "has(object.spec.x) && (type(object.spec.x) == list ? object.y >= 0 && object.y < size(object.spec.x) "
     ": object.y in object.spec.x) ? object.spec.x[object.y] : 1"),
    # o.orValue({}).?f is o.?f: the empty default has nothing
    ("object.?a.orValue({}).?b.orValue('') // a comment", "has(object.a) && has(object.a.b) ? object.a.b : ''"),
    ("object.?a.orValue([])[?0].orValue(1)", "has(object.a) && size(object.a) > 0 ? object.a[0] : 1"),
    ("object.?a.orValue({'b': 1}).?b.orValue(0)",
     "has((has(object.a) ? object.a : {'b': 1}).b) ? (has(object.a) ? object.a : {'b': 1}).b : 0"),
    # or, optional.of, optional.none, ?:
    ("object.spec.?c.or(object.spec.?d).orValue(1)",
     "(has(object.spec.c) ? true : has(object.spec.d)) ? (has(object.spec.c) ? object.spec.c : object.spec.d) : 1"),
    ("object.spec.?c.or(optional.none()).orValue(1)", "has(object.spec.c) ? object.spec.c : 1"),
    ("optional.none().or(object.spec.?d).value()", "object.spec.d"),
    ("optional.of(1).orValue(2)", "1"),
    ("optional.of(object.t ? object.a : object.b).?c.orValue(2)",
     "has((object.t ? object.a : object.b).c) ? (object.t ? object.a : object.b).c : 2"),
    ("optional.none().orValue(2)", "2"),
    ("optional.none().?x.hasValue()", "false"),
    ("(object.t ? object.?a : object.?b).orValue(1)",
     "(object.t ? has(object.a) : has(object.b)) ? (object.t ? object.a : object.b) : 1"),
    # inside macros, arguments and defaults; the rest of the text stays as written
    ("object.spec.containers.all(c, c.?image.orValue('').startsWith('r/'))",
     "object.spec.containers.all(c, (has(c.image) ? c.image : '').startsWith('r/'))"),
    ("object.a.?b.orValue(object.c.?d.orValue(0))",
     "has(object.a.b) ? object.a.b : has(object.c.d) ? object.c.d : 0"),
    ("size(object.?a.orValue([])) +\n  // the rest\n  1",
     "size(has(object.a) ? object.a : []) +\n  // the rest\n  1"),
    ("object.spec == null ? 1 : object.spec.?x.orValue(2)",
     "object.spec == null ? 1 : has(object.spec.x) ? object.spec.x : 2"),
    ("object.a.?b.orValue(1) == 1 ? 'x' : 'y'", "(has(object.a.b) ? object.a.b : 1) == 1 ? 'x' : 'y'"),
    (r"object.?b.orValue('\'.?x') + r'''a'.?b'''",   # strings that look like the syntax
     r"(has(object.b) ? object.b : '\'.?x') + r'''a'.?b'''"),
]

NOT_LOWERABLE = [
    ("object.?a", "an optional value (object.?a) as the expression's result"),
    ("optional.of(object.a)", "as the expression's result"),
    ("optional.ofNonZeroValue(object.a).hasValue()",
     "optional.ofNonZeroValue cannot be written without optional types"),
    ("object.?a.optMap(v, v + 1).orValue(0)", "optMap cannot be written without optional types"),
    ("object.?a.optFlatMap(v, v.?b).orValue(0)", "optFlatMap cannot be written without optional types"),
    ("[?object.?a]", "optional list elements ([?x])"),
    ("{?'a': object.?a}", "optional map entries ({?k: v})"),
    ("object.?a == optional.none()", "as an operand of =="),
    ("[object.?a].size()", "as an element of a list literal"),
    ("optional.none().value()", "always fails"),
    ("(object.t ? object.?a : optional.none()).value()", "value() of"),
    ("object.?a +", "does not compile"),
]


@pytest.mark.parametrize(("source", "expected"), LOWERED)
def test_lowering(source: str, expected: str) -> None:
    lowered = lower_optionals(source)
    assert lowered == expected
    if lowered != source:
        _assert_plain(lowered)


@pytest.mark.parametrize(("source", "message"), NOT_LOWERABLE)
def test_not_lowerable(source: str, message: str) -> None:
    with pytest.raises(NotLowerable, match=re.escape(message)):
        lower_optionals(source)


def test_not_lowerable_is_the_projects_error() -> None:
    from admission_policy.errors import AdmissionPolicyError
    assert issubclass(NotLowerable, AdmissionPolicyError) and issubclass(NotLowerable, ValueError)


def test_the_plain_environment_refuses_optional_syntax() -> None:
    for source in ("object.?a", "object[?'a']", "[?object.a]", "{?'a': object.a}", "optional.none()"):
        with pytest.raises(RuntimeError):
            check(plain_environment(), source)
    check(plain_environment(), "has(object.a) ? object.a : {}")


# --- edges, evaluated ------------------------------------------------------------------------

EDGES: list[tuple[str, dict[str, Any]]] = [
    ("object.metadata.?labels.?team.orValue('none')", {"object": {"metadata": {}}}),
    ("object.metadata.?labels.?team.orValue('none')", {"object": {"metadata": {"labels": {}}}}),
    ("object.metadata.?labels.?team.orValue('none')", {"object": {"metadata": {"labels": {"team": "a"}}}}),
    ("object.metadata.?labels.?team.orValue('none')", {"object": {"metadata": {"labels": {"team": None}}}}),
    ("object.metadata.?labels.?team.orValue('none')", {"object": {"metadata": {"labels": None}}}),
    ("object.metadata.?labels.?team.orValue('none')", {"object": {"metadata": None}}),
    ("object.metadata.?labels.?team.orValue('none')", {"object": {"metadata": {"labels": "text"}}}),
    ("object.metadata.?labels.?team.hasValue()", {"object": {"metadata": {"labels": {"team": None}}}}),
    ("object.metadata.?labels.?team.hasValue()", {"object": {"metadata": {}}}),
    ("object.metadata.?labels.?team.value()", {"object": {"metadata": {"labels": {"team": "a"}}}}),
    ("object.metadata.?labels.?team.value()", {"object": {"metadata": {"labels": {}}}}),
    ("object.m[?'a.b'].orValue(0)", {"object": {"m": {"a.b": 1}}}),
    ("object.m[?'a.b'].orValue(0)", {"object": {"m": {}}}),
    ("object.m[?'a.b'].orValue(0)", {"object": {"m": {"a.b": None}}}),
    ("object.m[?'a.b'].orValue(0)", {"object": {"m": ["a.b"]}}),
    ("object.l[?1].orValue(0)", {"object": {"l": [5]}}),
    ("object.l[?1].orValue(0)", {"object": {"l": [5, 6]}}),
    ("object.l[?1].orValue(0)", {"object": {"l": []}}),
    ("object.?l[?object.i].orValue(0)", {"object": {"l": [5, 6], "i": 1}}),
    ("object.?l[?object.i].orValue(0)", {"object": {"l": [5, 6], "i": 2}}),
    ("object.?l[?object.i].orValue(0)", {"object": {"l": [5, 6], "i": -1}}),
    ("object.?l[?object.i].orValue(0)", {"object": {"l": {"k": 7}, "i": "k"}}),
    ("object.?l[?object.i].orValue(0)", {"object": {"l": {"k": 7}, "i": "j"}}),
    ("object.?l[?object.i].orValue(0)", {"object": {"i": "j"}}),
    ("object.?l[?object.i].orValue(0)", {"object": {"l": [5], "i": "k"}}),
    ("object.?a.or(object.?b).orValue(0)", {"object": {"b": 2}}),
    ("object.?a.or(object.?b).orValue(0)", {"object": {"a": 1, "b": 2}}),
    ("object.?a.or(object.?b).orValue(0)", {"object": {}}),
    ("object.?a.or(object.?b).value()", {"object": {}}),
    ("object.?a.x.orValue(0)", {"object": {"a": {}}}),
    ("object.?a.x.orValue(0)", {"object": {}}),
    ("object.?a.x.orValue(0)", {"object": {"a": {"x": 1}}}),
    ("object.?a.x.orValue(0)", {"object": {"a": None}}),
    ("object.?a['x'].orValue(0)", {"object": {"a": {}}}),
    ("object.?a['x'].orValue(0)", {"object": {"a": {"x": 2}}}),
    ("object.?a.orValue({}).?b.orValue(0)", {"object": {"a": {"b": 3}}}),
    ("object.?a.orValue({}).?b.orValue(0)", {"object": {"a": {}}}),
    ("object.?a.orValue({}).?b.orValue(0)", {"object": {}}),
    ("object.?a.orValue({}).?b.orValue(0)", {"object": {"a": None}}),
    ("(object.t ? object.?a : object.?b).orValue(1)", {"object": {"t": True, "b": 2}}),
    ("(object.t ? object.?a : object.?b).orValue(1)", {"object": {"t": False, "b": 2}}),
    ("object.c.exists(c, c.?image.orValue('') == 'x')", {"object": {"c": [{}, {"image": "x"}]}}),
    ("object.c.exists(c, c.?image.orValue('') == 'x')", {"object": {"c": []}}),
]


def _outcome(source: str, bindings: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "value", evaluate(source, **bindings)
    except CelEvaluationError:
        return "error", None


@pytest.mark.parametrize(("source", "bindings"), EDGES)
def test_lowered_and_original_agree_at_the_edges(source: str, bindings: dict[str, Any]) -> None:
    lowered = lower_optionals(source)
    assert lowered != source
    assert _outcome(lowered, bindings) == _outcome(source, bindings)


# --- random chains, evaluated ------------------------------------------------------------------
# Objects of a consistent shape, as Kubernetes' are: maps under a, b and 'a.b', a list under l
# (read with a literal or an int index), scalars and null anywhere. Where a value is of another
# kind than its key says (a list read with a string key), the lowering assumes the kind (see the
# module doc) and the two may differ; cel-expr-python also runs a plain index on an optional list
# off the spec (``o.?l[5]`` has a value), so chains use [?i] there.

_OPTIONAL_STEPS = (".?a", ".?b", "[?'a.b']", "[?'a']", ".?l[?0]", ".?l[?1]", "[?object.k]", ".?l[?object.i]",
                   ".l[?object.i]")
_CONSUMERS = (".orValue(-1)", ".hasValue()", ".value()", ".orValue({}).?a.orValue(7)")
_SCALARS = st.sampled_from([None, 0, 1, "a", "", True])


def _objects(depth: int = 0) -> st.SearchStrategy[Any]:
    if depth > 2:
        return _SCALARS
    inner = _objects(depth + 1)
    maps = st.fixed_dictionaries({}, optional={"a": inner, "b": inner, "a.b": inner,
                                               "l": st.lists(st.one_of(inner, st.fixed_dictionaries({"a": inner})),
                                                             max_size=2)})
    return st.one_of(_SCALARS, maps)


_CHAINS = st.tuples(
    st.sampled_from(["object", "object.a", "object['a.b']", "object.l[0]"]),
    st.lists(st.sampled_from(_OPTIONAL_STEPS), min_size=1, max_size=3),
    st.lists(st.sampled_from((".a", ".b")), max_size=1),
    st.sampled_from(["", "or", "choice"]), st.sampled_from(_OPTIONAL_STEPS), st.sampled_from(_CONSUMERS))


@given(_CHAINS, st.lists(st.tuples(_objects(), st.sampled_from(["a", "b", "a.b", "c"]),
                                   st.sampled_from([0, 1, -1, 2]), st.booleans()), min_size=1, max_size=4))
def test_random_chains_decide_as_the_originals(chain: tuple[Any, ...], objects: list[tuple[Any, ...]]) -> None:
    base, steps, selects, wrapper, other, consumer = chain
    source = base + "".join(steps) + "".join(selects)
    if wrapper == "or":
        source = f"{source}.or(object{other})"
    elif wrapper == "choice":
        source = f"(object.t ? {source} : object{other})"
    source += consumer
    lowered = lower_optionals(source)
    for value, key, index, flag in objects:
        bindings = {"object": {**(value if isinstance(value, dict) else {"a": value}), "k": key, "i": index,
                               "t": flag}}
        assert _outcome(lowered, bindings) == _outcome(source, bindings), (source, lowered, bindings)


# --- every expression of every example --------------------------------------------------------

def _policy_files() -> list[Path]:
    return sorted(path for path in EXAMPLES.rglob("*.yaml")
                  if any(doc and doc.get("kind") in POLICY_KINDS for doc in _documents(path)))


def _documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


def _expressions(doc: Any) -> list[api.Expression]:
    return api.parse_policy(doc).expressions()


def _assert_plain(lowered: str) -> None:
    """Compiles without optional syntax; no optional call, entry or value left."""
    tree = syntax.Checked.decode(check(plain_environment(), lowered).serialize())
    for node in syntax.walk(tree.root):
        assert not (node.kind == "call" and node.name in OPTIONAL_CALLS), lowered
        assert not any(entry.optional for entry in node.entries), lowered


def test_every_example_expression_lowers_or_says_why() -> None:
    lowered_count, refused = 0, []
    for path in _policy_files():
        for doc in _documents(path):
            if doc.get("kind") not in POLICY_KINDS:
                continue
            for expression in _expressions(doc):
                try:
                    lowered = lower_optionals(expression.source)
                except NotLowerable as error:
                    refused.append((path.parent.name, expression.path, str(error)))
                    continue
                lowered_count += lowered != expression.source
                _assert_plain(lowered)
                check(plain_environment(), lowered)
    assert lowered_count >= 60
    # The one example that needs optional types: a mutation that rebuilds containers with
    # optional entries and optMap.
    assert refused == [("default-resources", "spec.mutations[0].jsonPatch[0].valueExpression",
                        "optMap cannot be written without optional types")]


_PATH_PART = re.compile(r"([A-Za-z]+)(?:\[(\d+)\])?")


def _set(doc: Any, path: str, value: str) -> None:
    """Write ``value`` at an expression's path (``spec.validations[0].expression``)."""
    parts: list[str | int] = []
    for found in _PATH_PART.finditer(path):
        parts.append(found[1])
        if found[2] is not None:
            parts.append(int(found[2]))
    node = doc
    for part in parts[:-1]:
        node = node[part]
    assert isinstance(node[parts[-1]], str)
    node[parts[-1]] = value


def _lower_policies(root: Path) -> dict[str, bool]:
    """Lower every expression of every policy under ``root`` in place: {example: fully lowered}."""
    full: dict[str, bool] = {}
    for path in sorted(root.rglob("*.yaml")):
        docs = _documents(path)
        if not any(doc.get("kind") in POLICY_KINDS for doc in docs):
            continue
        for doc in docs:
            if doc.get("kind") not in POLICY_KINDS:
                continue
            lowered_all = True
            for expression in _expressions(doc):
                try:
                    _set(doc, expression.path, lower_optionals(expression.source))
                except NotLowerable:
                    lowered_all = False
            full[path.parent.name] = full.get(path.parent.name, True) and lowered_all
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False, width=1000))
    return full


def _decisions(result: SuiteResult) -> list[tuple[Any, ...]]:
    """What each case decided. A patch's operations as a set: their order varies from run to
    run for the same policy (default-resources: the order of a CEL map's keys)."""
    out = []
    for case in result.cases:
        decision = case.decision
        out.append((case.name, case.problems, None if decision is None else (
            decision.allowed, decision.code, decision.reason, decision.message, decision.warnings,
            dict(decision.audit_annotations), sorted(json.dumps(op, sort_keys=True) for op in decision.patch),
            decision.patched_object)))
    return out


def _suites(root: Path) -> dict[str, SuiteResult]:
    return {str(path.relative_to(root)): run_suite(document) for path in sorted(root.rglob("test.yaml"))
            for document in read_documents(path) if is_suite(document)}


def test_lowered_examples_decide_their_suites_as_the_originals(tmp_path: Path) -> None:
    copy = tmp_path / "examples"
    shutil.copytree(EXAMPLES, copy)
    full = _lower_policies(copy)
    assert sum(full.values()) >= len(full) - 1 and full["default-resources"] is False
    # The copy really is lowered: no optional syntax left in the fully lowered ones.
    for name, whole in full.items():
        if whole:
            text = (copy / name / "policy.yaml").read_text()
            assert ".?" not in text and "[?" not in text and "optional." not in text, name
    originals, lowered = _suites(EXAMPLES), _suites(copy)
    assert len(originals) >= 12 and originals.keys() == lowered.keys()
    for name, result in originals.items():
        assert all(case.passed for case in result.cases), name
        assert _decisions(lowered[name]) == _decisions(result), name
